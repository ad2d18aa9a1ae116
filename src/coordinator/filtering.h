/* Installing the shards' filtering metadata from the coordinator (issue #17; the shard side
 * is src/shard/filtering.c, which explains the versions).
 *
 * At a migration switch (migrate_switch.c do_switch) the coordinator, which already bumps the moved
 * chunk's token on the donor and routes the chunk in metadata, also:
 *   1. gives the moved chunk a token above every token of the collection (cfilt_switch_token);
 *   2. right after the bump on the donor, installs on the donor what it keeps, with one
 *      remaining chunk (the "control chunk", MongoDB's name) at the new token, so the donor's
 *      shard version changes in the same step that makes it refuse the old chunk token
 *      (cfilt_install_donor);
 *   3. once metadata routes the chunk to the recipient, bumps the control chunk in metadata
 *      too and installs the fresh ownership on both shards (cfilt_after_route);
 * and when a switch is rolled back, reinstalls the donor from metadata.
 * Each install is a replicated write on the shard (stripedbSetFiltering).
 */
#ifndef SDB_COORDINATOR_FILTERING_H
#define SDB_COORDINATOR_FILTERING_H

#include <bson/bson.h>
#include <mongoc/mongoc.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A collection's routing as metadata has it (every chunk). */
typedef struct cfilt_table {
	bson_t key;    /* the shard key pattern */
	bson_t chunks; /* a BSON array of {id, ns, min, max, shard, token, ...} */
	int64_t max_token; /* the largest token of the collection */
} cfilt_table;

/* Run cmd on the admin database of c (the metadata leader or a shard). reply is always
 * initialised (bson_destroy it). Returns: 0, or the server's error code (> 0), or -1 for a
 * network error; message in err. */
int cfilt_command(mongoc_client_t *c, const bson_t *cmd, bson_t *reply, char *err,
		  size_t errlen);

/* Load ns's routing table from metadata (getRoutingTable by cursor). Free with
 * cfilt_table_destroy (also after a failure). Errors: SDB_EIO (metadata unreachable or
 * answering an error, a reply without a shard key pattern; message in err). */
int cfilt_load(mongoc_client_t *meta, const char *ns, cfilt_table *t, char *err, size_t errlen);
void cfilt_table_destroy(cfilt_table *t);

/* Call fn(chunk document, chunk id, arg) for each of t's chunks on shard `shard` (NULL:
 * every chunk). */
void cfilt_each_chunk_id(const cfilt_table *t, const char *shard,
			 void (*fn)(const bson_t *ch, int64_t id, void *arg), void *arg);
/* Has t a chunk with id `id` (on any shard)? */
bool cfilt_has_chunk(const cfilt_table *t, int64_t id);
/* The number of t's chunks on shard `shard`. */
size_t cfilt_chunks_on(const cfilt_table *t, const char *shard);

/* The token of a moved chunk at its switch: above the chunk's current token and above every
 * token of the collection. */
int64_t cfilt_switch_token(const cfilt_table *t, int64_t cur);

/* Install on shard client c (shard id `shard`) the chunks of t it holds, except chunk id
 * `without` (0: none); when control_token > 0 the first of them (lowest id) carries that
 * token. The collection version is max(t->max_token, control_token). Errors:
 * SDB_EUNAVAILABLE (the shard did not answer or refused stripedbSetFiltering; message in
 * err). */
int cfilt_install(mongoc_client_t *c, const char *ns, const char *shard, const cfilt_table *t,
		  int64_t without, int64_t control_token, char *err, size_t errlen);

/* After metadata routes chunk `chunk` from `from` to `to` with token tok: bump from's control
 * chunk in metadata to tok (when its chunks are all older), reload, and install the fresh
 * ownership on both shards. Idempotent. Errors: SDB_EIO (metadata unreachable, or a load
 * failed as cfilt_load; an error the metadata answers to the bump is not one: the
 * reload shows the state), SDB_EUNAVAILABLE (an install failed as cfilt_install). */
int cfilt_after_route(mongoc_client_t *meta, const char *ns, const char *from,
		      mongoc_client_t *from_c, const char *to, mongoc_client_t *to_c,
		      int64_t chunk, int64_t tok, char *err, size_t errlen);

/* Reinstall shard `shard` (client c) from metadata as it is now. Errors: as cfilt_load
 * (SDB_EIO) and cfilt_install (SDB_EUNAVAILABLE). */
int cfilt_refresh(mongoc_client_t *meta, const char *ns, const char *shard, mongoc_client_t *c,
		  char *err, size_t errlen);

#endif
