/* Scans: cursors over a collection or an index range (sdb_store_scan, see store.h). */
#include "storage/store.h"

#include <errno.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <time.h>

#include "common/clock.h"
#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"
#include "storage/keyenc.h"
#include "storage/path.h"
#include "storage/store_int.h"


/* ------------------------------------------------------------------ scans */

struct sdb_store_cursor {
	sdb_store_conn *conn;
	sqlite3_stmt *stmt; /* private statement */
	const sdb_store_coll *co;
	const sdb_store_index *ix; /* NULL: collection scan */
	scan_key key;              /* the statement's (scan_idle key) */
	sdb_store_range *ranges;   /* copies */
	size_t n_ranges, cur_range;
	bool reverse, started;
	int64_t keys, docs;
	store_idset seen;
};

static void range_free(sdb_store_range *r)
{
	free((void *)r->lo);
	free((void *)r->hi);
}

/* scan_key.shape bits */
enum {
	SCAN_LO = 1,      /* a lower bound is bound (?1) */
	SCAN_LO_INCL = 2, /* ... and includes its key */
	SCAN_HI = 4,      /* an upper bound is bound (?2) */
	SCAN_HI_INCL = 8, /* ... and includes its key */
	SCAN_DESC = 16,   /* descending */
};

static bool scan_key_eq(const scan_key *a, const scan_key *b)
{
	return a->tbl == b->tbl && a->ix_tbl == b->ix_tbl && a->shape == b->shape;
}

/* A reset statement of a closed cursor with this key, taken out of c's idle list, or NULL. */
static sqlite3_stmt *scan_stmt_take(sdb_store_conn *c, const scan_key *key)
{
	for (int i = 0; i < STORE_SCAN_IDLE; i++) {
		scan_slot *sl = &c->scan_idle[i];
		if (sl->stmt && scan_key_eq(&sl->key, key)) {
			sqlite3_stmt *s = sl->stmt;
			sl->stmt = NULL;
			return s;
		}
	}
	return NULL;
}

/* Keep cur's statement (reset, unbound) for the next cursor with the same key; the oldest
 * idle one is finalized when the list is full. cur->stmt is NULL afterwards. */
static void scan_stmt_put(sdb_store_cursor *cur)
{
	sdb_store_conn *c = cur->conn;
	scan_slot *sl = NULL;

	sqlite3_reset(cur->stmt);
	sqlite3_clear_bindings(cur->stmt);
	for (int i = 0; i < STORE_SCAN_IDLE && sl == NULL; i++)
		if (c->scan_idle[i].stmt == NULL)
			sl = &c->scan_idle[i];
	if (sl == NULL) {
		sl = &c->scan_idle[c->scan_next++ % STORE_SCAN_IDLE];
		sqlite3_finalize(sl->stmt);
	}
	sl->key = cur->key;
	sl->stmt = cur->stmt;
	cur->stmt = NULL;
}

/* Prepare the SQL of key on c: the key columns and documents of a collection's table, or of
 * an index's entries joined to theirs, between the bounds the shape names, in order. */
static sqlite3_stmt *scan_stmt_prepare(sdb_store_conn *c, const scan_key *key)
{
	char sql[400];
	char where[160] = "";
	const char *col = key->ix_tbl ? "i.k" : "k";
	size_t wl = 0;
	if (key->shape & SCAN_LO)
		wl += (size_t)snprintf(where + wl, sizeof where - wl, " WHERE %s %s ?1", col,
				       key->shape & SCAN_LO_INCL ? ">=" : ">");
	if (key->shape & SCAN_HI)
		snprintf(where + wl, sizeof where - wl, " %s %s %s ?2",
			 key->shape & SCAN_LO ? "AND" : "WHERE", col,
			 key->shape & SCAN_HI_INCL ? "<=" : "<");
	const char *dir = key->shape & SCAN_DESC ? "DESC" : "ASC";
	if (key->ix_tbl)
		snprintf(sql, sizeof sql,
			 "SELECT i.id, c.doc FROM i_%lld i JOIN c_%lld c ON c.k = i.id%s "
			 "ORDER BY i.k %s, i.id %s",
			 (long long)key->ix_tbl, (long long)key->tbl, where, dir, dir);
	else
		snprintf(sql, sizeof sql, "SELECT k, doc FROM c_%lld%s ORDER BY k %s",
			 (long long)key->tbl, where, dir);
	sqlite3_stmt *s = NULL;
	if (sqlite3_prepare_v3(c->db, sql, -1, SQLITE_PREPARE_PERSISTENT, &s, NULL) != SQLITE_OK) {
		sqlite3_finalize(s);
		return NULL;
	}
	return s;
}

/* Point cur->stmt at its current range: an idle statement of the same key, else a new one
 * (the SQL text is built only then: formatting it for every point read was 1.6% of a
 * shard's CPU under YCSB C). */
static int cursor_prepare_range(sdb_store_cursor *cur, char *err, size_t errlen)
{
	sdb_store_conn *c = cur->conn;
	sdb_store_range open = {0};
	size_t idx = cur->reverse ? cur->n_ranges - 1 - cur->cur_range : cur->cur_range;
	const sdb_store_range *r = cur->n_ranges ? &cur->ranges[idx] : &open;
	if (cur->stmt)
		scan_stmt_put(cur); /* the previous range's (same connection) */
	cur->key.tbl = cur->co->tbl;
	cur->key.ix_tbl = cur->ix ? cur->ix->tbl : 0;
	cur->key.shape = (r->lo ? SCAN_LO : 0) | (r->lo && r->lo_incl ? SCAN_LO_INCL : 0) |
			 (r->hi ? SCAN_HI : 0) | (r->hi && r->hi_incl ? SCAN_HI_INCL : 0) |
			 (cur->reverse ? SCAN_DESC : 0);
	cur->stmt = scan_stmt_take(c, &cur->key);
	if (cur->stmt == NULL)
		cur->stmt = scan_stmt_prepare(c, &cur->key);
	if (cur->stmt == NULL)
		return store_sqlerr(c->db, err, errlen, "scan");
	if (r->lo)
		sqlite3_bind_blob(cur->stmt, 1, r->lo, (int)r->lo_len, SQLITE_STATIC);
	if (r->hi)
		sqlite3_bind_blob(cur->stmt, 2, r->hi, (int)r->hi_len, SQLITE_STATIC);
	return 0;
}

int sdb_store_scan(sdb_store_conn *c, const char *db, const char *coll, const char *index,
		   const sdb_store_range *ranges, size_t n_ranges, bool reverse,
		   sdb_store_cursor **out, char *err, size_t errlen)
{
	*out = NULL;
	const sdb_store_coll *co = store_cache_find(c, db, coll);
	if (!co)
		return sdb_errf(err, errlen, SDB_ENOTFOUND, "ns not found");
	const sdb_store_index *ix = NULL;
	if (index) {
		for (size_t i = 0; i < co->n_indexes; i++)
			if (strcmp(co->indexes[i].name, index) == 0)
				ix = &co->indexes[i];
		if (!ix)
			return sdb_errf(err, errlen, SDB_EINVAL, "no such index: %s", index);
	}
	sdb_store_cursor *cur = sdb_calloc(1, sizeof *cur);
	cur->conn = c;
	cur->co = co;
	cur->ix = ix;
	cur->reverse = reverse;
	cur->n_ranges = n_ranges;
	if (n_ranges) {
		cur->ranges = sdb_calloc(n_ranges, sizeof *cur->ranges);
		for (size_t i = 0; i < n_ranges; i++) {
			cur->ranges[i] = ranges[i];
			if (ranges[i].lo) {
				void *p = sdb_malloc(ranges[i].lo_len ? ranges[i].lo_len : 1);
				memcpy(p, ranges[i].lo, ranges[i].lo_len);
				cur->ranges[i].lo = p;
			}
			if (ranges[i].hi) {
				void *p = sdb_malloc(ranges[i].hi_len ? ranges[i].hi_len : 1);
				memcpy(p, ranges[i].hi, ranges[i].hi_len);
				cur->ranges[i].hi = p;
			}
		}
	}
	store_idset_init(&cur->seen);
	int rc = cursor_prepare_range(cur, err, errlen);
	if (rc) {
		sdb_store_cursor_close(cur);
		return rc;
	}
	*out = cur;
	return 0;
}

static _Thread_local bool (*interrupt_fn)(const void *arg);
static _Thread_local const void *interrupt_arg;

void sdb_store_set_interrupt(bool (*fn)(const void *arg), const void *arg)
{
	interrupt_fn = fn;
	interrupt_arg = fn ? arg : NULL;
}

bool sdb_store_interrupted(void)
{
	return interrupt_fn && interrupt_fn(interrupt_arg);
}

int sdb_store_cursor_next(sdb_store_cursor *cur, bson_t *doc, char *err, size_t errlen)
{
	if (!cur)
		return 0;
	if (interrupt_fn && interrupt_fn(interrupt_arg))
		return sdb_errf(err, errlen, SDB_ECANCELED, "operation was interrupted");
	for (;;) {
		if (!cur->stmt)
			return 0;
		int r = sqlite3_step(cur->stmt);
		if (r == SQLITE_ROW) {
			cur->keys++;
			const void *id = sqlite3_column_blob(cur->stmt, 0);
			size_t idlen = (size_t)sqlite3_column_bytes(cur->stmt, 0);
			if (cur->ix && !store_idset_add(&cur->seen, id, idlen))
				continue; /* multikey: seen already */
			cur->docs++;
			if (!bson_init_static(doc, sqlite3_column_blob(cur->stmt, 1),
					      (size_t)sqlite3_column_bytes(cur->stmt, 1)))
				return sdb_errf(err, errlen, SDB_ECORRUPT,
						"corrupt document in %s.%s", cur->co->db,
						cur->co->coll);
			return 1;
		}
		if (r != SQLITE_DONE)
			return store_sqlerr(cur->conn->db, err, errlen, "scan");
		if (cur->cur_range + 1 >= cur->n_ranges) {
			scan_stmt_put(cur);
			return 0;
		}
		cur->cur_range++;
		int rc = cursor_prepare_range(cur, err, errlen);
		if (rc)
			return rc;
	}
}

void sdb_store_cursor_stats(const sdb_store_cursor *cur, int64_t *keys, int64_t *docs)
{
	*keys = cur ? (cur->ix ? cur->keys : 0) : 0;
	*docs = cur ? cur->docs : 0;
}

void sdb_store_cursor_close(sdb_store_cursor *cur)
{
	if (!cur)
		return;
	if (cur->stmt)
		scan_stmt_put(cur);
	for (size_t i = 0; i < cur->n_ranges; i++)
		range_free(&cur->ranges[i]);
	free(cur->ranges);
	store_idset_destroy(&cur->seen);
	free(cur);
}
