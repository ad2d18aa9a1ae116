/* The string operators of the expression language (issue #20, pipeline_ext.h): $split,
 * $trim/$ltrim/$rtrim, $indexOfBytes, $indexOfCP, $strLenCP, $substrCP, $strcasecmp,
 * $replaceOne, $replaceAll, $regexMatch, $regexFind, $regexFindAll, with MongoDB 6.0's
 * rules, codes and messages (expression.cpp, str_trim_utils, substr_utils). Code-point
 * operators count the bytes that are not UTF-8 continuation bytes, as mongod does, so any
 * byte string (invalid UTF-8 included) is walked safely. Regexes are compiled by the
 * matcher's helper (sdb_regex_compile) and matched under PCRE2 match and depth limits. */
#define _GNU_SOURCE 1 /* memmem */
#include "storage/pipeline_ext.h"
#include "storage/matcher.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

/* PCRE2's bounds on one match: the validator's (validator.c RX_MATCH_LIMIT/RX_DEPTH_LIMIT):
 * a catastrophic pattern fails with 51156 instead of holding the shard. */
#define STR_RX_MATCH_LIMIT 100000
#define STR_RX_DEPTH_LIMIT 1000

static bool is_cont(unsigned char c)
{
	return (c & 0xC0) == 0x80;
}

/* The byte offset of code point cp of s (len when past the end). */
static size_t cp_offset(const char *s, size_t len, size_t cp)
{
	size_t i = 0;

	while (i < len && cp > 0) {
		i++;
		while (i < len && is_cont((unsigned char)s[i])) {
			i++;
		}
		cp--;
	}
	return i;
}

static size_t cp_count(const char *s, size_t len)
{
	size_t n = 0;

	for (size_t i = 0; i < len; i++) {
		n += !is_cont((unsigned char)s[i]);
	}
	return n;
}

/* The largest result a string operator builds: BSONObjMaxInternalSize (16 MB + 16 KB);
 * past it mongod fails to build the document (10334), stripedb fails the operator the same
 * way before holding more memory. */
#define STR_MAX_RESULT (16 * 1024 * 1024 + 16 * 1024)

static int too_big(size_t n, const ectx *e)
{
	return efail(e, 10334, "BSONObj size: %zu (0x%zx) is invalid. Size must be between 0 and 16793600(16MB)",
		     n, n);
}

/* The first occurrence of t (tl bytes) in s[from, len), or NULL (memmem: linear time). */
static const char *find_bytes(const char *s, size_t len, size_t from, const char *t, size_t tl)
{
	if (from > len) {
		return NULL;
	}
	return memmem(s + from, len - from, t, tl);
}

/* A growable byte buffer. */
typedef struct {
	char *p;
	size_t len, cap;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
	if (b->len + n + 1 > b->cap) {
		b->cap = (b->len + n + 1) * 2;
		b->p = sdb_realloc(b->p, b->cap);
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
}

/* Value::coerceToString as $substrCP/$strcasecmp use it: null/missing "", strings,
 * numbers, dates, timestamps; else 16007. The caller frees *s. */
static int coerce_string(const docbuild_node *v, const char *op, char **s, size_t *len,
			 const ectx *e)
{
	char buf[64];

	*s = NULL;
	if (is_nullish(v)) {
		*s = sdb_strdup("");
		*len = 0;
		return 0;
	}
	switch (v->type) {
	case BSON_TYPE_UTF8:
		*len = v->value.value.v_utf8.len;
		*s = sdb_malloc(*len + 1);
		memcpy(*s, v->value.value.v_utf8.str, *len);
		(*s)[*len] = '\0';
		return 0;
	case BSON_TYPE_DATE_TIME:
		agg_date_iso(v->value.value.v_datetime, buf, sizeof buf);
		break;
	case BSON_TYPE_TIMESTAMP:
		snprintf(buf, sizeof buf, "Timestamp(%u, %u)", v->value.value.v_timestamp.timestamp,
			 v->value.value.v_timestamp.increment);
		break;
	case BSON_TYPE_INT32:
		snprintf(buf, sizeof buf, "%d", v->value.value.v_int32);
		break;
	case BSON_TYPE_INT64:
		snprintf(buf, sizeof buf, "%lld", (long long)v->value.value.v_int64);
		break;
	case BSON_TYPE_DECIMAL128:
		bson_decimal128_to_string(&v->value.value.v_decimal128, buf);
		break;
	case BSON_TYPE_DOUBLE:
		for (int prec = 15; prec <= 17; prec++) {
			snprintf(buf, sizeof buf, "%.*g", prec, v->value.value.v_double);
			if (strtod(buf, NULL) == v->value.value.v_double) {
				break;
			}
		}
		break;
	default:
		return efail(e, 16007, "can't convert from BSON type %s to String (%s)",
			     type_name(v->type), op);
	}
	*s = sdb_strdup(buf);
	*len = strlen(buf);
	return 0;
}

/* ---- $trim ---- */

static const char *const default_ws[] = {
	"\0",	  " ",	    "\f",	  "\n",		"\r",	      "\t",	    "\v",
	"\xC2\xA0", "\xE1\x9A\x80", "\xE2\x80\x80", "\xE2\x80\x81", "\xE2\x80\x82", "\xE2\x80\x83",
	"\xE2\x80\x84", "\xE2\x80\x85", "\xE2\x80\x86", "\xE2\x80\x87", "\xE2\x80\x88",
	"\xE2\x80\x89", "\xE2\x80\x8A",
};

/* The length of the code point at s (1 for a stray byte), within len. */
static size_t cp_len(const char *s, size_t len)
{
	size_t n = 1;

	while (n < len && is_cont((unsigned char)s[n])) {
		n++;
	}
	return n;
}

/* Does the code point at s[0..n) belong to the set (chars: code points of cs; NULL: the
 * default whitespace)? */
static bool in_set(const char *s, size_t n, const char *cs, size_t cslen)
{
	if (cs == NULL) {
		for (size_t i = 0; i < sizeof default_ws / sizeof default_ws[0]; i++) {
			size_t l = default_ws[i][0] == '\0' ? 1 : strlen(default_ws[i]);

			if (l == n && memcmp(default_ws[i], s, n) == 0) {
				return true;
			}
		}
		return false;
	}
	for (size_t i = 0; i < cslen;) {
		size_t l = cp_len(cs + i, cslen - i);

		if (l == n && memcmp(cs + i, s, n) == 0) {
			return true;
		}
		i += l;
	}
	return false;
}

static int eval_trim(const expr *x, docbuild_node **v, docbuild_node **out, const ectx *e)
{
	const char *name = ext_name(x);
	char show[256];
	const char *s, *cs = NULL;
	size_t len, cslen = 0, b = 0, end;

	if (is_nullish(v[0])) {
		*out = v_null();
		return 0;
	}
	if (v[0]->type != BSON_TYPE_UTF8) {
		return efail(e, 50699, "%s requires its input to be a string, got %s (of type %s) instead.",
			     name, ext_show(v[0], show, sizeof show), type_name(v[0]->type));
	}
	if (!ext_absent(x->args[1])) {
		if (is_nullish(v[1])) {
			*out = v_null();
			return 0;
		}
		if (v[1]->type != BSON_TYPE_UTF8) {
			return efail(e, 50700, "%s requires 'chars' to be a string, got %s (of type %s) instead.",
				     name, ext_show(v[1], show, sizeof show), type_name(v[1]->type));
		}
		cs = v[1]->value.value.v_utf8.str;
		cslen = v[1]->value.value.v_utf8.len;
	}
	s = v[0]->value.value.v_utf8.str;
	len = v[0]->value.value.v_utf8.len;
	end = len;
	if (x->ext != E_RTRIM) {
		while (b < len) {
			size_t l = cp_len(s + b, len - b);

			if (!in_set(s + b, l, cs, cslen)) {
				break;
			}
			b += l;
		}
	}
	if (x->ext != E_LTRIM) {
		while (end > b) {
			size_t st = end - 1;

			while (st > b && is_cont((unsigned char)s[st])) {
				st--;
			}
			if (!in_set(s + st, end - st, cs, cslen)) {
				break;
			}
			end = st;
		}
	}
	*out = v_string(s + b, end - b);
	return 0;
}

/* ---- $indexOfBytes / $indexOfCP ---- */

static int index_arg(const docbuild_node *v, const char *name, const char *what, int32_t *out,
		     const ectx *e)
{
	char show[256];

	if (!agg_integral32(v, out)) {
		return efail(e, 40096, "%srequires an integral %s, found a value of type: %s, with value: %s",
			     name, what, type_name(ntype(v)), ext_show(v, show, sizeof show));
	}
	if (*out < 0) {
		return efail(e, 40097, "%s requires a nonnegative %s, found: %s", name, what,
			     ext_show(v, show, sizeof show));
	}
	return 0;
}

static int eval_indexof(const expr *x, docbuild_node **v, docbuild_node **out, const ectx *e)
{
	bool cp = x->ext == E_INDEXOFCP;
	const char *name = ext_name(x);
	const char *s, *tok;
	size_t len, tlen, total;
	int32_t start = 0, end = 0;
	int rc;

	if (is_nullish(v[0])) {
		*out = v_null();
		return 0;
	}
	if (v[0]->type != BSON_TYPE_UTF8) {
		return efail(e, cp ? 40093 : 40091, "%s requires a string as the first argument, found: %s",
			     name, type_name(v[0]->type));
	}
	if (ntype(v[1]) != BSON_TYPE_UTF8) {
		return efail(e, cp ? 40094 : 40092, "%s requires a string as the second argument, found: %s",
			     name, type_name(ntype(v[1])));
	}
	s = v[0]->value.value.v_utf8.str;
	len = v[0]->value.value.v_utf8.len;
	tok = v[1]->value.value.v_utf8.str;
	tlen = v[1]->value.value.v_utf8.len;
	total = cp ? cp_count(s, len) : len;
	end = total > INT32_MAX ? INT32_MAX : (int32_t)total;
	if (x->n > 2 && (rc = index_arg(v[2], name, "starting index", &start, e)) != 0) {
		return rc;
	}
	if (x->n > 3) {
		int32_t en;

		if ((rc = index_arg(v[3], name, "ending index", &en, e)) != 0) {
			return rc;
		}
		end = (size_t)en < total ? en : end;
	}
	if ((size_t)start > total || end < start) {
		*out = v_int32(-1);
		return 0;
	}
	if (!cp) {
		/* within s[0, end) as input.substr(0, endIndex).find(token, startIndex) */
		const char *f = find_bytes(s, (size_t)end, (size_t)start, tok, tlen);

		*out = v_int32(f != NULL ? (int32_t)(f - s) : -1);
		return 0;
	}
	if (tlen == 0) {
		*out = v_int32(start);
		return 0;
	}
	{
		/* the first match starting on a code point whose index is below end (the token
		 * may run past it, as mongod's loop allows) */
		size_t b = cp_offset(s, len, (size_t)start), from = b;
		size_t idx = (size_t)start;
		const char *f;

		while ((f = find_bytes(s, len, from, tok, tlen)) != NULL) {
			size_t at = (size_t)(f - s);

			if (is_cont((unsigned char)s[at])) {
				from = at + 1;
				continue;
			}
			idx += cp_count(s + b, at - b);
			b = at;
			if (idx < (size_t)end) {
				*out = v_int32((int32_t)idx);
				return 0;
			}
			break;
		}
	}
	*out = v_int32(-1);
	return 0;
}

/* ---- $replaceOne / $replaceAll ---- */

static int eval_replace(const expr *x, docbuild_node **v, docbuild_node **out, const ectx *e)
{
	static const char *const what[3] = {"input", "find", "replacement"};
	const char *name = ext_name(x);
	const char *s, *f, *r;
	size_t len, flen, rlen;
	sbuf b = {0};
	bool any_null = false;

	for (int i = 0; i < 3; i++) {
		if (is_nullish(v[i])) {
			any_null = true;
		} else if (v[i]->type != BSON_TYPE_UTF8) {
			return efail(e, 51746 - i, "%s requires that '%s' be a string, found: %s", name,
				     what[i], type_name(v[i]->type));
		}
	}
	if (any_null) {
		*out = v_null();
		return 0;
	}
	s = v[0]->value.value.v_utf8.str;
	len = v[0]->value.value.v_utf8.len;
	f = v[1]->value.value.v_utf8.str;
	flen = v[1]->value.value.v_utf8.len;
	r = v[2]->value.value.v_utf8.str;
	rlen = v[2]->value.value.v_utf8.len;
	sb_put(&b, "", 0);
	if (flen == 0) {
		/* an empty find matches before every code point and at the end */
		for (size_t i = 0, iter = 0; i < len && x->ext == E_REPLACEALL; iter++) {
			size_t l = cp_len(s + i, len - i);

			if (agg_check_interrupt(iter, e) != 0) {
				free(b.p);
				return SDB_ECANCELED;
			}

			if (b.len + rlen + l > STR_MAX_RESULT) {
				free(b.p);
				return too_big(b.len + rlen + l, e);
			}

			sb_put(&b, r, rlen);
			sb_put(&b, s + i, l);
			i += l;
		}
		sb_put(&b, r, rlen);
		if (x->ext == E_REPLACEONE) {
			sb_put(&b, s, len);
		}
	} else {
		size_t i = 0, from = 0;

		for (size_t iter = 0; i + flen <= len; iter++) {
			const char *hit = find_bytes(s, len, i, f, flen);

			if (agg_check_interrupt(iter, e) != 0) {
				free(b.p);
				return SDB_ECANCELED;
			}

			if (hit == NULL) {
				break;
			}
			i = (size_t)(hit - s);
			if (b.len + (i - from) + rlen > STR_MAX_RESULT) {
				free(b.p);
				return too_big(b.len + (i - from) + rlen, e);
			}
			sb_put(&b, s + from, i - from);
			sb_put(&b, r, rlen);
			i += flen;
			from = i;
			if (x->ext == E_REPLACEONE) {
				break;
			}
		}
		sb_put(&b, s + from, len - from);
	}
	*out = v_string(b.p, b.len);
	free(b.p);
	return 0;
}

/* ---- $regexMatch / $regexFind / $regexFindAll ---- */

/* One match result document {match, idx, captures} (idx in code points). */
static docbuild_node *find_doc(const char *s, size_t cpidx, const PCRE2_SIZE *ov, int ncap)
{
	docbuild_node *d = docbuild_new_doc(NULL);
	docbuild_node *m = v_string(s + ov[0], ov[1] - ov[0]);
	docbuild_node *idx = v_int32((int32_t)cpidx);
	docbuild_node *caps = docbuild_new_array(NULL);

	docbuild_set_key(m, "match");
	docbuild_push(d, m);
	docbuild_set_key(idx, "idx");
	docbuild_push(d, idx);
	for (int i = 1; i < ncap; i++) {
		if (ov[2 * i] == PCRE2_UNSET) {
			docbuild_push(caps, v_null());
		} else {
			docbuild_push(caps, v_string(s + ov[2 * i], ov[2 * i + 1] - ov[2 * i]));
		}
	}
	docbuild_set_key(caps, "captures");
	docbuild_push(d, caps);
	return d;
}

static int eval_regex(const expr *x, docbuild_node **v, docbuild_node **out, const ectx *e)
{
	const char *name = ext_name(x);
	const char *pat = NULL, *reopts = "", *opts = "";
	char flags[16], msg[300];
	pcre2_code *re;
	pcre2_match_data *md;
	pcre2_match_context *mctx;
	size_t plen = 0;
	int code = 0, rc = 0;

	if (!is_nullish(v[0]) && v[0]->type != BSON_TYPE_UTF8) {
		return efail(e, 51104, "%s needs 'input' to be of type string", name);
	}
	if (!is_nullish(v[1])) {
		if (v[1]->type == BSON_TYPE_UTF8) {
			pat = v[1]->value.value.v_utf8.str;
			plen = v[1]->value.value.v_utf8.len;
		} else if (v[1]->type == BSON_TYPE_REGEX) {
			pat = v[1]->value.value.v_regex.regex;
			plen = strlen(pat);
			reopts = v[1]->value.value.v_regex.options;
		} else {
			return efail(e, 51105, "%s needs 'regex' to be of type string or regex", name);
		}
	}
	if (!is_nullish(v[2])) {
		if (v[2]->type != BSON_TYPE_UTF8) {
			return efail(e, 51106, "%s needs 'options' to be of type string", name);
		}
		opts = v[2]->value.value.v_utf8.str;
		if (strlen(opts) != v[2]->value.value.v_utf8.len) {
			return efail(e, 51110, "%s: regular expression options cannot contain an embedded null byte",
				     name);
		}
		if (opts[0] != '\0' && reopts[0] != '\0') {
			return efail(e, 51107, "%s found regex option(s) specified in both 'regex' and 'option' fields",
				     name);
		}
	}
	if (pat != NULL && strlen(pat) != plen) {
		return efail(e, 51109, "%s: regular expression cannot contain an embedded null byte", name);
	}
	if (is_nullish(v[0]) || pat == NULL) {
		*out = x->ext == E_REGEXMATCH	 ? v_bool(false)
		       : x->ext == E_REGEXFIND ? v_null()
					       : docbuild_new_array(NULL);
		return 0;
	}
	snprintf(flags, sizeof flags, "%s", opts[0] != '\0' ? opts : reopts);
	for (const char *f = opts[0] != '\0' ? opts : reopts; *f; f++) {
		if (strchr("imsx", *f) == NULL) {
			return efail(e, 51108, "%s invalid flag in regex options: %c", name, *f);
		}
	}
	re = sdb_regex_compile(pat, flags, &code, msg, sizeof msg);
	if (re == NULL) {
		const char *why = strstr(msg, ": ");

		return efail(e, 51111, "Invalid Regex in %s: %s", name, why != NULL ? why + 2 : msg);
	}
	md = pcre2_match_data_create_from_pattern(re, NULL);
	mctx = pcre2_match_context_create(NULL);
	if (md == NULL || mctx == NULL) {
		fprintf(stderr, "stripedb: out of memory (pcre2 match data)\n");
		abort();
	}
	pcre2_set_match_limit(mctx, STR_RX_MATCH_LIMIT);
	pcre2_set_depth_limit(mctx, STR_RX_DEPTH_LIMIT);
	{
		const char *s = v[0]->value.value.v_utf8.str;
		size_t len = v[0]->value.value.v_utf8.len;
		size_t start = 0;
		docbuild_node *all = x->ext == E_REGEXFINDALL ? docbuild_new_array(NULL) : NULL;
		size_t total = 0;
		size_t cp_at = 0, cp_idx = 0; /* the code point index of byte cp_at */
		uint32_t mopts = 0;

		for (size_t iter = 0; rc == 0; iter++) {
			int m;
			PCRE2_SIZE *ov;

			rc = agg_check_interrupt(iter, e);
			if (rc != 0) {
				break;
			}
			m = start > len ? PCRE2_ERROR_NOMATCH
					: pcre2_match(re, (PCRE2_SPTR)s, len, start, mopts, md, mctx);

			if (m == PCRE2_ERROR_NOMATCH) {
				if (all != NULL) {
					*out = all;
					all = NULL;
				} else {
					*out = x->ext == E_REGEXMATCH ? v_bool(false) : v_null();
				}
				break;
			}
			if (m < 0) {
				rc = efail(e, 51156,
					   "Error occurred while executing the regular expression in %s. Result code: %d",
					   name, m);
				break;
			}
			ov = pcre2_get_ovector_pointer(md);
			/* the subject was checked as UTF-8 once: later matches skip the check
			 * (each would read the whole subject again) */
			mopts = PCRE2_NO_UTF_CHECK;
			if (ov[0] >= cp_at) {
				cp_idx += cp_count(s + cp_at, ov[0] - cp_at);
				cp_at = ov[0];
			}
			if (x->ext == E_REGEXMATCH) {
				*out = v_bool(true);
				break;
			}
			if (x->ext == E_REGEXFIND) {
				*out = find_doc(s, cp_idx, ov, (int)pcre2_get_ovector_count(md));
				break;
			}
			{
				docbuild_node *d = find_doc(s, cp_idx, ov, (int)pcre2_get_ovector_count(md));

				/* the document's BSON size, about: its strings plus 64 bytes of
				 * field names, lengths and the array index */
				total += (ov[1] - ov[0]) + 64;
				for (size_t k = 0; k < d->kids[2]->n; k++) {
					total += 16 + (d->kids[2]->kids[k]->type == BSON_TYPE_UTF8
							       ? d->kids[2]->kids[k]->value.value.v_utf8.len
							       : 0);
				}
				docbuild_push(all, d);
			}
			if (total > STR_MAX_RESULT) {
				rc = too_big(total, e);
				break;
			}
			/* an empty match moves on one code point */
			start = ov[1] > ov[0] ? ov[1] : ov[1] + (ov[1] < len ? cp_len(s + ov[1], len - ov[1]) : 1);
		}
		docbuild_free(all);
	}
	pcre2_match_context_free(mctx);
	pcre2_match_data_free(md);
	pcre2_code_free(re);
	return rc;
}

/* ---- dispatch ---- */

int agg_str_eval(const expr *x, const bson_t *root, docbuild_node **out, const ectx *e)
{
	docbuild_node *v[4] = {NULL, NULL, NULL, NULL};
	const char *name = ext_name(x);
	int rc = 0;

	*out = NULL;
	for (size_t i = 0; i < x->n && i < 4 && rc == 0; i++) {
		rc = ext_arg(x, i, root, &v[i], e);
	}
	if (rc != 0) {
		goto done;
	}
	switch (x->ext) {
	case E_SPLIT: {
		const char *s, *sep;
		size_t len, slen, i = 0, from = 0;
		docbuild_node *arr;

		if (is_nullish(v[0]) || is_nullish(v[1])) {
			*out = v_null();
			break;
		}
		if (v[0]->type != BSON_TYPE_UTF8) {
			rc = efail(e, 40085, "$split requires an expression that evaluates to a string as a first argument, found: %s",
				   type_name(v[0]->type));
			break;
		}
		if (v[1]->type != BSON_TYPE_UTF8) {
			rc = efail(e, 40086, "$split requires an expression that evaluates to a string as a second argument, found: %s",
				   type_name(v[1]->type));
			break;
		}
		s = v[0]->value.value.v_utf8.str;
		len = v[0]->value.value.v_utf8.len;
		sep = v[1]->value.value.v_utf8.str;
		slen = v[1]->value.value.v_utf8.len;
		if (slen == 0) {
			rc = efail(e, 40087, "$split requires a non-empty separator");
			break;
		}
		arr = docbuild_new_array(NULL);
		{
			size_t total = 0;
			const char *hit;

			for (size_t iter = 0; (hit = find_bytes(s, len, i, sep, slen)) != NULL; iter++) {
				if (agg_check_interrupt(iter, e) != 0) {
					total = SIZE_MAX;
					break;
				}
				i = (size_t)(hit - s);
				/* an element's BSON size: type, index key, length, bytes, NUL */
				total += (i - from) + 16;
				if (total > STR_MAX_RESULT) {
					break;
				}
				docbuild_push(arr, v_string(s + from, i - from));
				i += slen;
				from = i;
			}
			if (total == SIZE_MAX) {
				docbuild_free(arr);
				rc = SDB_ECANCELED; /* interrupted: the code and message are in e */
				break;
			}
			if (total > STR_MAX_RESULT) {
				docbuild_free(arr);
				rc = too_big(total, e);
				break;
			}
		}
		docbuild_push(arr, v_string(s + from, len - from));
		*out = arr;
		break;
	}
	case E_TRIM:
	case E_LTRIM:
	case E_RTRIM:
		rc = eval_trim(x, v, out, e);
		break;
	case E_INDEXOFBYTES:
	case E_INDEXOFCP:
		rc = eval_indexof(x, v, out, e);
		break;
	case E_STRLENCP:
		if (ntype(v[0]) != BSON_TYPE_UTF8) {
			rc = efail(e, 34471, "$strLenCP requires a string argument, found: %s",
				   type_name(ntype(v[0])));
			break;
		}
		*out = v_int32((int32_t)cp_count(v[0]->value.value.v_utf8.str, v[0]->value.value.v_utf8.len));
		break;
	case E_SUBSTRCP: {
		char *s = NULL, show[256];
		size_t len = 0, b, en;
		int32_t start = 0, count = 0;

		rc = coerce_string(v[0], name, &s, &len, e);
		if (rc != 0) {
			break;
		}
		if (!is_number(v[1])) {
			rc = efail(e, 34450, "%s: starting index must be a numeric type (is BSON type %s)",
				   name, type_name(ntype(v[1])));
		} else if (!agg_integral32(v[1], &start)) {
			rc = efail(e, 34451, "%s: starting index cannot be represented as a 32-bit integral value: %s",
				   name, ext_show(v[1], show, sizeof show));
		} else if (!is_number(v[2])) {
			rc = efail(e, 34452, "%s: length must be a numeric type (is BSON type %s)", name,
				   type_name(ntype(v[2])));
		} else if (!agg_integral32(v[2], &count)) {
			rc = efail(e, 34453, "%s: length cannot be represented as a 32-bit integral value: %s",
				   name, ext_show(v[2], show, sizeof show));
		} else if (count < 0) {
			rc = efail(e, 34454, "%s: length must be a nonnegative integer.", name);
		} else if (start < 0) {
			rc = efail(e, 34455, "%s: the starting index must be nonnegative integer.", name);
		}
		if (rc == 0) {
			b = cp_offset(s, len, (size_t)start);
			en = b + cp_offset(s + b, len - b, (size_t)count);
			*out = v_string(s + b, en - b);
		}
		free(s);
		break;
	}
	case E_STRCASECMP: {
		char *a = NULL, *b = NULL;
		size_t la = 0, lb = 0;
		int c = 0;

		rc = coerce_string(v[0], name, &a, &la, e);
		if (rc == 0) {
			rc = coerce_string(v[1], name, &b, &lb, e);
		}
		if (rc == 0) {
			for (size_t i = 0; i < la && i < lb && c == 0; i++) {
				int ca = (unsigned char)a[i], cb = (unsigned char)b[i];

				ca = ca >= 'a' && ca <= 'z' ? ca - 32 : ca;
				cb = cb >= 'a' && cb <= 'z' ? cb - 32 : cb;
				c = (ca > cb) - (ca < cb);
			}
			if (c == 0) {
				c = (la > lb) - (la < lb);
			}
			*out = v_int32(c);
		}
		free(a);
		free(b);
		break;
	}
	case E_REPLACEONE:
	case E_REPLACEALL:
		rc = eval_replace(x, v, out, e);
		break;
	default:
		rc = eval_regex(x, v, out, e);
		break;
	}
done:
	for (size_t i = 0; i < 4; i++) {
		docbuild_free(v[i]);
	}
	if (rc != 0) {
		docbuild_free(*out);
		*out = NULL;
	}
	return rc;
}
