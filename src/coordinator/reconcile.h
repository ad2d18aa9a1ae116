/* The filtering-metadata reconciler (issue #17): installs on shards the filtering metadata
 * they lack.
 *
 * Filtering metadata reaches a shard from a proxy's shardCollection and from the
 * coordinator at migration switches (filtering.h). A collection sharded through metadata
 * directly (`stripedb ctl collection shard`, a script calling metadata's shardCollection),
 * a shard rebuilt from an empty disk, or an install that failed (shard down at the time)
 * leaves a shard without it; proxies then send that shard per-chunk requests with their
 * ownership filter (correct, but the cost grows with the chunk count, src/proxy/shardver.c)
 * and the shard cannot drop orphans on its own.
 *
 * A coordinator reconciles the shards whose CDC lease it holds (one coordinator per shard,
 * role.c), every CFILT_RECONCILE_PERIOD_MS, on its own thread (a shard or metadata that does
 * not answer must not delay lease renewals):
 *   1. metadata: listCollections (the sharded namespaces) and the routing version;
 *   2. each shard: stripedbListFiltering (the namespaces it has installed);
 *   3. for each sharded namespace some shard lacks: load its routing table once
 *      (getRoutingTable) and install, on each shard lacking it that owns chunks, exactly what
 *      a switch would install (cfilt_install: its chunks, the collection version); before
 *      that, create the shard-key index there ({k: 1} / {k: "hashed"}, as a proxy's
 *      shardCollection does) when no index serves the key and the collection on that shard
 *      holds no document (a build on a collection with documents would hold the shard's
 *      writes: only logged).
 * A (namespace, shard) pair found owning no chunk is remembered until the routing version
 * changes, so a quiet cluster costs two metadata reads and one read per shard a period.
 *
 * Safe against a concurrent migration: a shard refuses an install whose collection version
 * is older than the one installed (storage/store.h sdb_store_filtering_set, SDB_ESTALE), and
 * a switch installs with a token above every token the reconciler could have loaded. Safe
 * against a concurrent drop (and re-shard under the same name, whose tokens start again
 * at 1): every install is confirmed afterwards against metadata (the namespace still
 * listed, one of the chunk ids installed still among its chunks) and dropped from the
 * shard when it is of another collection; one that cannot be confirmed or dropped yet is
 * retried at the next passes. An install of a namespace metadata no longer lists (`ctl
 * collection drop` leaves the shards alone) is dropped from the shard, after metadata is
 * read again. Only missing metadata is installed; an install present on a shard of a
 * collection metadata lists is never replaced here (a stale one is repaired by the collection's next
 * migration switch, and a proxy meeting it retries per chunk). A pass ends early when the
 * coordinator stops. Proxies that met the shard without metadata probe it again after
 * PX_LEGACY_RECHECK_MS (src/proxy/shardver.c) and then send one request per shard.
 */
#ifndef SDB_COORDINATOR_RECONCILE_H
#define SDB_COORDINATOR_RECONCILE_H

#include <mongoc/mongoc.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* Milliseconds between two reconciliation passes. */
#define CFILT_RECONCILE_PERIOD_MS 5000

/* A held shard for one pass: its id and a client (owned by the caller, see
 * cfilt_shard_client). */
typedef struct cfilt_target {
	const char *shard;
	mongoc_client_t *client;
} cfilt_target;

/* What a reconciler remembers between passes: the (namespace, shard) pairs known to own no
 * chunk at one routing version. */
typedef struct cfilt_reconciler cfilt_reconciler;

/* stop (may be NULL): when it becomes non-zero a pass ends early (coordinator shutdown). */
cfilt_reconciler *cfilt_reconciler_new(const atomic_int *stop);
void cfilt_reconciler_free(cfilt_reconciler *r);

/* One pass over shards t[0..n) with metadata client meta (see top). *installed gets the
 * number of installs made. A shard that does not answer is skipped (logged) and the pass
 * goes on. Errors: SDB_EIO (metadata unreachable or answering an error; message in err),
 * after which nothing was installed. */
int cfilt_reconcile(cfilt_reconciler *r, mongoc_client_t *meta, const cfilt_target *t, size_t n,
		    size_t *installed, char *err, size_t errlen);

/* A client of shard uri for coordinator work: the cluster credentials (issue #10), 2 s to
 * select the server or connect (one try: a caller retries on its next round), 60 s per
 * socket read, error API 2, the application name appname. NULL on a bad uri. Destroy with
 * mongoc_client_destroy. */
mongoc_client_t *cfilt_shard_client(const char *uri, const char *appname);

#endif
