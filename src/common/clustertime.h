/* Cluster-time gossip (issue #20): MongoDB's logical clock as mongod and mongos pass it
 * around (src/mongo/db/vector_clock.cpp, logical_time_validator.cpp, 6.0).
 *
 * A cluster time is a BSON Timestamp packed as the oplog's ts (secs << 32 | inc,
 * storage/store.h sdb_store_ts_pack). Every reply of a shard or a proxy carries
 *   $clusterTime: {clusterTime: Timestamp, signature: {hash: BinData(0, 20 bytes), keyId: Long}}
 *   operationTime: Timestamp
 * and every request may carry $clusterTime: the receiver advances its clock to it, so
 * that what it writes next sorts after whatever the sender had seen (shards: the next
 * oplog ts is above it; see src/shard/README.md "Cluster time").
 *
 * Signature: hash = HMAC-SHA-1(secret, the 8 bytes of the Timestamp, big-endian
 * secs then inc) with a secret derived from the cluster key (auth_cluster_derive with
 * CT_SIGN_LABEL), keyId 1; without a cluster key the hash is 20 zero bytes and keyId 0,
 * what mongod sends when auth is off. Drivers only echo it back. */
#ifndef SDB_COMMON_CLUSTERTIME_H
#define SDB_COMMON_CLUSTERTIME_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stdint.h>

/* mongod's maxAcceptableLogicalClockDriftSecs default: a gossiped time more than this
 * many seconds ahead of the receiver's wall clock is refused. */
#define CT_MAX_DRIFT_SECS (365 * 24 * 60 * 60)
/* MongoDB's ClusterTimeFailsRateLimiter and TimeProofMismatch codes. */
#define CT_ERR_RATE_LIMITER 205
#define CT_ERR_TIME_PROOF_MISMATCH 204
/* The derivation label of the signing secret (auth_cluster_derive). */
#define CT_SIGN_LABEL "stripedb $clusterTime v1"
/* The length of a signature's hash (HMAC-SHA-1), as mongod's. */
#define CT_HASH_LEN 20

/* A request's $clusterTime, parsed. */
typedef struct ct_gossip {
	bool present;          /* the request carried $clusterTime */
	uint64_t time;         /* its clusterTime (packed) */
	bool signed_;          /* it carried a 20-byte hash and a keyId */
	uint8_t hash[CT_HASH_LEN];
	int64_t key_id;
} ct_gossip;

/* Parse cmd's $clusterTime into *out (out->present false when it has none). Shape
 * checks as mongod's (VectorClock::_gossipInInternal via the IDL): $clusterTime must be
 * an object with a Timestamp clusterTime; signature, when present, an object with a
 * BinData hash and a numeric keyId (a missing signature is accepted, as mongod does
 * when auth is off). Returns: 0, or a MongoDB error code with a message in err:
 * TypeMismatch 14 (a field of the wrong type), NoSuchKey 4 (clusterTime missing). */
int ct_parse(const bson_t *cmd, ct_gossip *out, char *err, size_t errlen);
/* ct_parse of a $clusterTime the caller found: field is on cmd's $clusterTime element, or
 * NULL when cmd has none (a caller with an index of the command's keys,
 * wire_req_cmd_find, need not walk it again). Returns: as ct_parse. */
int ct_parse_field(const bson_iter_t *field, ct_gossip *out, char *err, size_t errlen);

/* A request's gossip as a node takes it: ct_parse, then (when present) ct_check_drift
 * against this node's sdb_wall_ms(). Returns: 0 with *out (out->present false: no
 * $clusterTime), or ct_parse's / ct_check_drift's code with the message in err. */
int ct_take(const bson_t *cmd, ct_gossip *out, char *err, size_t errlen);
/* ct_take of a $clusterTime the caller found (field as ct_parse_field's). Returns: as
 * ct_take. */
int ct_take_field(const bson_iter_t *field, ct_gossip *out, char *err, size_t errlen);

/* MongoDB's drift guard: 0 when time is at most CT_MAX_DRIFT_SECS seconds ahead of
 * wall_ms (epoch ms), else ClusterTimeFailsRateLimiter (205) with mongod's message
 * ("New $clusterTime, S, is too far from this node's wall clock time, W.") in err.
 * Returns: 0 or 205. */
int ct_check_drift(uint64_t time, int64_t wall_ms, char *err, size_t errlen);

/* The ts floor a shard writes above for a cluster time it accepted: time, lowered when
 * needed to at most (wall + CT_MAX_DRIFT_SECS - 1 s, increment 0xFFFFFFFF), so the ts
 * written above it (+1, which may carry into the next second) stays within the drift
 * guard of every node whose clock is at wall_ms or later: otherwise a time accepted at the
 * guard's edge made the shard answer times the cluster then refused to its well-behaved
 * clients (205; issue #20 review). Only times within a second of a year ahead are
 * lowered. Returns: the floor (time as Timestamp bits). */
uint64_t ct_floor_clamp(uint64_t time, int64_t wall_ms);

/* hash = HMAC-SHA-1(secret[32], time as 8 big-endian bytes). */
void ct_sign(const uint8_t secret[32], uint64_t time, uint8_t hash[CT_HASH_LEN]);

/* Append the field $clusterTime {clusterTime: cluster_time, signature: {hash, keyId}} to
 * doc, whatever doc holds: hash is the CT_HASH_LEN bytes ct_sign gave for cluster_time
 * (keyId 1), or NULL for 20 zero bytes and keyId 0 (no cluster key). For a caller that
 * keeps a signature it computed once (the proxy, per shard command; issue #19).
 * Returns nothing: appending cannot fail. */
void ct_append_signed(bson_t *doc, uint64_t cluster_time, const uint8_t *hash);

/* Append $clusterTime {clusterTime, signature} (signed with secret, or zeros with keyId 0
 * when secret is NULL) and operationTime (op_time) to reply, each only when reply does
 * not have it yet. Returns nothing: appending cannot fail. */
void ct_append(bson_t *reply, uint64_t cluster_time, uint64_t op_time, const uint8_t *secret);

/* ct_append with the $clusterTime field prebuilt: ct_doc holds it alone, as a document
 * (ct_append_signed's); appended when reply has no $clusterTime yet, then operationTime
 * (op_time) when reply has none. Returns nothing: appending cannot fail. */
void ct_append_doc(bson_t *reply, const bson_t *ct_doc, uint64_t op_time);

/* Atomically raise *clock to time when it is higher. Returns: the clock's value after. */
uint64_t ct_advance(_Atomic uint64_t *clock, uint64_t time);

/* The clusterTime of a reply's $clusterTime (0 when absent or malformed). */
uint64_t ct_of_reply(const bson_t *reply);

#endif
