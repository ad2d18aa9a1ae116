/* $bucket (see pipeline_int.h agg_bucket_desugar): turned into a $group and a $sort, as
 * MongoDB 6.0 does (DocumentSourceBucket::createFromBson,
 * mongo/db/pipeline/document_source_bucket.cpp), with its checks and codes. */
#include "storage/pipeline.h"
#include "storage/pipeline_int.h"

#include <stdio.h>
#include <string.h>

#include "common/bsonval.h"

/* True when the element at it is an expression that is not a constant: a "$path" string
 * or an object whose first field is an operator. */
static bool is_expression(const bson_iter_t *it)
{
	bson_iter_t sub;

	if (BSON_ITER_HOLDS_UTF8(it))
		return bson_iter_utf8(it, NULL)[0] == '$';
	if (BSON_ITER_HOLDS_DOCUMENT(it) && bson_iter_recurse(it, &sub) && bson_iter_next(&sub))
		return bson_iter_key(&sub)[0] == '$';
	return false;
}

/* Append {name: [groupBy, {$literal: bound}]} (a comparison expression) to doc. */
static void append_cmp(bson_t *doc, const char *name, const bson_iter_t *group_by,
		       const bson_iter_t *bound)
{
	bson_t arr, lit;

	bson_append_array_begin(doc, name, -1, &arr);
	bson_append_iter(&arr, "0", 1, group_by);
	bson_append_document_begin(&arr, "1", 1, &lit);
	bson_append_iter(&lit, "$literal", -1, bound);
	bson_append_document_end(&arr, &lit);
	bson_append_array_end(doc, &arr);
}

/* The boundaries array at it: at least two constants of one canonical type, strictly
 * ascending (40192, 40191, 40193, 40194). */
static int check_boundaries(const bson_iter_t *it, const ectx *e)
{
	bson_iter_t a, prev;
	size_t n = 0;

	bson_iter_recurse(it, &a);
	while (bson_iter_next(&a)) {
		if (is_expression(&a))
			return efail(e, 40191,
				     "The $bucket 'boundaries' field must be an array of constant "
				     "values, but found value: %s",
				     bson_iter_type(&a) == BSON_TYPE_UTF8 ? bson_iter_utf8(&a, NULL)
									 : "an expression");
		if (n > 0) {
			if (sdb_bson_bracket(bson_iter_type(&prev)) !=
			    sdb_bson_bracket(bson_iter_type(&a)))
				return efail(e, 40193,
					     "All values in the the 'boundaries' option to $bucket must "
					     "have the same type. Found conflicting types %s and %s.",
					     type_name(bson_iter_type(&prev)),
					     type_name(bson_iter_type(&a)));
			if (sdb_bson_cmp(&prev, &a) >= 0)
				return efail(e, 40194,
					     "The 'boundaries' option to $bucket must be sorted, but "
					     "elements %zu and %zu are not in ascending order",
					     n - 1, n);
		}
		prev = a;
		n++;
	}
	if (n < 2)
		return efail(e, 40192,
			     "The $bucket 'boundaries' field must have at least 2 values, but found "
			     "%zu value(s).",
			     n);
	return 0;
}

int agg_bucket_desugar(const bson_iter_t *it, bson_t *group, bson_t *sort, const ectx *e)
{
	bson_iter_t sub, group_by, boundaries, dflt, output;
	bool have_group_by = false, have_boundaries = false, have_default = false,
	     have_output = false;
	int rc;

	if (!BSON_ITER_HOLDS_DOCUMENT(it))
		return efail(e, 40201, "Argument to $bucket stage must be an object, but found type: %s.",
			     type_name(bson_iter_type(it)));
	bson_iter_recurse(it, &sub);
	while (bson_iter_next(&sub)) {
		const char *k = bson_iter_key(&sub);

		if (strcmp(k, "groupBy") == 0) {
			group_by = sub;
			have_group_by = true;
		} else if (strcmp(k, "boundaries") == 0) {
			if (!BSON_ITER_HOLDS_ARRAY(&sub))
				return efail(e, 40200,
					     "The $bucket 'boundaries' field must be an array, but found "
					     "type: %s.",
					     type_name(bson_iter_type(&sub)));
			boundaries = sub;
			have_boundaries = true;
		} else if (strcmp(k, "default") == 0) {
			if (is_expression(&sub))
				return efail(e, 40195,
					     "The $bucket 'default' field must be a constant");
			dflt = sub;
			have_default = true;
		} else if (strcmp(k, "output") == 0) {
			if (!BSON_ITER_HOLDS_DOCUMENT(&sub))
				return efail(e, 40196,
					     "The $bucket 'output' field must be an object, but found "
					     "type: %s.",
					     type_name(bson_iter_type(&sub)));
			output = sub;
			have_output = true;
		} else {
			return efail(e, 40197, "Unrecognized option to $bucket: %s.", k);
		}
	}
	if (!have_group_by || !have_boundaries)
		return efail(e, 40198, "$bucket requires 'groupBy' and 'boundaries' to be specified.");
	if (!(BSON_ITER_HOLDS_UTF8(&group_by) && bson_iter_utf8(&group_by, NULL)[0] == '$') &&
	    !BSON_ITER_HOLDS_DOCUMENT(&group_by))
		return efail(e, 40202,
			     "The $bucket 'groupBy' field must be defined as a $-prefixed path or an "
			     "expression");
	rc = check_boundaries(&boundaries, e);
	if (rc != 0)
		return rc;
	if (have_default) {
		/* a default of the boundaries' type must lie outside them */
		bson_iter_t a, first, last;

		bson_iter_recurse(&boundaries, &a);
		bson_iter_next(&a);
		first = last = a;
		while (bson_iter_next(&a))
			last = a;
		if (sdb_bson_bracket(bson_iter_type(&dflt)) ==
			    sdb_bson_bracket(bson_iter_type(&first)) &&
		    sdb_bson_cmp(&dflt, &first) >= 0 && sdb_bson_cmp(&dflt, &last) < 0)
			return efail(e, 40199,
				     "The $bucket 'default' field must be less than the lowest "
				     "boundary or greater than or equal to the highest boundary.");
	}

	/* {_id: {$switch: {branches: [{case: {$and: [{$gte: [g, b_i]}, {$lt: [g, b_i+1]}]},
	 *  then: b_i}, ...], default: D}}, <output, or count: {$sum: 1}>} */
	bson_t id, sw, branches, br, cs, and, c1, c2, acc;
	bson_iter_t a, lo, hi;
	char k[16];
	size_t i = 0;

	bson_init(group);
	bson_append_document_begin(group, "_id", 3, &id);
	bson_append_document_begin(&id, "$switch", -1, &sw);
	bson_append_array_begin(&sw, "branches", -1, &branches);
	bson_iter_recurse(&boundaries, &a);
	bson_iter_next(&a);
	lo = a;
	while (bson_iter_next(&a)) {
		hi = a;
		snprintf(k, sizeof k, "%zu", i++);
		bson_append_document_begin(&branches, k, -1, &br);
		bson_append_document_begin(&br, "case", -1, &cs);
		bson_append_array_begin(&cs, "$and", -1, &and);
		bson_append_document_begin(&and, "0", 1, &c1);
		append_cmp(&c1, "$gte", &group_by, &lo);
		bson_append_document_end(&and, &c1);
		bson_append_document_begin(&and, "1", 1, &c2);
		append_cmp(&c2, "$lt", &group_by, &hi);
		bson_append_document_end(&and, &c2);
		bson_append_array_end(&cs, &and);
		bson_append_document_end(&br, &cs);
		/* then: the bucket's lower bound, as a literal (a string bound may start with $) */
		bson_t lit;
		bson_append_document_begin(&br, "then", -1, &lit);
		bson_append_iter(&lit, "$literal", -1, &lo);
		bson_append_document_end(&br, &lit);
		bson_append_document_end(&branches, &br);
		lo = hi;
	}
	bson_append_array_end(&sw, &branches);
	if (have_default) {
		bson_t lit;
		bson_append_document_begin(&sw, "default", -1, &lit);
		bson_append_iter(&lit, "$literal", -1, &dflt);
		bson_append_document_end(&sw, &lit);
	}
	bson_append_document_end(&id, &sw);
	bson_append_document_end(group, &id);
	if (have_output) {
		bson_iter_recurse(&output, &a);
		while (bson_iter_next(&a)) {
			if (strcmp(bson_iter_key(&a), "_id") == 0) {
				bson_destroy(group);
				return efail(e, 15948, "a group's _id may only be specified once");
			}
			bson_append_iter(group, bson_iter_key(&a), -1, &a);
		}
	} else {
		bson_append_document_begin(group, "count", -1, &acc);
		BSON_APPEND_INT32(&acc, "$sum", 1);
		bson_append_document_end(group, &acc);
	}
	bson_init(sort);
	BSON_APPEND_INT32(sort, "_id", 1);
	return 0;
}
