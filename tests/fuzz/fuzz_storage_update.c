/* libFuzzer target over the embedded shard's update engine (storage/update.h): the input is
 * a document whose first element is the `u` of an update statement (any BSON type: an
 * operator document, a replacement, or a pipeline-style array of stages run by the
 * pipeline engine) and, when present, a document to update appended after it. The update
 * is parsed, applied to the document, and used for an upsert with the document as filter;
 * the document and its updated image are diffed (storage/docdiff.h, both kinds), and so are
 * the two input documents themselves.
 * Build: CC=clang ./configure --enable-fuzzing && make tests/fuzz/fuzz_storage_update. */
#include <bson/bson.h>
#include <stdint.h>
#include <string.h>

#include "common/bsonget.h"
#include "storage/docdiff.h"
#include "storage/update.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	bson_t spec, target;
	bson_iter_t it;
	sdb_update *u = NULL;
	char err[256];
	int code = 0;
	size_t off;
	uint32_t l0;

	if (size < 5)
		return 0;
	memcpy(&l0, data, 4);
	if (l0 >= 5 && l0 < size && bson_init_static(&spec, data, l0) &&
	    bson_init_static(&target, data + l0, size - l0) &&
	    bson_validate(&target, BSON_VALIDATE_NONE, &off)) {
		/* spec + target document */
	} else {
		if (!bson_init_static(&spec, data, size))
			return 0;
		bson_init(&target);
	}
	/* what the wire layer lets through (src/wire/msg.c) */
	if (!bson_validate(&spec, BSON_VALIDATE_NONE, &off) || !sdb_bson_well_formed(&spec, 200) ||
	    !sdb_bson_well_formed(&target, 200) || !bson_iter_init(&it, &spec) ||
	    !bson_iter_next(&it))
		return 0;
	sdb_update_opts opts = {.query = &target};
	if (sdb_update_parse_value(&it, &opts, &u, &code, err, sizeof err) == 0) {
		bson_t out;
		bool changed;
		if (sdb_update_apply(u, &target, false, &out, &changed, &code, err, sizeof err) ==
			    0 &&
		    changed) {
			bson_t d;
			(void)sdb_docdiff_describe(&target, &out, SDB_DOCDIFF_MODIFIER, &d);
			bson_destroy(&d);
			(void)sdb_docdiff_describe(&target, &out, SDB_DOCDIFF_PIPELINE, &d);
			bson_destroy(&d);
		}
		bson_destroy(&out);
		(void)sdb_update_upsert_doc(u, &target, &out, &code, err, sizeof err);
		bson_destroy(&out);
		sdb_update_free(u);
	}
	if (BSON_ITER_HOLDS_DOCUMENT(&it)) {
		/* any two documents, e.g. a first element {a: ...} and the target */
		uint32_t len;
		const uint8_t *d0;
		bson_t first, d;
		bson_iter_document(&it, &len, &d0);
		if (bson_init_static(&first, d0, len)) {
			(void)sdb_docdiff_describe(&first, &target, SDB_DOCDIFF_MODIFIER, &d);
			bson_destroy(&d);
		}
	}
	return 0;
}
