/* Helpers shared by the unit tests of the aggregation engine (test_storage_pipeline.c,
 * test_storage_pipeline_lookup.c): single-quoted JSON to BSON, a pipeline run over an
 * array of documents, and checks that compare outputs as canonical extended JSON (types
 * and field order count). Include after storage/pipeline*.c and <cmocka.h>; every helper
 * is static inline so a test file may use any subset. */
#ifndef SDB_TEST_PIPELINE_CHECK_H
#define SDB_TEST_PIPELINE_CHECK_H

/* JSON with single quotes -> a new BSON document (caller destroys); fails the test on
 * bad JSON. */
static inline bson_t *J(const char *json)
{
	char *s = strdup(json);
	bson_error_t e;
	bson_t *b;

	for (char *p = s; *p; p++) {
		if (*p == '\'') {
			*p = '"';
		}
	}
	b = bson_new_from_json((const uint8_t *)s, -1, &e);
	if (b == NULL) {
		fail_msg("bad test JSON %s: %s", s, e.message);
	}
	free(s);
	return b;
}

/* Wrap "[...]" as {"v": [...]} and return the array as a document in *out. */
static inline bson_t *JA(const char *json_array, bson_t *out)
{
	size_t n = strlen(json_array) + 16;
	char *w = malloc(n);
	bson_t *b;
	bson_iter_t it;
	const uint8_t *data;
	uint32_t len;

	snprintf(w, n, "{'v': %s}", json_array);
	b = J(w);
	free(w);
	assert_true(bson_iter_init_find(&it, b, "v"));
	assert_true(BSON_ITER_HOLDS_ARRAY(&it));
	bson_iter_array(&it, &len, &data);
	assert_true(bson_init_static(out, data, len));
	return b;
}

/* The input iterator: walks the documents of an array. */
typedef struct {
	bson_iter_t it;
	bson_t cur;
	int fail_after; /* -1: never; else fail with SDB_EIO after this many documents */
	int served;
} input;

/* sdb_pipeline_open's input callback over an `input`. Returns: 1 with *doc (valid until
 * the next call), 0 at the end, SDB_EIO ("disk on fire") after fail_after documents. */
static inline int input_next(void *ctx, const bson_t **doc, int *code, char *err, size_t errlen)
{
	input *in = ctx;
	const uint8_t *data;
	uint32_t len;

	(void)code;
	if (in->fail_after >= 0 && in->served >= in->fail_after) {
		snprintf(err, errlen, "disk on fire");
		return SDB_EIO;
	}
	if (!bson_iter_next(&in->it)) {
		return 0;
	}
	bson_iter_document(&in->it, &len, &data);
	bson_init_static(&in->cur, data, len);
	*doc = &in->cur;
	in->served++;
	return 1;
}

/* Run the parsed pipeline p over the documents of the array darr, appending its output
 * documents to out (keys "0", "1", ...). Returns: 0 at the end, < 0 on an error (*code and
 * err set). */
static inline int drain(sdb_pipeline *p, const bson_t *darr, bson_t *out, int *code, char *err,
			size_t errlen)
{
	input in = {.fail_after = -1};
	sdb_pipeline_cursor *c;
	int rc, i = 0;

	bson_iter_init(&in.it, darr);
	sdb_pipeline_open(p, input_next, &in, &c);
	for (;;) {
		const bson_t *d;
		char key[16];

		rc = sdb_pipeline_cursor_next(c, &d, code, err, errlen);
		if (rc <= 0)
			break;
		snprintf(key, sizeof key, "%d", i++);
		bson_append_document(out, key, -1, d);
	}
	sdb_pipeline_cursor_free(c);
	return rc;
}

/* Run pipeline over docs; on success return the output documents as one canonical JSON
 * array string (caller frees); on failure return NULL and set *code/err. */
static inline char *run(const char *pipeline, const char *docs, const sdb_pipeline_opts *opts, int *code,
		 char *err, size_t errlen)
{
	bson_t parr, darr;
	bson_t *pw = JA(pipeline, &parr), *dw = JA(docs, &darr);
	sdb_pipeline *p = NULL;
	bson_t out = BSON_INITIALIZER;
	char *s = NULL;
	int rc;

	*code = 0;
	rc = sdb_pipeline_parse(&parr, opts, &p, code, err, errlen);
	if (rc != 0) {
		goto done;
	}
	rc = drain(p, &darr, &out, code, err, errlen);
	if (rc == 0) {
		bson_t wrap = BSON_INITIALIZER;

		bson_append_array(&wrap, "v", 1, &out);
		s = bson_as_canonical_extended_json(&wrap, NULL);
		bson_destroy(&wrap);
	}
done:
	sdb_pipeline_free(p);
	bson_destroy(&out);
	bson_destroy(pw);
	bson_destroy(dw);
	return s;
}

/* Run pipeline over docs with options o (NULL: none); fail the test unless it succeeds with
 * exactly want (a JSON array; types and field order count). */
static inline void check_opts(const char *pipeline, const char *docs,
			      const sdb_pipeline_opts *o, const char *want)
{
	int code;
	char err[512] = "";
	char *got = run(pipeline, docs, o, &code, err, sizeof err);
	bson_t warr, wrap = BSON_INITIALIZER;
	bson_t *ww;
	char *exp;

	if (got == NULL)
		fail_msg("pipeline %s failed: code %d %s", pipeline, code, err);
	ww = JA(want, &warr);
	bson_append_array(&wrap, "v", 1, &warr);
	exp = bson_as_canonical_extended_json(&wrap, NULL);
	bson_destroy(&wrap);
	assert_string_equal(got, exp);
	bson_free(got);
	bson_free(exp);
	bson_destroy(ww);
}

/* check_opts with no options. */
static inline void check(const char *pipeline, const char *docs, const char *want)
{
	check_opts(pipeline, docs, NULL, want);
}

/* Run pipeline over docs; fail the test unless it fails with want_code and (when part is
 * not NULL) a message containing part. */
static inline void check_err(const char *pipeline, const char *docs, int want_code, const char *part)
{
	int code;
	char err[512] = "";
	char *got = run(pipeline, docs, NULL, &code, err, sizeof err);

	if (got != NULL) {
		fail_msg("pipeline %s succeeded: %s", pipeline, got);
	}
	if (code != want_code) {
		fail_msg("pipeline %s: want code %d, got %d (%s)", pipeline, want_code, code, err);
	}
	if (part != NULL && strstr(err, part) == NULL) {
		fail_msg("message '%s' lacks '%s'", err, part);
	}
}


#endif
