/* $graphLookup (MongoDB 6.0's document_source_graph_lookup.cpp): a recursive search of
 * another collection for each input document. Like $lookup (pipeline_lookup.c) the engine
 * reads the foreign collection through the caller's sdb_pipeline_opts.foreign, one read per
 * round of the search, so the shard reads its own store (a view's pipeline first) and the
 * proxy reads through its routing (a sharded `from` too, as mongos 5.1+).
 *
 * {from, startWith, connectFromField, connectToField, as, maxDepth?, depthField?,
 *  restrictSearchWithMatch?}: the values of startWith (evaluated against the input
 * document; an array's elements one by one) are the first frontier. Each round reads
 * {$match: {$and: [restrictSearchWithMatch, {connectToField: {$in: frontier}}, ...]}} (the
 * $exists / $type guards mongod adds when null or undefined is searched, so that a missing
 * connectToField never matches); each document not reached before (by _id, compared as
 * values: 1 and 1.0 are one _id) joins the result, with depthField = the round (a long,
 * from 0), and the values of its connectFromField (an array's elements one by one) form the
 * next frontier. The search stops when a round reaches nothing new or after round maxDepth.
 * A value searched once is not searched again (mongod serves it from its cache: the same
 * documents, all reached already). The result is `as`, an array in the order the documents
 * were reached (mongod's is unspecified).
 *
 * Errors as mongod's: 9 FailedToParse (the spec not an object; no from; from not a string;
 * from as {db, coll}), 73 an invalid from, 40103 an argument that is not a string, 13111 an
 * object given for a string argument (BSONElement::String), 16411 a NUL inside a field
 * path, 40100-40102 maxDepth (not a number, negative, not integral), 40185
 * restrictSearchWithMatch not an object (its parse errors keep their code, with mongod's
 * "Failed to parse 'restrictSearchWithMatch' option to $graphLookup :: caused by :: "),
 * 40104 an unknown argument, 40105 a missing required argument, FieldPath's (15998, 16410,
 * 40352) for as, connectFromField, connectToField and depthField; at run time 40271 a
 * foreign document without _id and 40099 "$graphLookup reached maximum memory consumption"
 * when the documents reached plus the next frontier reach the pipeline's memory bound
 * (100 MB by default, mongod's internalDocumentSourceGraphLookupMaxMemoryBytes; never
 * spilled, allowDiskUse or not). Deviation: a `from` starting with '$' is 73, as $lookup's
 * here (mongod reads an empty collection). */
#include "storage/pipeline.h"
#include "storage/pipeline_int.h"

#include "storage/path.h"

void agg_graph_clear(stage *s)
{
	free(s->connect_from);
	free(s->connect_to);
	free(s->depth_field);
	if (s->restrict_match != NULL) {
		bson_destroy(s->restrict_match);
	}
	s->connect_from = s->connect_to = s->depth_field = NULL;
	s->restrict_match = NULL;
}

/* Replace *dst with a copy of v. */
static void set_str(char **dst, const char *v)
{
	free(*dst);
	*dst = sdb_strdup(v);
}

/* maxDepth's checks (40100-40102); *out gets it. */
static int parse_max_depth(const bson_iter_t *f, int64_t *out, const ectx *e)
{
	double d;
	int64_t n;

	if (BSON_ITER_HOLDS_INT32(f) || BSON_ITER_HOLDS_INT64(f)) {
		n = bson_iter_as_int64(f);
		d = (double)n;
	} else if (BSON_ITER_HOLDS_DOUBLE(f) || BSON_ITER_HOLDS_DECIMAL128(f)) {
		if (BSON_ITER_HOLDS_DOUBLE(f)) {
			d = bson_iter_double(f);
		} else {
			bson_decimal128_t dec;
			char s[BSON_DECIMAL128_STRING];

			bson_iter_decimal128(f, &dec);
			bson_decimal128_to_string(&dec, s);
			d = strtod(s, NULL);
		}
		/* BSONElement::safeNumberLong: NaN is 0, out of range clamps; a double truncates,
		 * a Decimal128 rounds half to even (Decimal128::toLong) */
		if (isnan(d)) {
			n = 0;
		} else if (d >= 9223372036854775807.0) {
			n = INT64_MAX;
		} else if (d <= -9223372036854775808.0) {
			n = INT64_MIN;
		} else {
			n = BSON_ITER_HOLDS_DECIMAL128(f) ? (int64_t)nearbyint(d) : (int64_t)d;
		}
	} else {
		return efail(e, 40100, "maxDepth must be numeric, found type: %s",
			     type_name(bson_iter_type(f)));
	}
	if (n < 0) {
		return efail(e, 40101, "maxDepth requires a nonnegative argument, found: %lld",
			     (long long)n);
	}
	/* mongod: `*maxDepth == argument.number()`, compared as doubles (so INT64_MAX, which
	 * rounds to 2^63 on both sides, is accepted) */
	if ((double)n != d) {
		return efail(e, 40102, "maxDepth could not be represented as a long long: %lld",
			     (long long)n);
	}
	*out = n;
	return 0;
}

/* The string arguments' checks (40103, 13111, 16411); *v gets the string. */
static int string_arg(const bson_iter_t *f, const char *k, const char **v, const ectx *e)
{
	uint32_t len = 0;

	if (BSON_ITER_HOLDS_DOCUMENT(f)) {
		return efail(e, 13111, "wrong type for field (%s) object != string", k);
	}
	if (!BSON_ITER_HOLDS_UTF8(f)) {
		return efail(e, 40103, "expected string as argument for %s, found: %s", k,
			     type_name(bson_iter_type(f)));
	}
	*v = bson_iter_utf8(f, &len);
	if (strlen(*v) != len) {
		return efail(e, 16411, "FieldPath field names may not contain '\\0'.");
	}
	return 0;
}

/* The lite parse's checks of `from` (mongod runs them first). */
static int parse_from(const bson_iter_t *arg, const char **from, const ectx *e)
{
	bson_iter_t f;
	uint32_t len = 0;

	if (!bson_iter_recurse(arg, &f) || !bson_iter_find(&f, "from")) {
		char *js = NULL;
		bson_t spec;
		const uint8_t *data;
		int rc;

		bson_iter_document(arg, &len, &data);
		if (bson_init_static(&spec, data, len)) {
			js = bson_as_relaxed_extended_json(&spec, NULL);
		}
		rc = efail(e, C_FAILED_TO_PARSE,
			   "missing 'from' option to $graphLookup stage specification: %s",
			   js != NULL ? js : "{}");
		bson_free(js);
		return rc;
	}
	if (BSON_ITER_HOLDS_DOCUMENT(&f)) {
		bson_iter_t sub;
		const char *db = "", *coll = "";

		if (bson_iter_recurse(&f, &sub)) {
			while (bson_iter_next(&sub)) {
				if (strcmp(bson_iter_key(&sub), "db") == 0 && BSON_ITER_HOLDS_UTF8(&sub)) {
					db = bson_iter_utf8(&sub, NULL);
				} else if (strcmp(bson_iter_key(&sub), "coll") == 0 &&
					   BSON_ITER_HOLDS_UTF8(&sub)) {
					coll = bson_iter_utf8(&sub, NULL);
				}
			}
		}
		return efail(e, C_FAILED_TO_PARSE,
			     "$graphLookup with syntax {from: {db:<>, coll:<>},..} is not supported "
			     "for db: %s and coll: %s",
			     db, coll);
	}
	if (!BSON_ITER_HOLDS_UTF8(&f)) {
		return efail(e, C_FAILED_TO_PARSE,
			     "$graphLookup 'from' field must be a string, but found %s",
			     type_name(bson_iter_type(&f)));
	}
	*from = bson_iter_utf8(&f, &len);
	if ((*from)[0] == '\0' || (*from)[0] == '$' || strlen(*from) != len) {
		/* (a NUL inside: C strings would read another collection) */
		return efail(e, 73, "invalid $graphLookup namespace: %s", *from);
	}
	return 0;
}

int agg_graph_parse(sdb_pipeline *p, const bson_iter_t *arg, const ectx *e)
{
	const char *from = NULL, *v = NULL;
	bson_iter_t f;
	stage *s;
	int rc;

	if (!BSON_ITER_HOLDS_DOCUMENT(arg)) {
		return efail(e, C_FAILED_TO_PARSE,
			     "the $graphLookup stage specification must be an object, but found %s",
			     type_name(bson_iter_type(arg)));
	}
	if ((rc = parse_from(arg, &from, e)) != 0 || (rc = agg_sub_depth_check(e)) != 0) {
		return rc;
	}
	/* the stage now, so that what the parse below builds is freed with p */
	p->st = sdb_realloc(p->st, (p->n + 1) * sizeof *p->st);
	s = &p->st[p->n++];
	memset(s, 0, sizeof *s);
	s->kind = S_GRAPH_LOOKUP;
	s->max_depth = -1;
	s->coll = sdb_strdup(from);
	bson_iter_recurse(arg, &f);
	while (bson_iter_next(&f)) {
		const char *k = bson_iter_key(&f);

		if (strcmp(k, "startWith") == 0) {
			agg_expr_free(s->id);
			s->id = NULL;
			if ((rc = agg_expr_parse(&f, &s->id, e)) != 0) {
				return rc;
			}
			continue;
		}
		if (strcmp(k, "maxDepth") == 0) {
			if ((rc = parse_max_depth(&f, &s->max_depth, e)) != 0) {
				return rc;
			}
			continue;
		}
		if (strcmp(k, "restrictSearchWithMatch") == 0) {
			bson_t m;
			uint32_t len;
			const uint8_t *data;
			sdb_matcher *mt = NULL;

			if (!BSON_ITER_HOLDS_DOCUMENT(&f)) {
				return efail(e, 40185, "restrictSearchWithMatch must be an object, found %s",
					     type_name(bson_iter_type(&f)));
			}
			bson_iter_document(&f, &len, &data);
			if (!bson_init_static(&m, data, len)) {
				return efail(e, C_FAILED_TO_PARSE, "malformed restrictSearchWithMatch");
			}
			/* parsed to check it (mongod's MatchExpressionParser::parse), then kept
			 * as BSON for the foreign reads' $match */
			rc = sdb_matcher_new_vars(&m, SDB_MATCHER_EXPR, e->vars, &mt, e->code, e->err,
						  e->errlen);
			sdb_matcher_free(mt);
			if (rc != 0) {
				if (e->err != NULL && e->errlen > 0) {
					char *cause = sdb_strdup(e->err);

					snprintf(e->err, e->errlen,
						 "Failed to parse 'restrictSearchWithMatch' option to "
						 "$graphLookup :: caused by :: %s",
						 cause);
					free(cause);
				}
				return rc;
			}
			if (s->restrict_match != NULL) {
				bson_destroy(s->restrict_match);
			}
			s->restrict_match = bson_copy(&m);
			continue;
		}
		if (strcmp(k, "from") == 0) {
			continue; /* checked above */
		}
		if (strcmp(k, "as") == 0 || strcmp(k, "connectFromField") == 0 ||
		    strcmp(k, "connectToField") == 0 || strcmp(k, "depthField") == 0) {
			if ((rc = string_arg(&f, k, &v, e)) != 0) {
				return rc;
			}
			if (strcmp(k, "as") == 0) {
				set_str(&s->as, v);
			} else if (strcmp(k, "connectFromField") == 0) {
				set_str(&s->connect_from, v);
			} else if (strcmp(k, "connectToField") == 0) {
				set_str(&s->connect_to, v);
			} else {
				if ((rc = agg_field_path_ok(v, e)) != 0) {
					return rc;
				}
				set_str(&s->depth_field, v);
			}
			continue;
		}
		return efail(e, 40104, "Unknown argument to $graphLookup: %s", k);
	}
	if (s->as == NULL || s->as[0] == '\0' || s->id == NULL || s->connect_from == NULL ||
	    s->connect_from[0] == '\0' || s->connect_to == NULL || s->connect_to[0] == '\0') {
		return efail(e, 40105,
			     "$graphLookup requires 'from', 'as', 'startWith', 'connectFromField', "
			     "and 'connectToField' to be specified.");
	}
	if ((rc = agg_field_path_ok(s->as, e)) != 0 ||
	    (rc = agg_field_path_ok(s->connect_from, e)) != 0 ||
	    (rc = agg_field_path_ok(s->connect_to, e)) != 0) {
		return rc;
	}
	if (p->foreign == NULL) {
		return efail(e, C_NOT_IMPLEMENTED, "$graphLookup is not supported here");
	}
	return 0;
}

/* ---- the search ---- */

/* The state of one search (one input document): the sets, the next frontier and the bytes
 * counted against the memory bound. */
typedef struct gsearch {
	const ectx *e;
	size_t max_mem;
	agg_keyset visited;  /* _id of the documents reached */
	agg_keyset searched; /* the values put in a frontier so far */
	bson_t frontier;     /* the values to search next, as an array */
	uint32_t n_front;
	bool front_null, front_undef; /* null / undefined among them */
	size_t front_bytes, visited_bytes;
	int rc; /* an error of a path visit */
} gsearch;

/* The key of a value for the sets: its order-preserving encoding, so values equal in
 * MongoDB's comparison are one; undefined (encoded as null) gets a byte more, since mongod
 * tells them apart here. */
static int value_key(const bson_value_t *v, sdb_key *k, const ectx *e)
{
	char err[128];

	sdb_key_init(k);
	if (sdb_keyenc_append_value(k, v, false, err, sizeof err) != 0) {
		sdb_key_free(k);
		return efail(e, C_BAD_VALUE, "$graphLookup: %s", err);
	}
	if (v->value_type == BSON_TYPE_UNDEFINED) {
		uint8_t u = 0xff;

		sdb_key_append(k, &u, 1);
	}
	return 0;
}

/* Add v to the next frontier unless it was searched already. */
static int frontier_add(gsearch *g, const bson_value_t *v)
{
	sdb_key k;
	char buf[16];
	const char *key;
	int rc;

	if ((rc = value_key(v, &k, g->e)) != 0) {
		return rc;
	}
	if (!agg_keyset_add(&g->searched, &k)) {
		return 0;
	}
	bson_uint32_to_string(g->n_front++, &key, buf, sizeof buf);
	bson_append_value(&g->frontier, key, -1, v);
	g->front_null = g->front_null || v->value_type == BSON_TYPE_NULL;
	g->front_undef = g->front_undef || v->value_type == BSON_TYPE_UNDEFINED;
	/* mongod's Value::getApproximateSize, roughly: the value plus its slot */
	g->front_bytes += 16 + (v->value_type == BSON_TYPE_UTF8 ? v->value.v_utf8.len : 0) +
			  (v->value_type == BSON_TYPE_DOCUMENT || v->value_type == BSON_TYPE_ARRAY
				   ? v->value.v_doc.data_len
				   : 0) +
			  (v->value_type == BSON_TYPE_BINARY ? v->value.v_binary.data_len : 0);
	return 0;
}

/* sdb_path_visit_fn: every value at connectFromField, an array's elements one by one
 * (document_path_support::visitAllValuesAtPath), into the frontier. */
static bool visit_from(void *ctx, const bson_iter_t *it, unsigned flags)
{
	gsearch *g = ctx;

	if ((flags & SDB_PATH_MISSING) || it == NULL) {
		return false;
	}
	if (BSON_ITER_HOLDS_ARRAY(it) && !(flags & SDB_PATH_ELEM)) {
		return false;
	}
	g->rc = frontier_add(g, bson_iter_value((bson_iter_t *)it));
	return g->rc != 0;
}

/* One round's stages: [{$match: {$and: [restrict?, {to: {$in: frontier}}, guards]}}], the
 * guards as mongod's makeMatchStageFromFrontier adds them. */
static void round_stages(const stage *st, const gsearch *g, bson_t *out)
{
	bson_t stage, match, and, c, op, sub;
	uint32_t n = 0;
	char buf[16];
	const char *key;

	bson_init(out);
	bson_append_document_begin(out, "0", 1, &stage);
	bson_append_document_begin(&stage, "$match", -1, &match);
	bson_append_array_begin(&match, "$and", -1, &and);
	if (st->restrict_match != NULL) {
		bson_uint32_to_string(n++, &key, buf, sizeof buf);
		bson_append_document(&and, key, -1, st->restrict_match);
	}
	bson_uint32_to_string(n++, &key, buf, sizeof buf);
	bson_append_document_begin(&and, key, -1, &c);
	bson_append_document_begin(&c, st->connect_to, -1, &op);
	bson_append_array(&op, "$in", -1, &g->frontier);
	bson_append_document_end(&c, &op);
	bson_append_document_end(&and, &c);
	if (g->front_null || g->front_undef) {
		bson_uint32_to_string(n++, &key, buf, sizeof buf);
		bson_append_document_begin(&and, key, -1, &c);
		bson_append_document_begin(&c, st->connect_to, -1, &op);
		BSON_APPEND_BOOL(&op, "$exists", true);
		bson_append_document_end(&c, &op);
		bson_append_document_end(&and, &c);
		if (g->front_null != g->front_undef) {
			bson_uint32_to_string(n++, &key, buf, sizeof buf);
			bson_append_document_begin(&and, key, -1, &c);
			bson_append_document_begin(&c, st->connect_to, -1, &op);
			bson_append_document_begin(&op, "$not", -1, &sub);
			BSON_APPEND_UTF8(&sub, "$type", g->front_null ? "undefined" : "null");
			bson_append_document_end(&op, &sub);
			bson_append_document_end(&c, &op);
			bson_append_document_end(&and, &c);
		}
	}
	bson_append_array_end(&match, &and);
	bson_append_document_end(&stage, &match);
	bson_append_document_end(out, &stage);
}

/* 40099 when the documents reached plus the next frontier reach the bound (mongod's
 * checkMemoryUsage). */
static int memory_check(const gsearch *g)
{
	if (g->visited_bytes + g->front_bytes >= g->max_mem) {
		return efail(g->e, 40099, "$graphLookup reached maximum memory consumption");
	}
	return 0;
}

/* A document d read in round depth: into arr (with depthField) and its connectFromField
 * values into the frontier, unless its _id was reached before (*added false). */
static int reach(gsearch *g, const stage *st, const bson_t *d, int64_t depth,
		 docbuild_node *arr, bool *added)
{
	bson_iter_t id;
	sdb_key k;
	docbuild_node *node;
	int rc;

	*added = false;
	if (!bson_iter_init_find(&id, d, "_id")) {
		return efail(g->e, 40271,
			     "Documents in the '%s' namespace must contain an _id for "
			     "de-duplication in $graphLookup",
			     st->coll);
	}
	if ((rc = value_key(bson_iter_value(&id), &k, g->e)) != 0) {
		return rc;
	}
	size_t klen = k.len;

	if (!agg_keyset_add(&g->visited, &k)) {
		return 0;
	}
	*added = true;
	g->visited_bytes += klen;
	node = docbuild_from_bson(d);
	if (st->depth_field != NULL) {
		/* set before the frontier is read, as mongod (a depthField that is the
		 * connectFromField connects from the depth) */
		bson_t withd;

		agg_set_path(node, st->depth_field, v_int64(depth));
		docbuild_to_bson(node, &withd);
		g->visited_bytes += withd.len;
		sdb_path_walk(&withd, st->connect_from, SDB_PATH_EXPAND_LEAF, visit_from, g);
		bson_destroy(&withd);
	} else {
		g->visited_bytes += d->len;
		sdb_path_walk(d, st->connect_from, SDB_PATH_EXPAND_LEAF, visit_from, g);
	}
	docbuild_push(arr, node);
	if (g->rc != 0) {
		return g->rc;
	}
	return memory_check(g);
}

int agg_graph_one(const sdb_pipeline *p, const stage *st, const bson_t *in,
		  docbuild_node **out, const ectx *e)
{
	gsearch g;
	docbuild_node *start = NULL, *arr;
	bson_t empty = BSON_INITIALIZER;
	int64_t depth = 0;
	int rc;

	*out = NULL;
	memset(&g, 0, sizeof g);
	g.e = e;
	g.max_mem = p->max_mem;
	bson_init(&g.frontier);
	if ((rc = agg_expr_eval(st->id, in, &start, e)) != 0) {
		bson_destroy(&g.frontier);
		return rc;
	}
	/* the starting values: an array's elements one by one; missing searches nothing */
	if (start != NULL) {
		bool is_arr = start->type == BSON_TYPE_ARRAY;
		size_t n = is_arr ? start->n : 1;

		for (size_t i = 0; i < n && rc == 0; i++) {
			bson_t tmp;
			bson_value_t v;

			docbuild_value(is_arr ? start->kids[i] : start, &tmp, &v);
			rc = frontier_add(&g, &v);
			bson_destroy(&tmp);
		}
		docbuild_free(start);
	}
	arr = docbuild_new_array(NULL);
	while (rc == 0 && g.n_front > 0 && (rc = memory_check(&g)) == 0) {
		bson_t stages;
		sdb_pipeline_source src;
		bool any = false;

		round_stages(st, &g, &stages);
		bson_reinit(&g.frontier);
		g.n_front = 0;
		g.front_null = g.front_undef = false;
		g.front_bytes = 0;
		memset(&src, 0, sizeof src);
		rc = p->foreign(p->foreign_arg, st->coll, &stages, p->let != NULL ? p->let : &empty,
				&src, e->code, e->err, e->errlen);
		bson_destroy(&stages);
		if (rc < 0) {
			if (e->code != NULL && *e->code == 0) {
				*e->code = C_INTERNAL;
			}
			break;
		}
		for (;;) {
			const bson_t *d = NULL;
			bool added;

			rc = src.next(src.ctx, &d, e->code, e->err, e->errlen);
			if (rc < 0) {
				if (e->code != NULL && *e->code == 0) {
					*e->code = C_INTERNAL;
				}
				break;
			}
			if (rc == 0 || d == NULL) {
				rc = 0;
				break;
			}
			if ((rc = reach(&g, st, d, depth, arr, &added)) != 0) {
				break;
			}
			any = any || added;
		}
		if (src.close != NULL) {
			src.close(src.ctx);
		}
		depth++;
		if (!any || (st->max_depth >= 0 && depth > st->max_depth)) {
			break;
		}
	}
	agg_keyset_free(&g.visited);
	agg_keyset_free(&g.searched);
	bson_destroy(&g.frontier);
	if (rc != 0) {
		docbuild_free(arr);
		return rc;
	}
	*out = arr;
	return 0;
}
