/* Installing the shards' filtering metadata from the coordinator: see filtering.h. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bsonget.h"
#include "common/err.h"
#include "common/log.h"
#include "coordinator/filtering.h"

int cfilt_command(mongoc_client_t *c, const bson_t *cmd, bson_t *reply, char *err,
		  size_t errlen)
{
	bson_error_t e;
	if (mongoc_client_command_simple(c, "admin", cmd, NULL, reply, &e))
		return 0;
	sdb_errf(err, errlen, SDB_EIO, "%s", e.message);
	return e.domain == MONGOC_ERROR_SERVER ? (int)e.code : -1;
}

/* An integer field of a metadata chunk document (id, token): the common/bsonget.h rule
 * (int32, int64, integral double in range); anything else, or no field, is def. */
static int64_t get_int(const bson_t *d, const char *k, int64_t def)
{
	bson_iter_t it;
	int64_t v;
	if (bson_iter_init_find(&it, d, k) && sdb_bson_as_int64(&it, &v))
		return v;
	return def;
}

static const char *get_str(const bson_t *d, const char *k)
{
	bson_iter_t it;
	if (bson_iter_init_find(&it, d, k) && BSON_ITER_HOLDS_UTF8(&it))
		return bson_iter_utf8(&it, NULL);
	return NULL;
}

static bool get_doc(const bson_t *d, const char *k, bson_t *out)
{
	bson_iter_t it;
	uint32_t len;
	const uint8_t *data;
	if (!bson_iter_init_find(&it, d, k) || !BSON_ITER_HOLDS_DOCUMENT(&it))
		return false;
	bson_iter_document(&it, &len, &data);
	return bson_init_static(out, data, len);
}

int cfilt_load(mongoc_client_t *meta, const char *ns, cfilt_table *t, char *err, size_t errlen)
{
	bson_t resume = BSON_INITIALIZER, arr;
	bool more = true, first = true;
	uint32_t n = 0;
	int rc = 0;

	bson_init(&t->key);
	bson_init(&t->chunks);
	t->max_token = 0;
	bson_append_array_begin(&t->chunks, "chunks", -1, &arr);
	while (more) {
		bson_t cmd = BSON_INITIALIZER, cur, reply, d;
		bson_iter_t it, ai;
		BSON_APPEND_UTF8(&cmd, "getRoutingTable", ns);
		BSON_APPEND_DOCUMENT_BEGIN(&cmd, "cursor", &cur);
		bson_append_document_end(&cmd, &cur);
		if (!first)
			BSON_APPEND_DOCUMENT(&cmd, "resumeAfter", &resume);
		rc = cfilt_command(meta, &cmd, &reply, err, errlen);
		bson_destroy(&cmd);
		if (rc != 0) {
			bson_destroy(&reply);
			rc = SDB_EIO;
			break;
		}
		if (first && get_doc(&reply, "key", &d))
			bson_concat(&t->key, &d);
		first = false;
		if (bson_iter_init_find(&it, &reply, "chunks") && bson_iter_recurse(&it, &ai)) {
			while (bson_iter_next(&ai)) {
				bson_t ch;
				const uint8_t *data;
				uint32_t len;
				const char *cns;
				char k[16];
				if (!BSON_ITER_HOLDS_DOCUMENT(&ai))
					continue;
				bson_iter_document(&ai, &len, &data);
				bson_init_static(&ch, data, len);
				cns = get_str(&ch, "ns");
				if (cns && strcmp(cns, ns) != 0)
					continue;
				if (get_int(&ch, "token", 0) > t->max_token)
					t->max_token = get_int(&ch, "token", 0);
				snprintf(k, sizeof k, "%u", n++);
				BSON_APPEND_DOCUMENT(&arr, k, &ch);
			}
		}
		more = bson_iter_init_find(&it, &reply, "more") && bson_iter_as_bool(&it) &&
		       get_doc(&reply, "resumeAfter", &d);
		if (more) {
			bson_reinit(&resume);
			bson_concat(&resume, &d);
		}
		bson_destroy(&reply);
	}
	bson_append_array_end(&t->chunks, &arr);
	bson_destroy(&resume);
	if (rc == 0 && bson_empty(&t->key))
		rc = sdb_errf(err, errlen, SDB_EIO, "%s: metadata gave no shard key pattern", ns);
	return rc;
}

void cfilt_table_destroy(cfilt_table *t)
{
	bson_destroy(&t->key);
	bson_destroy(&t->chunks);
}

int64_t cfilt_switch_token(const cfilt_table *t, int64_t cur)
{
	return (t->max_token > cur ? t->max_token : cur) + 1;
}

/* Walk the chunks of t held by shard: calls fn for each. */
typedef void (*chunk_fn)(const bson_t *ch, int64_t id, void *arg);

/* fn for each chunk of t on shard `shard` (NULL: every chunk). */
static void each_chunk(const cfilt_table *t, const char *shard, chunk_fn fn, void *arg)
{
	bson_iter_t it, ai;
	if (!bson_iter_init_find(&it, &t->chunks, "chunks") || !bson_iter_recurse(&it, &ai))
		return;
	while (bson_iter_next(&ai)) {
		bson_t ch;
		const uint8_t *data;
		uint32_t len;
		const char *s;
		if (!BSON_ITER_HOLDS_DOCUMENT(&ai))
			continue;
		bson_iter_document(&ai, &len, &data);
		bson_init_static(&ch, data, len);
		s = get_str(&ch, "shard");
		if (!shard || (s && strcmp(s, shard) == 0))
			fn(&ch, get_int(&ch, "id", 0), arg);
	}
}

static void count_fn(const bson_t *ch, int64_t id, void *arg)
{
	(void)ch;
	(void)id;
	(*(size_t *)arg)++;
}

void cfilt_each_chunk_id(const cfilt_table *t, const char *shard,
			 void (*fn)(const bson_t *ch, int64_t id, void *arg), void *arg)
{
	each_chunk(t, shard, fn, arg);
}

static void find_fn(const bson_t *ch, int64_t id, void *arg)
{
	int64_t *want = arg;
	(void)ch;
	if (id == want[0])
		want[1] = 1;
}

bool cfilt_has_chunk(const cfilt_table *t, int64_t id)
{
	int64_t want[2] = {id, 0};
	each_chunk(t, NULL, find_fn, want);
	return want[1] != 0;
}

size_t cfilt_chunks_on(const cfilt_table *t, const char *shard)
{
	size_t n = 0;
	each_chunk(t, shard, count_fn, &n);
	return n;
}

typedef struct lowest_arg {
	int64_t without, id, token;
} lowest_arg;

static void lowest_fn(const bson_t *ch, int64_t id, void *arg)
{
	lowest_arg *a = arg;
	int64_t tok = get_int(ch, "token", 0);
	if (id == a->without)
		return;
	if (a->id == 0 || id < a->id) {
		a->id = id;
		a->token = tok;
	}
}

typedef struct emit_arg {
	bson_t *arr;
	uint32_t n;
	int64_t without, control_id, control_token;
} emit_arg;

static void emit_fn(const bson_t *ch, int64_t id, void *arg)
{
	emit_arg *a = arg;
	bson_t o, d;
	char k[16], ids[32];
	if (id == a->without)
		return;
	snprintf(k, sizeof k, "%u", a->n++);
	snprintf(ids, sizeof ids, "%" PRId64, id);
	BSON_APPEND_DOCUMENT_BEGIN(a->arr, k, &o);
	BSON_APPEND_UTF8(&o, "id", ids);
	if (get_doc(ch, "min", &d))
		BSON_APPEND_DOCUMENT(&o, "min", &d);
	if (get_doc(ch, "max", &d))
		BSON_APPEND_DOCUMENT(&o, "max", &d);
	BSON_APPEND_INT64(&o, "token",
			  id == a->control_id ? a->control_token : get_int(ch, "token", 0));
	bson_append_document_end(a->arr, &o);
}

int cfilt_install(mongoc_client_t *c, const char *ns, const char *shard, const cfilt_table *t,
		  int64_t without, int64_t control_token, char *err, size_t errlen)
{
	bson_t cmd = BSON_INITIALIZER, arr, reply;
	lowest_arg low = {.without = without};
	emit_arg em = {.arr = &arr, .without = without};
	int64_t cver = t->max_token > control_token ? t->max_token : control_token;
	int rc;

	if (control_token > 0) {
		each_chunk(t, shard, lowest_fn, &low);
		if (low.id != 0 && low.token < control_token) {
			em.control_id = low.id;
			em.control_token = control_token;
		}
	}
	BSON_APPEND_UTF8(&cmd, "stripedbSetFiltering", ns);
	BSON_APPEND_DOCUMENT(&cmd, "key", &t->key);
	BSON_APPEND_INT64(&cmd, "collectionVersion", cver);
	BSON_APPEND_ARRAY_BEGIN(&cmd, "chunks", &arr);
	each_chunk(t, shard, emit_fn, &em);
	bson_append_array_end(&cmd, &arr);
	rc = cfilt_command(c, &cmd, &reply, err, errlen);
	bson_destroy(&cmd);
	bson_destroy(&reply);
	if (rc) {
		sdb_errwrap(err, errlen, SDB_EUNAVAILABLE, "stripedbSetFiltering on %s", shard);
		return SDB_EUNAVAILABLE;
	}
	sdb_debug("filtering installed", "ns=%s shard=%s chunks=%u cversion=%" PRId64, ns, shard,
		  em.n, cver);
	return 0;
}

int cfilt_refresh(mongoc_client_t *meta, const char *ns, const char *shard, mongoc_client_t *c,
		  char *err, size_t errlen)
{
	cfilt_table t;
	int rc = cfilt_load(meta, ns, &t, err, errlen);
	if (rc == 0)
		rc = cfilt_install(c, ns, shard, &t, 0, 0, err, errlen);
	cfilt_table_destroy(&t);
	return rc;
}

int cfilt_after_route(mongoc_client_t *meta, const char *ns, const char *from,
		      mongoc_client_t *from_c, const char *to, mongoc_client_t *to_c,
		      int64_t chunk, int64_t tok, char *err, size_t errlen)
{
	cfilt_table t;
	lowest_arg low = {.without = chunk};
	int rc = cfilt_load(meta, ns, &t, err, errlen);
	if (rc) {
		cfilt_table_destroy(&t);
		return rc;
	}
	each_chunk(&t, from, lowest_fn, &low);
	if (low.id != 0 && low.token < tok) {
		/* the donor's control chunk: its shard version changes in metadata as it did on
		 * the donor at the bump (a concurrent change of that chunk wins: reload) */
		bson_t cmd = BSON_INITIALIZER, reply;
		BSON_APPEND_INT64(&cmd, "setChunkShard", low.id);
		BSON_APPEND_UTF8(&cmd, "shard", from);
		BSON_APPEND_INT64(&cmd, "token", tok);
		BSON_APPEND_INT64(&cmd, "expectToken", low.token);
		rc = cfilt_command(meta, &cmd, &reply, err, errlen);
		bson_destroy(&cmd);
		bson_destroy(&reply);
		if (rc < 0) {
			cfilt_table_destroy(&t);
			return SDB_EIO;
		}
		cfilt_table_destroy(&t);
		if ((rc = cfilt_load(meta, ns, &t, err, errlen)) != 0) {
			cfilt_table_destroy(&t);
			return rc;
		}
	}
	rc = cfilt_install(to_c, ns, to, &t, 0, 0, err, errlen);
	if (rc == 0)
		rc = cfilt_install(from_c, ns, from, &t, 0, 0, err, errlen);
	cfilt_table_destroy(&t);
	return rc;
}
