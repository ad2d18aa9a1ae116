/* `stripedb ctl migrate` of several chunks at once and import filters (issue #17; usage in
 * the comment at the top of cli/migrate.c):
 *
 *   migrate --plan FILE|-            {"moves": [{"ns": "app.c", "chunk": 3, "to": "shard-c"},
 *                                     {"ns": "app.c", "filter": {"t": "acme"}, "to": "shard-d"}]}
 *   migrate DB.COLL --chunks A,B,C --to SHARD
 *   migrate DB.COLL --filter JSON --to SHARD
 *
 * The whole plan is checked before anything changes in metadata: every chunk exists in the
 * routing table, every target is a known shard, no chunk is named twice or lies in a filter's
 * range, no chunk moves to its own shard, every filter selects shard-key ranges. A bad plan
 * exits 2 with one line on stderr. Then the filters' ranges are cut out of their chunks
 * (metadata splitChunk, as `ctl chunk split`; both halves keep the parent's token, so the
 * shards' filtering metadata, which holds the unsplit range, still covers exactly what each
 * shard owns: src/shard/filtering.c), and one migration is registered per chunk, every spec
 * carrying the plan's "group" id (`ctl migration list --group G`). When registering move k
 * fails, the k-1 registered before are aborted (as `ctl migration rollback`) and the exit
 * code is 1.
 *
 * Import filters are sound only when they select whole shard-key ranges: routing is by
 * shard-key range, so a document a filter left out of a moved chunk would stay routed to a
 * shard that no longer holds it. Accepted: equality on a proper prefix of a ranged shard key
 * ({t: "acme"} on {t: 1, k: 1}), optionally followed by a range on the next key field with
 * both bounds of one type ({$gte|$gt: A, $lt|$lte: B}, numbers or strings: MongoDB's
 * comparison operators match one type only, a key range covers every type in between). The
 * remaining key fields of a bound are MinKey / MaxKey, as MongoDB fills them. Anything else
 * (a field outside the key, a hashed key, $or, $in, $regex, ...) is refused, saying why.
 */
#include <errno.h>
#include <stdarg.h>
#include <inttypes.h>
#include <math.h>
#include <mongoc/mongoc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/migrate_int.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/shardref.h"
#include "raft/migstate.h"
#include "routing/route.h"

#define PLAN_MAX_BYTES (16u << 20) /* a plan file larger than this is refused */
#define PLAN_MAX_MOVES 100000

/* One move of the plan: a chunk (chunk > 0) or a filter's range [lo, hi) of ns to `to`. */
typedef struct plan_move {
	char ns[256], to[64], from[64];
	int64_t chunk;
	bson_t *filter, *lo, *hi; /* heap; NULL for a chunk move */
} plan_move;

/* The routing table of one namespace named by the plan. */
typedef struct plan_ns {
	char ns[256];
	bson_t key; /* the shard key pattern */
	bool hashed;
	chunk_row *rows;
	size_t n;
} plan_ns;

typedef struct plan {
	plan_move *m;
	size_t n;
	plan_ns *ns;
	size_t nns;
	bool file; /* the moves came from --plan: messages name "plan: move K" */
	char err[1024]; /* the one line of a bad plan */
} plan;

static int bad(plan *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(plan *p, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(p->err, sizeof p->err, fmt, ap);
	va_end(ap);
	return 2;
}

static plan_move *add_move(plan *p, const char *ns, const char *to)
{
	p->m = sdb_realloc(p->m, (p->n + 1) * sizeof *p->m);
	plan_move *m = &p->m[p->n++];
	memset(m, 0, sizeof *m);
	snprintf(m->ns, sizeof m->ns, "%s", ns);
	snprintf(m->to, sizeof m->to, "%s", to);
	return m;
}

static void plan_free(plan *p)
{
	for (size_t i = 0; i < p->n; i++) {
		if (p->m[i].filter)
			bson_destroy(p->m[i].filter);
		if (p->m[i].lo)
			bson_destroy(p->m[i].lo);
		if (p->m[i].hi)
			bson_destroy(p->m[i].hi);
	}
	free(p->m);
	for (size_t i = 0; i < p->nns; i++) {
		bson_destroy(&p->ns[i].key);
		cmig_free_chunks(p->ns[i].rows, p->ns[i].n);
	}
	free(p->ns);
}

/* Read a plan file (or stdin for "-") into a NUL-terminated heap buffer. Returns: 0, or 2
 * with p->err set. */
static int read_file(plan *p, const char *path, char **out)
{
	FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
	size_t len = 0, cap = 4096;
	char *buf;
	if (!f)
		return bad(p, "--plan %s: %s", path, strerror(errno));
	buf = sdb_malloc(cap);
	for (;;) {
		if (len + 1 == cap) {
			if (cap > PLAN_MAX_BYTES) {
				free(buf);
				if (f != stdin)
					fclose(f);
				return bad(p, "--plan %s: larger than %u bytes", path, PLAN_MAX_BYTES);
			}
			cap *= 2;
			buf = sdb_realloc(buf, cap);
		}
		size_t r = fread(buf + len, 1, cap - 1 - len, f);
		len += r;
		if (r == 0)
			break;
	}
	int ferr = ferror(f);
	if (f != stdin)
		fclose(f);
	if (ferr) {
		free(buf);
		return bad(p, "--plan %s: read error", path);
	}
	buf[len] = '\0';
	*out = buf;
	return 0;
}

/* The moves of a plan document {"moves": [{ns, to, chunk | filter}, ...]}. Returns: 0 or 2
 * (p->err). */
static int parse_plan_doc(plan *p, const bson_t *doc)
{
	bson_iter_t it, arr;
	bool have_moves = false;
	if (!bson_iter_init(&it, doc))
		return bad(p, "plan: not a document");
	while (bson_iter_next(&it)) {
		if (strcmp(bson_iter_key(&it), "moves") != 0)
			return bad(p, "plan: unknown field '%s' (a plan is {\"moves\": [...]})",
				   bson_iter_key(&it));
		if (!BSON_ITER_HOLDS_ARRAY(&it) || !bson_iter_recurse(&it, &arr))
			return bad(p, "plan: moves must be an array");
		have_moves = true;
	}
	if (!have_moves)
		return bad(p, "plan: no moves array (a plan is {\"moves\": [...]})");
	size_t k = 0;
	while (bson_iter_next(&arr)) {
		bson_t mv;
		bson_iter_t f;
		const char *ns = NULL, *to = NULL;
		int64_t chunk = 0;
		bool have_chunk = false;
		bson_t filt;
		bool have_filter = false;
		k++;
		if (k > PLAN_MAX_MOVES)
			return bad(p, "plan: more than %d moves", PLAN_MAX_MOVES);
		if (!sdb_bson_iter_doc(&arr, &mv) || !bson_iter_init(&f, &mv))
			return bad(p, "plan: move %zu is not a document", k);
		while (bson_iter_next(&f)) {
			const char *key = bson_iter_key(&f);
			if (strcmp(key, "ns") == 0 && BSON_ITER_HOLDS_UTF8(&f)) {
				ns = bson_iter_utf8(&f, NULL);
			} else if (strcmp(key, "to") == 0 && BSON_ITER_HOLDS_UTF8(&f)) {
				to = bson_iter_utf8(&f, NULL);
			} else if (strcmp(key, "chunk") == 0) {
				if (!sdb_bson_as_int64(&f, &chunk) || chunk <= 0)
					return bad(p, "plan: move %zu: chunk must be a chunk id (an "
						      "integer > 0)",
						   k);
				have_chunk = true;
			} else if (strcmp(key, "filter") == 0) {
				if (!sdb_bson_iter_doc(&f, &filt))
					return bad(p, "plan: move %zu: filter must be a document", k);
				have_filter = true;
			} else {
				return bad(p, "plan: move %zu: unknown or mistyped field '%s' (a move is "
					      "{ns, chunk | filter, to})",
					   k, key);
			}
		}
		if (!ns || !strchr(ns, '.') || strlen(ns) >= sizeof p->m->ns)
			return bad(p, "plan: move %zu needs ns \"DB.COLL\"", k);
		if (!to || !*to || strlen(to) >= sizeof p->m->to)
			return bad(p, "plan: move %zu needs to (a shard id)", k);
		if (have_chunk == have_filter)
			return bad(p, "plan: move %zu needs either chunk or filter", k);
		plan_move *m = add_move(p, ns, to);
		m->chunk = have_chunk ? chunk : 0;
		m->filter = have_filter ? bson_copy(&filt) : NULL;
	}
	if (k == 0)
		return bad(p, "plan: no moves");
	return 0;
}

/* The moves given on the command line or in the plan file into p. Returns: 0 or 2. */
static int collect(plan *p, const char *ns, const char *to, const char *planf,
		   const char *chunks, const char *filter)
{
	bson_error_t e;
	if (planf) {
		char *text = NULL;
		int rc = read_file(p, planf, &text);
		if (rc != 0)
			return rc;
		bson_t *doc = bson_new_from_json((const uint8_t *)text, -1, &e);
		free(text);
		if (!doc)
			return bad(p, "plan: malformed JSON: %s", e.message);
		rc = parse_plan_doc(p, doc);
		bson_destroy(doc);
		p->file = true;
		return rc;
	}
	if (strlen(ns) >= sizeof p->m->ns || strlen(to) >= sizeof p->m->to)
		return bad(p, "namespace or shard id too long");
	if (filter) {
		const char *f = filter + strspn(filter, " \t\r\n");
		if (*f != '{')
			return bad(p, "--filter: a filter is a JSON document ({...})");
		bson_t *doc = bson_new_from_json((const uint8_t *)filter, -1, &e);
		if (!doc)
			return bad(p, "--filter: malformed JSON: %s", e.message);
		add_move(p, ns, to)->filter = doc;
		return 0;
	}
	/* comma-separated ids; an empty item (",,", a leading or trailing comma) is an error */
	char *list = sdb_strdup(chunks), *cur = list;
	int rc = 0;
	for (;;) {
		char *comma = strchr(cur, ',');
		long long id;
		if (comma)
			*comma = '\0';
		if (cli_parse_id(cur, &id) != 0 || id <= 0) {
			rc = bad(p, "--chunks: '%s' is not a chunk id", cur);
			break;
		}
		add_move(p, ns, to)->chunk = id;
		if (!comma)
			break;
		cur = comma + 1;
	}
	free(list);
	if (rc == 0 && p->n == 0)
		rc = bad(p, "--chunks: no chunk id");
	return rc;
}

/* The routing table of ns, loaded once. Returns: it, or NULL (2, p->err) when ns is not a
 * sharded collection, or NULL with *cluster_err set when metadata could not be read. */
static plan_ns *ns_table(plan *p, mongoc_client_t *c, const char *ns, int *rc)
{
	for (size_t i = 0; i < p->nns; i++)
		if (strcmp(p->ns[i].ns, ns) == 0)
			return &p->ns[i];
	bson_t rt, key;
	bson_iter_t it;
	bson_error_t e;
	bson_t cmd = BSON_INITIALIZER, reply;
	/* a probe without the error line of cmig_run: an unknown namespace is a bad plan */
	BSON_APPEND_UTF8(&cmd, "getRoutingTable", ns);
	BSON_APPEND_INT64(&cmd, "sinceVersion", 0);
	bool ok = mongoc_client_command_simple(c, "admin", &cmd, NULL, &reply, &e);
	bson_destroy(&cmd);
	bson_destroy(&reply);
	if (!ok) {
		if (e.domain == MONGOC_ERROR_SERVER) {
			*rc = bad(p, "%s: %s", ns, e.message);
		} else {
			fprintf(stderr, "stripedb ctl migrate: %s\n", e.message);
			*rc = 1;
		}
		return NULL;
	}
	if (cmig_routing(c, ns, &rt) != 0) {
		bson_destroy(&rt);
		*rc = 1;
		return NULL;
	}
	if (!cmig_sub(&rt, "key", &key) || bson_empty(&key)) {
		bson_destroy(&rt);
		*rc = bad(p, "%s is not a sharded collection", ns);
		return NULL;
	}
	p->ns = sdb_realloc(p->ns, (p->nns + 1) * sizeof *p->ns);
	plan_ns *t = &p->ns[p->nns++];
	memset(t, 0, sizeof *t);
	snprintf(t->ns, sizeof t->ns, "%s", ns);
	bson_copy_to(&key, &t->key);
	t->hashed = bson_iter_init_find(&it, &rt, "hashed") && bson_iter_as_bool(&it);
	if (bson_iter_init(&it, &key))
		while (bson_iter_next(&it))
			if (BSON_ITER_HOLDS_UTF8(&it) &&
			    strcmp(bson_iter_utf8(&it, NULL), "hashed") == 0)
				t->hashed = true;
	bson_destroy(&rt);
	t->n = cmig_load_chunks(c, ns, &t->rows);
	if (t->n == (size_t)-1) {
		t->n = 0;
		*rc = 1;
		return NULL;
	}
	return t;
}

/* Reload ns's chunks (after a split). Returns: 0 or 1. */
static int ns_reload(mongoc_client_t *c, plan_ns *t)
{
	cmig_free_chunks(t->rows, t->n);
	t->n = cmig_load_chunks(c, t->ns, &t->rows);
	if (t->n == (size_t)-1) {
		t->n = 0;
		t->rows = NULL;
		return 1;
	}
	return 0;
}

static const char *const WHY =
	"documents the filter leaves out of a moved chunk would stay routed to a shard that no "
	"longer holds them";

/* The type class of a range bound: 1 number, 2 string, 0 anything else (refused). Only
 * values every op version of metadata orders as MongoDB does become chunk bounds: below op
 * version 4 (raft/fsm.c cmp_value_v1: int32/int64/double by value, strings bytewise) a
 * Decimal128 reads as 0 and a NaN equals every number, so a split at one would be
 * misplaced (a reviewer's inverted chunk). From 4 metadata orders them as MongoDB does
 * (raft/migstate.h), but this plan does not read the cluster's op version, so it refuses
 * them whatever it is. */
static int bound_class(const bson_iter_t *it)
{
	if (BSON_ITER_HOLDS_INT32(it) || BSON_ITER_HOLDS_INT64(it) ||
	    (BSON_ITER_HOLDS_DOUBLE(it) && !isnan(bson_iter_double(it))))
		return 1;
	if (BSON_ITER_HOLDS_UTF8(it))
		return 2;
	return 0;
}

/* May an equality value stand for one point of the key order, as metadata orders chunk
 * bounds (bound_class)? Documents, arrays, regexes, MinKey / MaxKey may not, nor the values
 * metadata does not order by value (Decimal128, NaN, binary data, timestamps). */
static bool eq_value_ok(const bson_iter_t *it)
{
	switch (bson_iter_type(it)) {
	case BSON_TYPE_DOUBLE:
		return !isnan(bson_iter_double(it));
	case BSON_TYPE_UTF8:
	case BSON_TYPE_OID:
	case BSON_TYPE_BOOL:
	case BSON_TYPE_DATE_TIME:
	case BSON_TYPE_NULL:
	case BSON_TYPE_INT32:
	case BSON_TYPE_INT64:
		return true;
	default:
		return false;
	}
}

/* One key field's condition in a filter. */
typedef struct key_cond {
	int kind; /* 0 none, 1 equality, 2 range */
	bson_value_t eq, lo, hi;
	bool has_eq, lo_incl, hi_incl, have_lo, have_hi; /* which values are set (owned) */
} key_cond;

/* Append bound field values: conds[0..j) equalities, then field j's value v (when v), then
 * fill (MinKey or MaxKey) for the rest; field names from the key pattern. */
static bson_t *make_bound(const bson_t *keypat, const key_cond *conds, size_t j,
			  const bson_value_t *v, bson_type_t fill)
{
	bson_t *b = bson_new();
	bson_iter_t it;
	size_t i = 0;
	bson_iter_init(&it, keypat);
	while (bson_iter_next(&it)) {
		const char *f = bson_iter_key(&it);
		if (i < j)
			bson_append_value(b, f, -1, &conds[i].eq);
		else if (i == j && v)
			bson_append_value(b, f, -1, v);
		else if (fill == BSON_TYPE_MINKEY)
			bson_append_minkey(b, f, -1);
		else
			bson_append_maxkey(b, f, -1);
		i++;
	}
	return b;
}

/* Translate m->filter on table t into m->lo, m->hi. Returns: 0, or 2 with p->err saying why
 * the filter is refused. */
static int filter_range(plan *p, plan_move *m, const plan_ns *t, size_t k)
{
	char where[300];
	bson_iter_t it, kit;
	size_t nf = 0;
	key_cond conds[32];
	int rc = 0;
	if (p->file)
		snprintf(where, sizeof where, "plan: move %zu: filter", k + 1);
	else
		snprintf(where, sizeof where, "--filter");
	if (t->hashed)
		return bad(p, "%s: %s has a hashed shard key: documents of a key range are spread over "
			      "every chunk, so no filter selects whole chunks (%s)",
			   where, m->ns, WHY);
	memset(conds, 0, sizeof conds);
	bson_iter_init(&kit, &t->key);
	while (bson_iter_next(&kit))
		nf++;
	if (nf == 0 || nf > 32)
		return bad(p, "%s: %s: unexpected shard key", where, m->ns);
	if (bson_empty(m->filter))
		return bad(p, "%s: an empty filter selects the whole collection: use --chunks or "
			      "shard drain",
			   where);
	bson_iter_init(&it, m->filter);
	while (bson_iter_next(&it)) {
		const char *f = bson_iter_key(&it);
		size_t pos = 0;
		bool found = false;
		if (f[0] == '$') {
			rc = bad(p, "%s: operator %s is not supported: only equality on a prefix of the "
				    "shard key, then one range on the next key field, selects whole key "
				    "ranges (%s)",
				 where, f, WHY);
			goto out;
		}
		bson_iter_init(&kit, &t->key);
		while (bson_iter_next(&kit) && !found) {
			if (strcmp(bson_iter_key(&kit), f) == 0)
				found = true;
			else
				pos++;
		}
		if (!found) {
			rc = bad(p, "%s: field '%s' is not in the shard key of %s: routing is by "
				    "shard-key range, and %s",
				 where, f, m->ns, WHY);
			goto out;
		}
		key_cond *kc = &conds[pos];
		if (kc->kind) {
			rc = bad(p, "%s: field '%s' is given twice", where, f);
			goto out;
		}
		if (BSON_ITER_HOLDS_DOCUMENT(&it)) {
			bson_iter_t op;
			if (!bson_iter_recurse(&it, &op)) {
				rc = bad(p, "%s: field '%s': corrupt document", where, f);
				goto out;
			}
			int nops = 0;
			while (bson_iter_next(&op)) {
				const char *o = bson_iter_key(&op);
				nops++;
				if (strcmp(o, "$eq") == 0 && eq_value_ok(&op) && !kc->kind) {
					kc->kind = 1;
					kc->has_eq = true;
					bson_value_copy(bson_iter_value(&op), &kc->eq);
				} else if ((strcmp(o, "$gte") == 0 || strcmp(o, "$gt") == 0) &&
					   bound_class(&op) && !kc->have_lo && !kc->has_eq) {
					kc->kind = 2;
					kc->have_lo = true;
					kc->lo_incl = o[3] == 'e';
					bson_value_copy(bson_iter_value(&op), &kc->lo);
				} else if ((strcmp(o, "$lte") == 0 || strcmp(o, "$lt") == 0) &&
					   bound_class(&op) && !kc->have_hi && !kc->has_eq) {
					kc->kind = 2;
					kc->have_hi = true;
					kc->hi_incl = o[3] == 'e';
					bson_value_copy(bson_iter_value(&op), &kc->hi);
				} else if (kc->kind && (kc->has_eq || strcmp(o, "$eq") == 0)) {
					rc = bad(p, "%s: field '%s': give either $eq or a range, not both",
						 where, f);
					goto out;
				} else {
					rc = bad(p, "%s: field '%s': %s%s is not supported: only equality "
						    "and one range ($gte/$gt with $lt/$lte; int, long, double "
						    "or string bounds: metadata does not order Decimal128 or NaN "
						    "chunk bounds) select whole shard-key ranges (%s)",
						 where, f, o[0] == '$' ? "" : "an embedded document ",
						 o[0] == '$' ? o : "value", WHY);
					goto out;
				}
			}
			if (nops == 0 || (kc->kind == 1 && nops > 1)) {
				rc = bad(p, "%s: field '%s': give one $eq, or a range", where, f);
				goto out;
			}
		} else if (eq_value_ok(&it)) {
			kc->kind = 1;
			kc->has_eq = true;
			bson_value_copy(bson_iter_value(&it), &kc->eq);
		} else {
			bson_type_t ty = bson_iter_type(&it);
			rc = bad(p, "%s: field '%s': %s value does not select one shard-key range (%s)",
				 where, f,
				 ty == BSON_TYPE_REGEX	   ? "a regex"
				 : ty == BSON_TYPE_ARRAY   ? "an array"
				 : ty == BSON_TYPE_MINKEY  ? "a MinKey"
				 : ty == BSON_TYPE_MAXKEY  ? "a MaxKey"
				 : ty == BSON_TYPE_DECIMAL128 ? "a Decimal128"
				 : ty == BSON_TYPE_DOUBLE  ? "a NaN"
							   : "this type of",
				 WHY);
			goto out;
		}
	}
	/* equality on a prefix 0..j), then at most a range on field j, nothing after */
	size_t j = 0;
	while (j < nf && conds[j].kind == 1)
		j++;
	bool range = j < nf && conds[j].kind == 2;
	for (size_t i = j + (range ? 1 : 0); i < nf; i++)
		if (conds[i].kind) {
			rc = bad(p, "%s: the conditions must be equality on a prefix of the shard key of "
				    "%s (then at most one range on the next field); a condition on a "
				    "later key field alone does not select a key range (%s)",
				 where, m->ns, WHY);
			goto out;
		}
	if (!range) {
		if (j == nf) {
			rc = bad(p, "%s: equality on every shard key field selects one key value, not "
				    "a range of chunks: move its chunk with --chunk",
				 where);
			goto out;
		}
		m->lo = make_bound(&t->key, conds, j, NULL, BSON_TYPE_MINKEY);
		m->hi = make_bound(&t->key, conds, j, NULL, BSON_TYPE_MAXKEY);
	} else {
		key_cond *kc = &conds[j];
		bool last = j + 1 == nf;
		bson_iter_t a, b;
		if (!kc->have_lo || !kc->have_hi) {
			rc = bad(p, "%s: a range needs both a lower ($gte/$gt) and an upper ($lt/$lte) "
				    "bound: MongoDB's comparison operators match one type only, an open "
				    "shard-key range covers every type above or below",
				 where);
			goto out;
		}
		bson_t la = BSON_INITIALIZER, lb = BSON_INITIALIZER;
		bson_append_value(&la, "v", 1, &kc->lo);
		bson_append_value(&lb, "v", 1, &kc->hi);
		bson_iter_init_find(&a, &la, "v");
		bson_iter_init_find(&b, &lb, "v");
		bool same = bound_class(&a) == bound_class(&b);
		bson_destroy(&la);
		bson_destroy(&lb);
		if (!same) {
			rc = bad(p, "%s: the two bounds of a range must be of one type (numbers or "
				    "strings)",
				 where);
			goto out;
		}
		if (last && (!kc->lo_incl || kc->hi_incl)) {
			rc = bad(p, "%s: on the last shard key field only $gte with $lt is a key range "
				    "(no key lies just above a value)",
				 where);
			goto out;
		}
		m->lo = make_bound(&t->key, conds, j, &kc->lo,
				   kc->lo_incl ? BSON_TYPE_MINKEY : BSON_TYPE_MAXKEY);
		m->hi = make_bound(&t->key, conds, j, &kc->hi,
				   kc->hi_incl ? BSON_TYPE_MAXKEY : BSON_TYPE_MINKEY);
		if (route_key_cmp(m->lo, m->hi) >= 0) {
			rc = bad(p, "%s: the range is empty", where);
			goto out;
		}
	}
out:
	for (size_t i = 0; i < nf; i++) {
		if (conds[i].has_eq)
			bson_value_destroy(&conds[i].eq);
		if (conds[i].have_lo)
			bson_value_destroy(&conds[i].lo);
		if (conds[i].have_hi)
			bson_value_destroy(&conds[i].hi);
	}
	return rc;
}

static bool overlaps(const bson_t *amin, const bson_t *amax, const bson_t *bmin,
		     const bson_t *bmax)
{
	return route_key_cmp(amin, bmax) < 0 && route_key_cmp(bmin, amax) < 0;
}

/* The shards registered in metadata (listShards, common/shardref.h) into *out, *n.
 * Returns: 0, or 1 after an error line. */
static int list_shards(mongoc_client_t *c, sdb_shard_ref **out, size_t *n)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	BSON_APPEND_INT32(&cmd, "listShards", 1);
	int rc = cmig_run(c, &cmd, &reply);
	bson_destroy(&cmd);
	*out = NULL;
	*n = 0;
	if (rc == 0)
		sdb_shard_refs_parse(&reply, out, n);
	bson_destroy(&reply);
	return rc == 0 ? 0 : 1;
}

/* Every migration in metadata (listMigrations) into *out (initialised either way; the
 * caller destroys it). Returns: 0, or -1 after an error line. */
static int list_migrations(mongoc_client_t *c, bson_t *out)
{
	bson_t cmd = BSON_INITIALIZER;
	BSON_APPEND_INT32(&cmd, "listMigrations", 1);
	int rc = cmig_run(c, &cmd, out);
	bson_destroy(&cmd);
	return rc == 0 ? 0 : -1;
}

/* Is chunk (ns, id) the chunk of a migration of migs (a listMigrations reply) that has not
 * ended? Its id into busy. Returns: 1 yes, 0 no. */
static int chunk_busy_in(const bson_t *migs, const char *ns, int64_t id, char *busy, size_t n)
{
	bson_t arr;
	bson_iter_t it;
	if (!cmig_sub(migs, "migrations", &arr) || !bson_iter_init(&it, &arr))
		return 0;
	while (bson_iter_next(&it)) {
		bson_t m, spec;
		char st[32], mns[256];
		if (!sdb_bson_iter_doc(&it, &m) || !cmig_sub(&m, "spec", &spec))
			continue;
		cmig_sval(&m, "state", st, sizeof st);
		if (migrate_state_terminal(migrate_state_parse(st)))
			continue;
		if (strcmp(cmig_sval(&spec, "ns", mns, sizeof mns), ns) == 0 &&
		    cmig_ival(&spec, "chunk") == id) {
			cmig_sval(&m, "id", busy, n);
			return 1;
		}
	}
	return 0;
}

/* chunk_busy_in against metadata now. Returns: 1 yes, 0 no, -1 metadata could not be
 * read (an error line printed). */
static int chunk_busy(mongoc_client_t *c, const char *ns, int64_t id, char *busy, size_t n)
{
	bson_t migs;
	int rc = list_migrations(c, &migs);
	if (rc == 0)
		rc = chunk_busy_in(&migs, ns, id, busy, n);
	bson_destroy(&migs);
	return rc;
}

/* Check the whole plan against metadata (p->err and 2 when bad, 1 on a cluster error). */
static int validate(plan *p, mongoc_client_t *c)
{
	sdb_shard_ref *shards;
	size_t ns;
	int rc = list_shards(c, &shards, &ns);
	if (rc != 0)
		return rc;
	for (size_t k = 0; k < p->n && rc == 0; k++) {
		plan_move *m = &p->m[k];
		char where[64] = "";
		bool known = false;
		if (p->file)
			snprintf(where, sizeof where, "plan: move %zu: ", k + 1);
		for (size_t i = 0; i < ns && !known; i++)
			known = strcmp(shards[i].id, m->to) == 0;
		if (!known) {
			rc = bad(p, "%sunknown shard '%s'", where, m->to);
			break;
		}
		plan_ns *t = ns_table(p, c, m->ns, &rc);
		if (!t) {
			if (rc == 2 && p->file) {
				char tmp[sizeof p->err];
				snprintf(tmp, sizeof tmp, "%s", p->err);
				bad(p, "%s%s", where, tmp);
			}
			break;
		}
		if (m->filter) {
			rc = filter_range(p, m, t, k);
			continue;
		}
		const chunk_row *r = NULL;
		for (size_t i = 0; i < t->n && !r; i++)
			if (t->rows[i].id == m->chunk)
				r = &t->rows[i];
		if (!r) {
			rc = bad(p, "%sno chunk %" PRId64 " in %s", where, m->chunk, m->ns);
			break;
		}
		if (strcmp(r->shard, m->to) == 0) {
			rc = bad(p, "%schunk %" PRId64 " of %s is already on %s", where, m->chunk, m->ns,
				 m->to);
			break;
		}
		snprintf(m->from, sizeof m->from, "%s", r->shard);
	}
	/* no chunk twice, no chunk inside a filter's range, no two overlapping ranges */
	for (size_t a = 0; a < p->n && rc == 0; a++)
		for (size_t b = a + 1; b < p->n && rc == 0; b++) {
			plan_move *x = &p->m[a], *y = &p->m[b];
			if (strcmp(x->ns, y->ns) != 0)
				continue;
			if (!x->filter && !y->filter) {
				if (x->chunk == y->chunk)
					rc = bad(p, "chunk %" PRId64 " of %s is moved twice (moves %zu and "
						    "%zu)",
						 x->chunk, x->ns, a + 1, b + 1);
			} else if (x->filter && y->filter) {
				if (overlaps(x->lo, x->hi, y->lo, y->hi))
					rc = bad(p, "the filters of moves %zu and %zu overlap", a + 1, b + 1);
			} else {
				plan_move *f = x->filter ? x : y, *ch = x->filter ? y : x;
				plan_ns *t = ns_table(p, c, ch->ns, &rc);
				for (size_t i = 0; t && i < t->n; i++)
					if (t->rows[i].id == ch->chunk &&
					    overlaps(t->rows[i].min, t->rows[i].max, f->lo, f->hi))
						rc = bad(p, "chunk %" PRId64 " of %s overlaps the filter of "
							    "move %zu",
							 ch->chunk, ch->ns, (size_t)(f - p->m) + 1);
			}
		}
	/* a chunk a migration still holds (the plan would move it, or cut a filter's range out
	 * of it): refused before anything changes (after the checks of a bad plan: exit 2
	 * first), against one listMigrations */
	if (rc == 0) {
		bson_t migs;
		if (list_migrations(c, &migs) != 0)
			rc = 1;
		for (size_t k = 0; k < p->n && rc == 0; k++) {
			plan_move *m = &p->m[k];
			plan_ns *t = ns_table(p, c, m->ns, &rc);
			for (size_t i = 0; t && rc == 0 && i < t->n; i++) {
				chunk_row *r = &t->rows[i];
				char busy[128];
				if (m->filter ? !overlaps(r->min, r->max, m->lo, m->hi)
					      : r->id != m->chunk)
					continue;
				if (chunk_busy_in(&migs, t->ns, r->id, busy, sizeof busy)) {
					fprintf(stderr, "stripedb ctl migrate: chunk %" PRId64 " of %s is "
							"being migrated by %s: try again once it has "
							"ended\n",
						r->id, t->ns, busy);
					rc = 1;
				}
			}
		}
		bson_destroy(&migs);
	}
	sdb_shard_refs_free(shards, ns);
	return rc;
}

static void print_key(const char *pre, const bson_t *k, const char *post)
{
	char *s = bson_as_relaxed_extended_json(k, NULL);
	printf("%s%s%s", pre, s, post);
	bson_free(s);
}

/* Split the chunk of t holding bound strictly inside it, if any and not on shard `to`
 * already (metadata splitChunk), and print a line (unless quiet: --json); dry run: print what would be split. Returns: 0, or
 * 1 after an error line. */
static int cut_at(mongoc_client_t *c, plan_ns *t, const bson_t *bound, const char *to,
		  bool dry, bool quiet, bson_t *splits)
{
	for (size_t i = 0; i < t->n; i++) {
		chunk_row *r = &t->rows[i];
		if (!(route_key_cmp(r->min, bound) < 0 && route_key_cmp(bound, r->max) < 0))
			continue;
		if (strcmp(r->shard, to) == 0)
			return 0; /* its part in the range is on the target already: no split */
		if (dry && splits) { /* --json: {ns, chunk, at} */
			char k[24];
			bson_t d;
			snprintf(k, sizeof k, "%u", bson_count_keys(splits));
			BSON_APPEND_DOCUMENT_BEGIN(splits, k, &d);
			BSON_APPEND_UTF8(&d, "ns", t->ns);
			BSON_APPEND_INT64(&d, "chunk", r->id);
			BSON_APPEND_DOCUMENT(&d, "at", bound);
			bson_append_document_end(splits, &d);
			return 0;
		}
		if (dry) {
			printf("would split %s chunk %" PRId64 " at ", t->ns, r->id);
			print_key("", bound, "\n");
			return 0;
		}
		char busy[128];
		int b = chunk_busy(c, t->ns, r->id, busy, sizeof busy);
		if (b != 0) {
			if (b > 0)
				fprintf(stderr, "stripedb ctl migrate: chunk %" PRId64 " of %s is being "
						"migrated by %s: try again once it has ended\n",
					r->id, t->ns, busy);
			return 1;
		}
		bson_t cmd = BSON_INITIALIZER, reply;
		BSON_APPEND_INT64(&cmd, "splitChunk", r->id);
		BSON_APPEND_DOCUMENT(&cmd, "at", bound);
		int rc = cmig_run(c, &cmd, &reply);
		if (rc == 0 && !quiet) {
			printf("split %s chunk %" PRId64 ": left %" PRId64 ", right %" PRId64 "\n", t->ns,
			       r->id, cmig_ival(&reply, "left"), cmig_ival(&reply, "right"));
		}
		bson_destroy(&reply);
		bson_destroy(&cmd);
		return rc == 0 ? ns_reload(c, t) : 1;
	}
	return 0;
}

/* A resolved move: one chunk. */
typedef struct chunk_move {
	const char *ns, *to;
	const bson_t *lo, *hi; /* dry run: the part of the chunk in a filter's range, or NULL */
	char from[64];
	int64_t chunk;
} chunk_move;

int cli_migrate_plan(struct cli_ctx *ctx, const char *ns, const char *to, const char *planf,
		     const char *chunks, const char *filter, const mig_opts *o)
{
	plan p;
	memset(&p, 0, sizeof p);
	chunk_move *mv = NULL;
	size_t nmv = 0;
	char(*ids)[128] = NULL;
	size_t nids = 0;
	mongoc_client_t *c = NULL;
	bool dry_json = o->dry_run && ctx->json;
	bson_t splits = BSON_INITIALIZER; /* dry_json: the splits a real run would make */
	int rc = collect(&p, ns, to, planf, chunks, filter);
	if (rc != 0)
		goto out;
	c = cli_meta_client(ctx);
	if (!c) {
		rc = 2;
		goto out;
	}
	if ((rc = validate(&p, c)) != 0)
		goto out;
	/* cut the filters' ranges out of their chunks, then resolve them to chunks */
	for (size_t k = 0; k < p.n; k++) {
		plan_move *m = &p.m[k];
		int r2 = 0;
		plan_ns *t = ns_table(&p, c, m->ns, &r2);
		if (!t) {
			rc = 1;
			goto out;
		}
		if (!m->filter) {
			mv = sdb_realloc(mv, (nmv + 1) * sizeof *mv);
			mv[nmv] = (chunk_move){.ns = m->ns, .to = m->to, .chunk = m->chunk};
			snprintf(mv[nmv++].from, sizeof mv->from, "%s", m->from);
			continue;
		}
		if (cut_at(c, t, m->lo, m->to, o->dry_run, ctx->json, dry_json ? &splits : NULL) != 0 ||
		    cut_at(c, t, m->hi, m->to, o->dry_run, ctx->json, dry_json ? &splits : NULL) != 0) {
			rc = 1;
			goto out;
		}
		size_t inside = 0;
		for (size_t i = 0; i < t->n; i++) {
			chunk_row *r = &t->rows[i];
			if (!overlaps(r->min, r->max, m->lo, m->hi))
				continue;
			inside++;
			if (strcmp(r->shard, m->to) == 0)
				continue; /* already on the target (not cut: cut_at) */
			if (!o->dry_run && (route_key_cmp(r->min, m->lo) < 0 ||
					    route_key_cmp(m->hi, r->max) < 0)) {
				fprintf(stderr, "stripedb ctl migrate: the chunks of %s changed while "
						"the filter's range was cut out: try again\n",
					m->ns);
				rc = 1;
				goto out;
			}
			mv = sdb_realloc(mv, (nmv + 1) * sizeof *mv);
			mv[nmv] = (chunk_move){.ns = m->ns, .to = m->to, .chunk = r->id};
			if (route_key_cmp(r->min, m->lo) < 0 || route_key_cmp(m->hi, r->max) < 0) {
				/* dry run only: a real run split the chunk above */
				mv[nmv].lo = route_key_cmp(r->min, m->lo) < 0 ? m->lo : r->min;
				mv[nmv].hi = route_key_cmp(m->hi, r->max) < 0 ? m->hi : r->max;
			}
			snprintf(mv[nmv++].from, sizeof mv->from, "%s", r->shard);
		}
		if (!o->dry_run && !ctx->json) {
			print_key("filter range ", m->lo, " .. ");
			print_key("", m->hi, "");
			printf(" of %s: %zu chunk(s)\n", m->ns, inside);
		}
	}
	if (dry_json) { /* {"splits": [{ns, chunk, at}], "plan": [{ns, chunk, from, to}]} */
		bson_t out = BSON_INITIALIZER, arr, d;
		BSON_APPEND_ARRAY(&out, "splits", &splits);
		BSON_APPEND_ARRAY_BEGIN(&out, "plan", &arr);
		for (size_t i = 0; i < nmv; i++) {
			char k[24];
			snprintf(k, sizeof k, "%zu", i);
			BSON_APPEND_DOCUMENT_BEGIN(&arr, k, &d);
			BSON_APPEND_UTF8(&d, "ns", mv[i].ns);
			BSON_APPEND_INT64(&d, "chunk", mv[i].chunk);
			if (mv[i].lo) {
				BSON_APPEND_DOCUMENT(&d, "min", mv[i].lo);
				BSON_APPEND_DOCUMENT(&d, "max", mv[i].hi);
			}
			BSON_APPEND_UTF8(&d, "from", mv[i].from);
			BSON_APPEND_UTF8(&d, "to", mv[i].to);
			bson_append_document_end(&arr, &d);
		}
		bson_append_array_end(&out, &arr);
		char *j = bson_as_relaxed_extended_json(&out, NULL);
		printf("%s\n", j);
		bson_free(j);
		bson_destroy(&out);
		rc = 0;
		goto out;
	}
	if (o->dry_run) {
		for (size_t i = 0; i < nmv; i++) {
			printf("would migrate %s chunk %" PRId64, mv[i].ns, mv[i].chunk);
			if (mv[i].lo) {
				print_key("'s part ", mv[i].lo, " .. ");
				print_key("", mv[i].hi, "");
			}
			printf(" from %s to %s\n", mv[i].from, mv[i].to);
		}
		rc = 0;
		goto out;
	}
	char group[64];
	snprintf(group, sizeof group, "plan-%" PRIx64 "%04x", sdb_wall_ms(),
		 (unsigned)(getpid() & 0xffff));
	mig_opts o1 = *o;
	o1.id = NULL;
	o1.group = group;
	ids = sdb_calloc(nmv ? nmv : 1, sizeof *ids);
	for (size_t i = 0; i < nmv; i++) {
		if (cmig_register(c, mv[i].ns, mv[i].chunk, mv[i].from, mv[i].to, &o1, ids[i],
				  sizeof ids[0]) != 0) {
			fprintf(stderr, "stripedb ctl migrate: move %zu (%s chunk %" PRId64
					") could not be registered: aborting the %zu registered before\n",
				i + 1, mv[i].ns, mv[i].chunk, i);
			for (size_t j = 0; j < i; j++)
				cmig_rollback(c, ids[j]);
			rc = 1;
			goto out;
		}
		nids++;
	}
	if (ctx->json) {
		printf("{\"group\": \"%s\", \"ids\": [", group);
		for (size_t i = 0; i < nids; i++)
			printf("%s\"%s\"", i ? ", " : "", ids[i]);
		printf("]}\n");
	} else {
		printf("group %s\n", group);
		for (size_t i = 0; i < nids; i++)
			printf("%s\n", ids[i]);
	}
	fflush(stdout);
	rc = o->wait && nids ? cmig_wait_all(ctx, c, ids, nids) : 0;
out:
	if (rc == 2 && p.err[0])
		fprintf(stderr, "stripedb ctl migrate: %s\n", p.err);
	bson_destroy(&splits);
	free(ids);
	free(mv);
	plan_free(&p);
	if (c)
		mongoc_client_destroy(c);
	return rc;
}
