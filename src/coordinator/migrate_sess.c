/* Session records of a migrating chunk: see migrate_sess.h. */
#include <stdio.h>
#include <string.h>

#include "common/bsonget.h"
#include "coordinator/migrate_sess.h"

void mig_sess_of_event(const bson_t *e, mig_sess *s)
{
	bson_iter_t it;
	const uint8_t *data;
	uint32_t len;
	int64_t v;
	bool have_lsid = false, have_txn = false, have_stmt = false, have_res = false;
	memset(s, 0, sizeof *s);
	if (!bson_iter_init(&it, e))
		return;
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		if (strcmp(k, "lsid") == 0 && BSON_ITER_HOLDS_DOCUMENT(&it)) {
			bson_iter_document(&it, &len, &data);
			have_lsid = bson_init_static(&s->lsid, data, len);
		} else if (strcmp(k, "txnNumber") == 0 && sdb_bson_as_int64(&it, &v) && v >= 0) {
			s->txn = v;
			have_txn = true;
		} else if (strcmp(k, "stmtId") == 0 && sdb_bson_as_int64(&it, &v) && v >= 0 &&
			   v <= INT32_MAX) {
			s->stmt = (int32_t)v;
			have_stmt = true;
		} else if (strcmp(k, "stmtResult") == 0 && BSON_ITER_HOLDS_DOCUMENT(&it)) {
			bson_iter_document(&it, &len, &data);
			have_res = bson_init_static(&s->result, data, len);
		}
	}
	s->on = have_lsid && have_txn;
	s->have_result = s->on && have_stmt && have_res;
}

void mig_sess_append_stmt(bson_t *stmt, const mig_sess *s)
{
	bson_t d;
	BSON_APPEND_DOCUMENT_BEGIN(stmt, "$stripedbSession", &d);
	BSON_APPEND_DOCUMENT(&d, "lsid", &s->lsid);
	BSON_APPEND_INT64(&d, "txnNumber", s->txn);
	BSON_APPEND_INT32(&d, "stmtId", s->stmt);
	BSON_APPEND_DOCUMENT(&d, "result", &s->result);
	bson_append_document_end(stmt, &d);
}

void mig_sess_append_record(bson_t *arr, uint32_t n, const mig_sess *s, bool incomplete)
{
	char k[16];
	bson_t d;
	snprintf(k, sizeof k, "%u", n);
	BSON_APPEND_DOCUMENT_BEGIN(arr, k, &d);
	BSON_APPEND_DOCUMENT(&d, "lsid", &s->lsid);
	BSON_APPEND_INT64(&d, "txnNumber", s->txn);
	if (incomplete || !s->have_result) {
		BSON_APPEND_BOOL(&d, "incompleteHistory", true);
	} else {
		BSON_APPEND_INT32(&d, "stmtId", s->stmt);
		BSON_APPEND_DOCUMENT(&d, "result", &s->result);
	}
	bson_append_document_end(arr, &d);
}
