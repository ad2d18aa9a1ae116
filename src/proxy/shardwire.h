/* The proxy's own connections to one shard member (issue #19): OP_MSG over blocking TCP
 * sockets, on the request threads, without libmongoc.
 *
 * Why: libmongoc 1.23 makes a copy of the connection's handshake server description for
 * every command it sends (mongoc_server_description_new_copy re-parses the stored hello
 * reply: ~27k of the ~55k instructions libmongoc spends per proxied command), starts an
 * implicit session per command and reads a reply with a recv that meets EAGAIN and then a
 * poll. shardconn.c keeps libmongoc for everything else (server selection, monitoring,
 * failover, TLS, read preferences) and sends a shard's primary commands here once
 * libmongoc has selected that primary (see shardconn.c, "The own connections").
 *
 * A shardwire is the idle connections to one member (host:port; server_id is libmongoc's
 * id of that member in the shard's pool, kept for shardconn's bookkeeping). A connection
 * opens with a non-blocking connect bounded by connect_timeout_ms, then `hello` with the
 * client metadata (appName "stripedb-proxy", as the libmongoc pool says), then, when a
 * cluster key is loaded, SCRAM-SHA-256 as __system (auth_cluster_authenticate). Reads and
 * writes are bounded by socket_timeout_ms (SO_RCVTIMEO / SO_SNDTIMEO). No TLS and no
 * compression: shardconn.c only uses this for URIs that ask for neither.
 *
 * Thread-safe: any number of request threads call shardwire_command at once; each takes
 * an idle connection (or opens one) for the command and gives it back after a complete
 * answer; a connection that failed in any way is closed, never reused.
 */
#ifndef SDB_PROXY_SHARDWIRE_H
#define SDB_PROXY_SHARDWIRE_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct shardwire shardwire;

/* What became of a command (shardwire_command's result). */
enum {
	SHARDWIRE_OK = 0,      /* the member answered; reply holds its answer, whatever its ok */
	SHARDWIRE_UNSENT = 1,  /* no complete message reached the member: it cannot have run */
	SHARDWIRE_UNKNOWN = 2, /* sent, then no complete answer (reset, timeout): it may have run */
};

/* Idle connections to host_and_port ("H:P" or "[v6]:P", as libmongoc's
 * host_and_port) with libmongoc's server_id of that member. Timeouts in milliseconds,
 * the URI's connectTimeoutMS (0: libmongoc's default, 10 s) and socketTimeoutMS (0: none,
 * as in libmongoc). set_name (copied; NULL: none, a standalone): the replica set the member belongs
 * to, as its hello said to libmongoc; a connection whose hello names another set (or
 * none) is refused before any command, as libmongoc drops such a member (another
 * process now on the address, e.g. a member of another shard). Never fails (allocation
 * aborts); nothing is connected until a command. */
shardwire *shardwire_new(const char *host_and_port, uint32_t server_id, int connect_timeout_ms,
			 int socket_timeout_ms, const char *set_name);
/* Close the idle connections and free w. No command may be running on w. NULL is a no-op. */
void shardwire_free(shardwire *w);

/* Close w's idle connections and keep none from now on (a connection in use is closed
 * when its command ends): for a shard entry replaced (new cluster key, new URI) or
 * removed, whose w stays allocated while commands may still run on it. Thread-safe. */
void shardwire_retire(shardwire *w);

uint32_t shardwire_server_id(const shardwire *w);
const char *shardwire_host(const shardwire *w);

/* Run cmd (a complete command: $db included; borrowed) on the member and put its answer
 * into reply (initialised in every case; the caller destroys it). Blocking: request
 * threads only. Returns: one of the SHARDWIRE_* results (not a status); on UNSENT and UNKNOWN err holds a
 * message naming the member (connection refused, timeout, reset, an answer that is not a
 * well-formed OP_MSG reply to this request, authentication refused). An idle connection
 * the member has closed (its FIN or RST already received) is detected before sending and
 * replaced, so a member restarted between two commands costs a new connection, not an
 * unknown outcome. */
int shardwire_command(shardwire *w, const bson_t *cmd, bson_t *reply, char *err, size_t errlen);

/* ---- for the loop thread's forwarder (forwarder.h) ----
 * It keeps connections of its own, taken from w's idle ones once a request thread opened
 * them, and runs them non-blocking on the proxy's loop. */

/* Take one of w's idle connections for good (the caller closes it): its fd (a blocking,
 * connected, greeted and authenticated socket; the caller may make it non-blocking) and
 * in *request_id the last requestID sent on it. Never opens one, never blocks (a
 * non-blocking MSG_PEEK drops idle connections their member closed). Thread-safe.
 * Returns: the fd, or -1 when w has no idle connection. */
int shardwire_take_idle_fd(shardwire *w, int32_t *request_id);

/* The answer in msg (one complete message of len bytes, as framed by its length field) to
 * the OP_MSG sent with request_id, appended to reply (initialised by the caller). Any
 * thread. Returns: 0, or -1 with a message in err (malformed, not an OP_MSG, another
 * request's answer, moreToCome, document sequences): the connection is then unusable. */
int shardwire_parse_reply(const uint8_t *msg, size_t len, int32_t request_id, bson_t *reply,
			  char *err, size_t errlen);

/* Count one idle connection found closed by its member before a command was sent on it
 * (stripedb_proxy_shard_wire_stale_total), for the forwarder's own idle connections.
 * Thread-safe. */
void shardwire_count_stale(void);

/* Returns: w's socket timeout in ms (0: none), as shardwire_new took it. */
int shardwire_socket_timeout_ms(const shardwire *w);

/* Returns: true once shardwire_retire ran on w (its member's connections are not to be
 * used for new commands). Thread-safe. */
bool shardwire_retired(shardwire *w);

#endif
