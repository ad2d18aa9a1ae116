/* An insert of many documents applied in parts (shard/repl.h SHARD_INSERT_PART): the part
 * commands the primary proposes, one Raft entry each, and the merge of their replies into
 * the one reply the client gets. See src/shard/README.md, "State machine replication". */
#include <string.h>

#include "common/alloc.h"
#include "shard/repl.h"
#include "shard/repl_int.h"

/* mongod's budget for the errmsgs of one write reply, as cmd_write.c's WERR_ERRMSG_BUDGET:
 * past it the remaining errmsgs are "" (over the whole command, not per part, so that
 * 100,000 failed statements still answer under maxBsonObjectSize) */
#define PART_ERRMSG_BUDGET (1024 * 1024)

repl_part *repl_insert_parts(const char *name, const bson_t *cmd)
{
	bson_iter_t it, arr;
	uint32_t n = 0;

	if (strcmp(name, "insert") != 0 || bson_iter_init_find(&it, cmd, "autocommit") ||
	    bson_iter_init_find(&it, cmd, "startTransaction") ||
	    bson_iter_init_find(&it, cmd, "$stripedbOrigin") ||
	    bson_iter_init_find(&it, cmd, "$stripedbSessions") ||
	    !bson_iter_init_find(&it, cmd, "documents") || !BSON_ITER_HOLDS_ARRAY(&it) ||
	    !bson_iter_recurse(&it, &arr))
		return NULL;
	while (bson_iter_next(&arr))
		n++;
	if (n <= SHARD_INSERT_PART)
		return NULL;
	if (bson_iter_init_find(&it, cmd, "stmtIds")) {
		/* only a well-formed one (one per document): else the shard's own error */
		bson_iter_t s;
		uint32_t k = 0;
		if (!BSON_ITER_HOLDS_ARRAY(&it) || !bson_iter_recurse(&it, &s))
			return NULL;
		while (bson_iter_next(&s)) {
			if (!BSON_ITER_HOLDS_INT32(&s))
				return NULL;
			k++;
		}
		if (k != n)
			return NULL;
	}
	repl_part *p = sdb_calloc(1, sizeof *p);
	p->total = n;
	p->ordered = !bson_iter_init_find(&it, cmd, "ordered") || bson_iter_as_bool(&it);
	p->werrs = bson_new();
	return p;
}

uint32_t repl_part_len(const repl_part *p)
{
	return p->total - p->off < SHARD_INSERT_PART ? p->total - p->off : SHARD_INSERT_PART;
}

void repl_part_cmd(const repl_part *p, const bson_t *cmd, bson_t *out)
{
	bson_iter_t it, sub;
	bson_t arr;
	char key[16];
	uint32_t end = p->off + repl_part_len(p), k = 0;
	int32_t base = 0;
	bool txn = bson_iter_init_find(&it, cmd, "txnNumber"), ids = false;

	bson_init(out);
	if (bson_iter_init(&it, cmd)) {
		while (bson_iter_next(&it)) {
			const char *f = bson_iter_key(&it);
			if (strcmp(f, "stmtId") == 0 && BSON_ITER_HOLDS_INT32(&it))
				base = bson_iter_int32(&it);
			else if (strcmp(f, "stmtIds") == 0)
				ids = true;
			if (strcmp(f, "documents") != 0 && strcmp(f, "stmtIds") != 0 &&
			    strcmp(f, "stmtId") != 0)
				bson_append_iter(out, NULL, 0, &it);
		}
	}
	bson_append_array_begin(out, "documents", -1, &arr);
	if (bson_iter_init_find(&it, cmd, "documents") && bson_iter_recurse(&it, &sub)) {
		for (k = 0; bson_iter_next(&sub) && k < end; k++) {
			if (k < p->off)
				continue;
			snprintf(key, sizeof key, "%u", k - p->off);
			bson_append_iter(&arr, key, -1, &sub);
		}
	}
	bson_append_array_end(out, &arr);
	if (!txn && !ids)
		return;
	/* each document keeps the stmtId it has in the whole command: a retryable write's
	 * records stay per statement, and a retry of the whole command (split again) finds
	 * them (write_ops::getStmtIdForWriteAt) */
	bson_append_array_begin(out, "stmtIds", -1, &arr);
	if (ids && bson_iter_init_find(&it, cmd, "stmtIds") && bson_iter_recurse(&it, &sub)) {
		for (k = 0; bson_iter_next(&sub) && k < end; k++) {
			if (k < p->off)
				continue;
			snprintf(key, sizeof key, "%u", k - p->off);
			bson_append_iter(&arr, key, -1, &sub);
		}
	} else {
		for (k = p->off; k < end; k++) {
			snprintf(key, sizeof key, "%u", k - p->off);
			BSON_APPEND_INT32(&arr, key, base + (int32_t)k);
		}
	}
	bson_append_array_end(out, &arr);
}

bson_t *repl_part_done(repl_part *p, bson_t *reply, bool *more)
{
	bson_iter_t it, sub;
	double ok = 0;
	bool errs = false;
	char key[16];

	*more = false;
	if (bson_iter_init_find(&it, reply, "ok") && BSON_ITER_HOLDS_NUMBER(&it))
		ok = bson_iter_as_double(&it);
	if (ok != 1.0)
		return reply; /* a command error (parts before it stay applied) */
	if (bson_iter_init_find(&it, reply, "n") && BSON_ITER_HOLDS_NUMBER(&it))
		p->n += bson_iter_as_int64(&it);
	if (bson_iter_init_find(&it, reply, "writeErrors") && BSON_ITER_HOLDS_ARRAY(&it) &&
	    bson_iter_recurse(&it, &sub)) {
		while (bson_iter_next(&sub)) {
			bson_t e, ce;
			bson_iter_t f;
			uint32_t len;
			const uint8_t *data;
			if (!BSON_ITER_HOLDS_DOCUMENT(&sub))
				continue;
			bson_iter_document(&sub, &len, &data);
			if (!bson_init_static(&e, data, len) || !bson_iter_init(&f, &e))
				continue;
			errs = true;
			snprintf(key, sizeof key, "%u", p->n_werrs++);
			bson_append_document_begin(p->werrs, key, -1, &ce);
			while (bson_iter_next(&f)) {
				const char *k = bson_iter_key(&f);
				if (strcmp(k, "index") == 0) {
					BSON_APPEND_INT32(&ce, "index",
							  (int32_t)(bson_iter_as_int64(&f) + p->off));
				} else if (strcmp(k, "errmsg") == 0 && BSON_ITER_HOLDS_UTF8(&f)) {
					uint32_t ml;
					const char *m = bson_iter_utf8(&f, &ml);
					if (p->errmsg_bytes >= PART_ERRMSG_BUDGET)
						m = "", ml = 0;
					p->errmsg_bytes += ml;
					bson_append_utf8(&ce, "errmsg", -1, m, (int)ml);
				} else {
					bson_append_iter(&ce, NULL, 0, &f);
				}
			}
			bson_append_document_end(p->werrs, &ce);
		}
	}
	p->off += repl_part_len(p);
	if (p->off < p->total && !(p->ordered && errs)) {
		*more = true;
		bson_destroy(reply);
		return NULL;
	}
	bson_t *out = bson_new();
	BSON_APPEND_INT32(out, "n", (int32_t)p->n);
	if (p->n_werrs)
		BSON_APPEND_ARRAY(out, "writeErrors", p->werrs);
	if (bson_iter_init(&it, reply)) {
		while (bson_iter_next(&it)) {
			const char *f = bson_iter_key(&it);
			if (strcmp(f, "n") != 0 && strcmp(f, "writeErrors") != 0)
				bson_append_iter(out, NULL, 0, &it);
		}
	}
	bson_destroy(reply);
	return out;
}

void repl_part_free(repl_part *p)
{
	if (!p)
		return;
	bson_destroy(p->werrs);
	free(p);
}
