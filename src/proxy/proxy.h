/* Internal state of the proxy role, shared by role.c (lifecycle, routing refresh),
 * exec.c (command handlers) and cursor.c (proxy-side cursors). Not a public contract.
 */
#ifndef SDB_PROXY_PROXY_H
#define SDB_PROXY_PROXY_H

#include <bson/bson.h>
#include <mongoc/mongoc.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <uv.h>

#include "common/metrics.h"
#include "proxy/merge.h"
#include "proxy/quota.h"
#include "routing/route.h"
#include "proxy/shardconn.h"
#include "wire/server.h"

typedef struct proxy_cursor proxy_cursor;
/* A change stream's merge state (changestream.c), held by a proxy cursor. */
typedef struct px_cs px_cs;

/* Documents the proxy holds (shard results) are copied into 128-byte aligned bson_t, as the
 * storage/ query core (sort, projection, pipeline) accesses bson_t members. Free with
 * proxy_doc_free (NULL is a no-op). */
bson_t *proxy_doc_copy(const bson_t *src);
/* An empty aligned document (to fill, e.g. as a projection's output). */
bson_t *proxy_doc_new(void);
void proxy_doc_free(bson_t *doc);

/* Byte length of a document, read from its data, so any bson_t will do whatever its
 * alignment: bson_new/bson_copy's are 128-byte aligned (common/alloc.c installs an aligned
 * allocator for libbson), but a bson_t embedded in a struct libmongoc allocates (a
 * cursor's current document) need not be, and UBSan refuses member access (doc->len) on
 * a misaligned one. */
static inline uint32_t proxy_bson_len(const bson_t *doc)
{
	uint32_t len;

	memcpy(&len, bson_get_data(doc), sizeof len);
	return BSON_UINT32_FROM_LE(len);
}

typedef struct proxy {
	uv_loop_t *loop;
	wire_server *srv;
	shardconn *sc;
	route_cache *rc;
	/* the metadata pool lives in sc (shardconn_metadata; renewed at key rotation) */
	int64_t stale_retry_ms;     /* StaleConfig retry budget */
	int64_t cursor_timeout_ms;  /* idle proxy cursors are killed after this */
	/* routing refresh thread */
	uv_thread_t refresher;
	uv_mutex_t mu;
	uv_cond_t cv;
	bool stopping;
	bool ready;                 /* metadata reached once (shards, quotas): /healthz */
	int64_t known_version;
	char *primary;              /* primary shard id (first shard by id), under mu */
	/* issue #18: each metadata database's primary shard, {name: shard id} from
	 * listDatabases (reloaded with the quotas, every second), under mu; NULL before */
	bson_t *db_primaries;
	/* names proxy_db_primary_lookup asked metadata about and did not find (at most
	 * PROXY_DB_CHECKED_MAX; then no more synchronous lookups), under mu; NULL before */
	bson_t *db_checked;
	/* cursors */
	uv_mutex_t cmu;
	proxy_cursor *cursors;
	uv_timer_t reap_timer;
	/* metrics */
	sdb_counter *m_stale_retries;
	sdb_counter *m_shard_retries; /* commands re-sent to a shard (retry.c px_shard_call) */
	sdb_counter *m_scatter;
	sdb_counter *m_targeted;
	sdb_counter *m_refreshes;
	sdb_counter *m_routing_bytes;   /* getRoutingTable reply bytes (issue #26) */
	sdb_gauge *m_routing_chunks;    /* chunks in the routing cache */
	sdb_gauge *m_routing_version;   /* known_version */
	sdb_histogram *m_refresh_time;  /* long-poll refreshes */
	sdb_counter *m_rejected;
	sdb_gauge *m_cursors;
	sdb_gauge *m_ring_ready;
	/* admission (tenant quotas); tables refreshed by the refresh thread */
	proxy_quota *quota;
	uint64_t quota_loaded_ms;
	/* issue #10: authentication/authorization gate (src/auth/gate.h); NULL with
	 * --auth=disabled. Tables reloaded with the quotas. */
	struct auth_gate *auth;
	/* How handlers and cursors reach shards and routing (retry.h): NULL = the real cluster
	 * (px_cluster_default with impl = this proxy); a unit test sets a fake. */
	const struct px_cluster *cluster;
	void *cluster_impl;
	/* issue #16: the sessions of single-shard transactions (txnroute.h) */
	struct pxtxn_table *txns;
	/* issue #18: config.mongos. advertise: "host:port" this proxy is reached at (its
	 * --listen host, the host name for a wildcard, and the bound port; heap, set before
	 * the refresh thread starts); started_ms: epoch ms of the start; the refresh thread
	 * sends metadata pingProxy every PROXY_PING_MS (PROXY_PING_RETRY_MS after a failure,
	 * e.g. while the cluster op version is below 3) at ping_next_ms (monotonic ms). */
	char *advertise;
	int64_t started_ms;
	/* issue #20: parked change stream getMores and the shard watchers (cswait.h); NULL
	 * in unit tests (getMores then wait on their worker) */
	struct px_cswait *csw;
	uint64_t ping_next_ms;
	/* issue #19: the loop thread's forwarder of point reads (forwarder.h); NULL in unit
	 * tests */
	struct px_forwarder *fw;
} proxy;

/* retry.c: every shard command and fan-out of the proxy (handlers and cursors) goes through
 * these two, to p->cluster. proxy_shard_command is px_shard_call (retry.h) with a budget of
 * --stale-retry-ms from now (for calls outside a client request's budget: cursors'
 * getMore and killCursors); proxy_shard_fanout is shardconn_fanout's contract.
 * Returns: (proxy_shard_command) a SHARDCONN_* class, not an SDB_E* status. */
int proxy_shard_command(proxy *p, const char *shard, const char *db, const bson_t *cmd,
			uint32_t *sid, bson_t *reply, char *neterr, size_t nelen);
void proxy_shard_fanout(proxy *p, size_t n, void (*fn)(void *arg, size_t i), void *arg);

/* catalog.c: metadata access and the routing cache */
/* Run cmd on the metadata service (the leader, found by libmongoc) in db admin. reply is
 * always initialised (caller destroys). Errors: SDB_EPROTO (the service answered an
 * error: *code, message in err) or SDB_EUNAVAILABLE (no metadata service configured, or
 * not reachable). Worker/refresh threads only. */
int proxy_meta_command(proxy *p, const bson_t *cmd, bson_t *reply, int *code, char *err,
		       size_t errlen);
/* Current routing for ns (a reference: unref it), fetched from metadata when not cached or
 * when force. NULL with a message when metadata cannot be reached and nothing is cached. */
route_coll *proxy_route(proxy *p, const char *ns, bool force, char *err, size_t errlen);
/* Primary shard id (heap copy) or NULL when no shard is known (refreshes the shard list). */
char *proxy_primary(proxy *p);
/* The primary shard of database db as metadata records it (heap copy), or NULL when db is
 * not a metadata database (callers then use proxy_primary, the cluster's default). From the
 * cache proxy_set_db_primaries fills; never calls metadata. Any thread. */
char *proxy_db_primary(proxy *p, const char *db);
/* As proxy_db_primary, but a database this proxy has never asked about and does not
 * have cached is looked up at once (one metadata listDatabases, the cache replaced), so
 * that the first command on a database created a moment ago (`ctl db create --primary`)
 * already follows its primary. A name not found is remembered and not asked about again
 * (the periodic reload still learns it). Worker threads only (blocks on metadata). */
char *proxy_db_primary_lookup(proxy *p, const char *db);
/* The primary shard of database db as a command on it would be routed now without
 * asking metadata (heap copy): the cached one, or the cluster's default for a name
 * proxy_db_primary_lookup asked about and did not find. NULL when that takes a metadata
 * call (a name never asked about, no shard known yet). Never blocks on the network. Any
 * thread. */
char *proxy_db_primary_cached(proxy *p, const char *db);
/* Replace that cache from a metadata listDatabases reply ({databases: [{name, primary?}]}).
 * Called by the refresh thread and by handlers that just read or changed the databases. */
void proxy_set_db_primaries(proxy *p, const bson_t *list_databases_reply);
/* Reload the shard list from metadata. Errors: proxy_meta_command's (SDB_EPROTO,
 * SDB_EUNAVAILABLE). */
int proxy_load_shards(proxy *p, char *err, size_t errlen);
/* The refresh thread's body (arg: the proxy): until p->stopping, long-polls the routing
 * version and refreshes the cached tables it touches, loads the shard list, tenants and
 * quotas, and sets p->ready after the first full load. Started by role.c. */
void proxy_catalog_refresher(void *arg);

/* exec.c: register every command handler on p->srv. */
void proxy_exec_register(proxy *p);

/* cursor.c */
/* One buffered document of a stream: its bytes inside the stream's batch. */
typedef struct pstream_doc {
	const uint8_t *data;
	uint32_t len;
} pstream_doc;

/* One shard's part of a proxy cursor: the shard cursor and the documents of its last batch.
 * A batch is held as the shard's reply itself (issue #19: a copy and two allocations per
 * document were ~10% of the proxy's CPU under YCSB E), its documents as views into it.
 * Allocate with sdb_calloc_bson (head and err_reply are bson_t). */
typedef struct pstream {
	char *shard;          /* shard id */
	uint32_t server_id;
	int64_t cursor_id;    /* shard cursor, 0 when exhausted */
	char *db;
	char *coll;           /* collection name for getMore */
	bson_t *batch;        /* the batch the documents are in (owned; NULL = none) */
	pstream_doc *docs;    /* its buffered documents, views into batch (owned array) */
	size_t n, pos;
	bson_t head;          /* docs[pos] as a document (static), set by proxy_cursor_next */
	route_coll *rcoll;    /* ownership filter: routing snapshot (NULL = none) */
	ssize_t chunk;        /* keep only documents of this chunk */
	int status;           /* SHARDCONN_* of the first request */
	bson_t err_reply;     /* error reply when status != OK */
	char neterr[256];
} pstream;

/* Fill a stream from a cursor reply ({cursor: {id, ns, firstBatch|nextBatch}}), replacing
 * its buffered documents; documents of another chunk than s->chunk are dropped (s->rcoll;
 * when most are, the stream keeps a copy of its own instead of the reply).
 * On success the stream takes reply's contents over (no copy): reply is left an empty,
 * initialised document, so the caller's bson_destroy stays right. reply must be a bson_t
 * of the caller's (bson_init, BSON_INITIALIZER, bson_copy_to), never one of bson_new:
 * bson_steal frees such a struct, which this would then write. Errors: SDB_EPROTO (no
 * cursor document in reply; no message), reply then untouched. */
int pstream_take_batch(pstream *s, bson_t *reply, const char *field);
/* Fill a stream with the documents of arr (an array of documents built by the caller, e.g.
 * a pipeline's output; taken over as pstream_take_batch takes a reply: left empty, and
 * likewise never a bson_new one). Elements that are not documents are skipped. */
void pstream_take_docs(pstream *s, bson_t *arr);
/* Append doc to arr (an array being built for pstream_take_docs) as element i ("0", "1",
 * ...). False when arr cannot grow (libbson: past 1 GiB). */
bool pstream_docs_append(bson_t *arr, uint32_t i, const bson_t *doc);
/* Free a stream's documents and names (not err_reply's storage: bson_destroy that). */
void pstream_clear(pstream *s);

/* A merged cursor over streams. Takes ownership of streams (array of n), sort, proj. */
proxy_cursor *proxy_cursor_new(proxy *p, const char *ns, pstream *streams, size_t n,
			       merge_sort *sort, void *proj, int64_t skip, int64_t limit);
/* A change stream cursor (issue #20): it holds cs (taken over; freed with the cursor by
 * px_cs_free, which kills the shard cursors) instead of merged streams. */
proxy_cursor *proxy_cursor_new_cs(proxy *p, const char *ns, px_cs *cs);
/* The change stream of c, or NULL for another cursor. */
px_cs *proxy_cursor_cs(const proxy_cursor *c);
/* changestream.c: kill cs's shard cursors and free it (NULL: nothing). */
void px_cs_free(proxy *p, px_cs *cs);
/* Produce the next batch into arr (an array being built) of at most batch_size documents
 * (< 0 = no count limit; 0 = an empty batch, as find's batchSize: 0) and at most ~8 MiB. Returns 0 when the cursor has more
 * (still alive), 1 when exhausted. Errors: as proxy_cursor_next. */
int proxy_cursor_fill(proxy *p, proxy_cursor *c, bson_t *arr, int64_t batch_size, int *code,
		      char *err, size_t errlen);
/* A new empty document (bson_destroy it) for proxy_cursor_answer's answer, its buffer
 * sized for the next batch of c of at most batch_size documents (< 0 = no count limit)
 * from the documents c holds, up to ~8 MiB plus one document (not sized when the proxy
 * projects: the output may be far smaller). */
bson_t *proxy_cursor_answer_new(const proxy_cursor *c, int64_t batch_size);
/* Append to out (a document being built) the cursor of a find, aggregate or getMore
 * answer: `cursor: {id: 0, ns, <field>: [the next batch of c, proxy_cursor_fill's, built in
 * place], partialResultsReturned: true when allowPartialResults left a shard out}`
 * (mongos's CursorResponse). The id is a placeholder: the caller sets it with
 * proxy_cursor_answer_id once it has registered, checked in or destroyed c. Returns
 * proxy_cursor_fill's result. Errors: as proxy_cursor_fill's (< 0, *code and err set);
 * out then holds a partial cursor document and the caller drops it. */
int proxy_cursor_answer(proxy *p, proxy_cursor *c, int64_t batch_size, const char *field,
			const char *ns, bson_t *out, int *code, char *err, size_t errlen);
/* Set the id of the cursor proxy_cursor_answer appended to out (in place: no copy). */
void proxy_cursor_answer_id(bson_t *out, int64_t id);
/* Pull one document: returns 1 with *doc, 0 at the end. *doc is the cursor's (a view into
 * a shard's batch, or its projection's output): valid until the next call on c or its
 * destruction; copy what is kept longer.
 * Errors: with *code the MongoDB code and the message in err, SDB_EUNAVAILABLE (a shard
 * did not answer a getMore: HostUnreachable), SDB_EIO (a shard answered an error: its
 * code, InternalError without one), SDB_EINVAL (the projection failed: BadValue). */
int proxy_cursor_next(proxy *p, proxy_cursor *c, const bson_t **doc, int *code, char *err,
		      size_t errlen);
/* True while some stream has buffered documents or an open shard cursor. */
bool proxy_cursor_has_more(const proxy_cursor *c);
/* Register c in the cursor table and return its id (> 0, from a CSPRNG: an id is a
 * capability). owner: the authenticated user creating it (copied), or NULL when
 * authentication is off; only that user may use it (proxy_cursor_check). */
int64_t proxy_cursor_register(proxy *p, proxy_cursor *c, const char *owner);
/* May user (NULL: unauthenticated) use cursor id on namespace ns ("db.coll")? MongoDB
 * binds a cursor to the user that created it and to its namespace (getMore/killCursors
 * otherwise fail with Unauthorized 13). An unknown id is PROXY_CURSOR_OK (the caller then
 * finds nothing). */
typedef enum {
	PROXY_CURSOR_OK = 0,
	PROXY_CURSOR_OTHER_USER,
	PROXY_CURSOR_OTHER_NS,
} proxy_cursor_access;
proxy_cursor_access proxy_cursor_check(proxy *p, int64_t id, const char *ns, const char *user);
/* Take cursor id out of the table for exclusive use (NULL when unknown). */
proxy_cursor *proxy_cursor_checkout(proxy *p, int64_t id, const char *ns);
/* killCursors of a cursor another request has checked out (a getMore running or a
 * change stream's getMore between rounds): mark it so no one checks it out again; the
 * reaper (every PROXY_REAP_EVERY_MS) destroys it once it is checked in, as mongod kills
 * a pinned cursor when its operation ends. Returns: true if id was a live cursor (now
 * killed), false if unknown or already killed. Thread-safe. */
bool proxy_cursor_kill(proxy *p, int64_t id);
/* Put it back (refreshing its idle timer). */
void proxy_cursor_checkin(proxy *p, proxy_cursor *c);
/* Kill shard cursors and free. */
void proxy_cursor_destroy(proxy *p, proxy_cursor *c);
/* Remove cursors idle longer than the timeout (worker thread). */
void proxy_cursor_reap(proxy *p, bool all);
int64_t proxy_cursor_id(const proxy_cursor *c);
/* A cursor opened by a transaction's statement (issue #16): fields (lsid, txnNumber,
 * autocommit: false; taken over, may be NULL) are added to its shard getMores, which are
 * then sent one at a time. */
void proxy_cursor_set_txn(proxy_cursor *c, bson_t *fields);
/* A find's allowPartialResults (issue #20, mongos's AsyncResultsMerger): from now on a
 * stream whose getMore gets no answer from its shard (SHARDCONN_NET_ERR: down, timeout;
 * never a command error) is dropped, its documents missing, instead of failing the
 * cursor with HostUnreachable. dropped: some shard's part was dropped already (when the
 * cursor was opened). */
void proxy_cursor_set_partial(proxy_cursor *c, bool dropped);
/* True once some shard's part of c was dropped (proxy_cursor_set_partial): the cursor
 * replies carry partialResultsReturned: true from then on, as mongos's. */
bool proxy_cursor_partial(const proxy_cursor *c);
/* Make c a cursor that is never killed for idleness (find's noCursorTimeout: true, MongoDB's
 * ClientCursor isNoTimeout): only its exhaustion, killCursors, its owner's session end
 * or the proxy's stop end it. Before proxy_cursor_register. */
void proxy_cursor_set_no_timeout(proxy_cursor *c, bool no_timeout);

/* --- clustertime.c (issue #20: cluster-time gossip, common/clustertime.h) ---
 * The wire hooks (wire_ct_in_fn, wire_ct_out_fn) of the proxy's listener. in: reads the
 * client's $clusterTime, refuses a malformed one (TypeMismatch 14, NoSuchKey 4), one more
 * than a year ahead of the wall clock (ClusterTimeFailsRateLimiter 205, mongod's message)
 * and, with --auth and a cluster key, one above the proxy's clock without a valid
 * signature from a user other than __system (TimeProofMismatch 204); then raises the
 * proxy's clock (shardconn_advance_cluster_time). out: appends $clusterTime (signed when
 * a cluster key is loaded) and operationTime (both the proxy's clock) to every reply. */
bool proxy_ct_in(wire_req *req, void *role_data);
void proxy_ct_out(wire_req *req, void *role_data, bson_t *reply);

#endif
