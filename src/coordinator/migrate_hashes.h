/* A chunk's content as (_id, XXH64 of the document's bytes), the shape in which a
 * migration's verification compares source and target (migrate_verify.c), and the merge
 * that builds the source's expected content from the hashes the import recorded at T and
 * the documents that changed on the source after T (issue #17: the verification no longer
 * reads the whole chunk on the source). Plain data, no I/O: tests/unit/test_coordinator_hashes.c. */
#ifndef SDB_COORDINATOR_MIGRATE_HASHES_H
#define SDB_COORDINATOR_MIGRATE_HASHES_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One document: its _id (an owned copy) and XXH64(seed 0) of its BSON bytes. For a
 * change, present says whether the document exists in the chunk at the verification's
 * position (false: deleted, or its shard key now lies outside the chunk; hash then 0). */
typedef struct mig_hash {
	bson_value_t id;
	uint64_t hash;
	uint64_t ts;  /* changes: the oplog position the state was read at (0 unknown) */
	bool present; /* changes only; lists of documents leave it true */
} mig_hash;

/* A growable array of mig_hash. Zero-initialise it ({0}); free with mig_hashes_free. */
typedef struct mig_hashes {
	mig_hash *v;
	size_t n, cap;
} mig_hashes;

/* The hash of a document's bytes, as both sides of a verification compute it. */
uint64_t mig_doc_hash(const bson_t *doc);
/* Append doc's (_id copy, hash), present = true. Returns false (nothing appended) when
 * doc has no _id. Aborts on OOM (common/alloc.h). */
bool mig_hashes_add_doc(mig_hashes *l, const bson_t *doc);
/* Append (copy of id, hash, present, ts). Aborts on OOM. */
void mig_hashes_add(mig_hashes *l, const bson_value_t *id, uint64_t hash, bool present,
		    uint64_t ts);
/* Sort by _id in MongoDB's order (common/bsonval.h sdb_bson_value_cmp). When two entries
 * have equal _ids, only the one appended LAST is kept (the others are freed): a list of
 * changes collected in oplog order then holds each _id's latest state. */
void mig_hashes_sort_unique(mig_hashes *l);
/* Index of id in l (sorted by mig_hashes_sort_unique), or -1. */
ptrdiff_t mig_hashes_find(const mig_hashes *l, const bson_value_t *id);
/* The expected content: every entry of base (sorted, unique) whose _id has no entry in
 * changes (sorted, unique), plus every change that is present, in _id order, into *out
 * (zero-initialised by the caller; owns copies of the _ids; free with mig_hashes_free).
 * Aborts on OOM. */
void mig_hashes_merge(const mig_hashes *base, const mig_hashes *changes, mig_hashes *out);
/* Free the _ids and the array; l is empty (reusable) afterwards. l may be NULL. */
void mig_hashes_free(mig_hashes *l);

#endif
