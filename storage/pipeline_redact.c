/* $redact (issue #20), as MongoDB 6.0's DocumentSourceRedact
 * (src/mongo/db/pipeline/document_source_redact.cpp).
 *
 * The stage's expression is evaluated on each input document with $$CURRENT (and so every
 * "$field" path) the document; the variables $$DESCEND, $$PRUNE and $$KEEP, defined only
 * inside it, are the strings "descend", "prune" and "keep" (so an expression that returns
 * one of those strings by other means acts the same, as in mongod, which compares values).
 * "keep" returns the (sub)document as it is, "prune" drops it, "descend" keeps its scalar
 * fields and redacts each field that is a document (the expression evaluated again with
 * $$CURRENT that subdocument, $$ROOT still the input document) or an array (its document
 * and array elements redacted in turn, pruned ones removed, other elements kept). Anything
 * else is 17053. A document pruned at the top level is not output. */
#include "build_config.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"
#include "storage/pipeline.h"
#include "storage/pipeline_int.h"

int agg_redact_parse(sdb_pipeline *p, const bson_iter_t *it, const ectx *e)
{
	bson_t vars = BSON_INITIALIZER;
	ectx re = *e;
	expr *x = NULL;
	stage *s;
	int rc;

	/* the enclosing user variables, plus mongod's three (names a user variable cannot
	 * take: they start with an upper-case letter) */
	if (e->vars != NULL) {
		bson_concat(&vars, e->vars);
	}
	BSON_APPEND_UTF8(&vars, "DESCEND", "descend");
	BSON_APPEND_UTF8(&vars, "PRUNE", "prune");
	BSON_APPEND_UTF8(&vars, "KEEP", "keep");
	re.vars = &vars;
	rc = agg_expr_parse(it, &x, &re);
	bson_destroy(&vars);
	if (rc != 0) {
		agg_expr_free(x);
		return rc;
	}
	p->st = sdb_realloc(p->st, (p->n + 1) * sizeof *p->st);
	s = &p->st[p->n++];
	memset(s, 0, sizeof *s);
	s->kind = S_REDACT;
	s->id = x;
	return 0;
}

enum { R_KEEP, R_PRUNE, R_DESCEND };

/* Append to buf (len bytes, *at used) as snprintf does, never past the end. */
static void put(char *buf, size_t len, size_t *at, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void put(char *buf, size_t len, size_t *at, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (*at >= len) {
		return;
	}
	va_start(ap, fmt);
	n = vsnprintf(buf + *at, len - *at, fmt, ap);
	va_end(ap);
	if (n > 0) {
		*at += (size_t)n;
	}
}

/* mongod's Value/Document operator<< ({a: 1, b: "x"}, [1, 2], doubles at the ostream's
 * precision 6, MISSING) for the value at it; depth-bounded by the document's nesting. */
static void put_value(const bson_iter_t *it, char *buf, size_t len, size_t *at)
{
	switch (bson_iter_type(it)) {
	case BSON_TYPE_UTF8: {
		uint32_t n;
		const char *str = bson_iter_utf8(it, &n);

		put(buf, len, at, "\"%.*s\"", (int)n, str);
		break;
	}
	case BSON_TYPE_INT32:
		put(buf, len, at, "%" PRId32, bson_iter_int32(it));
		break;
	case BSON_TYPE_INT64:
		put(buf, len, at, "%" PRId64, bson_iter_int64(it));
		break;
	case BSON_TYPE_DOUBLE:
		put(buf, len, at, "%g", bson_iter_double(it));
		break;
	case BSON_TYPE_BOOL:
		put(buf, len, at, "%s", bson_iter_bool(it) ? "true" : "false");
		break;
	case BSON_TYPE_NULL:
		put(buf, len, at, "null");
		break;
	case BSON_TYPE_UNDEFINED:
		put(buf, len, at, "undefined");
		break;
	case BSON_TYPE_DOCUMENT:
	case BSON_TYPE_ARRAY: {
		bool doc = BSON_ITER_HOLDS_DOCUMENT(it);
		bson_iter_t sub;
		bool first = true;

		put(buf, len, at, doc ? "{" : "[");
		if (bson_iter_recurse(it, &sub)) {
			while (bson_iter_next(&sub)) {
				put(buf, len, at, "%s", first ? "" : ", ");
				if (doc) {
					put(buf, len, at, "%s: ", bson_iter_key(&sub));
				}
				put_value(&sub, buf, len, at);
				first = false;
			}
		}
		put(buf, len, at, doc ? "}" : "]");
		break;
	}
	default:
		put(buf, len, at, "%s", type_name(bson_iter_type(it)));
		break;
	}
}

/* mongod's Value::toString of the expression's result (v NULL: missing), for 17053 */
static void value_string(const docbuild_node *v, char *buf, size_t len)
{
	bson_t wrap = BSON_INITIALIZER;
	bson_iter_t it;
	size_t at = 0;

	buf[0] = '\0';
	if (v == NULL) {
		snprintf(buf, len, "MISSING");
		return;
	}
	docbuild_append(&wrap, "v", 1, v);
	if (bson_iter_init_find(&it, &wrap, "v")) {
		put_value(&it, buf, len, &at);
	}
	bson_destroy(&wrap);
}

/* Evaluate x with CURRENT = cur into *action. */
static int decide(const expr *x, const bson_t *cur, int *action, const ectx *e)
{
	docbuild_node *v = NULL;
	int rc = agg_expr_eval(x, cur, &v, e);

	if (rc != 0) {
		docbuild_free(v);
		return rc;
	}
	if (v != NULL && v->type == BSON_TYPE_UTF8) {
		const char *s = v->value.value.v_utf8.str;
		size_t n = v->value.value.v_utf8.len;

		if (n == 4 && memcmp(s, "keep", 4) == 0) {
			*action = R_KEEP;
		} else if (n == 5 && memcmp(s, "prune", 5) == 0) {
			*action = R_PRUNE;
		} else if (n == 7 && memcmp(s, "descend", 7) == 0) {
			*action = R_DESCEND;
		} else {
			rc = -1;
		}
	} else {
		rc = -1;
	}
	if (rc != 0) {
		char shown[256];

		value_string(v, shown, sizeof shown);
		rc = efail(e, 17053,
			   "$redact's expression should not return anything aside from the variables $$KEEP, $$DESCEND, and $$PRUNE, but returned %s",
			   shown);
	}
	docbuild_free(v);
	return rc;
}

static int redact_obj(const expr *x, const bson_t *cur, bson_t *out, bool *kept, const ectx *e);

/* redactValue of an array: out (uninitialised; initialised on success) gets its elements,
 * documents and arrays redacted, pruned documents removed. */
static int redact_arr(const expr *x, const bson_t *arr, bson_t *out, const ectx *e)
{
	bson_iter_t it;
	uint32_t i = 0;
	int rc = 0;

	bson_init(out);
	if (!bson_iter_init(&it, arr)) {
		return 0;
	}
	while (rc == 0 && bson_iter_next(&it)) {
		char buf[16];
		const char *key;
		const uint8_t *data;
		uint32_t len;
		bson_t sub, r;
		bool kept = true;

		bson_uint32_to_string(i, &key, buf, sizeof buf);
		if (BSON_ITER_HOLDS_DOCUMENT(&it) || BSON_ITER_HOLDS_ARRAY(&it)) {
			bool doc = BSON_ITER_HOLDS_DOCUMENT(&it);

			if (doc) {
				bson_iter_document(&it, &len, &data);
			} else {
				bson_iter_array(&it, &len, &data);
			}
			if (!bson_init_static(&sub, data, len)) {
				continue;
			}
			rc = doc ? redact_obj(x, &sub, &r, &kept, e) : redact_arr(x, &sub, &r, e);
			if (rc != 0) {
				break;
			}
			if (kept) {
				if (doc) {
					bson_append_document(out, key, -1, &r);
				} else {
					bson_append_array(out, key, -1, &r);
				}
				i++;
				bson_destroy(&r);
			}
		} else {
			bson_append_iter(out, key, -1, &it);
			i++;
		}
	}
	if (rc != 0) {
		bson_destroy(out);
	}
	return rc;
}

/* redactObject: *kept false when cur is pruned (out then not initialised), else out
 * (uninitialised) gets the redacted document. */
static int redact_obj(const expr *x, const bson_t *cur, bson_t *out, bool *kept, const ectx *e)
{
	bson_iter_t it;
	int action = R_PRUNE;
	int rc = decide(x, cur, &action, e);

	*kept = false;
	if (rc != 0 || action == R_PRUNE) {
		return rc;
	}
	if (action == R_KEEP) {
		bson_copy_to(cur, out);
		*kept = true;
		return 0;
	}
	bson_init(out);
	if (bson_iter_init(&it, cur)) {
		while (rc == 0 && bson_iter_next(&it)) {
			const char *key = bson_iter_key(&it);
			const uint8_t *data;
			uint32_t len;
			bson_t sub, r;
			bool k = true;

			if (BSON_ITER_HOLDS_DOCUMENT(&it)) {
				bson_iter_document(&it, &len, &data);
				if (!bson_init_static(&sub, data, len)) {
					continue;
				}
				rc = redact_obj(x, &sub, &r, &k, e);
				if (rc == 0 && k) {
					bson_append_document(out, key, -1, &r);
					bson_destroy(&r);
				}
			} else if (BSON_ITER_HOLDS_ARRAY(&it)) {
				bson_iter_array(&it, &len, &data);
				if (!bson_init_static(&sub, data, len)) {
					continue;
				}
				rc = redact_arr(x, &sub, &r, e);
				if (rc == 0) {
					bson_append_array(out, key, -1, &r);
					bson_destroy(&r);
				}
			} else {
				bson_append_iter(out, key, -1, &it);
			}
		}
	}
	if (rc != 0) {
		bson_destroy(out);
		return rc;
	}
	*kept = true;
	return 0;
}

int agg_redact_doc(const expr *x, const bson_t *in, bson_t **out, const ectx *e)
{
	ectx re = *e;
	bson_t r;
	bool kept = false;
	int rc;

	*out = NULL;
	re.root = in; /* $$ROOT: the input document at every depth */
	rc = redact_obj(x, in, &r, &kept, &re);
	if (rc == 0 && kept) {
		*out = bson_copy(&r);
		bson_destroy(&r);
	}
	return rc;
}
