/* Read preferences through the proxy (issue #15): a read sent with a $readPreference other
 * than primary (secondary, secondaryPreferred, nearest, primaryPreferred) is forwarded to
 * the shard with that $readPreference, and shardconn_command selects the shard replica
 * set's member with it (libmongoc server selection, shardconn.c), as mongos does. Writes
 * always go to the primary (mongos ignores a write's read preference too).
 *
 * maxStalenessSeconds (Max Staleness spec; validated as mongos does, MongoDB's
 * src/mongo/client/read_preference.cpp: a number, at least 90, not with mode primary) is
 * honoured conservatively: the shards' hello reports no lastWrite, so no secondary's
 * staleness can be estimated and none is eligible; the primary, never stale, is. So
 * primaryPreferred, secondaryPreferred and nearest with maxStalenessSeconds read from the
 * primary (what the spec selects when every secondary is too stale), and mode secondary,
 * which then has no eligible member, is refused (BadValue) rather than served by a member
 * of unknown staleness. Tag sets are refused (members have no tags). Contract in exec.h. */
#include <math.h>
#include <string.h>

#include "proxy/exec.h"

/* MongoDB's ReadPreferenceSetting::kMinimalMaxStalenessValue (seconds) and the code of a
 * smaller value (error_codes.yml MaxStalenessOutOfRange) */
#define RP_MIN_MAX_STALENESS 90
#define RP_MAX_STALENESS_OUT_OF_RANGE 160

static const char *const modes[] = {"primary", "primaryPreferred", "secondary",
				    "secondaryPreferred", "nearest", NULL};

int px_read_pref_check(ctx *c, const px_cmd *cmd, const bson_iter_t *rp)
{
	bson_iter_t it = *rp, sub;
	const char *mode = NULL;
	bool known = false;
	bool max_staleness = false; /* a bound was given (> 0; absent, -1 or 0: none) */
	uint32_t len;
	const uint8_t *data;

	c->rp_data = NULL;
	c->rp_len = 0;
	if (!BSON_ITER_HOLDS_DOCUMENT(&it) || !bson_iter_recurse(&it, &sub)) {
		return px_error(c, WIRE_ERR_FAILED_TO_PARSE, "$readPreference must be an object");
	}
	bson_iter_document(&it, &len, &data);
	while (bson_iter_next(&sub)) {
		const char *k = bson_iter_key(&sub);
		if (strcmp(k, "mode") == 0 && BSON_ITER_HOLDS_UTF8(&sub)) {
			mode = bson_iter_utf8(&sub, NULL);
		} else if (strcmp(k, "maxStalenessSeconds") == 0) {
			if (!BSON_ITER_HOLDS_NUMBER(&sub))
				return px_error(c, WIRE_ERR_FAILED_TO_PARSE,
						"maxStalenessSeconds field must be a number");
			/* read as a double, as mongos (no truncation before the checks) */
			double v = bson_iter_as_double(&sub);
			if (isnan(v) || (v < 0 && v != -1))
				return px_error(c, WIRE_ERR_BAD_VALUE,
						"maxStalenessSeconds must be a non-negative integer");
			if (v > 0 && v < RP_MIN_MAX_STALENESS)
				return px_error(c, RP_MAX_STALENESS_OUT_OF_RANGE,
						"maxStalenessSeconds value cannot be less than %d",
						RP_MIN_MAX_STALENESS);
			max_staleness = v > 0;
		} else if (strcmp(k, "tags") == 0) {
			bson_iter_t t, one;
			if (BSON_ITER_HOLDS_ARRAY(&sub) && bson_iter_recurse(&sub, &t))
				while (bson_iter_next(&t))
					if (!BSON_ITER_HOLDS_DOCUMENT(&t) || !bson_iter_recurse(&t, &one) ||
					    bson_iter_next(&one)) {
						return px_error(c, WIRE_ERR_BAD_VALUE,
								"$readPreference tag sets are not supported "
								"by stripedb (shard members have no tags)");
					}
		}
		/* hedge: an optimisation hint, ignored as mongos 8 ignores it */
	}
	for (size_t i = 0; mode && modes[i]; i++)
		known |= strcmp(mode, modes[i]) == 0;
	if (!known) {
		return px_error(c, WIRE_ERR_FAILED_TO_PARSE,
				"Could not parse $readPreference: mode must be one of primary, "
				"primaryPreferred, secondary, secondaryPreferred or nearest");
	}
	if (max_staleness && strcmp(mode, "primary") == 0)
		return px_error(c, WIRE_ERR_BAD_VALUE,
				"mode primary cannot be combined with 'maxStalenessSeconds' option");
	if (max_staleness && strcmp(mode, "secondary") == 0)
		return px_error(c, WIRE_ERR_BAD_VALUE,
				"$readPreference maxStalenessSeconds with mode secondary is not "
				"supported by stripedb (shard members report no last write time, so "
				"no secondary's staleness is known)");
	if (max_staleness)
		return 0; /* the primary: the only member known to be within the bound */
	if (strcmp(mode, "primary") != 0 && !(cmd->flags & PXC_WRITE)) {
		c->rp_data = data;
		c->rp_len = len;
	}
	return 0;
}

bool px_read_pref_applies(const ctx *c, const bson_t *fwd, bson_t *rp)
{
	static const char *const reads[] = {"find", "aggregate", "count", "distinct", NULL};
	bson_iter_t it;

	if (!c->rp_data || !bson_iter_init(&it, fwd) || !bson_iter_next(&it))
		return false;
	for (size_t i = 0; reads[i]; i++)
		if (strcmp(bson_iter_key(&it), reads[i]) == 0)
			return bson_init_static(rp, c->rp_data, c->rp_len);
	return false;
}
