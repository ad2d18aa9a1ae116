/* The failover step of `stripedb demo`: contract in cli/failover.h. */
#include "cli/failover.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"

enum { P_OK, P_FAIL, P_UNKNOWN, P_DUP };

typedef struct probe_op {
	int64_t id;
	uint64_t start_ns, end_ns;
	int st;
} probe_op;

typedef struct probe {
	char *uri;
	pthread_t thread;
	atomic_int stop;
	pthread_mutex_t mu;
	probe_op *ops;
	size_t n, cap;
	char last_err[200];
} probe;

/* A server error that says the write was not executed (refused before it ran). Anything
 * else (a network error, HostUnreachable 6 from the proxy when the shard's connection broke
 * mid-command, InterruptedDueToReplStateChange 11602) leaves the outcome unknown. */
static int refused(const bson_error_t *e)
{
	if (e->domain != MONGOC_ERROR_SERVER && e->domain != MONGOC_ERROR_WRITE_CONCERN)
		return 0;
	switch (e->code) {
	case 10107: /* NotWritablePrimary */
	case 13435: /* NotPrimaryNoSecondaryOk */
	case 91:    /* ShutdownInProgress */
	case 70:    /* ShardNotFound */
	case 13388: /* StaleConfig */
		return 1;
	default:
		return 0;
	}
}

static void *probe_main(void *arg)
{
	probe *p = arg;
	mongoc_client_t *c = mongoc_client_new(p->uri);
	mongoc_collection_t *coll;
	int64_t seq = 1;
	if (!c)
		return NULL;
	mongoc_client_set_error_api(c, MONGOC_ERROR_API_VERSION_2);
	coll = mongoc_client_get_collection(c, "pay", "failover");
	while (!atomic_load(&p->stop)) {
		bson_t *doc = BCON_NEW("_id", BCON_INT64(seq), "merchant", "m0000");
		bson_error_t e;
		probe_op op = {.id = seq++, .start_ns = sdb_mono_ns()};
		bool ok = mongoc_collection_insert_one(coll, doc, NULL, NULL, &e);
		op.end_ns = sdb_mono_ns();
		op.st = ok ? P_OK : e.code == 11000 ? P_DUP : refused(&e) ? P_FAIL : P_UNKNOWN;
		bson_destroy(doc);
		pthread_mutex_lock(&p->mu);
		if (p->n == p->cap) {
			p->cap = p->cap ? p->cap * 2 : 4096;
			p->ops = sdb_realloc(p->ops, p->cap * sizeof *p->ops);
		}
		p->ops[p->n++] = op;
		if (!ok)
			snprintf(p->last_err, sizeof p->last_err, "%.190s", e.message);
		pthread_mutex_unlock(&p->mu);
		if (!ok)
			sdb_sleep_ms(20); /* pacing while the shard has no primary */
		else
			sdb_sleep_ms(2);
	}
	mongoc_collection_destroy(coll);
	mongoc_client_destroy(c);
	return NULL;
}

/* Acknowledged probe writes so far; *first_after: end of the first acknowledged write
 * that started after after_ns (0: none). */
static int64_t probe_acked(probe *p, uint64_t after_ns, uint64_t *first_after)
{
	int64_t n = 0;
	*first_after = 0;
	pthread_mutex_lock(&p->mu);
	for (size_t i = 0; i < p->n; i++) {
		if (p->ops[i].st != P_OK)
			continue;
		n++;
		if (after_ns && !*first_after && p->ops[i].start_ns > after_ns)
			*first_after = p->ops[i].end_ns;
	}
	pthread_mutex_unlock(&p->mu);
	return n;
}

/* The shard of the chunk whose min is MinKey in pay.charges (merchant m0000, the busiest
 * of the zipfian workload), into buf; 0 or -1. */
static int busiest_shard(mongoc_client_t *meta, char *buf, size_t n)
{
	bson_t *cmd = BCON_NEW("getRoutingTable", "pay.charges");
	bson_t reply;
	bson_error_t e;
	bson_iter_t it, ci, di, mi;
	int rc = -1;
	if (mongoc_client_command_simple(meta, "admin", cmd, NULL, &reply, &e) &&
	    bson_iter_init_find(&it, &reply, "chunks") && bson_iter_recurse(&it, &ci)) {
		while (rc != 0 && bson_iter_next(&ci)) {
			const char *shard = NULL;
			bool lowest = false;
			if (!bson_iter_recurse(&ci, &di))
				continue;
			while (bson_iter_next(&di)) {
				if (strcmp(bson_iter_key(&di), "shard") == 0 && BSON_ITER_HOLDS_UTF8(&di))
					shard = bson_iter_utf8(&di, NULL);
				else if (strcmp(bson_iter_key(&di), "min") == 0 &&
					 bson_iter_recurse(&di, &mi) && bson_iter_next(&mi))
					lowest = bson_iter_type(&mi) == BSON_TYPE_MINKEY;
			}
			if (lowest && shard) {
				snprintf(buf, n, "%s", shard);
				rc = 0;
			}
		}
	}
	bson_destroy(&reply);
	bson_destroy(cmd);
	return rc;
}

static int64_t member_applied(int port)
{
	char uri[160];
	mongoc_client_t *c;
	bson_t *cmd = BCON_NEW("replSetGetStatus", BCON_INT32(1));
	bson_t reply;
	bson_error_t e;
	bson_iter_t it;
	int64_t v = -1;
	snprintf(uri, sizeof uri,
		 "mongodb://127.0.0.1:%d/?directConnection=true&serverSelectionTimeoutMS=1000", port);
	c = mongoc_client_new(uri);
	if (c && mongoc_client_command_simple(c, "admin", cmd, NULL, &reply, &e) &&
	    bson_iter_init_find(&it, &reply, "applied"))
		v = bson_iter_as_int64(&it);
	if (c) {
		bson_destroy(&reply);
		mongoc_client_destroy(c);
	}
	bson_destroy(cmd);
	return v;
}

static void wait_ticks(uint64_t until_ms, void (*tick)(void *), void *arg,
		       volatile sig_atomic_t *stop, int (*done)(void *), void *darg)
{
	uint64_t next = sdb_mono_ms() + 1000;
	while (!*stop && sdb_mono_ms() < until_ms && !(done && done(darg))) {
		sdb_sleep_ms(50);
		if (sdb_mono_ms() >= next) {
			next += 1000;
			if (tick)
				tick(arg);
		}
	}
}

typedef struct after_kill {
	probe *p;
	uint64_t kill_ns, first;
} after_kill;

static int acked_after(void *arg)
{
	after_kill *a = arg;
	probe_acked(a->p, a->kill_ns, &a->first);
	return a->first != 0;
}

/* Check the probe's documents against its history (after the probe stopped). */
static int check_probe(probe *p, const char *proxy_uri, demo_failover *f)
{
	mongoc_client_t *c = mongoc_client_new(proxy_uri);
	mongoc_collection_t *coll;
	mongoc_cursor_t *cur;
	const bson_t *doc;
	bson_t *q = bson_new();
	bson_error_t e;
	unsigned char *seen = sdb_calloc(p->n + 2, 1);
	int rc = 0;
	if (!c) {
		free(seen);
		bson_destroy(q);
		return -1;
	}
	mongoc_client_set_error_api(c, MONGOC_ERROR_API_VERSION_2);
	coll = mongoc_client_get_collection(c, "pay", "failover");
	cur = mongoc_collection_find_with_opts(coll, q, NULL, NULL);
	while (mongoc_cursor_next(cur, &doc)) {
		bson_iter_t it;
		int64_t id = bson_iter_init_find(&it, doc, "_id") ? bson_iter_as_int64(&it) : 0;
		f->found++;
		if (id < 1 || (size_t)id > p->n || seen[id])
			f->unexpected++; /* never attempted, or twice */
		else
			seen[id] = 1;
	}
	if (mongoc_cursor_error(cur, &e)) {
		snprintf(f->error, sizeof f->error, "reading pay.failover: %.200s", e.message);
		rc = -1;
	}
	for (size_t i = 0; i < p->n; i++) {
		const probe_op *op = &p->ops[i];
		f->sent++;
		f->acked += op->st == P_OK;
		f->failed += op->st == P_FAIL;
		f->unknown += op->st == P_UNKNOWN || op->st == P_DUP;
		if (op->st == P_OK && !seen[op->id])
			f->missing++;
		if (op->st == P_FAIL && seen[op->id])
			f->unexpected++; /* refused, yet written */
		if (op->st == P_DUP)
			f->unexpected++; /* 11000 on a fresh _id: the insert ran twice */
	}
	mongoc_cursor_destroy(cur);
	mongoc_collection_destroy(coll);
	mongoc_client_destroy(c);
	bson_destroy(q);
	free(seen);
	return rc;
}

int demo_failover_run(const dev_cluster *cl, const char *proxy_uri, mongoc_client_t *meta,
		      int (*run_self)(char *const *args), void (*tick)(void *arg), void *arg,
		      volatile sig_atomic_t *stop, demo_failover *f)
{
	probe p;
	after_kill ak;
	const dev_proc *victim, *np;
	int rc = -1, victim_wire = 0;

	memset(f, 0, sizeof *f);
	f->failover_ms = f->rejoin_ms = -1;
	memset(&p, 0, sizeof p);
	pthread_mutex_init(&p.mu, NULL);
	if (busiest_shard(meta, f->shard, sizeof f->shard) != 0) {
		snprintf(f->error, sizeof f->error, "no chunk of pay.charges starts at MinKey");
		goto out_nothread;
	}
	{
		bson_t *cmd = BCON_NEW("shardCollection", "pay.failover", "key", "{", "merchant",
				       BCON_INT32(1), "}", "shards", "[", f->shard, "]");
		bson_t reply;
		bson_error_t e;
		bool ok = mongoc_client_command_simple(meta, "admin", cmd, NULL, &reply, &e);
		bson_destroy(&reply);
		bson_destroy(cmd);
		if (!ok && e.code != 48) {
			snprintf(f->error, sizeof f->error, "shardCollection pay.failover: %.200s",
				 e.message);
			goto out_nothread;
		}
	}
	p.uri = sdb_asprintf("%s%sretryWrites=false", proxy_uri, strchr(proxy_uri, '?') ? "&" : "/?");
	if (pthread_create(&p.thread, NULL, probe_main, &p) != 0) {
		snprintf(f->error, sizeof f->error, "cannot start the probe thread");
		goto out_nothread;
	}
	/* the probe runs on the killed shard before the kill: routing and connections warm */
	{
		uint64_t deadline = sdb_mono_ms() + 20000, none;
		while (!*stop && probe_acked(&p, 0, &none) < 50 && sdb_mono_ms() < deadline)
			sdb_sleep_ms(50);
		if (probe_acked(&p, 0, &none) < 1) {
			snprintf(f->error, sizeof f->error, "the probe wrote nothing before the kill: %s",
				 p.last_err);
			goto out;
		}
	}
	victim = dev_cluster_primary(cl, f->shard, 10000);
	if (!victim) {
		snprintf(f->error, sizeof f->error, "shard %s has no primary", f->shard);
		goto out;
	}
	snprintf(f->victim, sizeof f->victim, "%s", victim->name);
	f->victim_pid = victim->pid;
	victim_wire = victim->wire;
	ak.p = &p;
	ak.first = 0;
	ak.kill_ns = sdb_mono_ns();
	kill(victim->pid, SIGKILL);
	printf("  SIGKILL %s (pid %d), the primary of %s\n", f->victim, f->victim_pid, f->shard);
	fflush(stdout);
	wait_ticks(sdb_mono_ms() + 30000, tick, arg, stop, acked_after, &ak);
	if (ak.first)
		f->failover_ms = (int64_t)((ak.first - ak.kill_ns) / 1000000);
	np = dev_cluster_primary(cl, f->shard, 5000);
	if (np)
		snprintf(f->new_primary, sizeof f->new_primary, "%s", np->name);
	printf("  first acknowledged write on the new primary%s%s: %s%" PRId64 " ms after the kill\n",
	       np ? " " : "", np ? np->name : "", f->failover_ms < 0 ? "none in 30 s; " : "",
	       f->failover_ms);
	/* the killed member comes back and catches up from the log */
	if (!*stop) {
		char *args[] = {"dev", "restart", f->victim, "--dir", (char *)cl->dir, NULL};
		uint64_t t_restart = sdb_mono_ms();
		if (run_self(args) == 0 && np) {
			int64_t target = member_applied(np->wire);
			uint64_t deadline = sdb_mono_ms() + 60000;
			while (!*stop && sdb_mono_ms() < deadline) {
				int64_t a = member_applied(victim_wire);
				if (a >= 0 && target >= 0 && a >= target) {
					f->rejoin_ms = (int64_t)(sdb_mono_ms() - t_restart);
					break;
				}
				sdb_sleep_ms(100);
			}
		}
	}
	rc = 0;
out:
	atomic_store(&p.stop, 1);
	pthread_join(p.thread, NULL);
	if (rc == 0 && check_probe(&p, proxy_uri, f) != 0)
		rc = -1;
	if (rc == 0 && (f->missing || f->unexpected || f->failover_ms < 0))
		rc = -1;
out_nothread:
	free(p.ops);
	free(p.uri);
	pthread_mutex_destroy(&p.mu);
	return rc;
}

void demo_failover_print(const demo_failover *f, FILE *to)
{
	if (f->error[0]) {
		fprintf(to, "failover: NOT RUN: %s\n", f->error);
		return;
	}
	fprintf(to,
		"failover: SIGKILL of %s (primary of %s, the busiest shard) under load: first "
		"acknowledged write on the new primary %s after %" PRId64 " ms; %s rejoined and "
		"caught up in %" PRId64 " ms\n",
		f->victim, f->shard, f->new_primary[0] ? f->new_primary : "?", f->failover_ms,
		f->victim, f->rejoin_ms);
	fprintf(to,
		"  probe (inserts through the proxies, retryWrites=false): %" PRId64 " sent, %" PRId64
		" acknowledged, %" PRId64 " refused, %" PRId64 " unknown; %" PRId64
		" documents found, %" PRId64 " acknowledged missing, %" PRId64
		" unexpected or duplicated: %s\n",
		f->sent, f->acked, f->failed, f->unknown, f->found, f->missing, f->unexpected,
		f->missing == 0 && f->unexpected == 0 ? "nothing lost or duplicated" : "VIOLATIONS");
}
