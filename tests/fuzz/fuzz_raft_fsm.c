/* libFuzzer target: the metadata state machine (raft/fsm.c) on arbitrary input.
 *
 * Input: one byte choosing a command, then bytes used both as the command's args
 * document (when they parse as BSON) and as a raw raft entry buffer. Whatever comes in,
 * apply must return 0 (a result, never a storage failure), must not crash, and the
 * read-only queries must not crash on the same bytes as their command document. A
 * fresh in-memory state machine per input, seeded with two shards, a database and a
 * sharded collection so that routing commands reach their deeper paths.
 *
 *   tests/fuzz/run.sh 20 tests/fuzz/fuzz_raft_fsm      (seeds: tests/fuzz/corpus/raft_fsm)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "raft/fsm.h"

static const char *const ops[] = {
	"addShard",       "removeShard",       "createDatabase",  "dropDatabase",
	"shardCollection", "dropCollection",   "splitChunk",      "mergeChunks",
	"setChunkShard",  "registerMigration", "updateMigration", "deleteMigration",
	"acquireLease",   "renewLease",        "releaseLease",    "createTenant",
	"setQuota",       "setPolicy",         "createUser",      "registerMember",
	"removeMember",   "updateUser",        "dropUser",
};
static const char *const queries[] = {
	"getRoutingTable", "listShards", "listDatabases", "listCollections", "getMigration",
	"listMigrations",  "listTenants", "getUser",      "listMembers",     "getLease",
	"listUsers",
};

static void seed(sdb_fsm *f, uint64_t *index)
{
	static const char *const json[][2] = {
		{"addShard", "{\"id\": \"shard-a\", \"uri\": \"mongodb://a\"}"},
		{"addShard", "{\"id\": \"shard-b\", \"uri\": \"mongodb://b\"}"},
		{"createDatabase", "{\"name\": \"app\"}"},
		{"shardCollection", "{\"ns\": \"app.c\", \"key\": {\"k\": 1}, \"splitPoints\": [{\"k\": 10}]}"},
		{"registerMigration", "{\"id\": \"m\", \"state\": \"s0\"}"},
	};
	for (size_t i = 0; i < sizeof json / sizeof json[0]; i++) {
		bson_t *args = bson_new_from_json((const uint8_t *)json[i][1], -1, NULL);
		bson_t cmd = BSON_INITIALIZER, *res = bson_new();
		BSON_APPEND_UTF8(&cmd, "op", json[i][0]);
		BSON_APPEND_INT64(&cmd, "ts", 1);
		BSON_APPEND_DOCUMENT(&cmd, "args", args);
		if (sdb_fsm_apply_doc(f, ++*index, &cmd, res) != 0)
			abort();
		bson_destroy(res);
		bson_destroy(&cmd);
		bson_destroy(args);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	sdb_fsm *f;
	char err[256];
	uint64_t index = 0;
	bson_t args, cmd = BSON_INITIALIZER, *res;
	struct raft_buffer buf;
	void *unused;

	if (size < 1)
		return 0;
	if (sdb_fsm_open(":memory:", &f, err, sizeof err) != 0)
		abort();
	seed(f, &index);
	const char *op = ops[data[0] % (sizeof ops / sizeof ops[0])];
	const char *qn = queries[data[0] % (sizeof queries / sizeof queries[0])];

	/* 1. the bytes as the args of a well-formed command */
	if (bson_init_static(&args, data + 1, size - 1) && bson_validate(&args, 0, NULL)) {
		res = bson_new();
		BSON_APPEND_UTF8(&cmd, "op", op);
		BSON_APPEND_INT64(&cmd, "ts", 1000);
		BSON_APPEND_DOCUMENT(&cmd, "args", &args);
		if (sdb_fsm_apply_doc(f, ++index, &cmd, res) != 0)
			abort(); /* logical errors are results, never storage failures */
		bson_destroy(res);
		/* 2. the same bytes as a read-only query's command document */
		res = bson_new();
		sdb_fsm_query(f, qn, &args, res, err, sizeof err);
		bson_destroy(res);
	}
	/* 3. the bytes as a raw raft entry (length checks against the buffer) */
	buf.len = size - 1;
	buf.base = malloc(buf.len ? buf.len : 1);
	memcpy(buf.base, data + 1, buf.len);
	if (sdb_fsm_raft(f)->apply(sdb_fsm_raft(f), &buf, &unused) != 0)
		abort();
	free(buf.base);
	res = sdb_fsm_take_result(f);
	if (res)
		bson_destroy(res);
	(void)sdb_fsm_hash(f);
	bson_destroy(&cmd);
	sdb_fsm_close(f);
	return 0;
}
