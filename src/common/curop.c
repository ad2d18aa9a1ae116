/* currentOp / killOp arguments: common/curop.h. */
#include "common/curop.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bsonget.h"
#include "common/cmdopts.h"

void sdb_curop_args_parse(const bson_t *cmd, const char *const *skip, bool test_commands,
			  sdb_curop_args *a)
{
	bson_iter_t it;
	bool first = true;

	memset(a, 0, sizeof *a);
	a->truncate = true;
	bson_init(&a->filter);
	if (!bson_iter_init(&it, cmd))
		return;
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		bool skipped = false;

		if (first) {
			first = false;
			continue;
		}
		if (strcmp(k, "$all") == 0) {
			a->all = bson_iter_as_bool(&it);
			continue;
		}
		if (strcmp(k, "$ownOps") == 0) {
			a->own_ops = bson_iter_as_bool(&it);
			continue;
		}
		if (strcmp(k, "$truncateOps") == 0) {
			/* current_op_common.cpp: !testCommandsEnabled || !present || trueValue */
			a->truncate = !test_commands || bson_iter_as_bool(&it);
			continue;
		}
		for (size_t i = 0; skip && skip[i]; i++)
			skipped = skipped || strcmp(skip[i], k) == 0;
		if (skipped || sdb_cmd_is_generic(k))
			continue;
		bson_append_iter(&a->filter, k, -1, &it);
	}
}

int sdb_curop_parse_opid(const bson_t *cmd, int32_t *opid, char *err, size_t errlen)
{
	bson_iter_t it;
	int64_t v;

	if (!bson_iter_init_find(&it, cmd, "op")) {
		snprintf(err, errlen, "Missing expected field \"op\"");
		return 4;
	}
	switch (bson_iter_type(&it)) {
	case BSON_TYPE_INT32:
		v = bson_iter_int32(&it);
		break;
	case BSON_TYPE_INT64:
		v = bson_iter_int64(&it);
		break;
	case BSON_TYPE_DOUBLE: {
		double d = bson_iter_double(&it);
		if (!isfinite(d) || d != floor(d) || d < -9.2e18 || d > 9.2e18) {
			snprintf(err, errlen,
				 "Expected field \"op\" to have a value exactly representable as a "
				 "64-bit integer, but found op: %g",
				 d);
			return 2;
		}
		v = (int64_t)d;
		break;
	}
	case BSON_TYPE_DECIMAL128: {
		bson_decimal128_t dec;
		char s[BSON_DECIMAL128_STRING];
		double d;
		bson_iter_decimal128(&it, &dec);
		bson_decimal128_to_string(&dec, s);
		d = strtod(s, NULL);
		if (!isfinite(d) || d != floor(d) || d < -9.2e18 || d > 9.2e18) {
			snprintf(err, errlen,
				 "Expected field \"op\" to have a value exactly representable as a "
				 "64-bit integer, but found op: %s",
				 s);
			return 2;
		}
		v = (int64_t)d;
		break;
	}
	default:
		snprintf(err, errlen, "\"op\" had the wrong type. Expected number, found %s",
			 sdb_bson_type_name(bson_iter_type(&it)));
		return 14;
	}
	if (v < INT32_MIN || v > INT32_MAX) {
		snprintf(err, errlen,
			 "invalid op : %lld. Op ID cannot be represented with 32 bits",
			 (long long)v);
		return 26823;
	}
	*opid = (int32_t)v;
	return 0;
}
