/* $bucketAuto (see pipeline_int.h agg_bucketauto_desugar, agg_gran_check, agg_gran_round):
 * the stage's options checked as MongoDB 6.0 does (DocumentSourceBucketAuto::createFromBson,
 * mongo/db/pipeline/document_source_bucket_auto.cpp) and turned into the $group-shaped spec
 * the pipeline compiler reads the groupBy expression and the accumulators from; and the
 * granularity rounders (mongo/db/pipeline/granularity_rounder_preferred_numbers.cpp and
 * granularity_rounder_powers_of_two.cpp). Running the stage is pipeline.c (run_bucket_auto,
 * bucket_auto_emit), next to the $group accumulators it reuses. */
#include "storage/pipeline.h"
#include "storage/pipeline_int.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- granularity ---------------------------------------------------------------------- */

/* MongoDB's series, as granularity_rounder_preferred_numbers.cpp lists them (its R40
 * series has no 335: kept, so that the boundaries are mongod's). */
static const double r5[] = {10, 16, 25, 40, 63};
static const double r10[] = {100, 125, 160, 200, 250, 315, 400, 500, 630, 800};
static const double r20[] = {100, 112, 125, 140, 160, 180, 200, 224, 250, 280,
			     315, 355, 400, 450, 500, 560, 630, 710, 800, 900};
static const double r40[] = {100, 106, 112, 118, 125, 132, 140, 150, 160, 170, 180, 190, 200,
			     212, 224, 236, 250, 265, 280, 300, 315, 355, 375, 400, 425, 450,
			     475, 500, 530, 560, 600, 630, 670, 710, 750, 800, 850, 900, 950};
static const double r80[] = {103, 109, 115, 122, 128, 136, 145, 155, 165, 175, 185, 195, 206, 218,
			     230, 243, 258, 272, 290, 307, 325, 345, 365, 387, 412, 437, 462, 487,
			     515, 545, 575, 615, 650, 690, 730, 775, 825, 875, 925, 975};
static const double s125[] = {10, 20, 50};
static const double e6[] = {10, 15, 22, 33, 47, 68};
static const double e12[] = {10, 12, 15, 18, 22, 27, 33, 39, 47, 56, 68, 82};
static const double e24[] = {10, 11, 12, 13, 15, 16, 18, 20, 22, 24, 27, 30,
			     33, 36, 39, 43, 47, 51, 56, 62, 68, 75, 82, 91};
static const double e48[] = {100, 105, 110, 115, 121, 127, 133, 140, 147, 154, 162, 169,
			     178, 187, 196, 205, 215, 226, 237, 249, 261, 274, 287, 301,
			     316, 332, 348, 365, 383, 402, 422, 442, 464, 487, 511, 536,
			     562, 590, 619, 649, 681, 715, 750, 787, 825, 866, 909, 953};
static const double e96[] = {100, 102, 105, 107, 110, 113, 115, 118, 121, 124, 127, 130, 133, 137,
			     140, 143, 147, 150, 154, 158, 162, 165, 169, 174, 178, 182, 187, 191,
			     196, 200, 205, 210, 215, 221, 226, 232, 237, 243, 249, 255, 261, 267,
			     274, 280, 287, 294, 301, 309, 316, 324, 332, 340, 348, 357, 365, 374,
			     383, 392, 402, 412, 422, 432, 442, 453, 464, 475, 487, 499, 511, 523,
			     536, 549, 562, 576, 590, 604, 619, 634, 649, 665, 681, 698, 715, 732,
			     750, 768, 787, 806, 825, 845, 866, 887, 909, 931, 953, 976};
static const double e192[] = {
	100, 101, 102, 104, 105, 106, 107, 109, 110, 111, 113, 114, 115, 117, 118, 120, 121, 123,
	124, 126, 127, 129, 130, 132, 133, 135, 137, 138, 140, 142, 143, 145, 147, 149, 150, 152,
	154, 156, 158, 160, 162, 164, 165, 167, 169, 172, 174, 176, 178, 180, 182, 184, 187, 189,
	191, 193, 196, 198, 200, 203, 205, 208, 210, 213, 215, 218, 221, 223, 226, 229, 232, 234,
	237, 240, 243, 246, 249, 252, 255, 258, 261, 264, 267, 271, 274, 277, 280, 284, 287, 291,
	294, 298, 301, 305, 309, 312, 316, 320, 324, 328, 332, 336, 340, 344, 348, 352, 357, 361,
	365, 370, 374, 379, 383, 388, 392, 397, 402, 407, 412, 417, 422, 427, 432, 437, 442, 448,
	453, 459, 464, 470, 475, 481, 487, 493, 499, 505, 511, 517, 523, 530, 536, 542, 549, 556,
	562, 569, 576, 583, 590, 597, 604, 612, 619, 626, 634, 642, 649, 657, 665, 673, 681, 690,
	698, 706, 715, 723, 732, 741, 750, 759, 768, 777, 787, 796, 806, 816, 825, 835, 845, 856,
	866, 876, 887, 898, 909, 920, 931, 942, 953, 965, 976, 988};

#define SERIES(name, a) {name, a, sizeof a / sizeof a[0]}
static const struct {
	const char *name;
	const double *s; /* NULL: POWERSOF2 */
	size_t n;
} granularities[] = {
	SERIES("R5", r5),   SERIES("R10", r10), SERIES("R20", r20),	  SERIES("R40", r40),
	SERIES("R80", r80), SERIES("1-2-5", s125), SERIES("E6", e6),	  SERIES("E12", e12),
	SERIES("E24", e24), SERIES("E48", e48), SERIES("E96", e96),	  SERIES("E192", e192),
	{"POWERSOF2", NULL, 0},
};
#undef SERIES

int agg_gran_check(const docbuild_node *key, const ectx *e)
{
	double d;

	if (!is_number(key))
		return efail(e, 40258,
			     "$bucketAuto can specify a 'granularity' with numeric boundaries only, but "
			     "found a value with type: %s",
			     type_name(ntype(key)));
	if (key->type == BSON_TYPE_DECIMAL128)
		return efail(e, C_NOT_IMPLEMENTED,
			     "$bucketAuto's 'granularity' over Decimal128 values is not supported by "
			     "the embedded shard");
	d = num_double(key);
	if (isnan(d))
		return efail(e, 40259,
			     "$bucketAuto can specify a 'granularity' with numeric boundaries only, but "
			     "found a NaN");
	if (d < 0.0)
		return efail(e, 40260,
			     "$bucketAuto can specify a 'granularity' with non-negative numbers only, "
			     "but found a negative number");
	if (isinf(d)) /* mongod's rounders loop forever on it */
		return efail(e, C_BAD_VALUE,
			     "$bucketAuto can specify a 'granularity' with finite numbers only, but "
			     "found Infinity");
	/* so do they on a subnormal double: rounding down divides the multiplier by 10 until
	 * it underflows to 0, and 0 * 10 never reaches the value (found by a review) */
	if (d > 0.0 && d < DBL_MIN)
		return efail(e, C_BAD_VALUE,
			     "$bucketAuto can specify a 'granularity' with numbers of at least %g "
			     "(or 0) only, but found a subnormal number",
			     DBL_MIN);
	return 0;
}

/* 2^x as MongoDB's {$pow: [2, x]} of two ints gives it: an int when it fits, else a long,
 * else a double; a negative exponent gives a double. */
static docbuild_node *pow2(int x)
{
	if (x < 0 || x > 62)
		return v_double(ldexp(1.0, x));
	if (x < 31)
		return v_int32((int32_t)1 << x);
	return v_int64((int64_t)1 << x);
}

/* The rounders of granularity_rounder_powers_of_two.cpp for a positive finite v. */
static docbuild_node *round_pow2(const docbuild_node *v, bool up)
{
	if (v->type == BSON_TYPE_DOUBLE) {
		double l = log2(v->value.value.v_double);

		return pow2(up ? (int)(floor(l) + 1.0) : (int)(ceil(l) - 1.0));
	}
	uint64_t n = v->type == BSON_TYPE_INT64 ? (uint64_t)v->value.value.v_int64
						 : (uint64_t)v->value.value.v_int32;
	int lz = __builtin_clzll(n), tz = __builtin_ctzll(n);

	if (up)
		return pow2(63 - lz + 1);
	return pow2(lz + tz == 63 ? 63 - lz - 1 : 63 - lz);
}

/* The rounders of granularity_rounder_preferred_numbers.cpp (doubles) for a positive
 * finite number: the next series value strictly above it (up) or strictly below it. */
static double round_series(const double *s, size_t n, double number, bool up)
{
	double m = 1.0, prev;
	size_t i;

	if (up) {
		while (number >= s[n - 1] * m)
			m *= 10.0;
		while (number < s[0] * m) {
			prev = s[0] * m;
			m /= 10.0;
			if (number >= s[n - 1] * m)
				return prev;
		}
		for (i = 0; i < n && !(number < s[i] * m); i++) /* upper_bound */
			;
		return s[i < n ? i : n - 1] * m;
	}
	while (number <= s[0] * m)
		m /= 10.0;
	while (number > s[n - 1] * m) {
		prev = s[n - 1] * m;
		m *= 10.0;
		if (number <= s[0] * m)
			return prev;
	}
	for (i = 0; i < n && s[i] * m < number; i++) /* lower_bound */
		;
	return s[(i > 0 ? i : 1) - 1] * m;
}

int agg_gran_round(int gran, bool up, const docbuild_node *v, docbuild_node **out,
		   const ectx *e)
{
	int rc = agg_gran_check(v, e);

	*out = NULL;
	if (rc != 0)
		return rc;
	if (gran < 1 || (size_t)gran > sizeof granularities / sizeof granularities[0])
		return efail(e, C_INTERNAL, "bad granularity %d", gran);
	if (num_double(v) == 0.0) {
		*out = docbuild_clone(v); /* zero rounds to itself, of its own type */
		return 0;
	}
	if (granularities[gran - 1].s == NULL)
		*out = round_pow2(v, up);
	else
		*out = v_double(round_series(granularities[gran - 1].s, granularities[gran - 1].n,
					     num_double(v), up));
	return 0;
}

/* ---- options --------------------------------------------------------------------------- */

int agg_bucketauto_desugar(const bson_iter_t *it, bson_t *group, int32_t *buckets, int *gran,
			   const ectx *e)
{
	bson_iter_t sub, group_by, output;
	bool have_group_by = false, have_buckets = false, have_output = false;

	*gran = 0;
	*buckets = 0;
	if (!BSON_ITER_HOLDS_DOCUMENT(it))
		return efail(e, 40240, "The argument to $bucketAuto must be an object, but found type: %s",
			     type_name(bson_iter_type(it)));
	bson_iter_recurse(it, &sub);
	while (bson_iter_next(&sub)) {
		const char *k = bson_iter_key(&sub);

		if (strcmp(k, "groupBy") == 0) {
			bson_iter_t first;
			uint32_t len = 0;
			const char *s = BSON_ITER_HOLDS_UTF8(&sub) ? bson_iter_utf8(&sub, &len) : NULL;

			/* an object whose first field is an operator, or "$" and a field path */
			if (!(BSON_ITER_HOLDS_DOCUMENT(&sub) && bson_iter_recurse(&sub, &first) &&
			      bson_iter_next(&first) && bson_iter_key(&first)[0] == '$') &&
			    !(s != NULL && len > 1 && s[0] == '$'))
				return efail(e, 40239,
					     "The $bucketAuto 'groupBy' field must be defined as a "
					     "$-prefixed path or an expression object, but found: %s%s%s",
					     s != NULL ? "\"" : "",
					     s != NULL ? s : type_name(bson_iter_type(&sub)),
					     s != NULL ? "\"" : "");
			group_by = sub;
			have_group_by = true;
		} else if (strcmp(k, "buckets") == 0) {
			docbuild_node *n;
			double d;

			if (!BSON_ITER_HOLDS_NUMBER(&sub) && !BSON_ITER_HOLDS_DECIMAL128(&sub))
				return efail(e, 40241,
					     "The $bucketAuto 'buckets' field must be a numeric value, "
					     "but found type: %s",
					     type_name(bson_iter_type(&sub)));
			n = docbuild_from_iter(&sub, false);
			d = num_double(n);
			docbuild_free(n);
			/* Value::integral(): exactly an int32 */
			if (BSON_ITER_HOLDS_INT32(&sub))
				*buckets = bson_iter_int32(&sub);
			else if (BSON_ITER_HOLDS_INT64(&sub) && bson_iter_int64(&sub) >= INT32_MIN &&
				 bson_iter_int64(&sub) <= INT32_MAX)
				*buckets = (int32_t)bson_iter_int64(&sub);
			else if (!BSON_ITER_HOLDS_INT64(&sub) && d == floor(d) && d >= INT32_MIN &&
				 d <= INT32_MAX)
				*buckets = (int32_t)d;
			else
				return efail(e, 40242,
					     "The $bucketAuto 'buckets' field must be representable as a "
					     "32-bit integer, but found %g",
					     d);
			have_buckets = true;
		} else if (strcmp(k, "output") == 0) {
			if (!BSON_ITER_HOLDS_DOCUMENT(&sub))
				return efail(e, 40244,
					     "The $bucketAuto 'output' field must be an object, but found "
					     "type: %s",
					     type_name(bson_iter_type(&sub)));
			output = sub;
			have_output = true;
		} else if (strcmp(k, "granularity") == 0) {
			const char *g;

			if (!BSON_ITER_HOLDS_UTF8(&sub))
				return efail(e, 40261,
					     "The $bucketAuto 'granularity' field must be a string, but "
					     "found type: %s",
					     type_name(bson_iter_type(&sub)));
			g = bson_iter_utf8(&sub, NULL);
			*gran = 0;
			for (size_t i = 0; i < sizeof granularities / sizeof granularities[0]; i++)
				if (strcmp(granularities[i].name, g) == 0)
					*gran = (int)i + 1;
			if (*gran == 0)
				return efail(e, 40257, "Unknown rounding granularity '%s'", g);
		} else {
			return efail(e, 40245, "Unrecognized option to $bucketAuto: %s", k);
		}
	}
	if (!have_group_by || !have_buckets)
		return efail(e, 40246, "$bucketAuto requires 'groupBy' and 'buckets' to be specified");
	if (*buckets <= 0)
		return efail(e, 40243,
			     "The $bucketAuto 'buckets' field must be greater than 0, but found: %d",
			     (int)*buckets);

	/* {_id: groupBy, <output, or count: {$sum: 1}>} */
	bson_init(group);
	bson_append_iter(group, "_id", 3, &group_by);
	bool any_output = false;

	if (have_output) {
		bson_iter_t a;

		bson_iter_recurse(&output, &a);
		while (bson_iter_next(&a)) {
			if (strcmp(bson_iter_key(&a), "_id") == 0) {
				/* mongod would emit a second _id field; refused rather than that */
				bson_destroy(group);
				return efail(e, 15948,
					     "a $bucketAuto output field may not be named _id (the "
					     "bucket's boundaries)");
			}
			bson_append_iter(group, bson_iter_key(&a), -1, &a);
			any_output = true;
		}
	}
	if (!any_output) { /* no output, or an empty one: mongod's default */
		bson_t acc;

		bson_append_document_begin(group, "count", -1, &acc);
		BSON_APPEND_INT32(&acc, "$sum", 1);
		bson_append_document_end(group, &acc);
	}
	return 0;
}
