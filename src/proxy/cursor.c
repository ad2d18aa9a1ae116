/* Proxy-side cursors: a merged view over shard cursors, continued with getMore and
 * killed with killCursors or after an idle timeout (MongoDB's cursorTimeoutMillis). */
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "proxy/proxy.h"
#include "storage/projection.h"

#define CURSOR_MAX_BATCH_BYTES (8 * 1024 * 1024)
/* a batch's documents with their elements' overhead, at most (mongod's
 * FindCommon::haveSpaceForNext: BSONObjMaxUserSize), so that the reply stays under
 * maxBsonObjectSize and the 16 KB the wire allows over it for the rest of the reply */
#define CURSOR_MAX_BATCH_DOC_BYTES (16 * 1024 * 1024)
#define CURSOR_DEFAULT_BATCH 101
#define CURSOR_SHARD_BATCH 1000

struct proxy_cursor {
	int64_t id;
	char *ns;
	char *owner; /* the authenticated user that created it, or NULL (no authentication) */
	pstream *s;
	size_t n;
	merge_sort *sort;
	sdb_projection *proj;
	bson_t *proj_out; /* the projection of the document proxy_cursor_next returned last */
	size_t *idx;          /* proxy_cursor_next's scratch: n stream indexes ... */
	const bson_t **heads; /* ... and n heads (allocated once, not per document) */
	int64_t skip;
	int64_t limit; /* 0 = none */
	int64_t returned;
	uint64_t last_used_ms;
	bool busy;
	bool no_timeout;   /* find's noCursorTimeout: never reaped for idleness */
	bool kill_pending; /* killCursors while busy: reaped once checked in (proxy_cursor_kill) */
	bson_t *txnf; /* a transaction's cursor: lsid, txnNumber, autocommit on its getMores */
	px_cs *cs;    /* a change stream (changestream.c): no streams, no sort */
	bool partial_ok; /* allowPartialResults: a stream whose shard is unreachable is dropped */
	bool partial;    /* ... and one was (partialResultsReturned) */
	/* proxy_cursor_fill left the document proxy_cursor_next returned last (last) for the
	 * next batch: the next call returns it again (it is still valid: nothing ran since) */
	bool unread;
	const bson_t *last;
	proxy_cursor *next;
};

bson_t *proxy_doc_copy(const bson_t *src)
{
	bson_t *d = sdb_calloc_bson(1, sizeof *d);

	bson_copy_to(src, d); /* a STATIC bson: bson_destroy leaves the struct to us */
	return d;
}

bson_t *proxy_doc_new(void)
{
	bson_t *d = sdb_calloc_bson(1, sizeof *d);

	bson_init(d);
	return d;
}

void proxy_doc_free(bson_t *doc)
{
	if (doc == NULL)
		return;
	bson_destroy(doc);
	free(doc);
}

void pstream_clear(pstream *s)
{
	free(s->docs);
	s->docs = NULL;
	s->n = s->pos = 0;
	proxy_doc_free(s->batch);
	s->batch = NULL;
	if (s->rcoll)
		route_coll_unref(s->rcoll);
	s->rcoll = NULL;
	free(s->shard);
	free(s->db);
	free(s->coll);
	s->shard = s->db = s->coll = NULL;
	bson_destroy(&s->err_reply);
	bson_init(&s->err_reply);
}

/* Replace s's batch with src's contents (stolen: src is left empty and initialised) and
 * forget its documents; returns the new batch. */
static bson_t *adopt_batch(pstream *s, bson_t *src)
{
	proxy_doc_free(s->batch);
	s->batch = sdb_calloc_bson(1, sizeof *s->batch);
	if (!bson_steal(s->batch, src)) /* a child or read-only document: copy it */
		bson_copy_to(src, s->batch);
	else
		bson_init(src); /* bson_steal leaves src unusable, even for bson_destroy */
	s->n = s->pos = 0;
	return s->batch;
}

/* Append the documents of the array arr points at (an iterator on an array element of
 * s->batch) to s->docs, dropping another chunk's when s filters (s->rcoll). */
static void index_docs(pstream *s, bson_iter_t *arr)
{
	size_t cap = 0;

	while (bson_iter_next(arr)) {
		uint32_t len;
		const uint8_t *data;
		bson_t tmp;
		if (!BSON_ITER_HOLDS_DOCUMENT(arr))
			continue;
		bson_iter_document(arr, &len, &data);
		if (!bson_init_static(&tmp, data, len))
			continue;
		if (s->rcoll && route_chunk_of_doc(s->rcoll, &tmp) != s->chunk)
			continue; /* not this chunk's: an orphan or another chunk's */
		if (s->n == cap) {
			cap = cap ? cap * 2 : 64;
			s->docs = sdb_realloc(s->docs, cap * sizeof *s->docs);
		}
		s->docs[s->n].data = data;
		s->docs[s->n].len = len;
		s->n++;
	}
}

bool pstream_docs_append(bson_t *arr, uint32_t i, const bson_t *doc)
{
	const char *key;
	char kb[16];

	bson_uint32_to_string(i, &key, kb, sizeof kb);
	return bson_append_document(arr, key, -1, doc);
}

/* A filtering stream (s->rcoll: a per-chunk request) kept only its chunk's documents of a
 * reply that holds all the shard's: when those are under half of the reply, hold a copy of
 * them instead of the reply. A per-chunk request returns every matching document of its
 * shard, so a shard of K chunks had the proxy hold K copies of its batch (up to 16 MiB
 * each) for one cursor, where it held the chunk's documents only before the batch became
 * the reply. */
static void compact_batch(pstream *s)
{
	bson_t arr = BSON_INITIALIZER;
	route_coll *rc = s->rcoll;
	size_t kept = 0, i;

	for (i = 0; i < s->n; i++)
		kept += s->docs[i].len;
	if (s->batch == NULL || kept >= s->batch->len / 2)
		return;
	for (i = 0; i < s->n; i++) {
		bson_t d;
		if (bson_init_static(&d, s->docs[i].data, s->docs[i].len))
			pstream_docs_append(&arr, (uint32_t)i, &d);
	}
	s->rcoll = NULL; /* filtered already */
	pstream_take_docs(s, &arr);
	s->rcoll = rc;
	bson_destroy(&arr);
}

int pstream_take_batch(pstream *s, bson_t *reply, const char *field)
{
	bson_iter_t it, cur, arr;
	bson_t *b;

	if (!bson_iter_init_find(&it, reply, "cursor") || !BSON_ITER_HOLDS_DOCUMENT(&it) ||
	    !bson_iter_recurse(&it, &cur)) {
		s->n = s->pos = 0;
		return SDB_EPROTO;
	}
	b = adopt_batch(s, reply);
	if (!bson_iter_init_find(&it, b, "cursor") || !bson_iter_recurse(&it, &cur))
		return SDB_EPROTO; /* cannot be: checked above, on the same bytes */
	s->cursor_id = 0;
	while (bson_iter_next(&cur)) {
		const char *k = bson_iter_key(&cur);
		if (strcmp(k, "id") == 0 && BSON_ITER_HOLDS_NUMBER(&cur))
			s->cursor_id = bson_iter_as_int64(&cur);
		else if (strcmp(k, field) == 0 && BSON_ITER_HOLDS_ARRAY(&cur) &&
			 bson_iter_recurse(&cur, &arr))
			index_docs(s, &arr);
	}
	if (s->rcoll)
		compact_batch(s);
	return 0;
}

void pstream_take_docs(pstream *s, bson_t *arr)
{
	bson_iter_t it;

	if (bson_iter_init(&it, adopt_batch(s, arr)))
		index_docs(s, &it);
}

/* The stream's next buffered document as s->head (NULL when none is buffered). */
static const bson_t *stream_head(pstream *s)
{
	if (s->pos >= s->n)
		return NULL;
	/* cannot fail: index_docs initialised a document from the same bytes */
	bson_init_static(&s->head, s->docs[s->pos].data, s->docs[s->pos].len);
	return &s->head;
}

proxy_cursor *proxy_cursor_new(proxy *p, const char *ns, pstream *streams, size_t n,
			       merge_sort *sort, void *proj, int64_t skip, int64_t limit)
{
	proxy_cursor *c = sdb_calloc(1, sizeof *c);

	c->ns = sdb_strdup(ns);
	c->s = streams;
	c->n = n;
	c->idx = sdb_calloc(n ? n : 1, sizeof *c->idx);
	c->heads = sdb_calloc(n ? n : 1, sizeof *c->heads);
	c->sort = sort;
	c->proj = proj;
	c->skip = skip < 0 ? 0 : skip;
	c->limit = limit < 0 ? -limit : limit;
	c->last_used_ms = sdb_mono_ms();
	return c;
}

proxy_cursor *proxy_cursor_new_cs(proxy *p, const char *ns, px_cs *cs)
{
	proxy_cursor *c = proxy_cursor_new(p, ns, NULL, 0, NULL, NULL, 0, 0);

	c->cs = cs;
	return c;
}

px_cs *proxy_cursor_cs(const proxy_cursor *c)
{
	return c->cs;
}

void proxy_cursor_set_txn(proxy_cursor *c, bson_t *fields)
{
	if (c->txnf)
		bson_destroy(c->txnf);
	c->txnf = fields;
}

void proxy_cursor_set_partial(proxy_cursor *c, bool dropped)
{
	c->partial_ok = true;
	c->partial = c->partial || dropped;
}

bool proxy_cursor_partial(const proxy_cursor *c)
{
	return c->partial;
}

void proxy_cursor_set_no_timeout(proxy_cursor *c, bool no_timeout)
{
	c->no_timeout = no_timeout;
}

int64_t proxy_cursor_id(const proxy_cursor *c)
{
	return c->id;
}

/* A fan-out over some of a cursor's shard streams (refill_one, kill_one): job k works on
 * stream c->s[idx[k]]. */
typedef struct streams_job {
	proxy *p;
	proxy_cursor *c;
	size_t *idx;
} streams_job;

static void refill_one(void *arg, size_t k)
{
	streams_job *rc = arg;
	pstream *s = &rc->c->s[rc->idx[k]];
	bson_t cmd = BSON_INITIALIZER, reply;
	int r;

	BSON_APPEND_INT64(&cmd, "getMore", s->cursor_id);
	BSON_APPEND_UTF8(&cmd, "collection", s->coll);
	BSON_APPEND_INT64(&cmd, "batchSize", CURSOR_SHARD_BATCH);
	if (rc->c->txnf)
		bson_concat(&cmd, rc->c->txnf);
	r = proxy_shard_command(rc->p, s->shard, s->db, &cmd, &s->server_id, &reply, s->neterr,
				sizeof s->neterr);
	s->status = r;
	if (r == SHARDCONN_OK) {
		if (pstream_take_batch(s, &reply, "nextBatch") != 0) {
			s->status = SHARDCONN_NET_ERR;
			snprintf(s->neterr, sizeof s->neterr, "shard %s: bad getMore reply", s->shard);
		}
	} else {
		bson_destroy(&s->err_reply);
		bson_copy_to(&reply, &s->err_reply);
		s->cursor_id = 0;
	}
	bson_destroy(&reply);
	bson_destroy(&cmd);
}

static int copy_error(pstream *s, int *code, char *err, size_t errlen)
{
	bson_iter_t it;

	if (s->status == SHARDCONN_NET_ERR) {
		*code = WIRE_ERR_HOST_UNREACHABLE;
		snprintf(err, errlen, "%s", s->neterr);
		return SDB_EUNAVAILABLE;
	}
	*code = WIRE_ERR_INTERNAL;
	if (bson_iter_init_find(&it, &s->err_reply, "code") && BSON_ITER_HOLDS_NUMBER(&it))
		*code = (int)bson_iter_as_int64(&it);
	if (bson_iter_init_find(&it, &s->err_reply, "errmsg") && BSON_ITER_HOLDS_UTF8(&it))
		snprintf(err, errlen, "%s", bson_iter_utf8(&it, NULL));
	else
		snprintf(err, errlen, "shard %s failed", s->shard);
	return SDB_EIO;
}

int proxy_cursor_next(proxy *p, proxy_cursor *c, const bson_t **doc_out, int *code, char *err,
		      size_t errlen)
{
	size_t *idx = c->idx;
	const bson_t **heads = c->heads;
	size_t i;
	int rc = 0;

	*doc_out = NULL;
	if (c->unread) {
		c->unread = false;
		*doc_out = c->last;
		return 1;
	}
	for (;;) {
		size_t nidx = 0;
		ssize_t pick;
		const bson_t *doc;

		if (c->limit > 0 && c->returned >= c->limit)
			break;
		for (i = 0; i < c->n; i++)
			if (c->s[i].pos == c->s[i].n && c->s[i].cursor_id != 0)
				idx[nidx++] = i;
		if (nidx > 0) {
			streams_job rcx = {p, c, idx};
			if (c->txnf) /* one command of a transaction at a time */
				for (i = 0; i < nidx; i++)
					refill_one(&rcx, i);
			else
				proxy_shard_fanout(p, nidx, refill_one, &rcx);
			for (i = 0; i < nidx; i++) {
				pstream *s = &c->s[idx[i]];
				if (s->status == SHARDCONN_NET_ERR && c->partial_ok) {
					/* allowPartialResults: this shard's part is dropped (its
					 * cursor id is 0 now, its buffer empty) */
					sdb_info("cursor: a shard's part dropped (allowPartialResults)",
						 "ns=%s shard=%s err=%s", c->ns, s->shard, s->neterr);
					s->cursor_id = 0;
					c->partial = true;
					continue;
				}
				if (s->status != SHARDCONN_OK) {
					rc = copy_error(s, code, err, errlen);
					goto out;
				}
			}
			continue; /* a refill may return an empty batch with more to come */
		}
		for (i = 0; i < c->n; i++)
			heads[i] = stream_head(&c->s[i]);
		pick = merge_pick(c->sort, heads, c->n);
		if (pick < 0)
			break;
		doc = heads[pick]; /* c->s[pick].head: valid until the next call */
		c->s[pick].pos++;
		if (c->skip > 0) {
			c->skip--;
			continue;
		}
		c->returned++;
		if (c->proj) {
			char perr[256];
			if (c->proj_out == NULL)
				c->proj_out = proxy_doc_new();
			else
				bson_reinit(c->proj_out);
			if (sdb_projection_apply(c->proj, doc, c->proj_out, perr, sizeof perr) != 0) {
				*code = WIRE_ERR_BAD_VALUE;
				snprintf(err, errlen, "%s", perr);
				rc = SDB_EINVAL;
				goto out;
			}
			doc = c->proj_out;
		}
		*doc_out = c->last = doc;
		rc = 1;
		break;
	}
out:
	return rc;
}

/* The array key of element i ("0", "1", ...), in buf or a static string of libbson's. */
static const char *key_of(int64_t i, char *buf, size_t len)
{
	const char *k;

	if (i >= 0 && i <= UINT32_MAX) {
		bson_uint32_to_string((uint32_t)i, &k, buf, len);
		return k;
	}
	snprintf(buf, len, "%lld", (long long)i);
	return buf;
}

int proxy_cursor_fill(proxy *p, proxy_cursor *c, bson_t *arr, int64_t batch_size, int *code,
		      char *err, size_t errlen)
{
	int64_t count = 0;
	size_t bytes = 0;  /* of the documents appended to arr */
	size_t total = 0;  /* ... with their elements' type and key */
	int rc = 0;
	char key[24];

	if (batch_size < 0)
		batch_size = INT64_MAX;
	while (count < batch_size && bytes < CURSOR_MAX_BATCH_BYTES) {
		const bson_t *doc;
		const char *k;
		size_t elem;
		int r = proxy_cursor_next(p, c, &doc, code, err, errlen);
		if (r < 0) {
			rc = r;
			break;
		}
		if (r == 0) {
			rc = 1;
			break;
		}
		k = key_of(count, key, sizeof key);
		elem = 2 + strlen(k) + proxy_bson_len(doc); /* type, key, NUL, document */
		if (count > 0 && total + elem > CURSOR_MAX_BATCH_DOC_BYTES) {
			/* it would take the reply over 16 MiB: it opens the next batch (8 MiB of
			 * documents then one of 15 MiB made a reply of 23 MiB, which the wire
			 * answered BSONObjectTooLarge, the batch's documents lost) */
			c->unread = true;
			break;
		}
		bson_append_document(arr, k, -1, doc);
		bytes += proxy_bson_len(doc);
		total += elem;
		count++;
	}
	if (rc == 0 && !c->unread && c->limit > 0 && c->returned >= c->limit)
		rc = 1;
	if (rc == 0 && !proxy_cursor_has_more(c))
		rc = 1;
	c->last_used_ms = sdb_mono_ms();
	return rc;
}

bson_t *proxy_cursor_answer_new(const proxy_cursor *c, int64_t batch_size)
{
	size_t bytes = 256, i, k;

	if (c->proj)
		return bson_new(); /* its output may be far smaller than what it projects */
	/* the documents buffered that the batch will take, as they are (a skip, or streams
	 * that the merge takes unevenly, make it an estimate, at most ~8 MiB plus one
	 * document), so that filling the answer does not grow it 2x by 2x:
	 * those reallocations and copies were 5% of the proxy's CPU under YCSB E (issue #19) */
	for (i = 0; i < c->n && bytes < CURSOR_MAX_BATCH_BYTES; i++) {
		const pstream *s = &c->s[i];
		for (k = s->pos; k < s->n && (batch_size < 0 || (int64_t)(k - s->pos) < batch_size) &&
				 bytes < CURSOR_MAX_BATCH_BYTES;
		     k++)
			bytes += s->docs[k].len + 16; /* the element's type and key */
	}
	return bson_sized_new(bytes);
}

int proxy_cursor_answer(proxy *p, proxy_cursor *c, int64_t batch_size, const char *field,
			const char *ns, bson_t *out, int *code, char *err, size_t errlen)
{
	bson_t cd, arr;
	int r;

	/* the batch goes straight into its place in the answer: filled into a separate
	 * array, it was copied whole once more (perf, YCSB E through a proxy: 4% of the
	 * proxy's CPU, issue #19) */
	bson_append_document_begin(out, "cursor", -1, &cd);
	BSON_APPEND_INT64(&cd, "id", 0);
	BSON_APPEND_UTF8(&cd, "ns", ns);
	bson_append_array_begin(&cd, field, -1, &arr);
	r = proxy_cursor_fill(p, c, &arr, batch_size, code, err, errlen);
	bson_append_array_end(&cd, &arr);
	if (r >= 0 && proxy_cursor_partial(c)) /* allowPartialResults left a shard out */
		BSON_APPEND_BOOL(&cd, "partialResultsReturned", true);
	bson_append_document_end(out, &cd);
	return r;
}

void proxy_cursor_answer_id(bson_t *out, int64_t id)
{
	bson_iter_t it, cur;

	if (bson_iter_init_find(&it, out, "cursor") && bson_iter_recurse(&it, &cur) &&
	    bson_iter_find(&cur, "id") && BSON_ITER_HOLDS_INT64(&cur))
		bson_iter_overwrite_int64(&cur, id);
}

bool proxy_cursor_has_more(const proxy_cursor *c)
{
	size_t i;

	if (c->unread)
		return true;
	for (i = 0; i < c->n; i++)
		if (c->s[i].pos < c->s[i].n || c->s[i].cursor_id != 0)
			return true;
	return false;
}

int64_t proxy_cursor_register(proxy *p, proxy_cursor *c, const char *owner)
{
	int64_t id;

	/* ids are capabilities: unpredictable (OpenSSL's CSPRNG), positive, non-zero */
	do {
		uint64_t r = 0;
		if (RAND_bytes((unsigned char *)&r, sizeof r) != 1)
			r = (uint64_t)rand() << 31 ^ (uint64_t)rand() << 7 ^ sdb_mono_ns();
		id = (int64_t)(r & 0x3fffffffffffffffull);
	} while (id == 0);
	c->id = id;
	c->owner = owner ? sdb_strdup(owner) : NULL;
	c->busy = false;
	c->last_used_ms = sdb_mono_ms();
	uv_mutex_lock(&p->cmu);
	c->next = p->cursors;
	p->cursors = c;
	uv_mutex_unlock(&p->cmu);
	sdb_gauge_add(p->m_cursors, 1);
	return id;
}

proxy_cursor_access proxy_cursor_check(proxy *p, int64_t id, const char *ns, const char *user)
{
	proxy_cursor *c;
	proxy_cursor_access a = PROXY_CURSOR_OK;

	uv_mutex_lock(&p->cmu);
	for (c = p->cursors; c; c = c->next) {
		if (c->id != id)
			continue;
		if (c->owner != NULL && (user == NULL || strcmp(c->owner, user) != 0))
			a = PROXY_CURSOR_OTHER_USER;
		else if (ns != NULL && strcmp(c->ns, ns) != 0)
			a = PROXY_CURSOR_OTHER_NS;
		break;
	}
	uv_mutex_unlock(&p->cmu);
	return a;
}

proxy_cursor *proxy_cursor_checkout(proxy *p, int64_t id, const char *ns)
{
	proxy_cursor *c;

	uv_mutex_lock(&p->cmu);
	for (c = p->cursors; c; c = c->next)
		if (c->id == id && !c->busy && !c->kill_pending &&
		    (ns == NULL || strcmp(c->ns, ns) == 0))
			break;
	if (c)
		c->busy = true;
	uv_mutex_unlock(&p->cmu);
	return c;
}

static void unlink_cursor(proxy *p, proxy_cursor *c)
{
	proxy_cursor **pp;

	for (pp = &p->cursors; *pp; pp = &(*pp)->next) {
		if (*pp == c) {
			*pp = c->next;
			return;
		}
	}
}

bool proxy_cursor_kill(proxy *p, int64_t id)
{
	proxy_cursor *c;

	uv_mutex_lock(&p->cmu);
	for (c = p->cursors; c; c = c->next)
		if (c->id == id && !c->kill_pending)
			break;
	if (c)
		c->kill_pending = true;
	uv_mutex_unlock(&p->cmu);
	return c != NULL;
}

void proxy_cursor_checkin(proxy *p, proxy_cursor *c)
{
	uv_mutex_lock(&p->cmu);
	c->busy = false;
	c->last_used_ms = sdb_mono_ms();
	uv_mutex_unlock(&p->cmu);
}

static void kill_one(void *arg, size_t k)
{
	streams_job *kc = arg;
	pstream *s = &kc->c->s[kc->idx[k]];
	bson_t cmd = BSON_INITIALIZER, reply, arr;
	char err[128];

	BSON_APPEND_UTF8(&cmd, "killCursors", s->coll);
	bson_append_array_begin(&cmd, "cursors", -1, &arr);
	BSON_APPEND_INT64(&arr, "0", s->cursor_id);
	bson_append_array_end(&cmd, &arr);
	proxy_shard_command(kc->p, s->shard, s->db, &cmd, &s->server_id, &reply, err, sizeof err);
	bson_destroy(&reply);
	bson_destroy(&cmd);
}

void proxy_cursor_destroy(proxy *p, proxy_cursor *c)
{
	size_t i, n = 0;
	size_t *idx = sdb_calloc(c->n ? c->n : 1, sizeof *idx);

	if (c->id != 0) {
		uv_mutex_lock(&p->cmu);
		unlink_cursor(p, c);
		uv_mutex_unlock(&p->cmu);
		sdb_gauge_add(p->m_cursors, -1);
	}
	/* kill the shard cursors still open, in parallel */
	for (i = 0; i < c->n; i++)
		if (c->s[i].cursor_id != 0 && c->s[i].shard != NULL)
			idx[n++] = i;
	if (n > 0) {
		streams_job kc = {p, c, idx};
		proxy_shard_fanout(p, n, kill_one, &kc);
	}
	free(idx);
	for (i = 0; i < c->n; i++) {
		pstream_clear(&c->s[i]);
		bson_destroy(&c->s[i].err_reply);
	}
	free(c->s);
	px_cs_free(p, c->cs);
	if (c->txnf)
		bson_destroy(c->txnf);
	merge_sort_free(c->sort);
	sdb_projection_free(c->proj);
	proxy_doc_free(c->proj_out);
	free(c->idx);
	free(c->heads);
	free(c->ns);
	free(c->owner);
	free(c);
}

void proxy_cursor_reap(proxy *p, bool all)
{
	proxy_cursor *dead = NULL, **pp, *c;
	uint64_t now = sdb_mono_ms();

	uv_mutex_lock(&p->cmu);
	pp = &p->cursors;
	while (*pp) {
		c = *pp;
		if (!c->busy && (all || c->kill_pending ||
				 (!c->no_timeout &&
				  now - c->last_used_ms > (uint64_t)p->cursor_timeout_ms))) {
			*pp = c->next;
			c->next = dead;
			dead = c;
		} else {
			pp = &c->next;
		}
	}
	uv_mutex_unlock(&p->cmu);
	while (dead) {
		c = dead;
		dead = c->next;
		sdb_debug(c->kill_pending ? "cursor killed while in use" : "cursor timed out",
			  "id=%lld ns=%s", (long long)c->id, c->ns);
		c->id = 0;
		sdb_gauge_add(p->m_cursors, -1);
		proxy_cursor_destroy(p, c);
	}
}
