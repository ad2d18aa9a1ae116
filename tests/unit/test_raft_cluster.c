/* Deterministic cluster tests of the metadata state machine under libraft's in-memory
 * fixture (raft/fixture.h): 3 and 5 members, a partitioned leader, message loss, a
 * crashed member that catches up through a snapshot, and at the end every member's
 * SQLite state hashes to the same value (same commands, same order). */

/* The module under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../raft/fsm.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <raft.h>
#include <raft/fixture.h>

#include "raft/fsm.h"

#define MAXN 5

typedef struct cluster {
	struct raft_fixture f;
	sdb_fsm *fsm[MAXN];
	unsigned n;
} cluster;

typedef struct prop {
	struct raft_apply req;
	sdb_fsm *fsm;
	int done;
	int status;
	bson_t *result;
} prop;

static void prop_cb(struct raft_apply *req, int status, void *result)
{
	prop *p = req->data;
	(void)result;
	p->done = 1;
	p->status = status;
	if (status == 0)
		p->result = sdb_fsm_take_result(p->fsm);
}

static void cluster_init(cluster *c, unsigned n)
{
	struct raft_configuration conf;
	char err[256];
	memset(c, 0, sizeof *c);
	c->n = n;
	assert_int_equal(raft_fixture_initialize(&c->f), 0);
	for (unsigned i = 0; i < n; i++) {
		assert_int_equal(sdb_fsm_open(":memory:", &c->fsm[i], err, sizeof err), 0);
		assert_int_equal(raft_fixture_grow(&c->f, sdb_fsm_raft(c->fsm[i])), 0);
		struct raft *r = raft_fixture_get(&c->f, i);
		sdb_fsm_bind(c->fsm[i], r);
		raft_set_snapshot_threshold(r, 16);
		raft_set_snapshot_trailing(r, 4);
		raft_set_pre_vote(r, true);
	}
	assert_int_equal(raft_fixture_configuration(&c->f, n, &conf), 0);
	assert_int_equal(raft_fixture_bootstrap(&c->f, &conf), 0);
	raft_configuration_close(&conf);
	assert_int_equal(raft_fixture_start(&c->f), 0);
}

static void cluster_close(cluster *c)
{
	raft_fixture_close(&c->f);
	for (unsigned i = 0; i < c->n; i++)
		sdb_fsm_close(c->fsm[i]);
}

/* Submit {op, ts, args} on server i. The ts is a constant: apply must not care. */
static prop *submit(cluster *c, unsigned i, const char *op, const char *json)
{
	bson_error_t e;
	bson_t *args = bson_new_from_json((const uint8_t *)json, -1, &e);
	bson_t cmd = BSON_INITIALIZER;
	struct raft_buffer buf;
	prop *p = calloc(1, sizeof *p);
	assert_non_null(args);
	BSON_APPEND_UTF8(&cmd, "op", op);
	BSON_APPEND_INT64(&cmd, "ts", 1700000000000);
	BSON_APPEND_DOCUMENT(&cmd, "args", args);
	buf.len = (cmd.len + 7u) & ~(size_t)7u; /* as raft/node.c: 8-byte multiples */
	buf.base = raft_calloc(1, buf.len);
	memcpy(buf.base, bson_get_data(&cmd), cmd.len);
	bson_destroy(&cmd);
	bson_destroy(args);
	p->fsm = c->fsm[i];
	p->req.data = p;
	if (raft_apply(raft_fixture_get(&c->f, i), &p->req, &buf, 1, prop_cb) != 0) {
		raft_free(buf.base);
		p->done = 1;
		p->status = -1;
	}
	return p;
}

static bool prop_done(struct raft_fixture *f, void *arg)
{
	(void)f;
	return ((prop *)arg)->done;
}

static double ok_of(const bson_t *r)
{
	bson_iter_t it;
	assert_true(bson_iter_init_find(&it, r, "ok"));
	return bson_iter_as_double(&it);
}

static void prop_free(prop *p)
{
	if (p->result)
		bson_destroy(p->result);
	free(p);
}

/* Submit on the leader i and step until applied there; returns the result's ok and, when
 * code is not NULL, its code (0 when ok). */
static double commit_code(cluster *c, unsigned i, const char *op, const char *json, int *code)
{
	prop *p = submit(c, i, op, json);
	bson_iter_t it;
	assert_true(raft_fixture_step_until(&c->f, prop_done, p, 20000));
	assert_int_equal(p->status, 0);
	assert_non_null(p->result);
	double ok = ok_of(p->result);
	if (code != NULL)
		*code = bson_iter_init_find(&it, p->result, "code") ? (int)bson_iter_as_int64(&it) : 0;
	prop_free(p);
	return ok;
}

static double commit(cluster *c, unsigned i, const char *op, const char *json)
{
	return commit_code(c, i, op, json, NULL);
}

typedef struct leader_among {
	unsigned from, to; /* candidates [from, to) excluding skip */
	unsigned skip;
	unsigned found;
} leader_among;

static bool has_leader_among(struct raft_fixture *f, void *arg)
{
	leader_among *la = arg;
	for (unsigned i = la->from; i < la->to; i++) {
		if (i == la->skip)
			continue;
		struct raft *r = raft_fixture_get(f, i);
		if (raft_state(r) == RAFT_LEADER) {
			la->found = i;
			return true;
		}
	}
	return false;
}

static void assert_converged(cluster *c, unsigned leader, int64_t want_rv, int want_shards)
{
	struct raft *lr = raft_fixture_get(&c->f, leader);
	raft_index last = raft_last_applied(lr);
	assert_true(raft_fixture_step_until_applied(&c->f, c->n, last, 30000));
	uint64_t h0 = sdb_fsm_hash(c->fsm[0]), chain0 = sdb_fsm_apply_chain(c->fsm[0]);
	assert_true(chain0 != 0);
	for (unsigned i = 0; i < c->n; i++) {
		/* same commands in the same order, and the same resulting state */
		assert_true(sdb_fsm_apply_chain(c->fsm[i]) == chain0);
		assert_true(sdb_fsm_hash(c->fsm[i]) == h0);
		assert_int_equal(sdb_fsm_routing_version(c->fsm[i]), want_rv);
		assert_int_equal(sdb_fsm_last_applied(c->fsm[i]), sdb_fsm_last_applied(c->fsm[0]));
	}
	bson_t q = BSON_INITIALIZER, rep = BSON_INITIALIZER;
	char err[128];
	bson_iter_t it, sub;
	int n = 0;
	assert_int_equal(sdb_fsm_query(c->fsm[c->n - 1], "listShards", &q, &rep, err, sizeof err), 0);
	assert_true(bson_iter_init_find(&it, &rep, "shards") && bson_iter_recurse(&it, &sub));
	while (bson_iter_next(&sub))
		n++;
	assert_int_equal(n, want_shards);
	bson_destroy(&rep);
	bson_destroy(&q);
}

static void scenario(unsigned n)
{
	cluster c;
	unsigned l, i;
	char json[256];

	cluster_init(&c, n);
	assert_true(raft_fixture_step_until_has_leader(&c.f, 10000));
	l = raft_fixture_leader_index(&c.f);
	assert_true(l < n);

	/* 1. normal operation */
	assert_true(commit(&c, l, "addShard", "{\"id\": \"shard-a\", \"uri\": \"mongodb://a\"}") == 1.0);
	assert_true(commit(&c, l, "addShard", "{\"id\": \"shard-b\", \"uri\": \"mongodb://b\"}") == 1.0);
	assert_true(commit(&c, l, "createDatabase", "{\"name\": \"app\"}") == 1.0);
	assert_true(commit(&c, l, "shardCollection",
			   "{\"ns\": \"app.c\", \"key\": {\"k\": 1}, \"splitPoints\": [{\"k\": 10},"
			   " {\"k\": 20}]}") == 1.0);
	assert_true(commit(&c, l, "registerMigration", "{\"id\": \"m1\", \"ns\": \"app.c\"}") == 1.0);

	/* 2. partition the leader (and, with 5 members, one follower with it) from the
	 * majority; a write on the old leader never commits */
	unsigned buddy = n == 5 ? (l + 1) % n : n; /* n = none */
	for (i = 0; i < n; i++) {
		if (i == l || i == buddy)
			continue;
		raft_fixture_disconnect(&c.f, l, i);
		raft_fixture_disconnect(&c.f, i, l);
		if (buddy < n) {
			raft_fixture_disconnect(&c.f, buddy, i);
			raft_fixture_disconnect(&c.f, i, buddy);
		}
	}
	prop *zombie = submit(&c, l, "addShard", "{\"id\": \"zombie\", \"uri\": \"mongodb://z\"}");
	leader_among la = {0, n, l, n};
	assert_true(raft_fixture_step_until(&c.f, has_leader_among, &la, 30000));
	assert_true(la.found != buddy);
	unsigned nl = la.found;
	/* compare-and-set on the new leader: the first succeeds, a stale one loses */
	assert_true(commit(&c, nl, "updateMigration",
			   "{\"id\": \"m1\", \"expectState\": \"registered\", \"state\": \"copying\"}") ==
		    1.0);
	assert_true(commit(&c, nl, "updateMigration",
			   "{\"id\": \"m1\", \"expectState\": \"registered\", \"state\": \"aborted\"}") ==
		    0.0);
	assert_true(commit(&c, nl, "setChunkShard",
			   "{\"id\": 1, \"shard\": \"shard-b\", \"expectToken\": 1, \"token\": 2}") == 1.0);
	/* heal: the old leader steps down and its uncommitted write is discarded */
	for (i = 0; i < n; i++)
		for (unsigned j = 0; j < n; j++)
			if (i != j)
				raft_fixture_reconnect(&c.f, i, j);
	assert_true(raft_fixture_step_until(&c.f, prop_done, zombie, 30000));
	assert_int_not_equal(zombie->status, 0);
	prop_free(zombie);

	/* 3. message loss: everything the leader sends to one follower is dropped */
	unsigned lossy = (nl + 1) % n;
	raft_fixture_saturate(&c.f, nl, lossy);
	assert_true(commit(&c, nl, "splitChunk", "{\"id\": 2, \"at\": {\"k\": 15}}") == 1.0);
	raft_fixture_desaturate(&c.f, nl, lossy);

	/* 4. crash a follower, write past the snapshot threshold, revive it: it must
	 * catch up through InstallSnapshot (its missing entries are compacted away) */
	unsigned dead = (nl + 2) % n;
	raft_fixture_kill(&c.f, dead);
	for (i = 0; i < 40; i++) {
		snprintf(json, sizeof json, "{\"id\": \"bulk-%u\"}", i);
		assert_true(commit(&c, nl, "registerMigration", json) == 1.0);
	}
	unsigned before = raft_fixture_n_recv(&c.f, dead, RAFT_IO_INSTALL_SNAPSHOT);
	raft_fixture_revive(&c.f, dead);
	assert_true(commit(&c, nl, "acquireLease", "{\"name\": \"coord\", \"holder\": \"c1\", \"ttlMS\": 1000}") ==
		    1.0);
	assert_converged(&c, nl, 3, 2);
	assert_true(raft_fixture_n_recv(&c.f, dead, RAFT_IO_INSTALL_SNAPSHOT) > before);

	/* the CAS winner's state is what every member has */
	for (i = 0; i < n; i++) {
		bson_t q = BSON_INITIALIZER, rep = BSON_INITIALIZER;
		bson_iter_t it, sub;
		char err[128];
		BSON_APPEND_UTF8(&q, "getMigration", "m1");
		assert_int_equal(sdb_fsm_query(c.fsm[i], "getMigration", &q, &rep, err, sizeof err), 0);
		assert_true(bson_iter_init_find(&it, &rep, "migration") && bson_iter_recurse(&it, &sub) &&
			    bson_iter_find(&sub, "state"));
		assert_string_equal(bson_iter_utf8(&sub, NULL), "copying");
		bson_destroy(&q);
		bson_destroy(&rep);
	}
	cluster_close(&c);
}


/* State and version of migration id on member i. */
static void mig_on(cluster *c, unsigned i, const char *id, char *state, size_t n, int64_t *ver)
{
	bson_t q = BSON_INITIALIZER, rep = BSON_INITIALIZER;
	bson_iter_t it, sub;
	char err[128];
	BSON_APPEND_UTF8(&q, "getMigration", id);
	assert_int_equal(sdb_fsm_query(c->fsm[i], "getMigration", &q, &rep, err, sizeof err), 0);
	assert_true(bson_iter_init_find(&it, &rep, "migration") && bson_iter_recurse(&it, &sub));
	assert_true(bson_iter_find(&sub, "state"));
	snprintf(state, n, "%s", bson_iter_utf8(&sub, NULL));
	assert_true(bson_iter_init_find(&it, &rep, "migration") && bson_iter_recurse(&it, &sub));
	assert_true(bson_iter_find(&sub, "version"));
	*ver = bson_iter_as_int64(&sub);
	bson_destroy(&q);
	bson_destroy(&rep);
}

/* Issue #24: the replicated state machine checks migration transitions itself, with the
 * one table of raft/migstate.h. An updateMigration stamped opVersion 2 (what the
 * metadata leader proposes) that takes an edge outside the table, or that has no
 * expectState, is refused at apply by every member, which all keep the same state; an
 * unstamped entry (an older binary's, replayed) applies with the old rules. */
static void test_illegal_migration_transition_refused_everywhere(void **state)
{
	cluster c;
	unsigned l, i;
	int code;
	char st[64];
	int64_t ver, ver0 = 0;

	/* op, args, expected code (0 = ok) */
	static const struct {
		const char *op, *json;
		int code;
	} steps[] = {
		{"registerMigration", "{\"id\": \"m\", \"ns\": \"app.c\", \"opVersion\": 2}", 0},
		/* a migration starts in registered */
		{"registerMigration", "{\"id\": \"m2\", \"state\": \"complete\", \"opVersion\": 2}", 20},
		{"updateMigration", "{\"id\": \"m\", \"expectState\": \"registered\", \"state\": "
				    "\"importing\", \"opVersion\": 2}", 0},
		/* importing -> switched skips replicating, verifying and switching */
		{"updateMigration", "{\"id\": \"m\", \"expectState\": \"importing\", \"state\": "
				    "\"switched\", \"checkpoint\": {\"ts\": 9}, \"opVersion\": 2}", 20},
		/* a name outside the table is no state at all */
		{"updateMigration", "{\"id\": \"m\", \"expectState\": \"importing\", \"state\": "
				    "\"copying\", \"opVersion\": 2}", 20},
		/* expectState is required */
		{"updateMigration", "{\"id\": \"m\", \"state\": \"aborted\", \"opVersion\": 2}", 2},
		/* saving progress in the same state is not a transition */
		{"updateMigration", "{\"id\": \"m\", \"expectState\": \"importing\", \"checkpoint\": "
				    "{\"ts\": 5}, \"opVersion\": 2}", 0},
		{"updateMigration", "{\"id\": \"m\", \"expectState\": \"importing\", \"state\": "
				    "\"aborted\", \"opVersion\": 2}", 0},
		/* a terminal state has no way out */
		{"updateMigration", "{\"id\": \"m\", \"expectState\": \"aborted\", \"state\": "
				    "\"importing\", \"opVersion\": 2}", 20},
		/* rolling upgrade: an unstamped entry keeps the old rules (any state, no
		 * expectState) */
		{"registerMigration", "{\"id\": \"old\", \"state\": \"s0\"}", 0},
		{"updateMigration", "{\"id\": \"old\", \"state\": \"s1\"}", 0},
	};

	(void)state;
	cluster_init(&c, 3);
	assert_true(raft_fixture_step_until_has_leader(&c.f, 10000));
	l = raft_fixture_leader_index(&c.f);
	for (i = 0; i < sizeof steps / sizeof steps[0]; i++) {
		double ok = commit_code(&c, l, steps[i].op, steps[i].json, &code);
		if (ok != (steps[i].code == 0 ? 1.0 : 0.0) || code != steps[i].code)
			fail_msg("step %u (%s %s): ok %g code %d, want code %d", i, steps[i].op,
				 steps[i].json, ok, code, steps[i].code);
	}

	/* every member applied the same entries to the same result */
	raft_index last = raft_last_applied(raft_fixture_get(&c.f, l));
	assert_true(raft_fixture_step_until_applied(&c.f, c.n, last, 30000));
	for (i = 0; i < c.n; i++) {
		mig_on(&c, i, "m", st, sizeof st, &ver);
		assert_string_equal(st, "aborted");
		assert_int_equal(ver, 4); /* registered, importing, progress, aborted */
		if (i == 0)
			ver0 = ver;
		assert_int_equal(ver, ver0);
		mig_on(&c, i, "old", st, sizeof st, &ver);
		assert_string_equal(st, "s1");
		assert_true(sdb_fsm_hash(c.fsm[i]) == sdb_fsm_hash(c.fsm[0]));
	}
	cluster_close(&c);
}

/* Issue #18: one active migration per chunk, decided at apply. A registerMigration stamped
 * opVersion 3 of a chunk (integer or decimal string) that has a non-terminal migration is
 * refused with 117 by every member; a terminal one, another chunk or another ns does not
 * count; entries stamped 2 (a cluster not raised yet) register as before. */
static void test_second_active_migration_of_a_chunk_refused_everywhere(void **state)
{
	cluster c;
	unsigned l, i;
	int code;
	char st[64];
	int64_t ver;

	static const struct {
		const char *op, *json;
		int code;
	} steps[] = {
		{"registerMigration", "{\"id\": \"a\", \"ns\": \"app.c\", \"chunk\": 7, "
				      "\"opVersion\": 3}", 0},
		{"registerMigration", "{\"id\": \"b\", \"ns\": \"app.c\", \"chunk\": 7, "
				      "\"opVersion\": 3}", 117},
		{"registerMigration", "{\"id\": \"b\", \"ns\": \"app.c\", \"chunk\": \"7\", "
				      "\"opVersion\": 3}", 117},
		{"registerMigration", "{\"id\": \"c\", \"ns\": \"app.c\", \"chunk\": 8, "
				      "\"opVersion\": 3}", 0},
		{"registerMigration", "{\"id\": \"d\", \"ns\": \"app.d\", \"chunk\": 7, "
				      "\"opVersion\": 3}", 0},
		/* op version 2: the old rules */
		{"registerMigration", "{\"id\": \"e\", \"ns\": \"app.c\", \"chunk\": 7, "
				      "\"opVersion\": 2}", 0},
		{"updateMigration", "{\"id\": \"a\", \"expectState\": \"registered\", "
				    "\"state\": \"aborted\", \"opVersion\": 2}", 0},
		/* e is still registered */
		{"registerMigration", "{\"id\": \"f\", \"ns\": \"app.c\", \"chunk\": 7, "
				      "\"opVersion\": 3}", 117},
		{"updateMigration", "{\"id\": \"e\", \"expectState\": \"registered\", "
				    "\"state\": \"aborted\", \"opVersion\": 2}", 0},
		/* both ended: the chunk may move again */
		{"registerMigration", "{\"id\": \"f\", \"ns\": \"app.c\", \"chunk\": \"7\", "
				      "\"opVersion\": 3}", 0},
	};

	(void)state;
	cluster_init(&c, 3);
	assert_true(raft_fixture_step_until_has_leader(&c.f, 10000));
	l = raft_fixture_leader_index(&c.f);
	for (i = 0; i < sizeof steps / sizeof steps[0]; i++) {
		double ok = commit_code(&c, l, steps[i].op, steps[i].json, &code);
		if (ok != (steps[i].code == 0 ? 1.0 : 0.0) || code != steps[i].code)
			fail_msg("step %u (%s %s): ok %g code %d, want code %d", i, steps[i].op,
				 steps[i].json, ok, code, steps[i].code);
	}
	raft_index last = raft_last_applied(raft_fixture_get(&c.f, l));
	assert_true(raft_fixture_step_until_applied(&c.f, c.n, last, 30000));
	for (i = 0; i < c.n; i++) {
		mig_on(&c, i, "f", st, sizeof st, &ver);
		assert_string_equal(st, "registered");
		mig_on(&c, i, "a", st, sizeof st, &ver);
		assert_string_equal(st, "aborted");
		assert_true(sdb_fsm_hash(c.fsm[i]) == sdb_fsm_hash(c.fsm[0]));
	}
	cluster_close(&c);
}

static void test_three_members(void **state)
{
	(void)state;
	scenario(3);
}

static void test_five_members(void **state)
{
	(void)state;
	scenario(5);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_three_members),
		cmocka_unit_test(test_five_members),
		cmocka_unit_test(test_illegal_migration_transition_refused_everywhere),
		cmocka_unit_test(test_second_active_migration_of_a_chunk_refused_everywhere),
	};
	return cmocka_run_group_tests_name("raft_cluster", tests, NULL, NULL);
}
