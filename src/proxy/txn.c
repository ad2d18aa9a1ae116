/* Session fields of the proxy's writes (see txn.h). */
#include "proxy/txn.h"

#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/bsonget.h"

bool proxy_txn_parse(const bson_t *cmd, const char *stmts, proxy_txn *t, int *code, char *err,
		     size_t errlen)
{
	bson_iter_t it, a;
	bool have_lsid = false;
	int64_t v;

	memset(t, 0, sizeof *t);
	if (!bson_iter_init_find(&it, cmd, "txnNumber"))
		return true;
	if (!sdb_bson_as_int64_exact(&it, &t->txn) || t->txn < 0) {
		*code = WIRE_ERR_TYPE_MISMATCH;
		snprintf(err, errlen, "BSON field 'txnNumber' must be a non-negative long");
		return false;
	}
	if (bson_iter_init_find(&it, cmd, "lsid") && BSON_ITER_HOLDS_DOCUMENT(&it)) {
		uint32_t len;
		const uint8_t *data;
		bson_iter_document(&it, &len, &data);
		have_lsid = bson_init_static(&t->lsid, data, len);
	}
	if (!have_lsid) {
		*code = WIRE_ERR_INVALID_OPTIONS;
		snprintf(err, errlen, "Transaction number requires a session ID to also be specified");
		return false;
	}
	if (bson_iter_init_find(&it, cmd, "stmtId")) {
		if (!sdb_bson_as_int64_exact(&it, &v) || v < 0 || v > INT32_MAX / 2) {
			*code = WIRE_ERR_TYPE_MISMATCH;
			snprintf(err, errlen, "BSON field 'stmtId' must be an int");
			return false;
		}
		t->base = (int32_t)v;
	}
	if (stmts && bson_iter_init_find(&it, cmd, "stmtIds")) {
		size_t n = 0, cap = 0;
		bson_iter_t s;
		if (bson_iter_init_find(&s, cmd, stmts) && BSON_ITER_HOLDS_ARRAY(&s) &&
		    bson_iter_recurse(&s, &a))
			while (bson_iter_next(&a))
				cap++;
		if (!BSON_ITER_HOLDS_ARRAY(&it) || !bson_iter_recurse(&it, &a)) {
			*code = WIRE_ERR_TYPE_MISMATCH;
			snprintf(err, errlen, "BSON field 'stmtIds' must be an array");
			return false;
		}
		t->ids = sdb_calloc(cap ? cap : 1, sizeof *t->ids);
		while (bson_iter_next(&a)) {
			if (n >= cap || !sdb_bson_as_int64_exact(&a, &v) || v < 0 || v > INT32_MAX) {
				n = cap + 1;
				break;
			}
			t->ids[n++] = (int32_t)v;
		}
		if (n != cap) {
			proxy_txn_free(t);
			*code = WIRE_ERR_INVALID_OPTIONS;
			snprintf(err, errlen,
				 "stmtIds must hold one non-negative int per statement (%zu "
				 "statements)",
				 cap);
			return false;
		}
		t->n = n;
	}
	t->on = true;
	return true;
}

void proxy_txn_free(proxy_txn *t)
{
	free(t->ids);
	t->ids = NULL;
	t->n = 0;
}

int32_t proxy_txn_stmt_id(const proxy_txn *t, int64_t idx)
{
	if (t->ids)
		return idx >= 0 && (size_t)idx < t->n ? t->ids[idx] : 0;
	return t->base + (int32_t)idx;
}

void proxy_txn_append(const proxy_txn *t, bson_t *cmd, const int64_t *idx, size_t n)
{
	bson_t arr;
	char k[24];

	if (!t->on)
		return;
	BSON_APPEND_DOCUMENT(cmd, "lsid", &t->lsid);
	BSON_APPEND_INT64(cmd, "txnNumber", t->txn);
	bson_append_array_begin(cmd, "stmtIds", -1, &arr);
	for (size_t i = 0; i < n; i++) {
		snprintf(k, sizeof k, "%zu", i);
		BSON_APPEND_INT32(&arr, k, proxy_txn_stmt_id(t, idx[i]));
	}
	bson_append_array_end(cmd, &arr);
}
