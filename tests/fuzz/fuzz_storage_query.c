/* libFuzzer target over the embedded shard's query core: the input is a filter (or
 * projection / sort spec) document optionally followed by a target document; every parser of
 * storage/ (matcher, element matcher, projection, sort spec, path walk, key encoding) runs on
 * it. Build: CC=clang ./configure --enable-fuzzing && make tests/fuzz/fuzz_storage_query. */
#include <bson/bson.h>
#include <stdint.h>
#include <string.h>
#include "common/bsonval.h"
#include "storage/keyenc.h"
#include "storage/matcher.h"
#include "storage/path.h"
#include "storage/projection.h"
#include "storage/sortspec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	bson_t doc;
	sdb_matcher *m = NULL;
	sdb_projection *p = NULL;
	sdb_sortspec *s = NULL;
	char err[256];
	int code;
	size_t off;

	bson_t target;
	uint32_t l0;
	if (size < 5)
		return 0;
	memcpy(&l0, data, 4);
	if (l0 >= 5 && l0 < size && bson_init_static(&doc, data, l0) &&
	    bson_init_static(&target, data + l0, size - l0) &&
	    bson_validate(&target, BSON_VALIDATE_NONE, &off)) {
		/* filter + target document */
	} else {
		if (!bson_init_static(&doc, data, size))
			return 0;
		target = doc;
	}
	if (!bson_validate(&doc, BSON_VALIDATE_NONE, &off))
		return 0;
	if (sdb_matcher_new(&doc, &m, &code, err, sizeof err) == 0) {
		(void)sdb_matcher_match(m, &target);
		sdb_matcher_free(m);
	}
	/* with $expr, as the store's query and $match build it */
	if (sdb_matcher_new_opts(&doc, SDB_MATCHER_EXPR, &m, &code, err, sizeof err) == 0) {
		(void)sdb_matcher_eval(m, &target, &code, err, sizeof err);
		sdb_matcher_free(m);
	}
	if (sdb_matcher_new_elem(&doc, &m, &code, err, sizeof err) == 0) {
		bson_iter_t it;
		if (bson_iter_init(&it, &doc))
			while (bson_iter_next(&it))
				(void)sdb_matcher_match_value(m, &it);
		sdb_matcher_free(m);
	}
	{
		bson_iter_t it;
		if (bson_iter_init(&it, &doc) && bson_iter_next(&it)) {
			sdb_bounds b;
			const char *k = bson_iter_key(&it);
			if (sdb_matcher_bounds(&doc, k, false, &b, err, sizeof err) == 0)
				sdb_bounds_free(&b);
			if (sdb_matcher_bounds(&doc, k, true, &b, err, sizeof err) == 0)
				sdb_bounds_free(&b);
			{
				const char *paths[2] = {k, "a.b"};
				bool desc[2] = {false, true};
				sdb_key *keys; size_t nk; bool mk;
				if (sdb_index_keys(&target, paths, desc, 2, &keys, &nk, &mk, &code, err, sizeof err) == 0)
					sdb_index_keys_free(keys, nk);
			}
		}
	}
	/* the projection engine, as find, $project and $addFields */
	for (int kind = SDB_PROJECTION_FIND; kind <= SDB_PROJECTION_ADD_FIELDS; kind++) {
		if (sdb_projection_new_kind(&doc, (sdb_projection_kind)kind, &p, &code, err,
					    sizeof err) == 0) {
			bson_t out = BSON_INITIALIZER;
			sdb_projection_eval(p, &target, &out, &code, err, sizeof err);
			bson_destroy(&out);
			sdb_projection_free(p);
		}
	}
	if (sdb_sortspec_parse(&doc, &s, &code, err, sizeof err) == 0) {
		sdb_key k; sdb_key_init(&k);
		(void)sdb_sortspec_cmp(s, &doc, &target);
		sdb_sortspec_key(s, &doc, &k, err, sizeof err);
		sdb_key_free(&k);
		sdb_sortspec_free(s);
	}
	{
		sdb_key k; sdb_key_init(&k);
		bson_iter_t it, it2;
		if (bson_iter_init(&it, &doc)) while (bson_iter_next(&it)) {
			sdb_keyenc_append_iter(&k, &it, false, err, sizeof err);
			if (bson_iter_init(&it2, &doc) && bson_iter_next(&it2)) (void)sdb_bson_cmp(&it, &it2);
		}
		sdb_key_free(&k);
		(void)sdb_bson_doc_cmp(&doc, &target);
		(void)sdb_bson_depth_ok(&doc, 100);
	}
	return 0;
}
