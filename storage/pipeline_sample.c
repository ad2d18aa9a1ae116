/* $sample (issue #20), as MongoDB 6.0's DocumentSourceSample
 * (src/mongo/db/pipeline/document_source_sample.cpp): every input document gets a random
 * key (mongod: the randVal metadata, PseudoRandom::nextCanonicalDouble) and the stage
 * returns the `size` documents of smallest key, in ascending key order: a uniform sample
 * without replacement. mongod runs a $sort on {$meta: "randVal"} limited to size; here
 * one pass keeps a max-heap of the size smallest keys, so memory is bounded by size
 * documents (and by the pipeline's blocking-stage limit, 292 beyond it, as $sort: we never
 * spill to disk). A leading $sample of a large collection does not use mongod's random
 * cursor (document_source_sample_from_random_cursor.cpp): the result's distribution is
 * the same.
 *
 * Across shards (mongod's distributedPlanLogic: each shard samples size documents, the
 * merger merges them by randVal and keeps size): a shard asked by the proxy emits each
 * document's key in the field SDB_PIPELINE_SAMPLE_KEY (sdb_pipeline_opts.sample_key_out),
 * the proxy's $sample keeps the size smallest of the keys it receives
 * (sample_key_in). The size smallest keys of a union are among the size smallest of each
 * part, so the result is uniform over the union, whatever the shards' shares. */
#include "build_config.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/err.h"
#include "storage/pipeline.h"
#include "storage/pipeline_int.h"

int agg_sample_parse(sdb_pipeline *p, const bson_iter_t *it, const ectx *e)
{
	bson_iter_t f;
	bool have_size = false;
	int64_t size = 0;
	stage *s;

	if (!BSON_ITER_HOLDS_DOCUMENT(it) || !bson_iter_recurse(it, &f)) {
		return efail(e, 28745, "the $sample stage specification must be an object");
	}
	while (bson_iter_next(&f)) {
		const char *k = bson_iter_key(&f);

		if (strcmp(k, "size") != 0) {
			return efail(e, 28748, "unrecognized option to $sample: %s", k);
		}
		if (!BSON_ITER_HOLDS_NUMBER(&f) && !BSON_ITER_HOLDS_DECIMAL128(&f)) {
			return efail(e, 28746, "size argument to $sample must be a number");
		}
		if (BSON_ITER_HOLDS_DOUBLE(&f) || BSON_ITER_HOLDS_DECIMAL128(&f)) {
			/* BSONElement::safeNumberLong: truncated, NaN is 0, out of range saturates
			 * (a Decimal128 through its decimal string: no decimal arithmetic here) */
			double d;

			if (BSON_ITER_HOLDS_DOUBLE(&f)) {
				d = bson_iter_double(&f);
			} else {
				bson_decimal128_t dec;
				char str[BSON_DECIMAL128_STRING];

				bson_iter_decimal128(&f, &dec);
				bson_decimal128_to_string(&dec, str);
				d = strtod(str, NULL);
			}
			size = isnan(d)				      ? 0
			       : d >= 9223372036854775807.0	      ? INT64_MAX
			       : d <= -9223372036854775808.0	      ? INT64_MIN
								      : (int64_t)d;
		} else {
			size = bson_iter_as_int64(&f);
		}
		if (size < 0) {
			return efail(e, 28747, "size argument to $sample must not be negative");
		}
		have_size = true;
	}
	if (!have_size) {
		return efail(e, 28749, "$sample stage must specify a size");
	}
	p->st = sdb_realloc(p->st, (p->n + 1) * sizeof *p->st);
	s = &p->st[p->n++];
	memset(s, 0, sizeof *s);
	s->kind = S_SAMPLE;
	s->n = size;
	return 0;
}

int64_t sdb_pipeline_first_sample(const sdb_pipeline *p)
{
	return p->n > 0 && p->st[0].kind == S_SAMPLE ? p->st[0].n : -1;
}

/* ---- the sampler ---- */

typedef struct sentry {
	double key;
	bson_t *doc;
} sentry;

struct agg_sampler {
	int64_t n;       /* documents to keep */
	size_t max_mem;
	bool key_in, key_out;
	uint64_t rng[4]; /* xoshiro256** state */
	sentry *heap;    /* max-heap on key while loading; ascending after finish */
	size_t len, cap;
	size_t mem;
	size_t pos;      /* next to emit */
	bool finished;
};

static uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

/* xoshiro256** (Blackman and Vigna): 64 random bits */
static uint64_t rng_next(uint64_t *s)
{
	uint64_t r = rotl(s[1] * 5, 7) * 9;
	uint64_t t = s[1] << 17;

	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return r;
}

/* splitmix64, to spread a weak fallback seed over the state */
static uint64_t splitmix(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static void rng_seed(uint64_t *s)
{
	size_t got = 0;

	while (got < 4 * sizeof *s) {
		ssize_t r = getrandom((char *)s + got, 4 * sizeof *s - got, 0);

		if (r < 0) {
			if (errno == EINTR) {
				continue;
			}
			break;
		}
		got += (size_t)r;
	}
	if (got < 4 * sizeof *s) {
		/* no getrandom (old kernel, seccomp): the clock and the address of the state */
		struct timespec ts;
		uint64_t x;

		clock_gettime(CLOCK_MONOTONIC, &ts);
		x = ((uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec) ^
		    (uint64_t)(uintptr_t)s ^ ((uint64_t)getpid() << 32);
		for (int i = 0; i < 4; i++) {
			s[i] = splitmix(&x);
		}
	}
	if ((s[0] | s[1] | s[2] | s[3]) == 0) {
		s[0] = 1; /* the one state xoshiro cannot leave */
	}
}

agg_sampler *agg_sampler_new(int64_t n, size_t max_mem, bool key_in, bool key_out)
{
	agg_sampler *s = sdb_calloc(1, sizeof *s);

	s->n = n < 0 ? 0 : n;
	s->max_mem = max_mem;
	s->key_in = key_in;
	s->key_out = key_out;
	rng_seed(s->rng);
	return s;
}

static size_t entry_mem(const sentry *en)
{
	return en->doc->len + sizeof(bson_t) + sizeof *en;
}

static void sift_down(sentry *h, size_t len, size_t i)
{
	for (;;) {
		size_t l = 2 * i + 1, r = l + 1, m = i;
		sentry t;

		if (l < len && h[l].key > h[m].key) {
			m = l;
		}
		if (r < len && h[r].key > h[m].key) {
			m = r;
		}
		if (m == i) {
			return;
		}
		t = h[i];
		h[i] = h[m];
		h[m] = t;
		i = m;
	}
}

static void sift_up(sentry *h, size_t i)
{
	while (i > 0) {
		size_t parent = (i - 1) / 2;
		sentry t;

		if (h[parent].key >= h[i].key) {
			return;
		}
		t = h[i];
		h[i] = h[parent];
		h[parent] = t;
		i = parent;
	}
}

/* The key a shard sent with doc (sample_key_in): removed from *doc, *key set; false when
 * doc has none. */
static bool take_key(bson_t **doc, double *key)
{
	bson_iter_t it;
	bson_t *copy;

	if (!bson_iter_init_find(&it, *doc, SDB_PIPELINE_SAMPLE_KEY) ||
	    !BSON_ITER_HOLDS_DOUBLE(&it)) {
		return false;
	}
	*key = bson_iter_double(&it);
	copy = bson_sized_new((*doc)->len);
	bson_copy_to_excluding_noinit(*doc, copy, SDB_PIPELINE_SAMPLE_KEY, NULL);
	bson_destroy(*doc);
	*doc = copy;
	return !isnan(*key);
}

int agg_sampler_add(agg_sampler *s, bson_t *doc, const ectx *e)
{
	sentry en;

	if (s->n == 0) {
		bson_destroy(doc);
		return 0;
	}
	if (!s->key_in || !take_key(&doc, &en.key)) {
		/* 53 random bits: a uniform double in [0, 1), as nextCanonicalDouble */
		en.key = (double)(rng_next(s->rng) >> 11) * 0x1.0p-53;
	}
	en.doc = doc;
	if ((int64_t)s->len < s->n) {
		if (s->len == s->cap) {
			s->cap = s->cap == 0 ? 64 : s->cap * 2;
			s->heap = sdb_realloc(s->heap, s->cap * sizeof *s->heap);
		}
		s->heap[s->len++] = en;
		s->mem += entry_mem(&en);
		sift_up(s->heap, s->len - 1);
	} else if (en.key < s->heap[0].key) {
		s->mem -= entry_mem(&s->heap[0]);
		bson_destroy(s->heap[0].doc);
		s->heap[0] = en;
		s->mem += entry_mem(&en);
		sift_down(s->heap, s->len, 0);
	} else {
		bson_destroy(doc);
		return 0;
	}
	if (s->mem > s->max_mem) {
		if (e->code != NULL) {
			*e->code = C_MEMORY;
		}
		snprintf(e->err, e->errlen,
			 "Exceeded memory limit for $sample, but didn't allow external sort. Pass allowDiskUse:true to opt in.");
		return SDB_ETOOBIG;
	}
	return 0;
}

bson_t *agg_sampler_next(agg_sampler *s)
{
	bson_t *d;

	if (!s->finished) {
		/* heap sort in place: the largest key goes last, repeatedly */
		for (size_t end = s->len; end > 1; end--) {
			sentry t = s->heap[0];

			s->heap[0] = s->heap[end - 1];
			s->heap[end - 1] = t;
			sift_down(s->heap, end - 1, 0);
		}
		s->finished = true;
	}
	if (s->pos >= s->len) {
		return NULL;
	}
	d = s->heap[s->pos].doc;
	s->heap[s->pos].doc = NULL;
	if (s->key_out) {
		BSON_APPEND_DOUBLE(d, SDB_PIPELINE_SAMPLE_KEY, s->heap[s->pos].key);
	}
	s->pos++;
	return d;
}

void agg_sampler_free(agg_sampler *s)
{
	if (s == NULL) {
		return;
	}
	for (size_t i = 0; i < s->len; i++) {
		if (s->heap[i].doc != NULL) {
			bson_destroy(s->heap[i].doc);
		}
	}
	free(s->heap);
	free(s);
}
