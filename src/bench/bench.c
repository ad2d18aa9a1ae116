/* The workload generator. See bench.h. */
#include "bench/bench.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <mongoc/mongoc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench/check.h"
#include "common/clock.h"
#include "common/alloc.h"
#include "common/err.h"

#define ZIPF_THETA 0.99
#define LOAD_BATCH 500
#define QUERY_WINDOW_MS 600000

typedef struct worker {
	bench *b;
	int id;
	pthread_t th;
	uint64_t rng;
	pthread_mutex_t mu; /* guards ph[] and the history against readers */
	bench_phase_stats ph[BENCH_MAX_PHASES];
	bench_ev *ev;
	size_t nev, cap;
	int64_t ninserted; /* inserts of new keys by this worker */
	int load_failed;
	char load_err[256];
} worker;

typedef struct zipf {
	int64_t n;
	double zetan, eta, alpha, half_pow_theta;
} zipf;

struct bench {
	bench_opts o;
	/* the URI says retryWrites=true: updates go through libmongoc's update_one, a
	 * retryable write (lsid, txnNumber from libmongoc's server session) */
	bool retryable;
	/* the URI's socketTimeoutMS and serverSelectionTimeoutMS (libmongoc's defaults when
	 * absent): how an error is told to be a timeout (bench_error_class) */
	int32_t socket_timeout_ms, select_timeout_ms;
	char *uri, *db, *workload, *dist;
	const char *coll;
	int payments;
	int mix[BENCH_N_OPS]; /* percent per op kind */
	int dist_kind;        /* 0 zipfian, 1 uniform, 2 latest */
	mongoc_client_pool_t *pool;
	int nthreads;
	worker *w;
	int started;
	int32_t *ver;     /* per key: last version assigned (owner thread only) */
	uint64_t mseed;   /* payments: a key's merchant is a pure function of (key, mseed) */
	int64_t maxkeys;
	atomic_int stop;
	atomic_int phase;
	atomic_llong inserted_hi; /* one past the highest key whose insert was acknowledged */
	int nphases;
	char labels[BENCH_MAX_PHASES][64];
	uint64_t phase_ns[BENCH_MAX_PHASES + 1];
	uint64_t t0;
	int64_t epoch_ms0; /* payments: `created` of the run's start (data, not timing) */
	zipf zkeys, zmerch;
	/* status line */
	bench_hist last;
	uint64_t last_errs, last_ns;
	int last_phase;
};


static uint64_t rnd(uint64_t *s)
{
	/* xorshift64* */
	uint64_t x = *s;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*s = x;
	return x * 0x2545F4914F6CDD1Dull;
}

static double rnd01(uint64_t *s)
{
	return (double)(rnd(s) >> 11) * (1.0 / 9007199254740992.0);
}

/* Gray et al., "Quickly generating billion-record synthetic databases" (SIGMOD 1994), as
 * in YCSB's ZipfianGenerator: item 0 is the most popular. */
static void zipf_init(zipf *z, int64_t n)
{
	double zeta2 = 1.0 + pow(0.5, ZIPF_THETA);

	z->n = n < 1 ? 1 : n;
	z->zetan = 0;
	for (int64_t i = 1; i <= z->n; i++) {
		z->zetan += 1.0 / pow((double)i, ZIPF_THETA);
	}
	z->alpha = 1.0 / (1.0 - ZIPF_THETA);
	z->eta = (1.0 - pow(2.0 / (double)z->n, 1.0 - ZIPF_THETA)) / (1.0 - zeta2 / z->zetan);
	z->half_pow_theta = 1.0 + pow(0.5, ZIPF_THETA);
}

static int64_t zipf_next(const zipf *z, uint64_t *s)
{
	double u = rnd01(s), uz = u * z->zetan;
	int64_t v;

	if (uz < 1.0) {
		return 0;
	}
	if (uz < z->half_pow_theta) {
		return z->n > 1 ? 1 : 0;
	}
	v = (int64_t)((double)z->n * pow(z->eta * u - z->eta + 1.0, z->alpha));
	return v >= z->n ? z->n - 1 : v;
}

static uint64_t fnv64(uint64_t v)
{
	uint64_t h = 0xCBF29CE484222325ull;

	for (int i = 0; i < 8; i++) {
		h ^= v & 0xff;
		h *= 1099511628211ull;
		v >>= 8;
	}
	return h;
}

/* --- keys --- */

/* payments: the merchant of a key, zipfian over merchants (m0000 the busiest). */
static int merchant_of(const bench *b, int64_t key)
{
	uint64_t s = fnv64((uint64_t)key ^ b->mseed) | 1;

	return (int)zipf_next(&b->zmerch, &s);
}

void bench_key_id(const bench *b, int64_t key, char *buf, size_t n)
{
	if (b->payments) {
		snprintf(buf, n, "ch_m%04d_%012" PRId64, merchant_of(b, key), key);
	} else {
		snprintf(buf, n, "user%012" PRId64, key);
	}
}

int64_t bench_key_parse(const bench *b, const char *id)
{
	const char *p;
	char *end;
	long long k;

	if (b->payments) {
		if (strncmp(id, "ch_m", 4) != 0 || (p = strchr(id + 4, '_')) == NULL) {
			return -1;
		}
		p++;
	} else {
		if (strncmp(id, "user", 4) != 0) {
			return -1;
		}
		p = id + 4;
	}
	errno = 0;
	k = strtoll(p, &end, 10);
	if (errno != 0 || *end != '\0' || k < 0 || k >= b->maxkeys) {
		return -1;
	}
	return (int64_t)k;
}

/* A key to read: from the workload's distribution over the keys inserted so far. */
static int64_t pick_key(bench *b, worker *w)
{
	int64_t hi = atomic_load(&b->inserted_hi);
	int64_t k;

	if (hi < 1) {
		hi = 1;
	}
	switch (b->dist_kind) {
	case 1:
		k = (int64_t)(rnd(&w->rng) % (uint64_t)hi);
		break;
	case 2: /* latest: YCSB SkewedLatestGenerator */
		k = hi - 1 - zipf_next(&b->zkeys, &w->rng) % hi;
		break;
	default: /* scrambled zipfian: hot keys spread over the key space */
		k = (int64_t)(fnv64((uint64_t)zipf_next(&b->zkeys, &w->rng)) % (uint64_t)hi);
		break;
	}
	return k < 0 ? 0 : k;
}

/* A key this worker may write: the picked key moved to the nearest key it owns that
 * exists (loaded, or inserted by this worker). */
static int64_t pick_own_key(bench *b, worker *w)
{
	int64_t k = pick_key(b, w) % (b->o.records > 0 ? b->o.records : 1);
	int64_t own = k - k % b->nthreads + w->id;

	if (own >= b->o.records) {
		own = w->id < b->o.records ? w->id : -1;
	}
	if (own < 0 && w->ninserted > 0) {
		own = b->o.records + (int64_t)(rnd(&w->rng) % (uint64_t)w->ninserted) * b->nthreads + w->id;
	}
	return own;
}

/* --- recording --- */

bench_err bench_error_class(const bson_error_t *e, uint64_t elapsed_ms, int32_t socket_timeout_ms,
			    int32_t select_timeout_ms, int *definite)
{
	*definite = 0;
	if (e->domain == MONGOC_ERROR_SERVER || e->domain == MONGOC_ERROR_WRITE_CONCERN) {
		switch (e->code) {
		case 462:
			*definite = 1;
			return BENCH_ERR_QUOTA;
		case 11000:
			*definite = 1;
			return BENCH_ERR_DUP;
		case 13388:
		case 70:
		case 6:
		case 133:
			return BENCH_ERR_ROUTING;
		case 50:
		case 89:
			return BENCH_ERR_TIMEOUT;
		case 2:
		case 9:
		case 61:
		case 66:
			*definite = 1;
			return BENCH_ERR_OTHER;
		default:
			return BENCH_ERR_OTHER;
		}
	}
	/* libmongoc gives a socket timeout and a reset the same code (STREAM_SOCKET), and a
	 * selection that timed out the same as one that found no server: the time the
	 * operation took tells them apart (a timeout cannot fire before its period) */
	if (e->domain == MONGOC_ERROR_SERVER_SELECTION)
		return select_timeout_ms > 0 && elapsed_ms >= (uint64_t)select_timeout_ms
			       ? BENCH_ERR_TIMEOUT
			       : BENCH_ERR_NETWORK;
	if (e->domain == MONGOC_ERROR_STREAM || e->domain == MONGOC_ERROR_CLIENT)
		return socket_timeout_ms > 0 && elapsed_ms >= (uint64_t)socket_timeout_ms
			       ? BENCH_ERR_TIMEOUT
			       : BENCH_ERR_NETWORK;
	return BENCH_ERR_OTHER;
}

static bench_err classify(const bench *b, const bson_error_t *e, uint64_t elapsed_ns, int *definite)
{
	return bench_error_class(e, elapsed_ns / 1000000u, b->socket_timeout_ms,
				 b->select_timeout_ms, definite);
}

static void record_ev(worker *w, int op, int64_t key, int64_t value, int outcome, int32_t n,
		      uint64_t t0, uint64_t t1)
{
	bench_ev *e;

	if (w->nev == w->cap) {
		w->cap = w->cap ? w->cap * 2 : 4096;
		w->ev = sdb_realloc(w->ev, w->cap * sizeof *w->ev);
	}
	e = &w->ev[w->nev++];
	e->key = key;
	e->value = value;
	e->t0 = t0 - w->b->t0;
	e->t1 = t1 - w->b->t0;
	e->op = (uint8_t)op;
	e->outcome = (uint8_t)outcome;
	e->n = n;
}

static void record_lat(worker *w, bench_op op, uint64_t t0, uint64_t t1, const bson_error_t *e,
		       int failed)
{
	int p = atomic_load(&w->b->phase);
	bench_phase_stats *ph = &w->ph[p];

	if (failed) {
		int definite;
		ph->errs[classify(w->b, e, t1 - t0, &definite)]++;
	} else {
		bench_hist_record(&ph->h[op], (t1 - t0) / 1000);
	}
}

/* --- operations --- */

static void fill_value(worker *w, char *buf, int n)
{
	static const char alpha[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
	uint64_t r = 0;

	for (int i = 0; i < n; i++) {
		if (i % 10 == 0) {
			r = rnd(&w->rng);
		}
		buf[i] = alpha[(r >> ((i % 10) * 6)) % 62];
	}
	buf[n] = '\0';
}

static void build_doc(bench *b, worker *w, int64_t key, int32_t v, bson_t *d)
{
	char id[64], val[4096];
	int fb = b->o.value_bytes / 10;

	bench_key_id(b, key, id, sizeof id);
	BSON_APPEND_UTF8(d, "_id", id);
	BSON_APPEND_INT32(d, "v", v);
	if (!b->payments) {
		if (fb > (int)sizeof val - 1) {
			fb = (int)sizeof val - 1;
		}
		for (int i = 0; i < 10; i++) {
			char f[16];
			snprintf(f, sizeof f, "field%d", i);
			fill_value(w, val, fb);
			bson_append_utf8(d, f, -1, val, fb);
		}
		return;
	}
	{
		static const char *const cur[] = {"usd", "usd", "usd", "eur", "gbp", "jpy"};
		static const char *const brand[] = {"visa", "mastercard", "amex", "discover"};
		static const char *const city[] = {"Berlin", "Lisbon", "Austin", "Osaka", "Toronto"};
		char m[16], cus[32], last4[8], buf[64];
		const char *pick;
		bson_t card, addr, meta;
		int64_t amount = 100 + (int64_t)(rnd(&w->rng) % 50000);
		int64_t created = b->epoch_ms0 + (int64_t)((sdb_mono_ns() - b->t0) / 1000000);

		if (key < b->o.records) {
			/* loaded history: spread over the 24 h before the run */
			created = b->epoch_ms0 - 86400000 + (key * 86400000) / (b->o.records + 1);
		}
		snprintf(m, sizeof m, "m%04d", merchant_of(b, key));
		snprintf(cus, sizeof cus, "cus_%010" PRIu64, rnd(&w->rng) % 1000000);
		snprintf(last4, sizeof last4, "%04d", (int)(rnd(&w->rng) % 10000));
		BSON_APPEND_UTF8(d, "merchant", m);
		BSON_APPEND_UTF8(d, "customer", cus);
		BSON_APPEND_INT64(d, "amount", amount);
		pick = cur[rnd(&w->rng) % 6]; /* BSON_APPEND_UTF8 evaluates its value twice */
		BSON_APPEND_UTF8(d, "currency", pick);
		BSON_APPEND_UTF8(d, "status", "succeeded");
		BSON_APPEND_INT64(d, "amountRefunded", 0);
		BSON_APPEND_DATE_TIME(d, "created", created);
		snprintf(buf, sizeof buf, "Order %" PRIu64 " at %s", rnd(&w->rng) % 100000000, m);
		BSON_APPEND_UTF8(d, "description", buf);
		BSON_APPEND_DOCUMENT_BEGIN(d, "card", &card);
		pick = brand[rnd(&w->rng) % 4]; /* BSON_APPEND_UTF8 evaluates its value twice */
		BSON_APPEND_UTF8(&card, "brand", pick);
		BSON_APPEND_UTF8(&card, "last4", last4);
		BSON_APPEND_INT32(&card, "expMonth", 1 + (int)(rnd(&w->rng) % 12));
		BSON_APPEND_INT32(&card, "expYear", 2027 + (int)(rnd(&w->rng) % 6));
		fill_value(w, val, 27);
		BSON_APPEND_UTF8(&card, "fingerprint", val);
		bson_append_document_end(d, &card);
		BSON_APPEND_DOCUMENT_BEGIN(d, "billingAddress", &addr);
		snprintf(buf, sizeof buf, "%d Market Street", 1 + (int)(rnd(&w->rng) % 9999));
		BSON_APPEND_UTF8(&addr, "line1", buf);
		pick = city[rnd(&w->rng) % 5]; /* BSON_APPEND_UTF8 evaluates its value twice */
		BSON_APPEND_UTF8(&addr, "city", pick);
		snprintf(buf, sizeof buf, "%05d", (int)(rnd(&w->rng) % 100000));
		BSON_APPEND_UTF8(&addr, "postalCode", buf);
		bson_append_document_end(d, &addr);
		BSON_APPEND_DOCUMENT_BEGIN(d, "metadata", &meta);
		snprintf(buf, sizeof buf, "ord_%016" PRIx64, rnd(&w->rng));
		BSON_APPEND_UTF8(&meta, "orderId", buf);
		fill_value(w, val, 120);
		BSON_APPEND_UTF8(&meta, "note", val);
		bson_append_document_end(d, &meta);
	}
}

static void filter_for(bench *b, int64_t key, bson_t *f)
{
	char id[64];

	bench_key_id(b, key, id, sizeof id);
	BSON_APPEND_UTF8(f, "_id", id);
	if (b->payments) {
		char m[16];
		snprintf(m, sizeof m, "m%04d", merchant_of(b, key));
		BSON_APPEND_UTF8(f, "merchant", m); /* the shard key: a targeted request */
	}
}

/* The int64 value of field "v" of the first document of a find reply's
 * cursor.firstBatch (*v unchanged when the batch is empty: the key is absent). A reply
 * that is not the closed one-batch cursor a find with limit 1 answers -- no cursor
 * document, no int id, no firstBatch array, a batch element that is not a document, or
 * an open cursor (id != 0) with an empty first batch, whose document could still come
 * in a getMore -- is an error (-1, e filled, as libmongoc's cursor fails such a reply):
 * the read is recorded as failed, never as a read of an absent key. */
static int first_batch_v(const bson_t *reply, int64_t *v, bson_error_t *e)
{
	bson_iter_t it, cur, batch, doc;
	int64_t id = 0;
	bool have_id = false, have_batch = false;

	if (!bson_iter_init_find(&it, reply, "cursor") || !BSON_ITER_HOLDS_DOCUMENT(&it) ||
	    !bson_iter_recurse(&it, &cur))
		goto bad;
	while (bson_iter_next(&cur)) {
		const char *k = bson_iter_key(&cur);
		if (strcmp(k, "id") == 0 && BSON_ITER_HOLDS_INT(&cur)) {
			id = bson_iter_as_int64(&cur);
			have_id = true;
		} else if (strcmp(k, "firstBatch") == 0 && BSON_ITER_HOLDS_ARRAY(&cur)) {
			batch = cur;
			have_batch = true;
		}
	}
	if (!have_id || !have_batch || !bson_iter_recurse(&batch, &it))
		goto bad;
	if (!bson_iter_next(&it)) {
		if (id != 0)
			goto bad;
		return 0;
	}
	if (!BSON_ITER_HOLDS_DOCUMENT(&it) || !bson_iter_recurse(&it, &doc))
		goto bad;
	if (bson_iter_find(&doc, "v"))
		*v = bson_iter_as_int64(&doc);
	return 0;
bad:
	bson_set_error(e, MONGOC_ERROR_CURSOR, MONGOC_ERROR_CURSOR_INVALID_CURSOR,
		       "invalid reply to the find command of a point read");
	return -1;
}

/* A point read: the find command {find, filter, limit: 1} that libmongoc's
 * find_with_opts cursor sends (the same command on the wire: implicit session lsid,
 * retryable read), run through mongoc_collection_read_command_with_opts, which does
 * not build a cursor per read (the cursor cost the client ~21% more CPU per read,
 * tests/bench/README.md, issue #19). */
static void op_read(bench *b, worker *w, mongoc_collection_t *c, bench_op kind)
{
	int64_t key = pick_key(b, w);
	bson_t f = BSON_INITIALIZER, cmd = BSON_INITIALIZER, reply;
	bson_error_t e;
	uint64_t t0, t1;
	int64_t seen = 0;
	int failed;

	filter_for(b, key, &f);
	BSON_APPEND_UTF8(&cmd, "find", b->coll);
	BSON_APPEND_DOCUMENT(&cmd, "filter", &f);
	BSON_APPEND_INT32(&cmd, "limit", 1);
	t0 = sdb_mono_ns();
	failed = !mongoc_collection_read_command_with_opts(c, &cmd, NULL, NULL, &reply, &e);
	if (!failed) {
		failed = first_batch_v(&reply, &seen, &e) != 0;
	}
	t1 = sdb_mono_ns();
	pthread_mutex_lock(&w->mu);
	record_lat(w, kind, t0, t1, &e, failed);
	if (!failed) {
		record_ev(w, BENCH_EV_READ, key, seen, BENCH_OK, 0, t0, t1);
	}
	pthread_mutex_unlock(&w->mu);
	bson_destroy(&reply);
	bson_destroy(&cmd);
	bson_destroy(&f);
}

/* The integer field name of reply (0 when absent). */
static int64_t bench_get_int(const bson_t *reply, const char *name)
{
	bson_iter_t it;

	return bson_iter_init_find(&it, reply, name) && BSON_ITER_HOLDS_NUMBER(&it)
		       ? bson_iter_as_int64(&it)
		       : 0;
}

static void op_update(bench *b, worker *w, mongoc_collection_t *c, bench_op kind, uint64_t t0)
{
	int64_t key = pick_own_key(b, w);
	bson_t f = BSON_INITIALIZER, u = BSON_INITIALIZER, set, reply;
	bson_error_t e;
	bson_iter_t it;
	int32_t n = 0, v;
	int ok, outcome, definite = 0;
	uint64_t t1;

	if (key < 0) {
		return;
	}
	v = ++b->ver[key];
	filter_for(b, key, &f);
	BSON_APPEND_DOCUMENT_BEGIN(&u, "$set", &set);
	BSON_APPEND_INT32(&set, "v", v);
	if (b->payments) {
		BSON_APPEND_UTF8(&set, "status", "refunded");
		BSON_APPEND_INT64(&set, "amountRefunded", 100 + (int64_t)(rnd(&w->rng) % 5000));
	} else {
		char val[4096], fld[16];
		int fb = b->o.value_bytes / 10;
		if (fb > (int)sizeof val - 1) {
			fb = (int)sizeof val - 1;
		}
		snprintf(fld, sizeof fld, "field%d", (int)(rnd(&w->rng) % 10));
		fill_value(w, val, fb);
		bson_append_utf8(&set, fld, -1, val, fb);
	}
	bson_append_document_end(&u, &set);
	if (t0 == 0) {
		t0 = sdb_mono_ns();
	}
	/* The update command with an embedded `updates` array (not update_one's OP_MSG document
	 * sequence: the proxy answers n: 0 to those on sharded collections, see the report of
	 * issue #9), with the raw reply: n, and writeErrors as a failure. */
	{
		bson_t cmd = BSON_INITIALIZER, arr, st;
		BSON_APPEND_UTF8(&cmd, "update", b->coll);
		BSON_APPEND_ARRAY_BEGIN(&cmd, "updates", &arr);
		BSON_APPEND_DOCUMENT_BEGIN(&arr, "0", &st);
		BSON_APPEND_DOCUMENT(&st, "q", &f);
		BSON_APPEND_DOCUMENT(&st, "u", &u);
		bson_append_document_end(&arr, &st);
		bson_append_array_end(&cmd, &arr);
		if (b->retryable) {
			/* a driver's retryable write (issue #16's bookkeeping cost): libmongoc sends
			 * lsid and its own txnNumber, and retries once on a retryable error */
			bson_t r1;
			ok = mongoc_collection_update_one(c, &f, &u, NULL, &r1, &e);
			bson_init(&reply);
			if (ok)
				BSON_APPEND_INT32(&reply, "n",
						  (int32_t)bench_get_int(&r1, "matchedCount"));
			bson_destroy(&r1);
		} else {
			ok = mongoc_collection_write_command_with_opts(c, &cmd, NULL, &reply, &e);
		}
		bson_destroy(&cmd);
	}
	t1 = sdb_mono_ns();
	if (ok && bson_iter_init_find(&it, &reply, "writeErrors")) {
		bson_iter_t we, code;
		ok = 0;
		memset(&e, 0, sizeof e);
		e.domain = MONGOC_ERROR_SERVER;
		if (bson_iter_recurse(&it, &we) && bson_iter_next(&we) && BSON_ITER_HOLDS_DOCUMENT(&we) &&
		    bson_iter_recurse(&we, &code) && bson_iter_find(&code, "code")) {
			e.code = (uint32_t)bson_iter_as_int64(&code);
		}
		snprintf(e.message, sizeof e.message, "write error %u", e.code);
	}
	if (ok && bson_iter_init_find(&it, &reply, "n")) {
		n = (int32_t)bson_iter_as_int64(&it);
	}
	if (!ok) {
		classify(b, &e, t1 - t0, &definite);
	}
	outcome = ok ? BENCH_OK : definite ? BENCH_FAIL : BENCH_UNKNOWN;
	pthread_mutex_lock(&w->mu);
	record_lat(w, kind, t0, t1, &e, !ok);
	record_ev(w, BENCH_EV_UPDATE, key, v, outcome, n, t0, t1);
	pthread_mutex_unlock(&w->mu);
	bson_destroy(&reply);
	bson_destroy(&f);
	bson_destroy(&u);
}

static void op_insert(bench *b, worker *w, mongoc_collection_t *c)
{
	int64_t key = b->o.records + w->ninserted * b->nthreads + w->id;
	bson_t d = BSON_INITIALIZER;
	bson_error_t e;
	uint64_t t0, t1;
	int ok, outcome, definite = 0;

	if (key >= b->maxkeys) {
		op_read(b, w, c, BENCH_READ); /* key space full: the run turns into reads */
		return;
	}
	w->ninserted++;
	b->ver[key] = 1;
	build_doc(b, w, key, 1, &d);
	t0 = sdb_mono_ns();
	ok = mongoc_collection_insert_one(c, &d, NULL, NULL, &e);
	t1 = sdb_mono_ns();
	if (!ok) {
		classify(b, &e, t1 - t0, &definite);
	}
	outcome = ok ? BENCH_OK : definite ? BENCH_FAIL : BENCH_UNKNOWN;
	pthread_mutex_lock(&w->mu);
	record_lat(w, BENCH_INSERT, t0, t1, &e, !ok);
	record_ev(w, BENCH_EV_INSERT, key, 1, outcome, 1, t0, t1);
	pthread_mutex_unlock(&w->mu);
	if (ok) {
		long long hi = atomic_load(&b->inserted_hi);
		while (key + 1 > hi && !atomic_compare_exchange_weak(&b->inserted_hi, &hi, key + 1)) {
		}
	}
	bson_destroy(&d);
}

/* scan (YCSB E): up to 100 documents from a key on; query (payments): charges of a
 * merchant in a 10-minute window of `created`. */
static void op_scan(bench *b, worker *w, mongoc_collection_t *c, bench_op kind)
{
	bson_t f = BSON_INITIALIZER, opts = BSON_INITIALIZER, s, r;
	const bson_t *doc;
	bson_error_t e;
	mongoc_cursor_t *cur;
	uint64_t t0, t1;
	int failed;

	if (kind == BENCH_QUERY) {
		char m[16];
		int64_t span = 86400000 + (int64_t)((sdb_mono_ns() - b->t0) / 1000000);
		int64_t from = b->epoch_ms0 - 86400000 + (int64_t)(rnd(&w->rng) % (uint64_t)span);
		snprintf(m, sizeof m, "m%04d", (int)zipf_next(&b->zmerch, &w->rng));
		BSON_APPEND_UTF8(&f, "merchant", m);
		BSON_APPEND_DOCUMENT_BEGIN(&f, "created", &r);
		BSON_APPEND_DATE_TIME(&r, "$gte", from);
		BSON_APPEND_DATE_TIME(&r, "$lt", from + QUERY_WINDOW_MS);
		bson_append_document_end(&f, &r);
		BSON_APPEND_INT32(&opts, "limit", 100);
	} else {
		char id[64];
		bench_key_id(b, pick_key(b, w), id, sizeof id);
		BSON_APPEND_DOCUMENT_BEGIN(&f, "_id", &r);
		BSON_APPEND_UTF8(&r, "$gte", id);
		bson_append_document_end(&f, &r);
		BSON_APPEND_DOCUMENT_BEGIN(&opts, "sort", &s);
		BSON_APPEND_INT32(&s, "_id", 1);
		bson_append_document_end(&opts, &s);
		BSON_APPEND_INT32(&opts, "limit", 1 + (int)(rnd(&w->rng) % 100));
	}
	t0 = sdb_mono_ns();
	cur = mongoc_collection_find_with_opts(c, &f, &opts, NULL);
	while (mongoc_cursor_next(cur, &doc)) {
	}
	failed = mongoc_cursor_error(cur, &e);
	t1 = sdb_mono_ns();
	mongoc_cursor_destroy(cur);
	pthread_mutex_lock(&w->mu);
	record_lat(w, kind, t0, t1, &e, failed);
	pthread_mutex_unlock(&w->mu);
	bson_destroy(&f);
	bson_destroy(&opts);
}

static void *worker_run(void *arg)
{
	worker *w = arg;
	bench *b = w->b;
	mongoc_client_t *cl = mongoc_client_pool_pop(b->pool);
	mongoc_collection_t *c = mongoc_client_get_collection(cl, b->db, b->coll);
	uint64_t end = b->o.seconds > 0 ? b->t0 + (uint64_t)(b->o.seconds * 1e9) : UINT64_MAX;

	while (!atomic_load(&b->stop) && sdb_mono_ns() < end) {
		int r = (int)(rnd(&w->rng) % 100), acc = 0, op = 0;
		for (op = 0; op < BENCH_N_OPS; op++) {
			acc += b->mix[op];
			if (r < acc) {
				break;
			}
		}
		switch (op) {
		case BENCH_UPDATE:
			op_update(b, w, c, BENCH_UPDATE, 0);
			break;
		case BENCH_INSERT:
			op_insert(b, w, c);
			break;
		case BENCH_SCAN:
		case BENCH_QUERY:
			op_scan(b, w, c, (bench_op)op);
			break;
		case BENCH_RMW: {
			uint64_t t0 = sdb_mono_ns();
			op_read(b, w, c, BENCH_READ);
			op_update(b, w, c, BENCH_RMW, t0);
			break;
		}
		default:
			op_read(b, w, c, BENCH_READ);
			break;
		}
	}
	mongoc_collection_destroy(c);
	mongoc_client_pool_push(b->pool, cl);
	return NULL;
}

/* Load this worker's keys in unordered batches; every document is one insert in the
 * history (acknowledged when its batch was). */
static void *worker_load(void *arg)
{
	worker *w = arg;
	bench *b = w->b;
	mongoc_client_t *cl = mongoc_client_pool_pop(b->pool);
	mongoc_collection_t *c = mongoc_client_get_collection(cl, b->db, b->coll);
	int64_t k = w->id;

	while (k < b->o.records && !atomic_load(&b->stop)) {
		bson_t opts = BSON_INITIALIZER, reply;
		mongoc_bulk_operation_t *bulk;
		bson_error_t e;
		int64_t first = k, n = 0;
		uint64_t t0, t1;
		int ok;

		BSON_APPEND_BOOL(&opts, "ordered", false);
		bulk = mongoc_collection_create_bulk_operation_with_opts(c, &opts);
		for (; k < b->o.records && n < LOAD_BATCH; k += b->nthreads, n++) {
			bson_t d = BSON_INITIALIZER;
			b->ver[k] = 1;
			build_doc(b, w, k, 1, &d);
			mongoc_bulk_operation_insert(bulk, &d);
			bson_destroy(&d);
		}
		t0 = sdb_mono_ns();
		ok = mongoc_bulk_operation_execute(bulk, &reply, &e) != 0;
		t1 = sdb_mono_ns();
		pthread_mutex_lock(&w->mu);
		for (int64_t j = first; j < k; j += b->nthreads) {
			record_ev(w, BENCH_EV_INSERT, j, 1, ok ? BENCH_OK : BENCH_UNKNOWN, 1, t0, t1);
		}
		pthread_mutex_unlock(&w->mu);
		mongoc_bulk_operation_destroy(bulk);
		bson_destroy(&reply);
		bson_destroy(&opts);
		if (!ok) {
			w->load_failed = 1;
			snprintf(w->load_err, sizeof w->load_err, "%.200s", e.message);
			break;
		}
	}
	mongoc_collection_destroy(c);
	mongoc_client_pool_push(b->pool, cl);
	return NULL;
}

static int setup_workload(bench *b, char *err, size_t errlen)
{
	static const struct {
		const char *name;
		int mix[BENCH_N_OPS]; /* read update insert scan rmw query */
		int dist;
	} wl[] = {
		{"a", {50, 50, 0, 0, 0, 0}, 0},  {"b", {95, 5, 0, 0, 0, 0}, 0},
		{"c", {100, 0, 0, 0, 0, 0}, 0},  {"d", {95, 0, 5, 0, 0, 0}, 2},
		{"e", {0, 0, 5, 95, 0, 0}, 0},   {"f", {50, 0, 0, 0, 50, 0}, 0},
		{"payments", {30, 15, 35, 0, 0, 20}, 0},
	};
	size_t i;

	for (i = 0; i < sizeof wl / sizeof wl[0]; i++) {
		if (strcasecmp(b->workload, wl[i].name) == 0) {
			break;
		}
	}
	if (i == sizeof wl / sizeof wl[0]) {
		return sdb_errf(err, errlen, SDB_EINVAL,
				"unknown workload '%s' (a, b, c, d, e, f or payments)", b->workload);
	}
	memcpy(b->mix, wl[i].mix, sizeof b->mix);
	b->dist_kind = wl[i].dist;
	b->payments = strcmp(wl[i].name, "payments") == 0;
	if (b->dist != NULL) {
		if (strcmp(b->dist, "zipfian") == 0) {
			b->dist_kind = 0;
		} else if (strcmp(b->dist, "uniform") == 0) {
			b->dist_kind = 1;
		} else if (strcmp(b->dist, "latest") == 0) {
			b->dist_kind = 2;
		} else {
			return sdb_errf(err, errlen, SDB_EINVAL,
					"unknown distribution '%s' (zipfian, uniform or latest)", b->dist);
		}
	}
	b->coll = b->payments ? "charges" : "usertable";
	return 0;
}

static int prepare_collection(bench *b, char *err, size_t errlen)
{
	mongoc_client_t *cl = mongoc_client_pool_pop(b->pool);
	mongoc_collection_t *c = mongoc_client_get_collection(cl, b->db, b->coll);
	bson_t ping = BSON_INITIALIZER, reply;
	bson_error_t e;
	int rc = 0;

	BSON_APPEND_INT32(&ping, "ping", 1);
	if (!mongoc_client_command_simple(cl, "admin", &ping, NULL, &reply, &e)) {
		rc = sdb_errf(err, errlen, SDB_EIO, "cannot reach %s: %s", b->uri, e.message);
		goto out;
	}
	if (b->o.load) {
		bson_t f = BSON_INITIALIZER;
		/* delete_many, not drop: a sharded collection set up by the caller stays sharded */
		if (!mongoc_collection_delete_many(c, &f, NULL, NULL, &e) &&
		    !(e.domain == MONGOC_ERROR_SERVER && e.code == 26)) {
			rc = sdb_errf(err, errlen, SDB_EIO, "clearing %s.%s: %s", b->db, b->coll,
				      e.message);
		}
		bson_destroy(&f);
	}
	if (rc == 0 && b->payments && b->o.create_indexes) {
		bson_t cmd = BSON_INITIALIZER, arr, ix, keys, r2;
		BSON_APPEND_UTF8(&cmd, "createIndexes", b->coll);
		BSON_APPEND_ARRAY_BEGIN(&cmd, "indexes", &arr);
		BSON_APPEND_DOCUMENT_BEGIN(&arr, "0", &ix);
		BSON_APPEND_DOCUMENT_BEGIN(&ix, "key", &keys);
		BSON_APPEND_INT32(&keys, "merchant", 1);
		BSON_APPEND_INT32(&keys, "created", 1);
		bson_append_document_end(&ix, &keys);
		BSON_APPEND_UTF8(&ix, "name", "merchant_1_created_1");
		bson_append_document_end(&arr, &ix);
		bson_append_array_end(&cmd, &arr);
		if (!mongoc_client_write_command_with_opts(cl, b->db, &cmd, NULL, &r2, &e)) {
			rc = sdb_errf(err, errlen, SDB_EIO, "createIndexes: %s", e.message);
		}
		bson_destroy(&r2);
		bson_destroy(&cmd);
	}
out:
	bson_destroy(&reply);
	bson_destroy(&ping);
	mongoc_collection_destroy(c);
	mongoc_client_pool_push(b->pool, cl);
	return rc;
}

int bench_start(const bench_opts *o, bench **out, char *err, size_t errlen)
{
	bench *b = sdb_calloc(1, sizeof *b);
	mongoc_uri_t *uri;
	bson_error_t e;
	int rc;

	*out = NULL;
	b->o = *o;
	if (o->uri == NULL) {
		free(b);
		return sdb_errf(err, errlen, SDB_EINVAL, "--uri is required");
	}
	b->uri = sdb_strdup(o->uri);
	b->workload = sdb_strdup(o->workload ? o->workload : "a");
	b->dist = o->dist ? sdb_strdup(o->dist) : NULL;
	b->nthreads = o->threads > 0 ? o->threads : 4;
	if (b->o.records <= 0) {
		b->o.records = 10000;
	}
	if (b->o.value_bytes <= 0) {
		b->o.value_bytes = 1000;
	}
	if (b->o.merchants <= 0 || b->o.merchants > 9999) {
		b->o.merchants = 200;
	}
	b->o.uri = b->o.workload = b->o.dist = b->o.db = NULL;
	rc = setup_workload(b, err, errlen);
	if (rc != 0) {
		goto fail;
	}
	b->db = sdb_strdup(o->db ? o->db : b->payments ? "pay" : "ycsb");
	b->maxkeys = b->o.records + 4000000;
	b->ver = sdb_calloc((size_t)b->maxkeys, sizeof *b->ver);
	zipf_init(&b->zkeys, b->o.records);
	zipf_init(&b->zmerch, b->o.merchants);
	b->epoch_ms0 = sdb_wall_ms() / 1000 * 1000; /* a data value (charges' `created`) */
	uri = mongoc_uri_new_with_error(b->uri, &e);
	if (uri == NULL) {
		rc = sdb_errf(err, errlen, SDB_EINVAL, "bad URI '%s': %s", b->uri, e.message);
		goto fail;
	}
	{
		/* retryWrites=true given in the URI: updates are retryable writes */
		bson_iter_t rw;
		const bson_t *uopts = mongoc_uri_get_options(uri);
		b->retryable = uopts && bson_iter_init_find_case(&rw, uopts, MONGOC_URI_RETRYWRITES) &&
			       bson_iter_as_bool(&rw);
		b->socket_timeout_ms = mongoc_uri_get_option_as_int32(
			uri, MONGOC_URI_SOCKETTIMEOUTMS, MONGOC_DEFAULT_SOCKETTIMEOUTMS);
		b->select_timeout_ms = mongoc_uri_get_option_as_int32(
			uri, MONGOC_URI_SERVERSELECTIONTIMEOUTMS, BENCH_SELECT_TIMEOUT_DEFAULT_MS);
	}
	b->pool = mongoc_client_pool_new(uri);
	mongoc_uri_destroy(uri);
	mongoc_client_pool_set_error_api(b->pool, MONGOC_ERROR_API_VERSION_2);
	mongoc_client_pool_max_size(b->pool, (uint32_t)b->nthreads + 2);
	b->w = sdb_calloc((size_t)b->nthreads, sizeof *b->w);
	{
		uint64_t seed = o->seed ? o->seed : sdb_mono_ns();
		b->mseed = 0x5EEDC0DEull; /* fixed: a --no-load run addresses the same ids */
		for (int i = 0; i < b->nthreads; i++) {
			b->w[i].b = b;
			b->w[i].id = i;
			b->w[i].rng = fnv64(seed + (uint64_t)i * 0x9E3779B97F4A7C15ull) | 1;
			pthread_mutex_init(&b->w[i].mu, NULL);
		}
	}
	rc = prepare_collection(b, err, errlen);
	if (rc != 0) {
		goto fail;
	}
	b->t0 = sdb_mono_ns();
	if (b->o.load) {
		for (int i = 0; i < b->nthreads; i++) {
			pthread_create(&b->w[i].th, NULL, worker_load, &b->w[i]);
		}
		for (int i = 0; i < b->nthreads; i++) {
			pthread_join(b->w[i].th, NULL);
		}
		for (int i = 0; i < b->nthreads; i++) {
			if (b->w[i].load_failed) {
				rc = sdb_errf(err, errlen, SDB_EIO, "load failed: %s", b->w[i].load_err);
				goto fail;
			}
		}
	} else {
		for (int64_t k = 0; k < b->o.records; k++) {
			b->ver[k] = 1; /* assumed loaded by an earlier run: not checked */
		}
	}
	atomic_store(&b->inserted_hi, b->o.records);
	snprintf(b->labels[0], sizeof b->labels[0], "%s", o->label ? o->label : "run");
	b->nphases = 1;
	b->phase_ns[0] = sdb_mono_ns() - b->t0;
	b->last_ns = sdb_mono_ns();
	if (b->o.seconds > 0) {
		/* the run's clock starts after the load */
		b->o.seconds += (double)(sdb_mono_ns() - b->t0) / 1e9;
	}
	for (int i = 0; i < b->nthreads; i++) {
		pthread_create(&b->w[i].th, NULL, worker_run, &b->w[i]);
	}
	b->started = 1;
	*out = b;
	return 0;
fail:
	bench_free(b);
	return rc;
}

void bench_mark(bench *b, const char *label)
{
	int p;

	for (int i = 0; i < b->nthreads; i++) {
		pthread_mutex_lock(&b->w[i].mu);
	}
	p = b->nphases < BENCH_MAX_PHASES ? b->nphases++ : b->nphases - 1;
	snprintf(b->labels[p], sizeof b->labels[p], "%s", label);
	b->phase_ns[p] = sdb_mono_ns() - b->t0;
	atomic_store(&b->phase, p);
	for (int i = b->nthreads - 1; i >= 0; i--) {
		pthread_mutex_unlock(&b->w[i].mu);
	}
}

int bench_done(const bench *b)
{
	return b->o.seconds > 0 && sdb_mono_ns() >= b->t0 + (uint64_t)(b->o.seconds * 1e9);
}

void bench_stop(bench *b)
{
	if (!b->started) {
		return;
	}
	atomic_store(&b->stop, 1);
	for (int i = 0; i < b->nthreads; i++) {
		pthread_join(b->w[i].th, NULL);
	}
	b->started = 0;
	b->phase_ns[b->nphases] = sdb_mono_ns() - b->t0;
}

int bench_phase(bench *b, int i, bench_phase_stats *out)
{
	memset(out, 0, sizeof *out);
	if (i < 0 || i >= b->nphases) {
		return b->nphases;
	}
	snprintf(out->label, sizeof out->label, "%s", b->labels[i]);
	out->start_ns = b->phase_ns[i];
	out->end_ns = i + 1 < b->nphases ? b->phase_ns[i + 1]
		      : b->started	  ? sdb_mono_ns() - b->t0
					  : b->phase_ns[b->nphases];
	for (int t = 0; t < b->nthreads; t++) {
		pthread_mutex_lock(&b->w[t].mu);
		for (int k = 0; k < BENCH_N_OPS; k++) {
			bench_hist_merge(&out->h[k], &b->w[t].ph[i].h[k]);
		}
		for (int k = 0; k < BENCH_N_ERRS; k++) {
			out->errs[k] += b->w[t].ph[i].errs[k];
		}
		pthread_mutex_unlock(&b->w[t].mu);
	}
	return b->nphases;
}

static const char *const op_names[BENCH_N_OPS] = {"read", "update", "insert", "scan", "rmw", "query"};
static const char *const err_names[BENCH_N_ERRS] = {"quota_462", "duplicate_key", "network",
						     "routing", "timeout", "other"};

void bench_status_line(bench *b, char *buf, size_t n)
{
	static bench_phase_stats ps;
	bench_hist all, iv;
	uint64_t now = sdb_mono_ns(), errs = 0;
	double dt;
	int p = atomic_load(&b->phase);

	/* the interval histogram: this phase's totals minus the last snapshot */
	bench_phase(b, p, &ps);
	memset(&all, 0, sizeof all);
	for (int k = 0; k < BENCH_N_OPS; k++) {
		bench_hist_merge(&all, &ps.h[k]);
	}
	for (int k = 0; k < BENCH_N_ERRS; k++) {
		errs += ps.errs[k];
	}
	if (p != b->last_phase) {
		/* a new phase began: the interval starts with it */
		memset(&b->last, 0, sizeof b->last);
		b->last_errs = 0;
		b->last_ns = b->t0 + b->phase_ns[p];
		b->last_phase = p;
	}
	bench_hist_diff(&iv, &all, &b->last);
	dt = (double)(now - b->last_ns) / 1e9;
	snprintf(buf, n, "[%5.1fs] %7.0f ops/s  p50 %6.2f ms  p99 %7.2f ms  errors %" PRIu64,
		 (double)(now - b->t0) / 1e9, dt > 0 ? (double)iv.n / dt : 0.0,
		 (double)bench_hist_percentile(&iv, 50) / 1000.0,
		 (double)bench_hist_percentile(&iv, 99) / 1000.0,
		 errs >= b->last_errs ? errs - b->last_errs : errs);
	b->last = all;
	b->last_errs = errs;
	b->last_ns = now;
}

int bench_report(bench *b, FILE *f, const char *json_path, const bench_verdict *v)
{
	static bench_phase_stats ps;
	FILE *j = NULL;

	if (json_path != NULL) {
		j = fopen(json_path, "w");
		if (j == NULL) {
			fprintf(stderr, "stripedb bench: cannot write %s: %s\n", json_path, strerror(errno));
			return SDB_EIO;
		}
		fprintf(j, "{\"workload\": \"%s\", \"uri\": \"%s\", \"threads\": %d, \"records\": %" PRId64
			   ", \"phases\": [",
			b->workload, b->uri, b->nthreads, b->o.records);
	}
	for (int i = 0; i < b->nphases; i++) {
		uint64_t tot = 0, errs = 0;
		double secs;
		bench_phase(b, i, &ps);
		secs = (double)(ps.end_ns - ps.start_ns) / 1e9;
		for (int k = 0; k < BENCH_N_OPS; k++) {
			tot += ps.h[k].n;
		}
		for (int k = 0; k < BENCH_N_ERRS; k++) {
			errs += ps.errs[k];
		}
		if (f != NULL) {
			fprintf(f, "phase %-28s %6.1f s  %9" PRIu64 " ops  %8.0f ops/s  %" PRIu64 " errors\n",
				ps.label, secs, tot, secs > 0 ? (double)tot / secs : 0.0, errs);
		}
		if (j != NULL) {
			fprintf(j, "%s{\"label\": \"%s\", \"seconds\": %.3f, \"ops\": %" PRIu64
				   ", \"opsPerSec\": %.1f, \"latencyMS\": {",
				i ? ", " : "", ps.label, secs, tot, secs > 0 ? (double)tot / secs : 0.0);
		}
		for (int k = 0, first = 1; k < BENCH_N_OPS; k++) {
			const bench_hist *h = &ps.h[k];
			if (h->n == 0) {
				continue;
			}
			if (f != NULL) {
				fprintf(f, "    %-7s %9" PRIu64 "  p50 %7.2f  p95 %7.2f  p99 %7.2f  max %8.2f ms\n",
					op_names[k], h->n, bench_hist_percentile(h, 50) / 1000.0,
					bench_hist_percentile(h, 95) / 1000.0,
					bench_hist_percentile(h, 99) / 1000.0, (double)h->max / 1000.0);
			}
			if (j != NULL) {
				fprintf(j, "%s\"%s\": {\"n\": %" PRIu64 ", \"p50\": %.3f, \"p95\": %.3f, "
					   "\"p99\": %.3f, \"max\": %.3f}",
					first ? "" : ", ", op_names[k], h->n,
					bench_hist_percentile(h, 50) / 1000.0,
					bench_hist_percentile(h, 95) / 1000.0,
					bench_hist_percentile(h, 99) / 1000.0, (double)h->max / 1000.0);
			}
			first = 0;
		}
		if (j != NULL) {
			fprintf(j, "}, \"errors\": {");
		}
		for (int k = 0, first = 1; k < BENCH_N_ERRS; k++) {
			if (f != NULL && ps.errs[k] != 0) {
				fprintf(f, "    error %-13s %" PRIu64 "\n", err_names[k], ps.errs[k]);
			}
			if (j != NULL) {
				fprintf(j, "%s\"%s\": %" PRIu64, first ? "" : ", ", err_names[k], ps.errs[k]);
				first = 0;
			}
		}
		if (j != NULL) {
			fprintf(j, "}}");
		}
	}
	if (j != NULL) {
		fprintf(j, "]");
		if (v != NULL) {
			fprintf(j, ", \"check\": {\"ok\": %s, \"keys\": %" PRId64 ", \"writes\": %" PRId64
				   ", \"acked\": %" PRId64 ", \"failed\": %" PRId64 ", \"unknown\": %" PRId64
				   ", \"reads\": %" PRId64 ", \"docs\": %" PRId64 ", \"violations\": %" PRId64 "}",
				v->ok ? "true" : "false", v->keys, v->writes, v->acked, v->failed, v->unknown,
				v->reads, v->docs, v->violations);
		}
		fprintf(j, "}\n");
		if (fclose(j) != 0) {
			return SDB_EIO;
		}
	}
	return 0;
}

int bench_write_history(bench *b, const char *path)
{
	static const char *const ops[] = {"insert", "update", "read"};
	static const char *const outc[] = {"ok", "fail", "unknown"};
	FILE *f = fopen(path, "w");

	if (f == NULL) {
		fprintf(stderr, "stripedb bench: cannot write %s: %s\n", path, strerror(errno));
		return SDB_EIO;
	}
	for (int t = 0; t < b->nthreads; t++) {
		worker *w = &b->w[t];
		pthread_mutex_lock(&w->mu);
		for (size_t i = 0; i < w->nev; i++) {
			const bench_ev *e = &w->ev[i];
			char id[64];
			bench_key_id(b, e->key, id, sizeof id);
			fprintf(f, "{\"op\": \"%s\", \"key\": \"%s\", \"value\": %" PRId64
				   ", \"ok\": \"%s\", \"n\": %d, \"start_ns\": %" PRIu64 ", \"end_ns\": %" PRIu64
				   "}\n",
				ops[e->op], id, e->value, outc[e->outcome], e->n, e->t0, e->t1);
		}
		pthread_mutex_unlock(&w->mu);
	}
	return fclose(f) == 0 ? 0 : SDB_EIO;
}

int bench_check(bench *b, bench_verdict *v, char *err, size_t errlen)
{
	size_t total = 0, o = 0;
	bench_ev *all;
	int rc;

	for (int t = 0; t < b->nthreads; t++) {
		total += b->w[t].nev;
	}
	all = sdb_malloc((total ? total : 1) * sizeof *all);
	for (int t = 0; t < b->nthreads; t++) {
		memcpy(all + o, b->w[t].ev, b->w[t].nev * sizeof *all);
		o += b->w[t].nev;
	}
	{
		mongoc_client_t *cl = mongoc_client_pool_pop(b->pool);
		mongoc_collection_t *c = mongoc_client_get_collection(cl, b->db, b->coll);
		rc = bench_check_run(b, c, all, total, b->maxkeys, v, err, errlen);
		mongoc_collection_destroy(c);
		mongoc_client_pool_push(b->pool, cl);
	}
	free(all);
	return rc;
}

void bench_free(bench *b)
{
	if (b == NULL) {
		return;
	}
	bench_stop(b);
	if (b->w != NULL) {
		for (int i = 0; i < b->nthreads; i++) {
			free(b->w[i].ev);
			pthread_mutex_destroy(&b->w[i].mu);
		}
		free(b->w);
	}
	if (b->pool != NULL) {
		mongoc_client_pool_destroy(b->pool);
	}
	free(b->ver);
	free(b->uri);
	free(b->db);
	free(b->workload);
	free(b->dist);
	free(b);
}
