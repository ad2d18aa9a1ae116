/* The aggregation pipeline engine (see pipeline.h).
 *
 * Stages are pulled: cursor_next asks the last stage for a document, which asks the
 * stage before it, down to the store's input iterator. Documents travel between stages
 * as heap bson_t (bson_new/bson_copy give libbson's 128-byte alignment). Expressions are
 * compiled once into a tree and evaluated into docbuild nodes (NULL meaning "missing";
 * pipeline_expr.c); $project, $unset and $addFields/$set are compiled by the projection engine
 * that find projections use too (projection.h).
 *
 * This file runs a compiled pipeline (the pull cursor and the blocking stages $sort,
 * $group, $unwind, $facet, which share the cursor's private state); compiling it (stage
 * parsing, the $sort + $limit coalescing and pushdown) is pipeline_parse.c, the compiled
 * form (stage, struct sdb_pipeline) pipeline_int.h.
 */
#include "storage/pipeline.h"
#include "storage/pipeline_int.h"
#include "storage/projection.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/bsonval.h"
#include "storage/docbuild.h"
#include "storage/collation.h"
#include "storage/keyenc.h"
#include "storage/matcher.h"
#include "storage/sortspec.h"

/* ---- cursors ------------------------------------------------------------------------- */

/* A set of encoded keys (pipeline_int.h). */
typedef agg_keyset keyset;

static uint64_t key_hash(const sdb_key *k);

static void keyset_free(keyset *s)
{
	for (size_t i = 0; i < s->cap; i++) {
		sdb_key_free(&s->slots[i]);
	}
	free(s->slots);
	memset(s, 0, sizeof *s);
}

/* pipeline_int.h */
void agg_keyset_free(agg_keyset *s)
{
	keyset_free(s);
}

static void keyset_place(sdb_key *slots, size_t cap, sdb_key *k)
{
	size_t i = (size_t)(key_hash(k) & (cap - 1));

	while (slots[i].data != NULL) {
		i = (i + 1) & (cap - 1);
	}
	slots[i] = *k;
}

/* Add k (taking ownership) unless an equal key is there (then k is freed). Returns true
 * when added. */
static bool keyset_add(keyset *s, sdb_key *k)
{
	if ((s->n + 1) * 2 > s->cap) {
		size_t cap = s->cap == 0 ? 16 : s->cap * 2;
		sdb_key *slots = sdb_calloc(cap, sizeof *slots);

		for (size_t i = 0; i < s->cap; i++) {
			if (s->slots[i].data != NULL) {
				keyset_place(slots, cap, &s->slots[i]);
			}
		}
		free(s->slots);
		s->slots = slots;
		s->cap = cap;
	}
	for (size_t i = (size_t)(key_hash(k) & (s->cap - 1));; i = (i + 1) & (s->cap - 1)) {
		if (s->slots[i].data == NULL) {
			s->slots[i] = *k;
			s->n++;
			return true;
		}
		if (sdb_key_cmp(&s->slots[i], k) == 0) {
			sdb_key_free(k);
			return false;
		}
	}
}

/* pipeline_int.h */
bool agg_keyset_add(agg_keyset *s, sdb_key *k)
{
	return keyset_add(s, k);
}

typedef struct {
	akind kind;
	keyset seen;      /* $addToSet: keys of the values in v */
	docbuild_node *v; /* min/max/first/last value, or push/addToSet array */
	bool set;
	agg_sum sum;   /* $sum / $avg */
	agg_stddev sd; /* $stdDevPop / $stdDevSamp */
	int64_t count; /* $count */
} acc_state;

typedef struct group {
	sdb_key key;
	docbuild_node *id;
	acc_state *acc;
	struct group *next_in_bucket;
} group;

typedef struct sitem {
	bson_t *doc;         /* $sort: the document; $bucketAuto: NULL (not kept) */
	uint64_t seq;
	sdb_key key;
	docbuild_node *val; /* $bucketAuto: the groupBy value (key is its encoding); else NULL */
	docbuild_node **accv; /* $bucketAuto: each accumulator's argument, evaluated on input
			       * (naccv of them, NULL entries for $count); else NULL */
	size_t naccv;
} sitem;

/* Free an item's evaluated accumulator arguments. */
static void sitem_accv_free(sitem *it)
{
	for (size_t a = 0; a < it->naccv; a++)
		docbuild_free(it->accv[a]);
	free(it->accv);
	it->accv = NULL;
	it->naccv = 0;
}

typedef struct {
	/* $sort */
	sitem *items; /* $sort: held documents with their sort keys */
	size_t n, cap;
	size_t pos;
	bool loaded;
	size_t mem;
	/* $limit/$skip */
	int64_t count;
	/* $group */
	group **buckets;
	size_t n_buckets;
	group **order;
	size_t n_groups;
	/* $unwind */
	bson_t *cur;
	docbuild_node *cur_arr;
	size_t cur_i;
	/* $bucketAuto (over items, sorted by the groupBy value) */
	int64_t bucket_num;       /* buckets emitted */
	int64_t approx;           /* documents aimed at per bucket */
	docbuild_node *prev_max;  /* with a granularity: the previous bucket's max */
	/* $unionWith: the foreign source, open once the input ended (loaded) */
	sdb_pipeline_source src;
	bool src_open;
	/* $lookup: the foreign reads already made */
	agg_lookup_cache lookups;
	/* $sample: the documents kept (pipeline_sample.c) */
	agg_sampler *sampler;
} stage_state;

struct sdb_pipeline_cursor {
	const sdb_pipeline *p;
	sdb_pipeline_next_fn next;
	void *ctx;
	stage_state *ss;
	bson_t *out;
	int done_rc; /* 1 = running, 0 = ended, <0 = failed */
	int done_code;
	char done_err[256];
	bool input_done;
};

void sdb_pipeline_open(const sdb_pipeline *p, sdb_pipeline_next_fn next, void *ctx,
		       sdb_pipeline_cursor **out)
{
	sdb_pipeline_cursor *c = sdb_calloc(1, sizeof *c);

	c->p = p;
	c->next = next;
	c->ctx = ctx;
	c->ss = sdb_calloc(p->n + 1, sizeof *c->ss);
	c->done_rc = 1;
	*out = c;
}

static void state_clear(stage_state *s)
{
	for (size_t i = s->pos; i < s->n; i++) {
		bson_destroy(s->items[i].doc);
		sdb_key_free(&s->items[i].key);
		docbuild_free(s->items[i].val);
		sitem_accv_free(&s->items[i]);
	}
	free(s->items);
	docbuild_free(s->prev_max);
	for (size_t i = 0; i < s->n_groups; i++) {
		group *g = s->order[i];

		sdb_key_free(&g->key);
		docbuild_free(g->id);
		/* accumulator values are freed when emitted; leftovers here */
		free(g->acc);
		free(g);
	}
	free(s->order);
	free(s->buckets);
	if (s->cur != NULL) {
		bson_destroy(s->cur);
	}
	docbuild_free(s->cur_arr);
	if (s->src_open && s->src.close != NULL) {
		s->src.close(s->src.ctx);
	}
	s->src_open = false;
	agg_lookup_cache_clear(&s->lookups);
	agg_sampler_free(s->sampler);
	s->sampler = NULL;
}

void sdb_pipeline_cursor_free(sdb_pipeline_cursor *c)
{
	if (c == NULL) {
		return;
	}
	for (size_t i = 0; i < c->p->n; i++) {
		stage_state *s = &c->ss[i];

		if (c->p->st[i].kind == S_GROUP) {
			for (size_t g = s->pos; g < s->n_groups; g++) {
				for (size_t a = 0; a < c->p->st[i].n_accs; a++) {
					docbuild_free(s->order[g]->acc[a].v);
					keyset_free(&s->order[g]->acc[a].seen);
				}
			}
		}
		state_clear(s);
	}
	free(c->ss);
	if (c->out != NULL) {
		bson_destroy(c->out);
	}
	free(c);
}

static int pull(sdb_pipeline_cursor *c, size_t i, bson_t **doc, const ectx *e);

static int pull_input(sdb_pipeline_cursor *c, bson_t **doc, const ectx *e)
{
	const bson_t *in = NULL;
	int rc;

	*doc = NULL;
	if (c->input_done) {
		return 0;
	}
	rc = c->next(c->ctx, &in, e->code, e->err, e->errlen);
	if (rc < 0) {
		if (e->code != NULL && *e->code == 0) {
			*e->code = C_INTERNAL;
		}
		return rc;
	}
	if (rc == 0 || in == NULL) {
		c->input_done = true;
		return 0;
	}
	*doc = bson_copy(in);
	return 0;
}

/* A stage's output document as heap BSON. A document nested deeper than a BSON document
 * may be (a pipeline can nest $$ROOT in itself stage after stage) is 15 Overflow, as
 * mongod's Document::toBson, before any recursive walk meets it. Returns 0 (*out set), or
 * SDB_EINVAL with the error in e (*out NULL). */
static int node_to_heap(const docbuild_node *n, const ectx *e, bson_t **out)
{
	bson_t tmp;

	*out = NULL;
	if (docbuild_depth(n, SDB_BSON_MAX_DEPTH) > SDB_BSON_MAX_DEPTH) {
		return efail(e, 15,
			     "cannot convert document to BSON because it exceeds the limit of %d "
			     "levels of nesting",
			     SDB_BSON_MAX_DEPTH);
	}
	docbuild_to_bson(n, &tmp);
	*out = bson_copy(&tmp);
	bson_destroy(&tmp);
	return 0;
}

static int memory_error(const ectx *e, const char *stage)
{
	if (e->code != NULL) {
		*e->code = C_MEMORY;
	}
	snprintf(e->err, e->errlen,
		 "Exceeded memory limit for %s, but didn't allow external sort. Pass allowDiskUse:true to opt in.",
		 stage);
	return SDB_ETOOBIG;
}

static int sitem_cmp(const sitem *x, const sitem *y)
{
	int r = sdb_key_cmp(&x->key, &y->key);

	if (r != 0) {
		return r;
	}
	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Merge sort of items[0..n) with scratch space tmp (n entries); no global state, so
 * cursors on several threads may sort at once. */
static void msort(sitem *items, sitem *tmp, size_t n)
{
	size_t h, i, j, k;

	if (n < 2) {
		return;
	}
	h = n / 2;
	msort(items, tmp, h);
	msort(items + h, tmp, n - h);
	for (i = 0, j = h, k = 0; i < h && j < n;) {
		tmp[k++] = sitem_cmp(&items[j], &items[i]) < 0 ? items[j++] : items[i++];
	}
	while (i < h) {
		tmp[k++] = items[i++];
	}
	while (j < n) {
		tmp[k++] = items[j++];
	}
	memcpy(items, tmp, n * sizeof *items);
}

static size_t sitem_mem(const sitem *it)
{
	return (it->doc ? it->doc->len + sizeof(bson_t) : 0) + it->key.len + sizeof *it;
}

/* Sort s->items[0..n) stably; keep at most keep (0 = all). */
static void sort_docs(stage_state *s, size_t keep)
{
	sitem *tmp = sdb_malloc((s->n + 1) * sizeof *tmp);

	msort(s->items, tmp, s->n);
	free(tmp);
	if (keep > 0 && s->n > keep) {
		for (size_t i = keep; i < s->n; i++) {
			s->mem -= sitem_mem(&s->items[i]);
			bson_destroy(s->items[i].doc);
			sdb_key_free(&s->items[i].key);
			sitem_accv_free(&s->items[i]);
		}
		s->n = keep;
	}
}

static int run_sort(sdb_pipeline_cursor *c, size_t i, const ectx *e)
{
	const stage *st = &c->p->st[i];
	stage_state *s = &c->ss[i];
	size_t keep = st->n > 0 ? (size_t)st->n : 0;
	uint64_t seq = 0;

	for (;;) {
		bson_t *d = NULL;
		sitem *it;
		int rc = pull(c, i, &d, e);

		if (rc != 0) {
			return rc;
		}
		if (d == NULL) {
			break;
		}
		if (s->n == s->cap) {
			s->cap = s->cap == 0 ? 64 : s->cap * 2;
			s->items = sdb_realloc(s->items, s->cap * sizeof *s->items);
		}
		it = &s->items[s->n];
		it->doc = d;
		it->val = NULL;
		it->accv = NULL;
		it->naccv = 0;
		it->seq = seq++;
		sdb_key_init(&it->key);
		/* the sort key is computed once per document (storage/sortspec.h) */
		rc = sdb_sortspec_key(st->sort, d, &it->key, e->err, e->errlen);
		s->n++;
		if (rc != 0) {
			if (e->code != NULL) {
				*e->code = C_BAD_VALUE;
			}
			return rc;
		}
		s->mem += sitem_mem(it);
		if (keep > 0 && s->n >= 2 * keep + 64) {
			sort_docs(s, keep);
		}
		if (s->mem > c->p->max_mem) {
			return memory_error(e, "$sort");
		}
	}
	sort_docs(s, keep);
	return 0;
}

/* ---- $group ---- */

static uint64_t key_hash(const sdb_key *k)
{
	uint64_t h = 1469598103934665603ull;

	for (size_t i = 0; i < k->len; i++) {
		h ^= k->data[i];
		h *= 1099511628211ull;
	}
	return h;
}

static void groups_grow(stage_state *s)
{
	size_t nb = s->n_buckets == 0 ? 64 : s->n_buckets * 2;
	group **b = sdb_calloc(nb, sizeof *b);

	for (size_t i = 0; i < s->n_groups; i++) {
		group *g = s->order[i];
		size_t h = (size_t)(key_hash(&g->key) % nb);

		g->next_in_bucket = b[h];
		b[h] = g;
	}
	free(s->buckets);
	s->buckets = b;
	s->n_buckets = nb;
}

static void acc_add(acc_state *a, docbuild_node *v, size_t *mem)
{
	switch (a->kind) {
	case A_COUNT:
		a->count++;
		break;
	case A_SUM:
	case A_AVG:
		agg_sum_add(&a->sum, v);
		break;
	case A_STDDEVPOP:
	case A_STDDEVSAMP:
		agg_stddev_add(&a->sd, v);
		break;
	case A_MIN:
	case A_MAX:
		if (is_nullish(v)) {
			break;
		}
		if (a->v == NULL || (a->kind == A_MIN ? vcmp(v, a->v) < 0 : vcmp(v, a->v) > 0)) {
			docbuild_free(a->v);
			a->v = v;
			return;
		}
		break;
	case A_FIRST:
		if (!a->set) {
			a->set = true;
			a->v = v;
			return;
		}
		break;
	case A_LAST:
		docbuild_free(a->v);
		a->v = v;
		return;
	case A_PUSH:
	case A_ADDTOSET:
		if (v == NULL) {
			break;
		}
		if (a->v == NULL) {
			a->v = docbuild_new_array(NULL);
		}
		if (a->kind == A_ADDTOSET) {
			sdb_key k;
			bson_t scratch;
			bson_value_t bv;

			sdb_key_init(&k);
			docbuild_value(v, &scratch, &bv);
			(void)sdb_keyenc_append_value_coll(&k, &bv, false, sdb_collation_current(), NULL, 0);
			bson_destroy(&scratch);
			if (!keyset_add(&a->seen, &k)) {
				docbuild_free(v);
				return;
			}
			*mem += k.len + sizeof k;
		}
		*mem += node_size(v);
		docbuild_push(a->v, v);
		return;
	}
	docbuild_free(v);
}

static docbuild_node *acc_result(acc_state *a)
{
	docbuild_node *v;

	keyset_free(&a->seen);

	switch (a->kind) {
	case A_COUNT:
		return a->count <= INT32_MAX ? v_int32((int32_t)a->count) : v_int64(a->count);
	case A_SUM:
	case A_AVG:
		return agg_sum_result(&a->sum, a->kind == A_AVG);
	case A_STDDEVPOP:
	case A_STDDEVSAMP:
		return agg_stddev_result(&a->sd, a->kind == A_STDDEVSAMP);
	case A_PUSH:
	case A_ADDTOSET:
		v = a->v != NULL ? a->v : docbuild_new_array(NULL);
		a->v = NULL;
		return v;
	default:
		v = a->v != NULL ? a->v : v_null();
		a->v = NULL;
		return v;
	}
}

/* Pull stage i's next input document into *d and evaluate the stage's key expression on it
 * ($group's _id, $bucketAuto's groupBy: st->id) into *v (NULL when it is missing).
 * Returns: 0 with *d NULL at the end of the input; 0 with *d (the caller destroys it) and
 * *v (the caller frees it with docbuild_free); or pull's error, or the expression's with
 * *d destroyed and *v NULL. */
static int pull_keyed(sdb_pipeline_cursor *c, size_t i, bson_t **d, docbuild_node **v,
		      const ectx *e)
{
	int rc = pull(c, i, d, e);

	*v = NULL;
	if (rc != 0 || *d == NULL) {
		return rc;
	}
	rc = agg_expr_eval(c->p->st[i].id, *d, v, e);
	if (rc != 0) {
		docbuild_free(*v);
		*v = NULL;
		bson_destroy(*d);
	}
	return rc;
}

/* Append v's order-preserving encoding, under the current collation, to key (v not NULL:
 * a missing key is null by then).
 * Returns: 0; or the encoder's error with its message in e->err and *e->code BadValue
 * (key is left to the caller to free). */
static int key_append_node(sdb_key *key, const docbuild_node *v, const ectx *e)
{
	bson_t scratch;
	bson_value_t bv;
	int rc;

	docbuild_value(v, &scratch, &bv);
	rc = sdb_keyenc_append_value_coll(key, &bv, false, sdb_collation_current(), e->err,
					  e->errlen);
	bson_destroy(&scratch);
	if (rc != 0 && e->code != NULL) {
		*e->code = C_BAD_VALUE;
	}
	return rc;
}

static int run_group(sdb_pipeline_cursor *c, size_t i, const ectx *e)
{
	const stage *st = &c->p->st[i];
	stage_state *s = &c->ss[i];

	for (;;) {
		bson_t *d = NULL;
		docbuild_node *id = NULL;
		sdb_key key;
		group *g;
		int rc = pull_keyed(c, i, &d, &id, e);

		if (rc != 0) {
			return rc;
		}
		if (d == NULL) {
			break;
		}
		if (id == NULL) {
			id = v_null();
		}
		sdb_key_init(&key);
		rc = key_append_node(&key, id, e);
		if (rc != 0) {
			sdb_key_free(&key);
			docbuild_free(id);
			bson_destroy(d);
			return rc;
		}
		if (s->n_groups >= s->n_buckets) {
			groups_grow(s);
		}
		size_t h = (size_t)(key_hash(&key) % s->n_buckets);

		for (g = s->buckets[h]; g != NULL; g = g->next_in_bucket) {
			if (sdb_key_cmp(&g->key, &key) == 0) {
				break;
			}
		}
		if (g == NULL) {
			g = sdb_calloc(1, sizeof *g);
			g->key = key;
			g->id = id;
			g->acc = sdb_calloc(st->n_accs + 1, sizeof *g->acc);
			for (size_t a = 0; a < st->n_accs; a++) {
				g->acc[a].kind = st->accs[a].kind;
			}
			g->next_in_bucket = s->buckets[h];
			s->buckets[h] = g;
			s->order = sdb_realloc(s->order, (s->n_groups + 1) * sizeof *s->order);
			s->order[s->n_groups++] = g;
			s->mem += key.len * 2 + node_size(id) + sizeof *g + st->n_accs * sizeof *g->acc;
		} else {
			sdb_key_free(&key);
			docbuild_free(id);
		}
		for (size_t a = 0; a < st->n_accs && rc == 0; a++) {
			docbuild_node *v = NULL;

			if (st->accs[a].x != NULL) {
				rc = agg_expr_eval(st->accs[a].x, d, &v, e);
			}
			if (rc == 0) {
				size_t before = 0;
				acc_state *as = &g->acc[a];

				if (as->kind == A_MIN || as->kind == A_MAX || as->kind == A_FIRST ||
				    as->kind == A_LAST) {
					before = as->v != NULL ? node_size(as->v) : 0;
					acc_add(as, v, &s->mem);
					s->mem += (as->v != NULL ? node_size(as->v) : 0);
					s->mem -= before < s->mem ? before : s->mem;
				} else {
					acc_add(as, v, &s->mem);
				}
			} else {
				docbuild_free(v);
			}
		}
		bson_destroy(d);
		if (rc != 0) {
			return rc;
		}
		if (s->mem > c->p->max_mem) {
			return memory_error(e, "$group");
		}
	}
	return 0;
}

static bson_t *group_emit(const stage *st, stage_state *s, const ectx *e)
{
	group *g = s->order[s->pos++];
	docbuild_node *d = docbuild_new_doc(NULL);
	bson_t *out;

	docbuild_set_key(g->id, "_id");
	docbuild_push(d, g->id);
	g->id = NULL;
	for (size_t a = 0; a < st->n_accs; a++) {
		docbuild_node *v = acc_result(&g->acc[a]);

		docbuild_set_key(v, st->accs[a].name);
		docbuild_push(d, v);
	}
	(void)node_to_heap(d, e, &out);
	docbuild_free(d);
	return out;
}

/* ---- $bucketAuto ---- */

/* Read all of stage i's input: each document with its groupBy value (missing = null, as
 * mongod's extractKey; checked against the granularity first) and that value's
 * order-preserving encoding, held within max_mem bytes (as $sort: 292 beyond), then sorted
 * stably by the value (MongoDB's comparison order; equal values keep their input order, as
 * 6.0's in-memory sorter). */
static int run_bucket_auto(sdb_pipeline_cursor *c, size_t i, const ectx *e)
{
	const stage *st = &c->p->st[i];
	stage_state *s = &c->ss[i];
	uint64_t seq = 0;

	for (;;) {
		bson_t *d = NULL;
		docbuild_node *v = NULL;
		sitem *it;
		int rc = pull_keyed(c, i, &d, &v, e);

		if (rc != 0) {
			return rc;
		}
		if (d == NULL) {
			break;
		}
		if (st->gran != 0) {
			rc = agg_gran_check(v, e);
		}
		if (rc != 0) {
			docbuild_free(v);
			bson_destroy(d);
			return rc;
		}
		if (v == NULL) {
			v = v_null();
		}
		if (s->n == s->cap) {
			s->cap = s->cap == 0 ? 64 : s->cap * 2;
			s->items = sdb_realloc(s->items, s->cap * sizeof *s->items);
		}
		it = &s->items[s->n++];
		it->doc = NULL;
		it->val = v;
		it->seq = seq++;
		it->accv = NULL;
		it->naccv = 0;
		sdb_key_init(&it->key);
		/* only what the stage needs is held, not the document (as mongod's bucketAuto
		 * keeps the groupBy value and the accumulators' arguments): each accumulator's
		 * argument is evaluated now and fed to its bucket later */
		size_t argmem = 0;
		if (st->n_accs > 0) {
			it->accv = sdb_calloc(st->n_accs, sizeof *it->accv);
			it->naccv = st->n_accs;
		}
		for (size_t a = 0; a < st->n_accs && rc == 0; a++) {
			if (st->accs[a].x != NULL) {
				rc = agg_expr_eval(st->accs[a].x, d, &it->accv[a], e);
				argmem += it->accv[a] ? node_size(it->accv[a]) : 0;
			}
		}
		bson_destroy(d);
		if (rc != 0) {
			return rc; /* the item is freed with the stage (state_clear) */
		}
		rc = key_append_node(&it->key, v, e);
		if (rc != 0) {
			return rc;
		}
		s->mem += sitem_mem(it) + node_size(v) + argmem +
			  it->naccv * sizeof *it->accv;
		if (s->mem > c->p->max_mem) {
			return memory_error(e, "$bucketAuto");
		}
	}
	sort_docs(s, 0);
	if (st->n > 0) {
		double a = round((double)s->n / (double)st->n);

		s->approx = a < 1 ? 1 : (int64_t)a;
	}
	return 0;
}

/* Feed items[s->pos] to the bucket's accumulators and consume it: its value becomes *max
 * (the previous one freed) and its key *max_key. */
static int bucket_add(const stage *st, stage_state *s, acc_state *acc, docbuild_node **max,
		      sdb_key *max_key, size_t *mem, const ectx *e)
{
	sitem *it = &s->items[s->pos++];
	int rc = 0;

	(void)e;
	for (size_t a = 0; a < st->n_accs && a < it->naccv; a++) {
		/* the argument evaluated on input (run_bucket_auto); acc_add takes it */
		acc_add(&acc[a], it->accv[a], mem);
		it->accv[a] = NULL;
	}
	sitem_accv_free(it);
	docbuild_free(*max);
	*max = it->val;
	it->val = NULL;
	sdb_key_free(max_key);
	*max_key = it->key;
	sdb_key_init(&it->key);
	return rc;
}

/* The next bucket of stage i as mongod's populateNextBucket and
 * adjustBoundariesAndGetMinForNextBucket build it: the next `approx` documents (all the
 * rest for the last bucket), then every following document of an equal value (with a
 * granularity: below the max rounded up); its max is the next bucket's first value (with
 * a granularity: the rounded max), the last bucket's the largest value; with a granularity
 * a bucket's min is the previous one's max (the first's: its first value rounded down).
 * *doc NULL when no bucket is left. */
static int bucket_auto_emit(const stage *st, stage_state *s, size_t max_mem, bson_t **doc,
			    const ectx *e)
{
	acc_state *acc;
	docbuild_node *min = NULL, *max = NULL, *out, *idd;
	sdb_key max_key;
	size_t mem = 0;
	bool last;
	int rc = 0;

	*doc = NULL;
	if (s->bucket_num >= st->n || s->pos >= s->n) {
		return 0;
	}
	last = ++s->bucket_num == st->n;
	sdb_key_init(&max_key);
	acc = sdb_calloc(st->n_accs + 1, sizeof *acc);
	for (size_t a = 0; a < st->n_accs; a++) {
		acc[a].kind = st->accs[a].kind;
	}
	if (st->gran == 0) {
		min = docbuild_clone(s->items[s->pos].val);
	} else if (s->prev_max != NULL) {
		min = docbuild_clone(s->prev_max);
	} else {
		rc = agg_gran_round(st->gran, false, s->items[s->pos].val, &min, e);
	}
	if (rc == 0) {
		rc = bucket_add(st, s, acc, &max, &max_key, &mem, e);
	}
	for (int64_t k = 1; rc == 0 && s->pos < s->n && (k < s->approx || last); k++) {
		rc = bucket_add(st, s, acc, &max, &max_key, &mem, e);
	}
	if (rc == 0 && st->gran != 0) {
		docbuild_node *bound = NULL;

		rc = agg_gran_round(st->gran, true, max, &bound, e);
		while (rc == 0 && s->pos < s->n &&
		       (vcmp(bound, s->items[s->pos].val) > 0 ||
			sdb_key_cmp(&max_key, &s->items[s->pos].key) == 0)) {
			rc = bucket_add(st, s, acc, &max, &max_key, &mem, e);
		}
		if (rc == 0 && num_double(bound) == 0.0 && s->pos < s->n) {
			docbuild_free(bound);
			bound = NULL;
			rc = agg_gran_round(st->gran, false, s->items[s->pos].val, &bound, e);
		}
		docbuild_free(max);
		max = bound;
	} else if (rc == 0) {
		while (rc == 0 && s->pos < s->n && sdb_key_cmp(&max_key, &s->items[s->pos].key) == 0) {
			rc = bucket_add(st, s, acc, &max, &max_key, &mem, e);
		}
		if (rc == 0 && s->pos < s->n) {
			docbuild_free(max);
			max = docbuild_clone(s->items[s->pos].val);
		}
	}
	sdb_key_free(&max_key);
	if (rc == 0 && mem > max_mem) { /* $push / $addToSet values of one bucket */
		rc = memory_error(e, "$bucketAuto");
	}
	if (rc != 0) {
		for (size_t a = 0; a < st->n_accs; a++) {
			docbuild_free(acc[a].v);
			keyset_free(&acc[a].seen);
		}
		free(acc);
		docbuild_free(min);
		docbuild_free(max);
		return rc;
	}
	if (st->gran != 0) {
		docbuild_free(s->prev_max);
		s->prev_max = docbuild_clone(max);
	}
	/* {_id: {min, max}, <accumulators; missing is null>} */
	out = docbuild_new_doc(NULL);
	idd = docbuild_new_doc("_id");
	docbuild_set_key(min, "min");
	docbuild_push(idd, min);
	docbuild_set_key(max, "max");
	docbuild_push(idd, max);
	docbuild_push(out, idd);
	for (size_t a = 0; a < st->n_accs; a++) {
		docbuild_node *v = acc_result(&acc[a]);

		docbuild_set_key(v, st->accs[a].name);
		docbuild_push(out, v);
	}
	free(acc);
	if (node_to_heap(out, e, doc) != 0) {
		docbuild_free(out);
		return SDB_EINVAL;
	}
	docbuild_free(out);
	return 0;
}

void agg_set_field(docbuild_node *doc, const char *name, docbuild_node *v)
{
	size_t idx;

	if (docbuild_field(doc, name, strlen(name), &idx) != NULL) {
		if (v == NULL) {
			docbuild_free(docbuild_take(doc, idx));
		} else {
			docbuild_replace(doc, idx, v);
		}
		return;
	}
	if (v != NULL) {
		docbuild_set_key(v, name);
		docbuild_push(doc, v);
	}
}

/* ---- $unwind ---- */

static void set_path(docbuild_node *doc, const char *path, docbuild_node *v)
{
	const char *dot = strchr(path, '.');
	size_t len = dot != NULL ? (size_t)(dot - path) : strlen(path);
	size_t idx;
	docbuild_node *f = docbuild_field(doc, path, len, &idx);

	if (dot == NULL) {
		char *k = sdb_strndup(path, len);

		agg_set_field(doc, k, v);
		free(k);
		return;
	}
	if (f == NULL || f->type != BSON_TYPE_DOCUMENT) {
		char *k = sdb_strndup(path, len);
		docbuild_node *sub = docbuild_new_doc(NULL);

		agg_set_field(doc, k, sub);
		free(k);
		f = docbuild_field(doc, path, len, &idx);
	}
	set_path(f, dot + 1, v);
}

/* pipeline_int.h */
void agg_set_path(docbuild_node *doc, const char *path, docbuild_node *v)
{
	set_path(doc, path, v);
}

/* The value at a dotted path through documents only (no array traversal). */
static docbuild_node *unwind_value(const bson_t *doc, const char *path)
{
	bson_iter_t it, found;

	if (bson_iter_init(&it, doc) && bson_iter_find_descendant(&it, path, &found)) {
		return docbuild_from_iter(&found, false);
	}
	return NULL;
}

static int unwind_next(sdb_pipeline_cursor *c, size_t i, bson_t **doc, const ectx *e)
{
	const stage *st = &c->p->st[i];
	stage_state *s = &c->ss[i];

	for (;;) {
		if (s->cur != NULL && s->cur_arr != NULL && s->cur_i < s->cur_arr->n) {
			docbuild_node *d = docbuild_from_bson(s->cur);
			docbuild_node *el = docbuild_clone(s->cur_arr->kids[s->cur_i]);

			set_path(d, st->path, el);
			if (st->index_field != NULL) {
				set_path(d, st->index_field, v_int64((int64_t)s->cur_i));
			}
			s->cur_i++;
			if (node_to_heap(d, e, doc) != 0) {
				docbuild_free(d);
				return SDB_EINVAL;
			}
			docbuild_free(d);
			return 0;
		}
		if (s->cur != NULL) {
			bson_destroy(s->cur);
			s->cur = NULL;
		}
		docbuild_free(s->cur_arr);
		s->cur_arr = NULL;

		bson_t *in = NULL;
		int rc = pull(c, i, &in, e);

		if (rc != 0 || in == NULL) {
			*doc = NULL;
			return rc;
		}
		docbuild_node *v = unwind_value(in, st->path);

		if (v != NULL && v->type == BSON_TYPE_ARRAY && v->n > 0) {
			s->cur = in;
			s->cur_arr = v;
			s->cur_i = 0;
			continue;
		}
		bool emptyish = v == NULL || v->type == BSON_TYPE_NULL || v->type == BSON_TYPE_ARRAY ||
				v->type == BSON_TYPE_UNDEFINED;

		if (emptyish && !st->preserve) {
			docbuild_free(v);
			bson_destroy(in);
			continue;
		}
		/* a non-array value passes as is; preserved null/missing/empty too */
		if (st->index_field != NULL) {
			docbuild_node *d = docbuild_from_bson(in);

			if (v != NULL && v->type == BSON_TYPE_ARRAY) {
				/* preserved empty array: MongoDB drops the field */
				set_path(d, st->path, NULL);
			}
			set_path(d, st->index_field, v_null());
			bson_destroy(in);
			if (node_to_heap(d, e, &in) != 0) {
				docbuild_free(d);
				docbuild_free(v);
				return SDB_EINVAL;
			}
			docbuild_free(d);
		} else if (v != NULL && v->type == BSON_TYPE_ARRAY) {
			docbuild_node *d = docbuild_from_bson(in);

			set_path(d, st->path, NULL);
			bson_destroy(in);
			if (node_to_heap(d, e, &in) != 0) {
				docbuild_free(d);
				docbuild_free(v);
				return SDB_EINVAL;
			}
			docbuild_free(d);
		}
		docbuild_free(v);
		*doc = in;
		return 0;
	}
}

/* $facet: read all of stage i's input (held within max_mem bytes, as $sort), then its one
 * output document (agg_facet_run; at most a BSON document's 16 MiB, where mongod allows
 * 100 MB for a document that a later stage reduces). */
static int run_facet(sdb_pipeline_cursor *c, size_t i, bson_t **doc, const ectx *e)
{
	bson_t **docs = NULL;
	size_t n = 0, cap = 0, mem = 0;
	int rc;

	for (;;) {
		bson_t *d = NULL;

		rc = pull(c, i, &d, e);
		if (rc != 0 || d == NULL) {
			break;
		}
		if (n == cap) {
			cap = cap == 0 ? 64 : cap * 2;
			docs = sdb_realloc(docs, cap * sizeof *docs);
		}
		docs[n++] = d;
		mem += d->len;
		if (mem > c->p->max_mem) {
			rc = memory_error(e, "$facet");
			break;
		}
	}
	if (rc == 0) {
		rc = agg_facet_run(c->p->st[i].facet, docs, n, AGG_FACET_MAX_BYTES, doc, e);
	}
	for (size_t k = 0; k < n; k++) {
		bson_destroy(docs[k]);
	}
	free(docs);
	return rc;
}

/* A blocking stage ($sort, $group, $bucketAuto) reads and processes its whole input once:
 * the first pull of stage i's output runs run (run_sort, run_group, run_bucket_auto) on it,
 * later pulls find it loaded.
 * Returns: 0, or run's error (the stage is marked loaded all the same: a later pull does
 * not run it again). */
static int load_once(sdb_pipeline_cursor *c, size_t i,
		     int (*run)(sdb_pipeline_cursor *c, size_t i, const ectx *e), const ectx *e)
{
	stage_state *s = &c->ss[i];

	if (s->loaded) {
		return 0;
	}
	s->loaded = true;
	return run(c, i, e);
}

/* Pull the output of stage i-1 (the input of stage i); i == 0 reads the store. */
static int pull(sdb_pipeline_cursor *c, size_t i, bson_t **doc, const ectx *e)
{
	const stage *st;
	stage_state *s;
	int rc;

	*doc = NULL;
	if (i == 0) {
		return pull_input(c, doc, e);
	}
	st = &c->p->st[i - 1];
	s = &c->ss[i - 1];
	for (;;) {
		bson_t *in = NULL;

		switch (st->kind) {
		case S_SORT:
			rc = load_once(c, i - 1, run_sort, e);
			if (rc != 0) {
				return rc;
			}
			if (s->pos < s->n) {
				sdb_key_free(&s->items[s->pos].key);
				*doc = s->items[s->pos++].doc;
			}
			return 0;
		case S_GROUP:
			rc = load_once(c, i - 1, run_group, e);
			if (rc != 0) {
				return rc;
			}
			if (s->pos < s->n_groups) {
				*doc = group_emit(st, s, e);
				if (*doc == NULL) {
					return SDB_EINVAL;
				}
			}
			return 0;
		case S_BUCKET_AUTO:
			rc = load_once(c, i - 1, run_bucket_auto, e);
			if (rc != 0) {
				return rc;
			}
			return bucket_auto_emit(st, s, c->p->max_mem, doc, e);
		case S_SAMPLE:
			if (!s->loaded) {
				/* size 0: nothing, the input unread (mongod disposes of it) */
				s->loaded = true;
				s->sampler = agg_sampler_new(st->n, c->p->max_mem, c->p->sample_key_in,
							     c->p->sample_key_out && i == c->p->n);
				for (;;) {
					bson_t *d = NULL;

					if (st->n == 0) {
						break;
					}
					rc = pull(c, i - 1, &d, e);
					if (rc != 0) {
						return rc;
					}
					if (d == NULL) {
						break;
					}
					rc = agg_sampler_add(s->sampler, d, e);
					if (rc != 0) {
						return rc;
					}
				}
			}
			*doc = agg_sampler_next(s->sampler);
			return 0;
		case S_UNWIND:
			return unwind_next(c, i - 1, doc, e);
		case S_FACET:
			if (s->loaded) {
				return 0; /* its one document is out */
			}
			s->loaded = true;
			return run_facet(c, i - 1, doc, e);
		case S_UNION_WITH: {
			const bson_t *d = NULL;

			if (!s->loaded) {
				rc = pull(c, i - 1, doc, e);
				if (rc != 0 || *doc != NULL) {
					return rc;
				}
				s->loaded = true;
				rc = agg_union_open(c->p, st, &s->src, e);
				if (rc != 0) {
					return rc;
				}
				s->src_open = true;
			}
			if (!s->src_open) {
				return 0;
			}
			rc = s->src.next(s->src.ctx, &d, e->code, e->err, e->errlen);
			if (rc < 0) {
				if (e->code != NULL && *e->code == 0) {
					*e->code = C_INTERNAL;
				}
				return rc;
			}
			if (rc == 0 || d == NULL) {
				if (s->src.close != NULL) {
					s->src.close(s->src.ctx);
				}
				s->src_open = false;
				return 0;
			}
			*doc = bson_copy(d);
			return 0;
		}
		case S_LIMIT:
			if (s->count >= st->n) {
				return 0;
			}
			rc = pull(c, i - 1, doc, e);
			if (rc == 0 && *doc != NULL) {
				s->count++;
			}
			return rc;
		default:
			break;
		}
		rc = pull(c, i - 1, &in, e);
		if (rc != 0 || in == NULL) {
			return rc;
		}
		switch (st->kind) {
		case S_MATCH:
			rc = sdb_matcher_eval(st->m, in, e->code, e->err, e->errlen);
			if (rc == 1) {
				*doc = in;
				return 0;
			}
			bson_destroy(in);
			if (rc < 0) {
				return rc; /* a $expr failed */
			}
			continue;
		case S_SKIP:
			if (s->count < st->n) {
				s->count++;
				bson_destroy(in);
				continue;
			}
			*doc = in;
			return 0;
		case S_PROJECT: {
			bson_t *r = bson_new();

			rc = sdb_projection_eval(st->proj, in, r, e->code, e->err, e->errlen);
			bson_destroy(in);
			if (rc != 0) {
				bson_destroy(r);
				return rc;
			}
			*doc = r;
			return 0;
		}
		case S_LOOKUP:
		case S_GRAPH_LOOKUP: {
			docbuild_node *arr = NULL, *d;

			rc = st->kind == S_LOOKUP ? agg_lookup_one(c->p, st, in, &s->lookups, &arr, e)
						  : agg_graph_one(c->p, st, in, &arr, e);
			if (rc != 0) {
				bson_destroy(in);
				return rc;
			}
			d = docbuild_from_bson(in);
			bson_destroy(in);
			set_path(d, st->as, arr);
			if (node_to_heap(d, e, doc) != 0) {
				docbuild_free(d);
				return SDB_EINVAL;
			}
			docbuild_free(d);
			return 0;
		}
		case S_REDACT: {
			bson_t *r = NULL;

			rc = agg_redact_doc(st->id, in, &r, e);
			bson_destroy(in);
			if (rc != 0) {
				return rc;
			}
			if (r == NULL) {
				continue; /* pruned */
			}
			*doc = r;
			return 0;
		}
		case S_REPLACE_ROOT: {
			docbuild_node *v = NULL;

			rc = agg_expr_eval(st->id, in, &v, e);
			bson_destroy(in);
			if (rc != 0) {
				return rc;
			}
			if (ntype(v) != BSON_TYPE_DOCUMENT) {
				rc = efail(e, 40228,
					   "'newRoot' expression must evaluate to an object, but resulting value was of type: %s",
					   type_name(ntype(v)));
				docbuild_free(v);
				return rc;
			}
			if (node_to_heap(v, e, doc) != 0) {
				docbuild_free(v);
				return SDB_EINVAL;
			}
			docbuild_free(v);
			return 0;
		}
		default:
			bson_destroy(in);
			return efail(e, C_INTERNAL, "unhandled stage");
		}
	}
}

int sdb_pipeline_cursor_next(sdb_pipeline_cursor *c, const bson_t **doc, int *code, char *err,
			     size_t errlen)
{
	ectx e = {code, err, errlen};
	bson_t *d = NULL;
	int rc;

	*doc = NULL;
	if (code != NULL) {
		*code = 0;
	}
	if (c->done_rc <= 0) {
		if (code != NULL) {
			*code = c->done_code;
		}
		if (err != NULL && errlen > 0) {
			snprintf(err, errlen, "%s", c->done_err);
		}
		return c->done_rc;
	}
	if (c->out != NULL) {
		bson_destroy(c->out);
		c->out = NULL;
	}
	rc = pull(c, c->p->n, &d, &e);
	if (rc != 0) {
		if (code != NULL && *code == 0) {
			*code = C_INTERNAL;
		}
		c->done_rc = rc;
		c->done_code = code != NULL ? *code : C_INTERNAL;
		snprintf(c->done_err, sizeof c->done_err, "%s", err != NULL ? err : "");
		return rc;
	}
	if (d == NULL) {
		c->done_rc = 0;
		return 0;
	}
	c->out = d;
	*doc = d;
	return 1;
}

typedef struct one_doc {
	const bson_t *doc;
	bool given;
} one_doc;

static int one_next(void *ctx, const bson_t **doc, int *code, char *err, size_t errlen)
{
	one_doc *o = ctx;

	(void)code;
	(void)err;
	(void)errlen;
	if (o->given)
		return 0;
	o->given = true;
	*doc = o->doc;
	return 1;
}

int sdb_pipeline_run_one(const sdb_pipeline *p, const bson_t *doc, bson_t **out, int *code,
			 char *err, size_t errlen)
{
	one_doc in = {doc, false};
	sdb_pipeline_cursor *c;
	const bson_t *r;
	int rc;

	*out = NULL;
	*code = 0;
	sdb_pipeline_open(p, one_next, &in, &c);
	rc = sdb_pipeline_cursor_next(c, &r, code, err, errlen);
	if (rc == 1)
		*out = bson_copy(r);
	sdb_pipeline_cursor_free(c);
	return rc;
}
