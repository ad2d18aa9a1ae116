/* Collations with ICU (issue #20); the contract is in storage/collation.h. */
#include "storage/collation.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unicode/ucol.h>
#include <unicode/uloc.h>
#include <unicode/ustring.h>
#include <unicode/uvernum.h>

#include "common/alloc.h"
#include "common/err.h"

#define CODE_BAD_VALUE 2
#define CODE_NO_SUCH_KEY 4
#define CODE_FAILED_TO_PARSE 9
#define CODE_TYPE_MISMATCH 14
#define CODE_OPERATION_FAILED 96

struct sdb_collator {
	sdb_bson_collator base; /* first: sdb_bson_collator_get() casts back */
	UCollator *ucol;
	bson_t spec; /* the full spec, as MongoDB reports it */
	char *cache_key;
	sdb_collator *next;
};

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static sdb_collator *cache_head;

/* {locale: "simple"} as BSON */
static const uint8_t simple_bytes[] = {24, 0, 0, 0, 0x02, 'l', 'o', 'c', 'a', 'l', 'e', 0, 7, 0, 0, 0,
				       's', 'i', 'm', 'p', 'l', 'e', 0, 0};
static bson_t simple_doc;
static pthread_once_t simple_once = PTHREAD_ONCE_INIT;

static void simple_init(void)
{
	bson_init_static(&simple_doc, simple_bytes, sizeof simple_bytes);
}

static const bson_t *simple_spec(void)
{
	pthread_once(&simple_once, simple_init);
	return &simple_doc;
}

/* UTF-8 to UTF-16 (invalid sequences as U+FFFD). Returns a heap buffer (sdb_free) and its
 * length in *n; buf (cap UChars) is used when it is big enough (then not to be freed). */
static UChar *to_u16(const char *s, size_t len, UChar *buf, int32_t cap, int32_t *n,
		     bool *heap)
{
	UErrorCode st = U_ZERO_ERROR;
	int32_t need = 0;

	*heap = false;
	if (len > (size_t)INT32_MAX / 2)
		len = (size_t)INT32_MAX / 2; /* a BSON string is < 16 MB anyway */
	u_strFromUTF8WithSub(buf, cap, &need, s, (int32_t)len, 0xFFFD, NULL, &st);
	if (st == U_BUFFER_OVERFLOW_ERROR || need >= cap) {
		UChar *h = sdb_malloc(((size_t)need + 1) * sizeof *h);

		st = U_ZERO_ERROR;
		u_strFromUTF8WithSub(h, need + 1, &need, s, (int32_t)len, 0xFFFD, NULL, &st);
		*heap = true;
		buf = h;
	}
	if (U_FAILURE(st))
		need = 0;
	*n = need;
	return buf;
}

static int icu_cmp(const sdb_collator *c, const char *a, size_t alen, const char *b, size_t blen)
{
	UErrorCode st = U_ZERO_ERROR;
	UCharIterator ia, ib;
	UCollationResult r;

	if (alen > INT32_MAX || blen > INT32_MAX)
		return 0;
	uiter_setUTF8(&ia, a, (int32_t)alen);
	uiter_setUTF8(&ib, b, (int32_t)blen);
	r = ucol_strcollIter(c->ucol, &ia, &ib, &st);
	if (U_FAILURE(st)) {
		/* cannot happen with valid arguments; never crash, fall back to bytes */
		size_t n = alen < blen ? alen : blen;
		int m = n ? memcmp(a, b, n) : 0;
		return m ? m : (alen > blen) - (alen < blen);
	}
	return r == UCOL_LESS ? -1 : r == UCOL_GREATER ? 1 : 0;
}

static int hook_cmp(const sdb_bson_collator *self, const char *a, size_t alen, const char *b,
		    size_t blen)
{
	return icu_cmp((const sdb_collator *)self, a, alen, b, blen);
}

int sdb_collator_cmp(const sdb_collator *c, const char *a, size_t alen, const char *b,
		     size_t blen)
{
	if (c == NULL) {
		size_t n = alen < blen ? alen : blen;
		int m = n ? memcmp(a, b, n) : 0;

		if (m)
			return m < 0 ? -1 : 1;
		return (alen > blen) - (alen < blen);
	}
	return icu_cmp(c, a, alen, b, blen);
}

void sdb_collator_sort_key(const sdb_collator *c, const char *s, size_t len, sdb_key *out)
{
	UChar sbuf[256];
	uint8_t kbuf[512];
	int32_t n, klen;
	bool heap;
	UChar *u;

	if (c == NULL) {
		sdb_key_append(out, s, len);
		return;
	}
	u = to_u16(s, len, sbuf, (int32_t)(sizeof sbuf / sizeof sbuf[0]), &n, &heap);
	klen = ucol_getSortKey(c->ucol, u, n, kbuf, (int32_t)sizeof kbuf);
	if (klen > (int32_t)sizeof kbuf) {
		uint8_t *k = sdb_malloc((size_t)klen);

		klen = ucol_getSortKey(c->ucol, u, n, k, klen);
		if (klen > 1)
			sdb_key_append(out, k, (size_t)klen - 1);
		free(k);
	} else if (klen > 1) {
		sdb_key_append(out, kbuf, (size_t)klen - 1); /* without the final 0x00 */
	}
	if (heap)
		free(u);
}

const bson_t *sdb_collator_spec(const sdb_collator *c)
{
	return c ? &c->spec : simple_spec();
}

const sdb_bson_collator *sdb_collator_hook(const sdb_collator *c)
{
	return c ? &c->base : NULL;
}

const sdb_collator *sdb_collation_current(void)
{
	return (const sdb_collator *)sdb_bson_collator_get();
}

const sdb_collator *sdb_collation_use(const sdb_collator *c)
{
	return (const sdb_collator *)sdb_bson_collator_set(sdb_collator_hook(c));
}

bool sdb_collation_is_simple_spec(const bson_iter_t *field)
{
	bson_iter_t c;

	if (!BSON_ITER_HOLDS_DOCUMENT(field) || !bson_iter_recurse(field, &c) || !bson_iter_next(&c))
		return false;
	if (strcmp(bson_iter_key(&c), "locale") != 0 || !BSON_ITER_HOLDS_UTF8(&c) ||
	    strcmp(bson_iter_utf8(&c, NULL), "simple") != 0)
		return false;
	return !bson_iter_next(&c);
}

/* ---- parsing ---- */

/* The requested options; -1 = not given (the locale's default). */
typedef struct coll_opts {
	const char *locale;
	int case_level, numeric, normalization, backwards;
	int case_first;	 /* UCOL_UPPER_FIRST, UCOL_LOWER_FIRST, UCOL_OFF */
	int strength;	 /* 1..5 */
	int alternate;	 /* UCOL_NON_IGNORABLE, UCOL_SHIFTED */
	int max_variable; /* UCOL_REORDER_CODE_PUNCTUATION / _SPACE */
	const char *version;
} coll_opts;

static int fail(int *code, int c, char *err, size_t errlen, int rc, const char *fmt, ...)
	__attribute__((format(printf, 6, 7)));
static int fail(int *code, int c, char *err, size_t errlen, int rc, const char *fmt, ...)
{
	va_list ap;

	*code = c;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return rc;
}

/* The spec as MongoDB prints it in messages ({ locale: "x", strength: 2 }): relaxed
 * extended JSON is close enough (the field names and values are the same). Heap string. */
static char *spec_str(const bson_t *spec)
{
	size_t n;
	char *j = bson_as_relaxed_extended_json(spec, &n);
	char *s = sdb_strdup(j ? j : "{}");

	bson_free(j);
	return s;
}

static int type_mismatch(const char *field, const char *want, const bson_iter_t *it, int *code,
			 char *err, size_t errlen)
{
	return fail(code, CODE_TYPE_MISMATCH, err, errlen, SDB_EINVAL,
		    "\"%s\" had the wrong type. Expected %s, found %s", field, want,
		    sdb_bson_type_name(bson_iter_type(it)));
}

static int parse_bool(const bson_iter_t *it, const char *field, int *out, int *code, char *err,
		      size_t errlen)
{
	if (!BSON_ITER_HOLDS_BOOL(it))
		return type_mismatch(field, "bool", it, code, err, errlen);
	*out = bson_iter_bool(it) ? 1 : 0;
	return 0;
}

static int parse_str(const bson_iter_t *it, const char *field, const char **out, int *code,
		     char *err, size_t errlen)
{
	if (!BSON_ITER_HOLDS_UTF8(it))
		return type_mismatch(field, "string", it, code, err, errlen);
	*out = bson_iter_utf8(it, NULL);
	return 0;
}

static int parse_opts(const bson_t *spec, coll_opts *o, int *code, char *err, size_t errlen)
{
	bson_iter_t it;
	const char *s;
	int rc;
	bool unknown = false;

	memset(o, 0, sizeof *o);
	o->case_level = o->numeric = o->normalization = o->backwards = -1;
	o->case_first = o->strength = o->alternate = o->max_variable = -1;
	if (!bson_iter_init(&it, spec))
		return fail(code, CODE_FAILED_TO_PARSE, err, errlen, SDB_EINVAL,
			    "malformed collation spec");
	/* locale first: MongoDB parses it before the rest (parseLocaleID) */
	if (!bson_iter_init_find(&it, spec, "locale"))
		return fail(code, CODE_NO_SUCH_KEY, err, errlen, SDB_EINVAL,
			    "Missing expected field \"locale\"");
	if ((rc = parse_str(&it, "locale", &o->locale, code, err, errlen)) != 0)
		return rc;
	{
		uint32_t len;
		const char *l = bson_iter_utf8(&it, &len);

		if (strlen(l) != len) {
			char *j = spec_str(spec);

			rc = fail(code, CODE_BAD_VALUE, err, errlen, SDB_EINVAL,
				  "Field 'locale' cannot contain null byte. Collation spec: %s", j);
			free(j);
			return rc;
		}
	}
	if (strcmp(o->locale, "simple") == 0) {
		if (bson_count_keys(spec) > 1) {
			char *j = spec_str(spec);

			rc = fail(code, CODE_FAILED_TO_PARSE, err, errlen, SDB_EINVAL,
				  "If locale=simple, no other fields should be present in: %s", j);
			free(j);
			return rc;
		}
		return 0;
	}
	bson_iter_init(&it, spec);
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);

		rc = 0;
		if (strcmp(k, "locale") == 0)
			continue;
		if (strcmp(k, "caseLevel") == 0) {
			rc = parse_bool(&it, k, &o->case_level, code, err, errlen);
		} else if (strcmp(k, "numericOrdering") == 0) {
			rc = parse_bool(&it, k, &o->numeric, code, err, errlen);
		} else if (strcmp(k, "normalization") == 0) {
			rc = parse_bool(&it, k, &o->normalization, code, err, errlen);
		} else if (strcmp(k, "backwards") == 0) {
			rc = parse_bool(&it, k, &o->backwards, code, err, errlen);
		} else if (strcmp(k, "caseFirst") == 0) {
			if ((rc = parse_str(&it, k, &s, code, err, errlen)) != 0)
				return rc;
			if (strcmp(s, "upper") == 0)
				o->case_first = UCOL_UPPER_FIRST;
			else if (strcmp(s, "lower") == 0)
				o->case_first = UCOL_LOWER_FIRST;
			else if (strcmp(s, "off") == 0)
				o->case_first = UCOL_OFF;
			else
				return fail(code, CODE_FAILED_TO_PARSE, err, errlen, SDB_EINVAL,
					    "Field 'caseFirst' must be 'upper', 'lower', or 'off'. "
					    "Got: %s",
					    s);
		} else if (strcmp(k, "strength") == 0) {
			int64_t v;

			if (!BSON_ITER_HOLDS_NUMBER(&it))
				return type_mismatch(k, "number", &it, code, err, errlen);
			if (BSON_ITER_HOLDS_DOUBLE(&it) &&
			    (bson_iter_double(&it) != (double)(int64_t)bson_iter_double(&it)))
				return fail(code, CODE_BAD_VALUE, err, errlen, SDB_EINVAL,
					    "Expected field \"strength\" to have a value exactly "
					    "representable as a 64-bit integer, but found strength: "
					    "%g",
					    bson_iter_double(&it));
			v = bson_iter_as_int64(&it);
			if (v < 1 || v > 5)
				return fail(code, CODE_FAILED_TO_PARSE, err, errlen, SDB_EINVAL,
					    "Field 'strength' must be an integer 1 through 5. Got: "
					    "%" PRId64,
					    v);
			o->strength = (int)v;
		} else if (strcmp(k, "alternate") == 0) {
			if ((rc = parse_str(&it, k, &s, code, err, errlen)) != 0)
				return rc;
			if (strcmp(s, "non-ignorable") == 0)
				o->alternate = UCOL_NON_IGNORABLE;
			else if (strcmp(s, "shifted") == 0)
				o->alternate = UCOL_SHIFTED;
			else
				return fail(code, CODE_FAILED_TO_PARSE, err, errlen, SDB_EINVAL,
					    "Field 'alternate' must be 'non-ignorable' or 'shifted'. "
					    "Got: %s",
					    s);
		} else if (strcmp(k, "maxVariable") == 0) {
			if ((rc = parse_str(&it, k, &s, code, err, errlen)) != 0)
				return rc;
			if (strcmp(s, "punct") == 0)
				o->max_variable = UCOL_REORDER_CODE_PUNCTUATION;
			else if (strcmp(s, "space") == 0)
				o->max_variable = UCOL_REORDER_CODE_SPACE;
			else
				return fail(code, CODE_FAILED_TO_PARSE, err, errlen, SDB_EINVAL,
					    "Field 'maxVariable' must be 'punct' or 'space'. Got: %s",
					    s);
		} else if (strcmp(k, "version") == 0) {
			rc = parse_str(&it, k, &o->version, code, err, errlen);
		} else {
			unknown = true;
		}
		if (rc)
			return rc;
	}
	if (unknown) {
		char *j = spec_str(spec);

		rc = fail(code, CODE_FAILED_TO_PARSE, err, errlen, SDB_EINVAL,
			  "Collation spec contains unknown field. Collation spec: %s", j);
		free(j);
		return rc;
	}
	return 0;
}

/* Open and configure the ICU collator of o; validate as MongoDB. */
static int make(const bson_t *spec, const coll_opts *o, sdb_collator **out, int *code, char *err,
		size_t errlen)
{
	UErrorCode st = U_ZERO_ERROR;
	char canon[ULOC_FULLNAME_CAPACITY];
	const char *valid;
	UCollator *u;
	int rc = 0;
	char *j = NULL;
	int strength, case_level, case_first, alternate, maxvar;

	if (o->locale[0] == '\0') {
		j = spec_str(spec);
		rc = fail(code, CODE_BAD_VALUE, err, errlen, SDB_EINVAL,
			  "Field 'locale' cannot be the empty string in: %s", j);
		free(j);
		return rc;
	}
	uloc_getName(o->locale, canon, (int32_t)sizeof canon, &st);
	if (U_FAILURE(st) || st == U_STRING_NOT_TERMINATED_WARNING) {
		j = spec_str(spec);
		rc = fail(code, CODE_BAD_VALUE, err, errlen, SDB_EINVAL,
			  "Field 'locale' is not valid in: %s", j);
		free(j);
		return rc;
	}
	st = U_ZERO_ERROR;
	u = ucol_open(canon, &st);
	if (U_FAILURE(st) || u == NULL) {
		j = spec_str(spec);
		rc = fail(code, CODE_OPERATION_FAILED, err, errlen, SDB_EINTERNAL,
			  "Failed to create collator: %s. Collation spec: %s", u_errorName(st), j);
		free(j);
		if (u)
			ucol_close(u);
		return rc;
	}
	st = U_ZERO_ERROR;
	valid = ucol_getLocaleByType(u, ULOC_VALID_LOCALE, &st);
	if (U_FAILURE(st) || valid == NULL || strcmp(valid, o->locale) != 0) {
		j = spec_str(spec);
		if (valid && strcmp(valid, "root") != 0 && valid[0] != '\0')
			rc = fail(code, CODE_BAD_VALUE, err, errlen, SDB_EINVAL,
				  "Field 'locale' is invalid in: %s. Did you mean '%s'?", j, valid);
		else
			rc = fail(code, CODE_BAD_VALUE, err, errlen, SDB_EINVAL,
				  "Field 'locale' is invalid in: %s", j);
		free(j);
		ucol_close(u);
		return rc;
	}
#define SET(attr, val)                                                                          \
	do {                                                                                    \
		st = U_ZERO_ERROR;                                                              \
		ucol_setAttribute(u, attr, (UColAttributeValue)(val), &st);                     \
		if (U_FAILURE(st))                                                              \
			goto icu_fail;                                                          \
	} while (0)
	if (o->case_level >= 0)
		SET(UCOL_CASE_LEVEL, o->case_level ? UCOL_ON : UCOL_OFF);
	if (o->case_first >= 0)
		SET(UCOL_CASE_FIRST, o->case_first);
	if (o->strength > 0)
		SET(UCOL_STRENGTH, o->strength == 4   ? UCOL_QUATERNARY
				   : o->strength == 5 ? UCOL_IDENTICAL
						      : o->strength - 1);
	if (o->numeric >= 0)
		SET(UCOL_NUMERIC_COLLATION, o->numeric ? UCOL_ON : UCOL_OFF);
	if (o->alternate >= 0)
		SET(UCOL_ALTERNATE_HANDLING, o->alternate);
	if (o->max_variable >= 0) {
		st = U_ZERO_ERROR;
		ucol_setMaxVariable(u, (UColReorderCode)o->max_variable, &st);
		if (U_FAILURE(st))
			goto icu_fail;
	}
	if (o->normalization >= 0)
		SET(UCOL_NORMALIZATION_MODE, o->normalization ? UCOL_ON : UCOL_OFF);
	if (o->backwards >= 0)
		SET(UCOL_FRENCH_COLLATION, o->backwards ? UCOL_ON : UCOL_OFF);
#undef SET
	if (o->version && strcmp(o->version, U_ICU_VERSION) != 0) {
		j = spec_str(spec);
		rc = fail(code, SDB_CODE_INCOMPATIBLE_COLLATION_VERSION, err, errlen, SDB_EINVAL,
			  "Requested collation version %s but the only available collator version "
			  "was %s. Requested collation spec: %s",
			  o->version, U_ICU_VERSION, j);
		free(j);
		ucol_close(u);
		return rc;
	}
	/* the effective values (the locale's defaults where not given) */
	st = U_ZERO_ERROR;
	switch (ucol_getAttribute(u, UCOL_STRENGTH, &st)) {
	case UCOL_PRIMARY:
		strength = 1;
		break;
	case UCOL_SECONDARY:
		strength = 2;
		break;
	case UCOL_QUATERNARY:
		strength = 4;
		break;
	case UCOL_IDENTICAL:
		strength = 5;
		break;
	default:
		strength = 3;
		break;
	}
	case_level = ucol_getAttribute(u, UCOL_CASE_LEVEL, &st) == UCOL_ON;
	case_first = ucol_getAttribute(u, UCOL_CASE_FIRST, &st);
	alternate = ucol_getAttribute(u, UCOL_ALTERNATE_HANDLING, &st);
	maxvar = ucol_getMaxVariable(u);
	bool numeric = ucol_getAttribute(u, UCOL_NUMERIC_COLLATION, &st) == UCOL_ON;
	bool norm = ucol_getAttribute(u, UCOL_NORMALIZATION_MODE, &st) == UCOL_ON;
	bool backwards = ucol_getAttribute(u, UCOL_FRENCH_COLLATION, &st) == UCOL_ON;
	if (U_FAILURE(st))
		goto icu_fail;
	/* validateCollationSpec */
	if (backwards && strength == 1) {
		rc = fail(code, CODE_BAD_VALUE, err, errlen, SDB_EINVAL,
			  "'backwards' is invalid with 'strength' of 1");
		ucol_close(u);
		return rc;
	}
	if (case_first != UCOL_OFF && !case_level && strength <= 2) {
		rc = fail(code, CODE_BAD_VALUE, err, errlen, SDB_EINVAL,
			  "'caseFirst' is invalid unless 'caseLevel' is on or 'strength' is "
			  "greater than 2");
		ucol_close(u);
		return rc;
	}
	sdb_collator *c = sdb_calloc_bson(1, sizeof *c);
	c->base.cmp = hook_cmp;
	c->ucol = u;
	bson_init(&c->spec);
	BSON_APPEND_UTF8(&c->spec, "locale", canon);
	BSON_APPEND_BOOL(&c->spec, "caseLevel", case_level);
	BSON_APPEND_UTF8(&c->spec, "caseFirst",
			 case_first == UCOL_UPPER_FIRST	  ? "upper"
			 : case_first == UCOL_LOWER_FIRST ? "lower"
							  : "off");
	BSON_APPEND_INT32(&c->spec, "strength", strength);
	BSON_APPEND_BOOL(&c->spec, "numericOrdering", numeric);
	BSON_APPEND_UTF8(&c->spec, "alternate",
			 alternate == UCOL_SHIFTED ? "shifted" : "non-ignorable");
	BSON_APPEND_UTF8(&c->spec, "maxVariable",
			 maxvar == UCOL_REORDER_CODE_SPACE ? "space" : "punct");
	BSON_APPEND_BOOL(&c->spec, "normalization", norm);
	BSON_APPEND_BOOL(&c->spec, "backwards", backwards);
	BSON_APPEND_UTF8(&c->spec, "version", U_ICU_VERSION);
	*out = c;
	return 0;
icu_fail:
	j = spec_str(spec);
	rc = fail(code, CODE_OPERATION_FAILED, err, errlen, SDB_EINTERNAL,
		  "Failed to set collation attribute: %s. Collation spec: %s", u_errorName(st), j);
	free(j);
	ucol_close(u);
	return rc;
}

int sdb_collation_parse_doc(const bson_t *spec, const sdb_collator **out, int *code, char *err,
			    size_t errlen)
{
	coll_opts o;
	int rc;
	sdb_collator *c = NULL, *e;
	char *key;

	*out = NULL;
	*code = 0;
	if ((rc = parse_opts(spec, &o, code, err, errlen)) != 0)
		return rc;
	if (strcmp(o.locale, "simple") == 0)
		return 0;
	/* the cache key: the request's own options (the same request gives the same collator) */
	key = sdb_asprintf("%s|%d|%d|%d|%d|%d|%d|%d|%d|%s", o.locale, o.case_level, o.numeric,
			   o.normalization, o.backwards, o.case_first, o.strength, o.alternate,
			   o.max_variable, o.version ? o.version : "");
	pthread_mutex_lock(&cache_mu);
	for (e = cache_head; e; e = e->next)
		if (strcmp(e->cache_key, key) == 0)
			break;
	pthread_mutex_unlock(&cache_mu);
	if (e) {
		free(key);
		*out = e;
		return 0;
	}
	if ((rc = make(spec, &o, &c, code, err, errlen)) != 0) {
		free(key);
		return rc;
	}
	c->cache_key = key;
	pthread_mutex_lock(&cache_mu);
	for (e = cache_head; e; e = e->next)
		if (strcmp(e->cache_key, key) == 0)
			break;
	if (e == NULL) {
		c->next = cache_head;
		cache_head = c;
	}
	pthread_mutex_unlock(&cache_mu);
	if (e) { /* another thread made it meanwhile */
		ucol_close(c->ucol);
		bson_destroy(&c->spec);
		free(c->cache_key);
		free(c);
		c = e;
	}
	*out = c;
	return 0;
}

int sdb_collation_parse(const bson_iter_t *it, const sdb_collator **out, int *code, char *err,
			size_t errlen)
{
	bson_t doc;
	const uint8_t *data;
	uint32_t len;

	*out = NULL;
	if (!BSON_ITER_HOLDS_DOCUMENT(it))
		return fail(code, CODE_TYPE_MISMATCH, err, errlen, SDB_EINVAL,
			    "BSON field 'collation' is the wrong type '%s', expected type 'object'",
			    sdb_bson_type_name(bson_iter_type(it)));
	bson_iter_document(it, &len, &data);
	if (!bson_init_static(&doc, data, len))
		return fail(code, CODE_FAILED_TO_PARSE, err, errlen, SDB_EINVAL,
			    "malformed collation spec");
	return sdb_collation_parse_doc(&doc, out, code, err, errlen);
}
