/* Cluster-time gossip: parsing, the drift guard, signing and the reply fields (see
 * clustertime.h). */
#include "common/clustertime.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/fieldscan.h"

/* bson type names for the TypeMismatch messages */
static const char *type_name(bson_type_t t)
{
	switch (t) {
	case BSON_TYPE_DOUBLE: return "double";
	case BSON_TYPE_UTF8: return "string";
	case BSON_TYPE_DOCUMENT: return "object";
	case BSON_TYPE_ARRAY: return "array";
	case BSON_TYPE_BINARY: return "binData";
	case BSON_TYPE_BOOL: return "bool";
	case BSON_TYPE_DATE_TIME: return "date";
	case BSON_TYPE_NULL: return "null";
	case BSON_TYPE_INT32: return "int";
	case BSON_TYPE_TIMESTAMP: return "timestamp";
	case BSON_TYPE_INT64: return "long";
	default: return "another type";
	}
}

int ct_parse(const bson_t *cmd, ct_gossip *out, char *err, size_t errlen)
{
	bson_iter_t it;

	return ct_parse_field(bson_iter_init_find(&it, cmd, "$clusterTime") ? &it : NULL, out,
			      err, errlen);
}

int ct_parse_field(const bson_iter_t *field, ct_gossip *out, char *err, size_t errlen)
{
	bson_iter_t f, s;

	memset(out, 0, sizeof *out);
	if (field == NULL)
		return 0;
	if (!BSON_ITER_HOLDS_DOCUMENT(field) || !bson_iter_recurse(field, &f)) {
		snprintf(err, errlen, "$clusterTime must be an object, found %s",
			 type_name(bson_iter_type(field)));
		return 14;
	}
	bool have_time = false;
	while (bson_iter_next(&f)) {
		const char *k = bson_iter_key(&f);
		if (strcmp(k, "clusterTime") == 0) {
			uint32_t t, i;
			if (!BSON_ITER_HOLDS_TIMESTAMP(&f)) {
				snprintf(err, errlen,
					 "BSON field '$clusterTime.clusterTime' is the wrong type "
					 "'%s', expected type 'timestamp'",
					 type_name(bson_iter_type(&f)));
				return 14;
			}
			bson_iter_timestamp(&f, &t, &i);
			out->time = ((uint64_t)t << 32) | i;
			have_time = true;
		} else if (strcmp(k, "signature") == 0) {
			if (!BSON_ITER_HOLDS_DOCUMENT(&f) || !bson_iter_recurse(&f, &s)) {
				snprintf(err, errlen,
					 "BSON field '$clusterTime.signature' is the wrong type "
					 "'%s', expected type 'object'",
					 type_name(bson_iter_type(&f)));
				return 14;
			}
			bool have_hash = false, have_key = false;
			while (bson_iter_next(&s)) {
				const char *sk = bson_iter_key(&s);
				if (strcmp(sk, "hash") == 0) {
					bson_subtype_t st;
					uint32_t len;
					const uint8_t *data;
					if (!BSON_ITER_HOLDS_BINARY(&s)) {
						snprintf(err, errlen,
							 "BSON field 'signature.hash' is the wrong "
							 "type '%s', expected type 'binData'",
							 type_name(bson_iter_type(&s)));
						return 14;
					}
					bson_iter_binary(&s, &st, &len, &data);
					if (len == CT_HASH_LEN) {
						memcpy(out->hash, data, CT_HASH_LEN);
						have_hash = true;
					}
				} else if (strcmp(sk, "keyId") == 0) {
					if (!BSON_ITER_HOLDS_NUMBER(&s)) {
						snprintf(err, errlen,
							 "BSON field 'signature.keyId' is the wrong "
							 "type '%s', expected type 'long'",
							 type_name(bson_iter_type(&s)));
						return 14;
					}
					out->key_id = bson_iter_as_int64(&s);
					have_key = true;
				}
			}
			out->signed_ = have_hash && have_key;
		}
	}
	if (!have_time) {
		snprintf(err, errlen, "BSON field '$clusterTime.clusterTime' is missing but a "
				      "required field");
		return 4;
	}
	out->present = true;
	return 0;
}

int ct_take(const bson_t *cmd, ct_gossip *out, char *err, size_t errlen)
{
	bson_iter_t it;

	return ct_take_field(bson_iter_init_find(&it, cmd, "$clusterTime") ? &it : NULL, out, err,
			     errlen);
}

int ct_take_field(const bson_iter_t *field, ct_gossip *out, char *err, size_t errlen)
{
	int code = ct_parse_field(field, out, err, errlen);

	if (code || !out->present)
		return code;
	return ct_check_drift(out->time, sdb_wall_ms(), err, errlen);
}

uint64_t ct_floor_clamp(uint64_t time, int64_t wall_ms)
{
	uint64_t wall = wall_ms > 0 ? (uint64_t)wall_ms / 1000 : 0;
	uint64_t top = ((wall + CT_MAX_DRIFT_SECS - 1) << 32) | 0xFFFFFFFFu;

	return time < top ? time : top;
}

int ct_check_drift(uint64_t time, int64_t wall_ms, char *err, size_t errlen)
{
	uint64_t secs = time >> 32;
	uint64_t wall = wall_ms > 0 ? (uint64_t)wall_ms / 1000 : 0;

	/* both unsigned: compare first (mongod's VectorClock::_ensurePassesRateLimiter) */
	if (secs > wall && secs - wall > CT_MAX_DRIFT_SECS) {
		snprintf(err, errlen,
			 "New $clusterTime, %llu, is too far from this node's wall clock time, "
			 "%llu.",
			 (unsigned long long)secs, (unsigned long long)wall);
		return CT_ERR_RATE_LIMITER;
	}
	return 0;
}

void ct_sign(const uint8_t secret[32], uint64_t time, uint8_t hash[CT_HASH_LEN])
{
	uint8_t msg[8];
	unsigned int len = CT_HASH_LEN;

	for (int i = 0; i < 8; i++)
		msg[i] = (uint8_t)(time >> (56 - 8 * i));
	if (!HMAC(EVP_sha1(), secret, 32, msg, sizeof msg, hash, &len))
		memset(hash, 0, CT_HASH_LEN); /* never verifies: a time then is not accepted */
}

void ct_append_signed(bson_t *doc, uint64_t cluster_time, const uint8_t *hash)
{
	static const uint8_t zeros[CT_HASH_LEN];
	bson_t ct, sig;

	BSON_APPEND_DOCUMENT_BEGIN(doc, "$clusterTime", &ct);
	BSON_APPEND_TIMESTAMP(&ct, "clusterTime", (uint32_t)(cluster_time >> 32),
			      (uint32_t)cluster_time);
	BSON_APPEND_DOCUMENT_BEGIN(&ct, "signature", &sig);
	BSON_APPEND_BINARY(&sig, "hash", BSON_SUBTYPE_BINARY, hash ? hash : zeros, CT_HASH_LEN);
	BSON_APPEND_INT64(&sig, "keyId", hash ? 1 : 0);
	bson_append_document_end(&ct, &sig);
	bson_append_document_end(doc, &ct);
}

/* Which of $clusterTime (bit 0) and operationTime (bit 1) reply has: one pass over it
 * (two lookups walked it twice: ~0.5% of a shard's point read, issue #19). */
static uint64_t ct_reply_has(const bson_t *reply)
{
	static const char *const names[] = {"$clusterTime", "operationTime"};
	uint64_t found = 0;

	(void)sdb_bson_find_fields(reply, names, 2, &found, NULL); /* cannot fail: n = 2 */
	return found;
}

void ct_append(bson_t *reply, uint64_t cluster_time, uint64_t op_time, const uint8_t *secret)
{
	uint64_t has = ct_reply_has(reply);

	if (!(has & SDB_FIELD_BIT(0))) {
		uint8_t hash[CT_HASH_LEN] = {0};
		if (secret)
			ct_sign(secret, cluster_time, hash);
		ct_append_signed(reply, cluster_time, secret ? hash : NULL);
	}
	if (!(has & SDB_FIELD_BIT(1)))
		BSON_APPEND_TIMESTAMP(reply, "operationTime", (uint32_t)(op_time >> 32),
				      (uint32_t)op_time);
}

void ct_append_doc(bson_t *reply, const bson_t *ct_doc, uint64_t op_time)
{
	uint64_t has = ct_reply_has(reply);

	if (!(has & SDB_FIELD_BIT(0)))
		bson_concat(reply, ct_doc);
	if (!(has & SDB_FIELD_BIT(1)))
		BSON_APPEND_TIMESTAMP(reply, "operationTime", (uint32_t)(op_time >> 32),
				      (uint32_t)op_time);
}

uint64_t ct_advance(_Atomic uint64_t *clock, uint64_t time)
{
	uint64_t cur = atomic_load(clock);

	while (cur < time && !atomic_compare_exchange_weak(clock, &cur, time))
		;
	return cur < time ? time : cur;
}

uint64_t ct_of_reply(const bson_t *reply)
{
	bson_iter_t it, f;

	if (bson_iter_init_find(&it, reply, "$clusterTime") && BSON_ITER_HOLDS_DOCUMENT(&it) &&
	    bson_iter_recurse(&it, &f) && bson_iter_find(&f, "clusterTime") &&
	    BSON_ITER_HOLDS_TIMESTAMP(&f)) {
		uint32_t t, i;
		bson_iter_timestamp(&f, &t, &i);
		return ((uint64_t)t << 32) | i;
	}
	return 0;
}
