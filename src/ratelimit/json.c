/* HTTP/JSON gateway codec (see json.h). JSON is read and written by libbson; nothing
 * here scans JSON text by hand. */
#include "ratelimit/json.h"

#include <bson/bson.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/bsonget.h"
#include "common/err.h"

typedef struct priv {
	bson_t *doc; /* heap: bson_t wants 128-byte alignment, which libbson's allocator gives */
	rl_kv *kv; /* every request's metadata pairs, one array */
	size_t n_kv;
	size_t cap_kv;
} priv;

static const char *const algorithm_names[] = {"TOKEN_BUCKET", "LEAKY_BUCKET", "GCRA"};
static const char *const status_names[] = {"UNDER_LIMIT", "OVER_LIMIT"};

/* gubernator.proto enum Behavior; NO_BATCHING..DRAIN_OVER_LIMIT are bits. */
static const struct {
	const char *name;
	int32_t value;
} behavior_names[] = {
	{"BATCHING", RL_BATCHING},
	{"NO_BATCHING", RL_NO_BATCHING},
	{"GLOBAL", RL_GLOBAL},
	{"DURATION_IS_GREGORIAN", RL_DURATION_IS_GREGORIAN},
	{"RESET_REMAINING", RL_RESET_REMAINING},
	{"MULTI_REGION", RL_MULTI_REGION},
	{"DRAIN_OVER_LIMIT", RL_DRAIN_OVER_LIMIT},
};

const char *rl_algorithm_name(int32_t algorithm)
{
	if (algorithm < 0 || algorithm > RL_ALGORITHM_MAX)
		return NULL;
	return algorithm_names[algorithm];
}

const char *rl_status_name(int32_t status)
{
	if (status < 0 || status > 1)
		return NULL;
	return status_names[status];
}

/* A decimal integer string, whole (protojson's int64 encoding). */
static bool parse_decimal(const char *s, int64_t *out)
{
	char *end;
	long long v;

	/* strtoll would skip any leading white space and take a '+': protojson takes
	 * neither */
	if (*s == '\0' || isspace((unsigned char)*s) || *s == '+')
		return false;
	errno = 0;
	v = strtoll(s, &end, 10);
	if (errno != 0 || *end != '\0')
		return false;
	*out = v;
	return true;
}

/* proto3 JSON int64: a number (common/bsonget.h's integral rules), a decimal string, or
 * null (0). */
static int get_int64(const bson_iter_t *it, const char *field, int64_t *out, char *err,
		     size_t errlen)
{
	if (BSON_ITER_HOLDS_NULL(it)) {
		*out = 0;
		return 0;
	}
	if (sdb_bson_as_int64(it, out))
		return 0;
	if (BSON_ITER_HOLDS_UTF8(it) && parse_decimal(bson_iter_utf8(it, NULL), out))
		return 0;
	return sdb_errf(err, errlen, SDB_EPROTO,
			"invalid value for field '%s': want an int64 (number or decimal string)",
			field);
}

static int get_string(const bson_iter_t *it, const char *field, const char **out, char *err,
		      size_t errlen)
{
	uint32_t len;
	const char *s;

	if (bson_iter_type(it) == BSON_TYPE_NULL) {
		*out = "";
		return 0;
	}
	if (bson_iter_type(it) != BSON_TYPE_UTF8)
		return sdb_errf(err, errlen, SDB_EPROTO,
				"invalid value for field '%s': want a string", field);
	s = bson_iter_utf8(it, &len);
	if (strlen(s) != len)
		return sdb_errf(err, errlen, SDB_EPROTO,
				"invalid value for field '%s': contains a NUL character", field);
	*out = s;
	return 0;
}

static bool int32_of(const bson_iter_t *it, int32_t *out)
{
	int64_t v = 0;
	if (get_int64(it, "", &v, NULL, 0) != 0 || v < INT32_MIN || v > INT32_MAX)
		return false;
	*out = (int32_t)v;
	return true;
}

static int get_algorithm(const bson_iter_t *it, int32_t *out, char *err, size_t errlen)
{
	if (bson_iter_type(it) == BSON_TYPE_UTF8) {
		const char *s = bson_iter_utf8(it, NULL);
		for (int32_t i = 0; i <= RL_ALGORITHM_MAX; i++) {
			if (strcmp(s, algorithm_names[i]) == 0) {
				*out = i;
				return 0;
			}
		}
	}
	if (int32_of(it, out))
		return 0;
	return sdb_errf(err, errlen, SDB_EPROTO,
			"invalid value for enum field 'algorithm': want TOKEN_BUCKET, "
			"LEAKY_BUCKET, GCRA or a number");
}

static int get_behavior(const bson_iter_t *it, int32_t *out, char *err, size_t errlen)
{
	if (bson_iter_type(it) == BSON_TYPE_UTF8) {
		const char *s = bson_iter_utf8(it, NULL);
		int32_t v = 0;
		bool ok = true;
		/* NAME, or NAME|NAME... (',' also separates); no empty names */
		for (;;) {
			size_t n = strcspn(s, "|,");
			size_t i;
			bool found = false;
			for (i = 0; i < sizeof(behavior_names) / sizeof(behavior_names[0]); i++) {
				if (strlen(behavior_names[i].name) == n &&
				    strncmp(s, behavior_names[i].name, n) == 0) {
					v |= behavior_names[i].value;
					found = true;
					break;
				}
			}
			if (!found) {
				ok = false;
				break;
			}
			s += n;
			if (*s == '\0')
				break;
			s++; /* separator: another name must follow */
		}
		if (ok) {
			*out = v;
			return 0;
		}
	}
	if (int32_of(it, out))
		return 0;
	return sdb_errf(err, errlen, SDB_EPROTO,
			"invalid value for enum field 'behavior': want names such as "
			"\"GLOBAL|DRAIN_OVER_LIMIT\" or a number");
}

static bool key_is(const char *key, const char *snake, const char *camel)
{
	return strcmp(key, snake) == 0 || (camel != NULL && strcmp(key, camel) == 0);
}

/* Count a metadata object's pairs (strings only). */
static int count_metadata(const bson_iter_t *it, size_t *n, char *err, size_t errlen)
{
	bson_iter_t child;

	if (bson_iter_type(it) == BSON_TYPE_NULL)
		return 0;
	if (bson_iter_type(it) != BSON_TYPE_DOCUMENT || !bson_iter_recurse(it, &child))
		return sdb_errf(err, errlen, SDB_EPROTO,
				"invalid value for field 'metadata': want an object of strings");
	while (bson_iter_next(&child)) {
		if (bson_iter_type(&child) != BSON_TYPE_UTF8)
			return sdb_errf(err, errlen, SDB_EPROTO,
					"invalid value for field 'metadata.%s': want a string",
					bson_iter_key(&child));
		(*n)++;
	}
	return 0;
}

/* RateLimitReq's fields (proto names, and the JSON names protojson also accepts): the
 * index of k, or -1 for an unknown field. */
static int field_index(const char *k)
{
	static const char *const names[][2] = {
		{"name", NULL},		{"unique_key", "uniqueKey"}, {"hits", NULL},
		{"limit", NULL},	{"duration", NULL},	      {"burst", NULL},
		{"created_at", "createdAt"}, {"algorithm", NULL},   {"behavior", NULL},
		{"metadata", NULL},
	};
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
		if (key_is(k, names[i][0], names[i][1]))
			return (int)i;
	return -1;
}

static int parse_req(const bson_iter_t *item, rl_req *r, priv *p, char *err, size_t errlen)
{
	bson_iter_t it;
	int rc = 0;
	unsigned seen = 0;

	memset(r, 0, sizeof(*r));
	r->name = "";
	r->unique_key = "";
	if (bson_iter_type(item) != BSON_TYPE_DOCUMENT || !bson_iter_recurse(item, &it))
		return sdb_errf(err, errlen, SDB_EPROTO,
				"invalid value for field 'requests': want an array of objects");
	while (rc == 0 && bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		int f = field_index(k);
		if (f >= 0) {
			/* protojson refuses a field given twice (also as snake and camel) */
			if (seen & (1u << f))
				return sdb_errf(err, errlen, SDB_EPROTO,
						"duplicate field '%s' in a request", k);
			seen |= 1u << f;
		}
		if (key_is(k, "name", NULL))
			rc = get_string(&it, "name", &r->name, err, errlen);
		else if (key_is(k, "unique_key", "uniqueKey"))
			rc = get_string(&it, "unique_key", &r->unique_key, err, errlen);
		else if (key_is(k, "hits", NULL))
			rc = get_int64(&it, "hits", &r->hits, err, errlen);
		else if (key_is(k, "limit", NULL))
			rc = get_int64(&it, "limit", &r->limit, err, errlen);
		else if (key_is(k, "duration", NULL))
			rc = get_int64(&it, "duration", &r->duration, err, errlen);
		else if (key_is(k, "burst", NULL))
			rc = get_int64(&it, "burst", &r->burst, err, errlen);
		else if (key_is(k, "created_at", "createdAt"))
			rc = get_int64(&it, "created_at", &r->created_at, err, errlen);
		else if (key_is(k, "algorithm", NULL))
			rc = get_algorithm(&it, &r->algorithm, err, errlen);
		else if (key_is(k, "behavior", NULL))
			rc = get_behavior(&it, &r->behavior, err, errlen);
		else if (key_is(k, "metadata", NULL) && bson_iter_type(&it) == BSON_TYPE_DOCUMENT) {
			bson_iter_t child;
			bson_iter_recurse(&it, &child);
			r->metadata = &p->kv[p->n_kv];
			while (bson_iter_next(&child) && p->n_kv < p->cap_kv) {
				p->kv[p->n_kv].key = bson_iter_key(&child);
				p->kv[p->n_kv].value = bson_iter_utf8(&child, NULL);
				p->n_kv++;
				r->n_metadata++;
			}
		}
		/* unknown fields are ignored (protojson DiscardUnknown, as grpc-gateway) */
	}
	return rc;
}

/* libbson's JSON reader wraps integer literals of 20 or more digits modulo 2^64 instead of
 * failing (2^64+1 would become a limit of 1). Every field here is at most int64 (19 digits),
 * so refuse any run of 20+ digits outside string literals before parsing. This scans, it
 * does not parse: libbson still validates the document. */
static bool has_oversized_number(const char *body, size_t len)
{
	bool in_str = false;
	size_t run = 0;

	for (size_t i = 0; i < len; i++) {
		char c = body[i];
		if (in_str) {
			if (c == '\\')
				i++;
			else if (c == '"')
				in_str = false;
			continue;
		}
		if (c == '"') {
			in_str = true;
			run = 0;
		} else if (c >= '0' && c <= '9') {
			if (++run >= 20)
				return true;
		} else {
			run = 0;
		}
	}
	return false;
}

/* Exactly one JSON object in body (whitespace around it allowed): a second value after
 * it, as `{...} {...}` or `{...} x`, is malformed, as Go's decoder says. NULL with berr
 * set on error. */
static bson_t *parse_one_object(const char *body, size_t len, bson_error_t *berr)
{
	bson_json_reader_t *rd = bson_json_data_reader_new(false, 0);
	bson_t *doc = bson_new(), extra = BSON_INITIALIZER;
	int r;

	bson_json_data_reader_ingest(rd, (const uint8_t *)body, len);
	r = bson_json_reader_read(rd, doc, berr);
	if (r != 1) {
		if (r == 0)
			bson_set_error(berr, BSON_ERROR_JSON, 1, "empty document");
		bson_destroy(doc);
		doc = NULL;
	} else {
		r = bson_json_reader_read(rd, &extra, berr);
		if (r != 0) {
			bson_set_error(berr, BSON_ERROR_JSON, 1,
				       "unexpected data after the top-level object");
			bson_destroy(doc);
			doc = NULL;
		}
	}
	bson_destroy(&extra);
	bson_json_reader_destroy(rd);
	return doc;
}

int rl_json_parse_reqs(const char *body, size_t len, rl_json_reqs *out, char *err,
		       size_t errlen)
{
	bson_error_t berr;
	bson_iter_t top, arr, it;
	size_t n = 0, n_kv = 0, i = 0;
	size_t skip = 0;
	priv *p;
	int rc = 0;

	memset(out, 0, sizeof(*out));
	while (skip < len && (body[skip] == ' ' || body[skip] == '\t' || body[skip] == '\r' ||
			      body[skip] == '\n'))
		skip++;
	if (skip == len)
		return sdb_errf(err, errlen, SDB_EPROTO, "empty request body: want a JSON object");
	if (body[skip] != '{')
		return sdb_errf(err, errlen, SDB_EPROTO, "malformed JSON: want an object");
	if (len > (size_t)SSIZE_MAX)
		return sdb_errf(err, errlen, SDB_ETOOBIG, "request body too large");
	if (has_oversized_number(body, len))
		return sdb_errf(err, errlen, SDB_EPROTO,
				"malformed JSON: an integer literal is outside the int64 range");
	p = sdb_calloc(1, sizeof(*p));
	p->doc = parse_one_object(body, len, &berr);
	if (p->doc == NULL) {
		free(p);
		return sdb_errf(err, errlen, SDB_EPROTO, "malformed JSON: %s", berr.message);
	}
	{
		int n_requests = 0;
		bson_iter_init(&top, p->doc);
		while (bson_iter_next(&top))
			n_requests += strcmp(bson_iter_key(&top), "requests") == 0;
		if (n_requests > 1) {
			rc = sdb_errf(err, errlen, SDB_EPROTO, "duplicate field 'requests'");
			goto err;
		}
	}
	/* First pass: find "requests", count items and metadata pairs, check the types the
	 * arrays need; nothing is allocated per item before the count is known good. */
	bson_iter_init(&top, p->doc);
	if (bson_iter_find(&top, "requests") && bson_iter_type(&top) != BSON_TYPE_NULL) {
		if (bson_iter_type(&top) != BSON_TYPE_ARRAY || !bson_iter_recurse(&top, &arr)) {
			rc = sdb_errf(err, errlen, SDB_EPROTO,
				      "invalid value for field 'requests': want an array");
			goto err;
		}
		while (bson_iter_next(&arr)) {
			if (++n > RL_MAX_BATCH) {
				rc = sdb_errf(err, errlen, SDB_ETOOBIG,
					      "Requests.RateLimits list too large; max size is '%d'",
					      RL_MAX_BATCH);
				goto err;
			}
			if (bson_iter_type(&arr) != BSON_TYPE_DOCUMENT ||
			    !bson_iter_recurse(&arr, &it))
				continue; /* reported by parse_req */
			while (bson_iter_next(&it)) {
				if (strcmp(bson_iter_key(&it), "metadata") != 0)
					continue;
				rc = count_metadata(&it, &n_kv, err, errlen);
				if (rc != 0)
					goto err;
			}
		}
	}
	out->reqs = sdb_calloc(n ? n : 1, sizeof(rl_req));
	p->kv = sdb_calloc(n_kv ? n_kv : 1, sizeof(rl_kv));
	p->cap_kv = n_kv;
	out->priv = p;
	if (n > 0) {
		bson_iter_recurse(&top, &arr);
		while (bson_iter_next(&arr)) {
			rc = parse_req(&arr, &out->reqs[i], p, err, errlen);
			if (rc != 0) {
				rl_json_reqs_free(out);
				return rc;
			}
			i++;
		}
	}
	out->n = n;
	return 0;

err:
	bson_destroy(p->doc);
	free(p);
	return rc;
}

void rl_json_reqs_free(rl_json_reqs *r)
{
	priv *p = r->priv;
	if (p != NULL) {
		bson_destroy(p->doc);
		free(p->kv);
		free(p);
	}
	free(r->reqs);
	memset(r, 0, sizeof(*r));
}

static void append_i64_str(bson_t *doc, const char *key, int64_t v)
{
	char num[24];
	int n = snprintf(num, sizeof num, "%" PRId64, v);
	bson_append_utf8(doc, key, -1, num, n);
}

/* libbson's relaxed extended JSON of a document holding only strings, int32, arrays and
 * documents is plain JSON. Returned memory comes from libbson's allocator, which is
 * malloc/free (or stripedb's wrappers over them, sdb_alloc_init). */
static char *to_json(bson_t *doc, size_t *len)
{
	char *s = bson_as_relaxed_extended_json(doc, len);
	bson_destroy(doc);
	return s;
}

char *rl_json_render_resps(const rl_resp *resps, size_t n, size_t *len)
{
	bson_t doc, arr, item, md;
	char idx[16];
	const char *key;
	size_t i;

	bson_init(&doc);
	bson_append_array_begin(&doc, "responses", -1, &arr);
	for (i = 0; i < n; i++) {
		const rl_resp *r = &resps[i];
		const char *st = rl_status_name(r->status);
		bson_uint32_to_string((uint32_t)i, &key, idx, sizeof idx);
		bson_append_document_begin(&arr, key, -1, &item);
		bson_append_utf8(&item, "status", -1, st != NULL ? st : "UNDER_LIMIT", -1);
		append_i64_str(&item, "limit", r->limit);
		append_i64_str(&item, "remaining", r->remaining);
		append_i64_str(&item, "reset_time", r->reset_time);
		bson_append_utf8(&item, "error", -1, r->error, -1);
		bson_append_document_begin(&item, "metadata", -1, &md);
		if (r->owner[0] != '\0')
			bson_append_utf8(&md, "owner", -1, r->owner, -1);
		if (r->error[0] == '\0')
			append_i64_str(&md, "retry_after", r->retry_after);
		bson_append_document_end(&item, &md);
		bson_append_document_end(&arr, &item);
	}
	bson_append_array_end(&doc, &arr);
	return to_json(&doc, len);
}

char *rl_json_render_error(int code, const char *msg, size_t *len)
{
	bson_t doc, details;

	bson_init(&doc);
	bson_append_int32(&doc, "code", -1, code);
	bson_append_utf8(&doc, "message", -1, msg, -1);
	bson_append_array_begin(&doc, "details", -1, &details);
	bson_append_array_end(&doc, &details);
	return to_json(&doc, len);
}

char *rl_json_render_health(const char *status, const char *message, int peer_count,
			    const char *advertise_address, size_t *len)
{
	bson_t doc;

	bson_init(&doc);
	bson_append_utf8(&doc, "status", -1, status, -1);
	bson_append_utf8(&doc, "message", -1, message != NULL ? message : "", -1);
	bson_append_int32(&doc, "peer_count", -1, peer_count);
	bson_append_utf8(&doc, "advertise_address", -1,
			 advertise_address != NULL ? advertise_address : "", -1);
	return to_json(&doc, len);
}
