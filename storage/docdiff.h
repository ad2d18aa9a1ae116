/* The difference between a document's pre-image and its post-image, as MongoDB 6.0 reports
 * it in a change stream `update` event:
 *
 *   {updatedFields: {<dotted path>: <value>, ...}, removedFields: [<dotted path>, ...],
 *    truncatedArrays: [{field: <dotted path>, newSize: <int32>}, ...]}
 *
 * The shard writes it into every "u" oplog entry of a modifier or pipeline update (field
 * updateDescription, src/shard/README.md "Oplog"); a replacement carries none.
 *
 * Rules (MongoDB's src/mongo/db/update/document_diff_calculator.cpp, which builds the $v:2
 * oplog diff, and src/mongo/db/pipeline/change_stream_document_diff_parser.cpp, which turns
 * that diff into updatedFields/removedFields/truncatedArrays):
 * - The two documents are walked in parallel. An equal element (same name and same bytes)
 *   is skipped. Same name, both documents or both arrays: the sub-diff, reported with dotted
 *   paths (`a.b`, `arr.3`), unless that sub-diff would be larger in BSON than the
 *   post-image value itself, in which case the whole value is reported as updated (the
 *   size heuristic, with MongoDB's approximate sizes, which are the exact sizes of the $v:2
 *   diff). Same name otherwise (a type change, a new scalar): the new value. A field of
 *   the pre-image whose name differs from the post-image's field at the same place is
 *   removed unless it shows up again among the post-image's remaining fields, which are
 *   inserted (so a moved field is reported as updated).
 * - Arrays, element by element: a changed element `arr.i` (or its sub-diff), appended
 *   elements `arr.i`, a shrunk array in truncatedArrays {field: "arr", newSize: n}.
 * - Order, per level as in the change stream parser: updatedFields lists the updated
 *   fields then the inserted ones (post-image order), removedFields the fields removed
 *   after the last matching field (pre-image order) then the others (sorted by name, the
 *   calculator's std::set); sub-diffs come after a level's own entries; an array reports
 *   its truncation before its elements, elements in index order.
 * - Values are the post-image's bytes (type and representation kept).
 * MongoDB 6.0's disambiguatedPaths (6.1+, showExpandedEvents) is not produced.
 *
 * Known difference from MongoDB: mongod logs a modifier update ($set, $inc, $push, ...)
 * from its operators, not from the images (v2 log builder), so for example {$inc: {"x.y": 1}}
 * on {x: {y: 1}} is {"x.y": 2} there, and {x: {y: 2}} here (the sub-diff of the small
 * sub-document is larger than the sub-document, so the heuristic replaces it whole);
 * {$set: {a: {b: 1}}} on {a: {b: 0, c: 1}} is {a: {b: 1}} in both; $push of one element
 * is {"arr.3": 4} in both. Pipeline updates are diffed exactly as mongod does.
 */
#ifndef SDB_STORAGE_DOCDIFF_H
#define SDB_STORAGE_DOCDIFF_H

#include <bson/bson.h>

/* MongoDB's update_oplog_entry::kSizeOfDeltaOplogEntryMetadata: the bytes of {$v: 2, diff:
 * {}} added to a pipeline update's diff before it is compared with the post-image. */
#define SDB_DOCDIFF_PADDING 15

typedef enum {
	/* A modifier update ({$set: ...}): always described (mongod logs every modifier update
	 * as a $v:2 delta, whatever its size). */
	SDB_DOCDIFF_MODIFIER = 0,
	/* A pipeline update ([{$set: ...}]): described only when the diff (plus
	 * SDB_DOCDIFF_PADDING) is smaller than the post-image, as mongod's PipelineExecutor
	 * (computeOplogDiff); otherwise mongod logs a replacement, and so do we. */
	SDB_DOCDIFF_PIPELINE,
} sdb_docdiff_kind;

/* Describe the change from pre to post (whole documents, e.g. a stored image and the
 * update's result) as the updateDescription document above, into out (uninitialised on
 * entry, always initialised on return: bson_destroy it). A pure function: the same images
 * give the same bytes on every member (the Raft apply relies on it).
 * Returns: 1 (out holds {updatedFields, removedFields, truncatedArrays}; all three always
 * present, possibly empty), 0 (SDB_DOCDIFF_PIPELINE only: the diff is not smaller than post,
 * out is empty: log the update as a replacement).
 * Errors: SDB_EINVAL (pre or post, or a sub-document of them, is not well-formed BSON; out
 * is empty). */
int sdb_docdiff_describe(const bson_t *pre, const bson_t *post, sdb_docdiff_kind kind,
			 bson_t *out);

#endif
