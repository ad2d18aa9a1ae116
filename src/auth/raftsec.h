/* Security of the Raft port (issue #21): which transport a role with a raft listener
 * uses, and the key and TLS contexts it gets.
 *
 * --raft-tls=enabled|disabled|auto (default auto):
 *   - TLS when --tls-cert, --tls-key and --tls-ca are all set (independent of
 *     --tls-mode, which is about the wire listener): mutual TLS, both members present
 *     --tls-cert and verify the peer's against --tls-ca; host names are not checked
 *     (every certificate the cluster CA signed for a member is a member).
 *   - the cluster key (--cluster-key-file) adds the HMAC challenge-response of
 *     raft/handshake.h (with or without TLS). The transport asks for the current keys at
 *     every new connection (opts->keys: auth_cluster_derive_all), so a key file re-read on
 *     SIGHUP applies to the next connection: the first key proves outgoing connections,
 *     any key is accepted on incoming ones (key rotation, src/auth/README.md).
 *   - enabled: one of the two must be configured (SDB_EUSAGE otherwise); TLS needs all
 *     three files (SDB_EUSAGE when cert/key are given without --tls-ca).
 *   - auto: the secure transport when either is configured; otherwise the plaintext
 *     transport (libraft's wire format, raft/transport.h plaintext mode: members only,
 *     messages checked) with a start-up warning.
 *   - disabled: that plaintext transport (wire-compatible with members of earlier
 *     versions), with a start-up warning.
 * Call after auth_cluster_setup (the key must be loaded). The TLS contexts are rebuilt
 * by auth_raft_reload, the "Raft TLS" SIGHUP hook that the first auth_raft_setup with TLS
 * registers (common/role.h sdb_on_sighup): new Raft connections use the new certificate and CA, the
 * open ones keep theirs. A CA bundle with the old and the new CA accepts both during a
 * rotation.
 */
#ifndef SDB_AUTH_RAFTSEC_H
#define SDB_AUTH_RAFTSEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/config.h"
#include "raft/transport.h"

/* The transport settings for cfg's raft port. *secure = false: use the plaintext stock
 * transport (opts untouched); true: sdb_transport_init with *opts, whose key points to
 * *key_buf (SDB_HS_KEY_LEN bytes the caller keeps alive until init; the first key at
 * setup) and whose keys callback gives the current ones. Errors: SDB_EUSAGE (bad mode,
 * missing file or flag) / SDB_EINVAL (OpenSSL refusing the files), message in err. */
int auth_raft_setup(const sdb_config *cfg, sdb_transport_opts *opts, uint8_t key_buf[32],
		    bool *secure, char *err, size_t errlen);

/* Rebuild the Raft TLS contexts from their files (the "Raft TLS" SIGHUP hook).
 * 0 also when Raft TLS is off. Errors: SDB_EINVAL (OpenSSL refused or could not read the
 * files): the old contexts stay. Thread-safe. */
int auth_raft_reload(char *err, size_t errlen);

/* Is hp ("H:P" or "[H]:P") a loopback address: 127.0.0.0/8, localhost or [::1]? */
bool auth_raft_is_loopback(const char *hp);

/* Check --raft-tls's value (enabled, disabled, auto) for any role, so that a bad value is bad
 * usage everywhere and not only where a Raft port exists. Errors: SDB_EUSAGE with err. */
int auth_raft_check_mode(const sdb_config *cfg, char *err, size_t errlen);

#endif
