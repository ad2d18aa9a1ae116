/* shard_bench: YCSB-shaped workloads against an embedded shard (through libmongoc, the way
 * every stripedb component talks to shards) and the same work on raw SQLite with the same
 * durability settings (WAL, synchronous=FULL), reporting ops/s and the overhead ratio.
 *
 *   shard_bench --uri mongodb://127.0.0.1:PORT/?directConnection=true
 *               [--n 100000] [--ops 20000] [--sqlite-dir /tmp/shard-bench-sqlite]
 *               [--field-bytes 100] [--fields 10] [--seed 1]
 *
 * Phases (single client, one request at a time, so numbers are per-request latency bound):
 *   load-random   bulk insert of N documents in random _id order (batches of 1000)
 *   load-ordered  the same N documents in _id order into a second collection
 *   insert        single-document acknowledged inserts (--ops / 10 of them)
 *   C  (read)     100% point reads by _id, uniform keys
 *   B  (95/5)     95% point reads, 5% updates ($set of one field)
 *   A  (50/50)    50% point reads, 50% updates
 *   E  (scan)     95% short range scans (find _id >= k, limit 1..100), 5% inserts
 * Raw SQLite does each phase on one table (k BLOB PRIMARY KEY, doc BLOB) WITHOUT ROWID,
 * one transaction per write (the shard's batch is one transaction too), documents as the
 * same BSON bytes. Output: one line per phase with both rates and shard/sqlite ratio.
 */
#include <bson/bson.h>
#include <mongoc/mongoc.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t rng_state = 1;
static uint64_t rnd(void)
{
	/* xorshift64* */
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 2685821657736338717ULL;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int n_fields = 10, field_bytes = 100;

static void make_doc(bson_t *d, int64_t id)
{
	char val[1024], key[16];
	bson_init(d);
	BSON_APPEND_INT64(d, "_id", id);
	for (int f = 0; f < n_fields; f++) {
		for (int i = 0; i < field_bytes && i < (int)sizeof val - 1; i++)
			val[i] = (char)('a' + (rnd() % 26));
		val[field_bytes < (int)sizeof val ? field_bytes : (int)sizeof val - 1] = 0;
		snprintf(key, sizeof key, "field%d", f);
		BSON_APPEND_UTF8(d, key, val);
	}
}

static void die(const char *what, const bson_error_t *e)
{
	fprintf(stderr, "shard_bench: %s: %s\n", what, e ? e->message : "");
	exit(1);
}

/* ----------------------------------------------------------------- shard side */

static void shard_bulk(mongoc_collection_t *c, const int64_t *ids, int64_t n)
{
	bson_error_t e;
	for (int64_t i = 0; i < n; i += 1000) {
		mongoc_bulk_operation_t *b = mongoc_collection_create_bulk_operation_with_opts(c, NULL);
		for (int64_t j = i; j < n && j < i + 1000; j++) {
			bson_t d;
			make_doc(&d, ids[j]);
			mongoc_bulk_operation_insert(b, &d);
			bson_destroy(&d);
		}
		bson_t reply;
		if (!mongoc_bulk_operation_execute(b, &reply, &e))
			die("bulk insert", &e);
		bson_destroy(&reply);
		mongoc_bulk_operation_destroy(b);
	}
}

static void shard_read(mongoc_collection_t *c, int64_t id)
{
	bson_t *f = BCON_NEW("_id", BCON_INT64(id));
	bson_t *o = BCON_NEW("limit", BCON_INT64(1), "singleBatch", BCON_BOOL(true));
	mongoc_cursor_t *cur = mongoc_collection_find_with_opts(c, f, o, NULL);
	const bson_t *d;
	int n = 0;
	while (mongoc_cursor_next(cur, &d))
		n++;
	bson_error_t e;
	if (mongoc_cursor_error(cur, &e))
		die("read", &e);
	mongoc_cursor_destroy(cur);
	bson_destroy(f);
	bson_destroy(o);
	(void)n;
}

static void shard_update(mongoc_collection_t *c, int64_t id)
{
	bson_error_t e;
	bson_t *f = BCON_NEW("_id", BCON_INT64(id));
	bson_t *u = BCON_NEW("$set", "{", "field0", BCON_UTF8("updated-value"), "}");
	if (!mongoc_collection_update_one(c, f, u, NULL, NULL, &e))
		die("update", &e);
	bson_destroy(f);
	bson_destroy(u);
}

static void shard_insert(mongoc_collection_t *c, int64_t id)
{
	bson_error_t e;
	bson_t d;
	make_doc(&d, id);
	if (!mongoc_collection_insert_one(c, &d, NULL, NULL, &e))
		die("insert", &e);
	bson_destroy(&d);
}

static void shard_scan(mongoc_collection_t *c, int64_t id, int len)
{
	bson_t *f = BCON_NEW("_id", "{", "$gte", BCON_INT64(id), "}");
	bson_t *o = BCON_NEW("limit", BCON_INT64(len), "sort", "{", "_id", BCON_INT32(1), "}");
	mongoc_cursor_t *cur = mongoc_collection_find_with_opts(c, f, o, NULL);
	const bson_t *d;
	while (mongoc_cursor_next(cur, &d))
		;
	bson_error_t e;
	if (mongoc_cursor_error(cur, &e))
		die("scan", &e);
	mongoc_cursor_destroy(cur);
	bson_destroy(f);
	bson_destroy(o);
}

/* ----------------------------------------------------------------- raw SQLite side */

typedef struct raw {
	sqlite3 *db;
	sqlite3_stmt *ins, *get, *upd, *scan;
} raw;

static void key_of(int64_t id, uint8_t k[8])
{
	uint64_t u = (uint64_t)id ^ 0x8000000000000000ULL;
	for (int i = 7; i >= 0; i--) {
		k[i] = (uint8_t)u;
		u >>= 8;
	}
}

static void raw_exec(raw *r, const char *sql)
{
	char *msg = NULL;
	if (sqlite3_exec(r->db, sql, NULL, NULL, &msg) != SQLITE_OK) {
		fprintf(stderr, "shard_bench: sqlite %s: %s\n", sql, msg);
		exit(1);
	}
}

static void raw_open(raw *r, const char *path, const char *table)
{
	char sql[256];
	if (sqlite3_open(path, &r->db) != SQLITE_OK)
		die("sqlite open", NULL);
	raw_exec(r, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA cache_size=-16384");
	snprintf(sql, sizeof sql,
		 "DROP TABLE IF EXISTS %s; CREATE TABLE %s(k BLOB PRIMARY KEY, doc BLOB NOT NULL) "
		 "WITHOUT ROWID",
		 table, table);
	raw_exec(r, sql);
	snprintf(sql, sizeof sql, "INSERT INTO %s(k, doc) VALUES(?, ?)", table);
	sqlite3_prepare_v2(r->db, sql, -1, &r->ins, NULL);
	snprintf(sql, sizeof sql, "SELECT doc FROM %s WHERE k = ?", table);
	sqlite3_prepare_v2(r->db, sql, -1, &r->get, NULL);
	snprintf(sql, sizeof sql, "UPDATE %s SET doc = ? WHERE k = ?", table);
	sqlite3_prepare_v2(r->db, sql, -1, &r->upd, NULL);
	snprintf(sql, sizeof sql, "SELECT doc FROM %s WHERE k >= ? ORDER BY k LIMIT ?", table);
	sqlite3_prepare_v2(r->db, sql, -1, &r->scan, NULL);
}

static void raw_close(raw *r)
{
	sqlite3_finalize(r->ins);
	sqlite3_finalize(r->get);
	sqlite3_finalize(r->upd);
	sqlite3_finalize(r->scan);
	sqlite3_close(r->db);
}

static void raw_put(raw *r, int64_t id)
{
	uint8_t k[8];
	bson_t d;
	make_doc(&d, id);
	key_of(id, k);
	sqlite3_reset(r->ins);
	sqlite3_bind_blob(r->ins, 1, k, 8, SQLITE_STATIC);
	sqlite3_bind_blob(r->ins, 2, bson_get_data(&d), (int)d.len, SQLITE_STATIC);
	if (sqlite3_step(r->ins) != SQLITE_DONE)
		die("sqlite insert", NULL);
	bson_destroy(&d);
}

static void raw_bulk(raw *r, const int64_t *ids, int64_t n)
{
	for (int64_t i = 0; i < n; i += 1000) {
		raw_exec(r, "BEGIN");
		for (int64_t j = i; j < n && j < i + 1000; j++)
			raw_put(r, ids[j]);
		raw_exec(r, "COMMIT");
	}
}

static void raw_read(raw *r, int64_t id)
{
	uint8_t k[8];
	key_of(id, k);
	raw_exec(r, "BEGIN");
	sqlite3_reset(r->get);
	sqlite3_bind_blob(r->get, 1, k, 8, SQLITE_STATIC);
	while (sqlite3_step(r->get) == SQLITE_ROW) {
		bson_t d;
		bson_init_static(&d, sqlite3_column_blob(r->get, 0),
				 (size_t)sqlite3_column_bytes(r->get, 0));
	}
	raw_exec(r, "COMMIT");
}

static void raw_update(raw *r, int64_t id)
{
	uint8_t k[8];
	key_of(id, k);
	raw_exec(r, "BEGIN IMMEDIATE");
	sqlite3_reset(r->get);
	sqlite3_bind_blob(r->get, 1, k, 8, SQLITE_STATIC);
	if (sqlite3_step(r->get) == SQLITE_ROW) {
		/* read-modify-write like the shard: rebuild the document with field0 changed */
		bson_t old, neu = BSON_INITIALIZER;
		bson_init_static(&old, sqlite3_column_blob(r->get, 0),
				 (size_t)sqlite3_column_bytes(r->get, 0));
		bson_iter_t it;
		bson_iter_init(&it, &old);
		while (bson_iter_next(&it)) {
			if (strcmp(bson_iter_key(&it), "field0") == 0)
				BSON_APPEND_UTF8(&neu, "field0", "updated-value");
			else
				bson_append_iter(&neu, bson_iter_key(&it), -1, &it);
		}
		sqlite3_reset(r->upd);
		sqlite3_bind_blob(r->upd, 1, bson_get_data(&neu), (int)neu.len, SQLITE_TRANSIENT);
		sqlite3_bind_blob(r->upd, 2, k, 8, SQLITE_STATIC);
		sqlite3_step(r->upd);
		bson_destroy(&neu);
	}
	sqlite3_reset(r->get);
	raw_exec(r, "COMMIT");
}

static void raw_insert(raw *r, int64_t id)
{
	raw_exec(r, "BEGIN IMMEDIATE");
	raw_put(r, id);
	raw_exec(r, "COMMIT");
}

static void raw_scan(raw *r, int64_t id, int len)
{
	uint8_t k[8];
	key_of(id, k);
	raw_exec(r, "BEGIN");
	sqlite3_reset(r->scan);
	sqlite3_bind_blob(r->scan, 1, k, 8, SQLITE_STATIC);
	sqlite3_bind_int(r->scan, 2, len);
	while (sqlite3_step(r->scan) == SQLITE_ROW)
		;
	raw_exec(r, "COMMIT");
}

/* ----------------------------------------------------------------- workloads */

typedef struct target {
	mongoc_collection_t *coll; /* shard, or NULL for raw */
	raw *r;
} target;

static int64_t next_insert_id;

static void op_read(target *t, int64_t id)
{
	t->coll ? shard_read(t->coll, id) : raw_read(t->r, id);
}
static void op_update(target *t, int64_t id)
{
	t->coll ? shard_update(t->coll, id) : raw_update(t->r, id);
}
static void op_insert(target *t, int64_t id)
{
	t->coll ? shard_insert(t->coll, id) : raw_insert(t->r, id);
}
static void op_scan(target *t, int64_t id, int len)
{
	t->coll ? shard_scan(t->coll, id, len) : raw_scan(t->r, id, len);
}

/* Run a mix: read_pct reads, update_pct updates, scan_pct scans, rest inserts. */
static double run_mix(target *t, int64_t n, int64_t ops, int read_pct, int update_pct,
		      int scan_pct, uint64_t seed)
{
	rng_state = seed;
	int64_t ins = next_insert_id;
	double t0 = now_s();
	for (int64_t i = 0; i < ops; i++) {
		int p = (int)(rnd() % 100);
		int64_t id = (int64_t)(rnd() % (uint64_t)n);
		if (p < read_pct)
			op_read(t, id);
		else if (p < read_pct + update_pct)
			op_update(t, id);
		else if (p < read_pct + update_pct + scan_pct)
			op_scan(t, id, 1 + (int)(rnd() % 100));
		else
			op_insert(t, ins++);
	}
	return (double)ops / (now_s() - t0);
}

static void report(const char *phase, double shard, double sqlite)
{
	printf("%-14s shard %10.0f ops/s   raw sqlite %10.0f ops/s   sqlite/shard %6.2fx\n",
	       phase, shard, sqlite, shard > 0 ? sqlite / shard : 0.0);
	fflush(stdout);
}

int main(int argc, char **argv)
{
	const char *uri_s = NULL, *sqlite_dir = "/tmp/shard-bench-sqlite";
	int64_t n = 100000, ops = 20000;
	uint64_t seed = 1;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!v) {
			fprintf(stderr, "shard_bench: %s needs a value\n", a);
			return 2;
		}
		if (strcmp(a, "--uri") == 0)
			uri_s = v;
		else if (strcmp(a, "--n") == 0)
			n = atoll(v);
		else if (strcmp(a, "--ops") == 0)
			ops = atoll(v);
		else if (strcmp(a, "--sqlite-dir") == 0)
			sqlite_dir = v;
		else if (strcmp(a, "--fields") == 0)
			n_fields = atoi(v);
		else if (strcmp(a, "--field-bytes") == 0)
			field_bytes = atoi(v);
		else if (strcmp(a, "--seed") == 0)
			seed = (uint64_t)atoll(v);
		else {
			fprintf(stderr, "shard_bench: unknown option %s\n", a);
			return 2;
		}
		i++;
	}
	if (!uri_s || n <= 0 || ops <= 0 || n_fields <= 0 || field_bytes <= 0 ||
	    field_bytes > 1000) {
		fprintf(stderr, "usage: shard_bench --uri URI [--n N] [--ops N] [--sqlite-dir DIR] "
				"[--fields F] [--field-bytes B] [--seed S]\n");
		return 2;
	}
	mongoc_init();
	bson_error_t e;
	mongoc_uri_t *uri = mongoc_uri_new_with_error(uri_s, &e);
	if (!uri)
		die("uri", &e);
	mongoc_client_t *client = mongoc_client_new_from_uri(uri);
	mongoc_database_t *db = mongoc_client_get_database(client, "shard_bench");
	mongoc_database_drop(db, NULL);
	mongoc_collection_t *c_rand = mongoc_database_get_collection(db, "ycsb");
	mongoc_collection_t *c_ord = mongoc_database_get_collection(db, "ordered");
	char cmd[512];
	snprintf(cmd, sizeof cmd, "mkdir -p '%s'", sqlite_dir);
	if (system(cmd) != 0)
		die("mkdir", NULL);
	char path[512];
	snprintf(path, sizeof path, "%s/raw.db", sqlite_dir);
	raw r_rand, r_ord;
	raw_open(&r_rand, path, "ycsb");
	raw_open(&r_ord, path, "ordered");

	int64_t *ids = malloc((size_t)n * sizeof *ids);
	for (int64_t i = 0; i < n; i++)
		ids[i] = i;
	rng_state = seed;
	for (int64_t i = n - 1; i > 0; i--) {
		int64_t j = (int64_t)(rnd() % (uint64_t)(i + 1));
		int64_t t = ids[i];
		ids[i] = ids[j];
		ids[j] = t;
	}
	printf("shard_bench: n=%lld ops=%lld document=%d fields x %d bytes, durability: WAL + "
	       "synchronous=FULL on both sides\n",
	       (long long)n, (long long)ops, n_fields, field_bytes);
	double t0 = now_s();
	shard_bulk(c_rand, ids, n);
	double s_rand = (double)n / (now_s() - t0);
	t0 = now_s();
	raw_bulk(&r_rand, ids, n);
	double q_rand = (double)n / (now_s() - t0);
	report("load-random", s_rand, q_rand);
	for (int64_t i = 0; i < n; i++)
		ids[i] = i;
	t0 = now_s();
	shard_bulk(c_ord, ids, n);
	double s_ord = (double)n / (now_s() - t0);
	t0 = now_s();
	raw_bulk(&r_ord, ids, n);
	double q_ord = (double)n / (now_s() - t0);
	report("load-ordered", s_ord, q_ord);
	printf("%-14s shard ordered/random %.2fx   raw sqlite ordered/random %.2fx\n",
	       "bulk-order", s_ord / s_rand, q_ord / q_rand);
	free(ids);

	target ts = {.coll = c_rand}, tr = {.r = &r_rand};
	int64_t nins = ops / 10 > 0 ? ops / 10 : 1;
	next_insert_id = n;
	double a = run_mix(&ts, n, nins, 0, 0, 0, seed + 1);
	next_insert_id = n;
	double b = run_mix(&tr, n, nins, 0, 0, 0, seed + 1);
	report("insert", a, b);
	next_insert_id = n + nins;
	struct {
		const char *name;
		int read, update, scan;
	} mixes[] = {
		{"C (100r)", 100, 0, 0},
		{"B (95r/5u)", 95, 5, 0},
		{"A (50r/50u)", 50, 50, 0},
		{"E (95s/5i)", 0, 0, 95},
	};
	for (size_t i = 0; i < sizeof mixes / sizeof mixes[0]; i++) {
		int64_t base = next_insert_id;
		int64_t o = mixes[i].scan ? ops / 4 : ops;
		a = run_mix(&ts, n, o, mixes[i].read, mixes[i].update, mixes[i].scan, seed + 2 + i);
		next_insert_id = base;
		b = run_mix(&tr, n, o, mixes[i].read, mixes[i].update, mixes[i].scan, seed + 2 + i);
		next_insert_id = base + o;
		report(mixes[i].name, a, b);
	}
	raw_close(&r_rand);
	raw_close(&r_ord);
	mongoc_collection_destroy(c_rand);
	mongoc_collection_destroy(c_ord);
	mongoc_database_destroy(db);
	mongoc_client_destroy(client);
	mongoc_uri_destroy(uri);
	mongoc_cleanup();
	return 0;
}
