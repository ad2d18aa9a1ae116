/* The shard's cursor registry: materialized results (and tailable oplog cursors) kept
 * between find/aggregate and getMore, reaped after --cursor-timeout-ms (SHARD_CURSOR_IDLE_MS
 * by default) of idleness unless find asked for noCursorTimeout. */
#include <fcntl.h>
#include <time.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/alloc.h"
#include "shard/changestream.h"
#include "shard/shard.h"
#include "shard/util.h"
#include "storage/collation.h"
#include "storage/projection.h"
#include "storage/query.h"

static int64_t random_id(void)
{
	uint64_t v = 0;
	int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		if (read(fd, &v, sizeof v) != (ssize_t)sizeof v)
			v = 0;
		close(fd);
	}
	if (v == 0)
		v = sdb_mono_ns() * 2654435761u;
	v &= 0x7fffffffffffffffULL; /* positive, as mongod's */
	return v ? (int64_t)v : 1;
}

int64_t shard_cursor_add(shard *sh, shard_cursor *c)
{
	pthread_mutex_lock(&sh->cur_mu);
	for (;;) {
		c->id = random_id();
		bool clash = false;
		for (shard_cursor *o = sh->cursors; o; o = o->next)
			if (o->id == c->id)
				clash = true;
		if (!clash)
			break;
	}
	c->last_used_ms = sdb_mono_ms();
	c->collation = sdb_collation_current();
	c->sh = sh;
	c->next = sh->cursors;
	sh->cursors = c;
	int64_t id = c->id;
	pthread_mutex_unlock(&sh->cur_mu);
	return id;
}

shard_cursor *shard_cursor_take(shard *sh, int64_t id, bool *busy)
{
	*busy = false;
	pthread_mutex_lock(&sh->cur_mu);
	shard_cursor *c = sh->cursors;
	while (c && c->id != id)
		c = c->next;
	if (c && c->busy) {
		*busy = true;
		c = NULL;
	} else if (c) {
		c->busy = true;
	}
	pthread_mutex_unlock(&sh->cur_mu);
	return c;
}

static void unlink_locked(shard *sh, shard_cursor *c)
{
	shard_cursor **pp = &sh->cursors;
	while (*pp && *pp != c)
		pp = &(*pp)->next;
	if (*pp)
		*pp = c->next;
}

void shard_cursor_put(shard *sh, shard_cursor *c, bool drop)
{
	pthread_mutex_lock(&sh->cur_mu);
	c->busy = false;
	c->last_used_ms = sdb_mono_ms();
	if (c->killed)
		drop = true;
	if (drop)
		unlink_locked(sh, c);
	pthread_mutex_unlock(&sh->cur_mu);
	if (drop)
		shard_cursor_free(c);
}

bool shard_cursor_kill(shard *sh, int64_t id)
{
	pthread_mutex_lock(&sh->cur_mu);
	shard_cursor *c = sh->cursors;
	while (c && c->id != id)
		c = c->next;
	bool found = c != NULL;
	if (c && !c->busy) {
		unlink_locked(sh, c);
	} else if (c) {
		/* in use by a getMore: it is dropped when that getMore puts it back */
		c->killed = true;
		c = NULL;
	}
	pthread_mutex_unlock(&sh->cur_mu);
	if (c)
		shard_cursor_free(c);
	return found;
}

void shard_cursor_free(shard_cursor *c)
{
	if (!c)
		return;
	for (size_t i = c->pos; i < c->n_docs; i++)
		sdb_doc_free(c->docs[i]);
	if (c->q)
		sdb_query_free(c->q);
	if (c->proj)
		sdb_projection_free(c->proj);
	sdb_doc_free(c->pending);
	shard_cs_free(c->cs);
	if (c->conn)
		shard_conn_put(c->sh, c->conn);
	free(c->docs);
	free(c->ns);
	bson_destroy(&c->filter);
	free(c);
}

void shard_cursors_reap(shard *sh, uint64_t now_ms, uint64_t idle_ms)
{
	shard_cursor *dead = NULL;
	pthread_mutex_lock(&sh->cur_mu);
	shard_cursor **pp = &sh->cursors;
	while (*pp) {
		shard_cursor *c = *pp;
		/* idle_ms 0 (the shard stopping) frees noCursorTimeout cursors too */
		if (!c->busy && (idle_ms == 0 || !c->no_timeout) &&
		    now_ms - c->last_used_ms >= idle_ms) {
			*pp = c->next;
			c->next = dead;
			dead = c;
		} else {
			pp = &c->next;
		}
	}
	pthread_mutex_unlock(&sh->cur_mu);
	while (dead) {
		shard_cursor *n = dead->next;
		shard_cursor_free(dead);
		dead = n;
	}
}

void shard_cursors_free_all(shard *sh)
{
	shard_cursors_reap(sh, UINT64_MAX, 0);
}

void shard_cursor_reply(bson_t *reply, const char *ns, int64_t id, bool first, bson_t **docs,
			size_t n, size_t batch, size_t *taken, const bson_t *extra)
{
	bson_t cur, arr;
	size_t k = shard_batch_fit(docs, n, batch);
	BSON_APPEND_DOCUMENT_BEGIN(reply, "cursor", &cur);
	BSON_APPEND_ARRAY_BEGIN(&cur, first ? "firstBatch" : "nextBatch", &arr);
	for (size_t i = 0; i < k; i++) {
		char key[16];
		const char *kp;
		bson_uint32_to_string((uint32_t)i, &kp, key, sizeof key);
		bson_append_document(&arr, kp, -1, docs[i]);
	}
	bson_append_array_end(&cur, &arr);
	BSON_APPEND_INT64(&cur, "id", id);
	BSON_APPEND_UTF8(&cur, "ns", ns);
	if (extra) {
		bson_iter_t it;
		if (bson_iter_init(&it, extra))
			while (bson_iter_next(&it))
				bson_append_iter(&cur, bson_iter_key(&it), -1, &it);
	}
	bson_append_document_end(reply, &cur);
	*taken = k;
}

size_t shard_batch_fit(bson_t **docs, size_t n, size_t batch)
{
	size_t k = 0, bytes = 0;
	for (; k < n; k++) {
		char key[16];
		const char *kp;
		size_t cost;
		if (batch && k >= batch)
			break;
		bson_uint32_to_string((uint32_t)k, &kp, key, sizeof key);
		cost = sdb_store_doc_len(docs[k]) + strlen(kp) + 2; /* element key + type byte */
		if (k > 0 && bytes + cost > SHARD_MAX_REPLY_BYTES)
			break;
		bytes += cost;
	}
	return k;
}

void shard_sessions_note(shard *sh, const wire_req *req, const bson_t *cmd)
{
	bson_iter_t it, sub;
	if (!util_cmd_find(req, cmd, "lsid", &it) || !BSON_ITER_HOLDS_DOCUMENT(&it) ||
	    !bson_iter_recurse(&it, &sub) || !bson_iter_find(&sub, "id") ||
	    !BSON_ITER_HOLDS_BINARY(&sub))
		return;
	bson_subtype_t st;
	uint32_t len;
	const uint8_t *data;
	bson_iter_binary(&sub, &st, &len, &data);
	if (len != 16)
		return;
	int64_t now = sdb_wall_ms(); /* lastUse is a Date */
	pthread_mutex_lock(&sh->sess_mu);
	size_t oldest = 0;
	for (size_t i = 0; i < sh->n_sessions; i++) {
		if (memcmp(sh->sessions[i].id, data, 16) == 0) {
			sh->sessions[i].last_use_ms = now;
			pthread_mutex_unlock(&sh->sess_mu);
			return;
		}
		if (sh->sessions[i].last_use_ms < sh->sessions[oldest].last_use_ms)
			oldest = i;
	}
	size_t slot = sh->n_sessions < SHARD_MAX_SESSIONS ? sh->n_sessions++ : oldest;
	memcpy(sh->sessions[slot].id, data, 16);
	sh->sessions[slot].last_use_ms = now;
	pthread_mutex_unlock(&sh->sess_mu);
}

void shard_sessions_list(shard *sh, bson_t ***docs, size_t *n)
{
	/* uid: SHA-256 of the empty user name, as mongod reports for unauthenticated use */
	static const uint8_t uid[32] = {0xe3, 0xb0, 0xc4, 0x42, 0x98, 0xfc, 0x1c, 0x14,
					0x9a, 0xfb, 0xf4, 0xc8, 0x99, 0x6f, 0xb9, 0x24,
					0x27, 0xae, 0x41, 0xe4, 0x64, 0x9b, 0x93, 0x4c,
					0xa4, 0x95, 0x99, 0x1b, 0x78, 0x52, 0xb8, 0x55};
	*docs = NULL;
	*n = 0;
	pthread_mutex_lock(&sh->sess_mu);
	if (sh->n_sessions)
		*docs = sdb_calloc(sh->n_sessions, sizeof **docs);
	for (size_t i = 0; i < sh->n_sessions; i++) {
		bson_t *d = sdb_doc_new(), id;
		BSON_APPEND_DOCUMENT_BEGIN(d, "_id", &id);
		bson_append_binary(&id, "id", 2, BSON_SUBTYPE_UUID, sh->sessions[i].id, 16);
		bson_append_binary(&id, "uid", 3, BSON_SUBTYPE_BINARY, uid, 32);
		bson_append_document_end(d, &id);
		BSON_APPEND_DATE_TIME(d, "lastUse", sh->sessions[i].last_use_ms);
		(*docs)[(*n)++] = d;
	}
	pthread_mutex_unlock(&sh->sess_mu);
}
