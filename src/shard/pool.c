/* The shard's worker pool: each worker owns one store connection (SQLite connections are
 * per thread) and runs queued commands to completion. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"
#include "common/thread.h"
#include "common/metrics.h"
#include "shard/util.h"
#include "storage/collation.h"
#include "storage/pipeline.h"
#include "shard/repl.h"
#include "shard/shard.h"
#include "storage/collation.h"

/* Parse $stripedbOrigin and $stripedbVersion of the command into x. Replies and returns
 * false when they are malformed. */
static bool ctx_parse_ext(shard_ctx *x)
{
	bson_iter_t it, sub;
	if (util_ctx_find(x, "$stripedbOrigin", &it)) {
		if (!BSON_ITER_HOLDS_UTF8(&it)) {
			shard_fail(x, WIRE_ERR_BAD_VALUE, "$stripedbOrigin must be a string");
			return false;
		}
		x->origin = bson_iter_utf8(&it, NULL);
	}
	if (util_ctx_find(x, "$stripedbVersion", &it)) {
		bool ok = BSON_ITER_HOLDS_DOCUMENT(&it) && bson_iter_recurse(&it, &sub);
		bool have_chunk = false, have_token = false;
		while (ok && bson_iter_next(&sub)) {
			if (strcmp(bson_iter_key(&sub), "chunk") == 0 && BSON_ITER_HOLDS_UTF8(&sub)) {
				x->chunk = bson_iter_utf8(&sub, NULL);
				have_chunk = true;
			} else if (strcmp(bson_iter_key(&sub), "token") == 0 &&
				   util_token(&sub, &x->token)) {
				have_token = true;
			}
		}
		if (!ok || !have_chunk || !have_token) {
			x->chunk = NULL;
			shard_fail(x, WIRE_ERR_BAD_VALUE,
				   "$stripedbVersion must be {chunk: <string>, token: <integer>}");
			return false;
		}
	}
	return shard_filtering_parse(x);
}

/* The command's `let` into x->let (shard.h). Replies and returns false when it is refused
 * (not a document, a bad variable name, an expression error). */
static bool ctx_parse_let(shard_ctx *x)
{
	bson_iter_t it;
	int code = 0;

	if (!util_ctx_find(x, "let", &it))
		return true;
	if (sdb_let_parse(&it, NULL, "let", &x->let, &code, x->err, sizeof x->err) != 0) {
		bson_destroy(&x->let);
		shard_fail(x, code ? code : WIRE_ERR_BAD_VALUE, "%s", x->err);
		return false;
	}
	x->have_let = true;
	return true;
}

void shard_ctx_init(shard_ctx *x, shard *sh, sdb_store_conn *conn, wire_req *req)
{
	memset(x, 0, sizeof *x);
	x->sh = sh;
	x->conn = conn;
	x->req = req;
	x->cmd = wire_req_cmd(req);
	x->db = wire_req_db(req);
}

void shard_ctx_run(shard_ctx *x, shard_cmd_fn fn)
{
	/* the command's collation (shard_collation_begin) lasts until it ends */
	const sdb_collator *coll_prev = sdb_collation_use(NULL);

	if (ctx_parse_ext(x) && !shard_txn_refuse_fields(x) && ctx_parse_let(x))
		fn(x);
	sdb_collation_use(coll_prev);
	if (x->have_let)
		bson_destroy(&x->let);
	x->have_let = false;
	if (x->err_info)
		bson_destroy(x->err_info);
	x->err_info = NULL;
	shard_filtering_release(x);
}

/* What storage's interruption check looks at for one request. */
typedef struct req_limits {
	wire_req *req;
	uint64_t deadline_ns; /* maxTimeMS from the request's arrival (monotonic), 0 = none */
} req_limits;

/* storage's interruption check (sdb_store_set_interrupt): the request was killed
 * (killOp) or has run past its maxTimeMS (then marked expired: answered 50). */
static bool req_killed(const void *arg)
{
	const req_limits *l = arg;

	if (wire_req_killed(l->req))
		return true;
	if (l->deadline_ns != 0 && sdb_mono_ns() >= l->deadline_ns) {
		wire_req_expire(l->req);
		return true;
	}
	return false;
}

/* The deadline of a command's maxTimeMS (a positive whole number), counted from its
 * arrival as mongod counts it, or 0: none, and none for getMore (whose maxTimeMS is an
 * awaitData cursor's wait, handled by the getMore itself). */
static uint64_t req_deadline(wire_req *req, const bson_t *cmd)
{
	bson_iter_t it;
	int64_t ms;

	if (strcmp(wire_req_name(req), "getMore") == 0 ||
	    !util_cmd_find(req, cmd, "maxTimeMS", &it) || !BSON_ITER_HOLDS_NUMBER(&it))
		return 0;
	ms = bson_iter_as_int64(&it);
	if (ms <= 0 || ms > INT32_MAX)
		return 0;
	return wire_req_start_ns(req) + (uint64_t)ms * 1000000u;
}

typedef struct worker_arg {
	shard *sh;
	int idx;
	sdb_store_conn *conn;
} worker_arg;

static void *worker_main(void *arg)
{
	worker_arg *wa = arg;
	shard *sh = wa->sh;
	char node[16];
	snprintf(node, sizeof node, "w%d", wa->idx);
	sdb_log_set_thread("shard", node);
	for (;;) {
		pthread_mutex_lock(&sh->mu);
		while (!sh->head && !sh->stopping)
			pthread_cond_wait(&sh->cv, &sh->mu);
		shard_job *job = sh->head;
		if (job) {
			sh->head = job->next;
			if (!sh->head)
				sh->tail = NULL;
		}
		pthread_mutex_unlock(&sh->mu);
		if (!job)
			break; /* stopping and the queue is drained */
		shard_ctx x;
		shard_ctx_init(&x, sh, wa->conn, job->req);
		x.resume = job->resume;
		shard_sessions_note(sh, x.req, x.cmd);
		if (!job->resume && shard_txn_fail_point(&x))
			; /* answered by the onPrimaryTransactionalWrite test fail point */
		else if (job->replicate) {
			if (ctx_parse_ext(&x) && !shard_txn_refuse_fields(&x) &&
			    shard_filtering_precheck(&x))
				shard_repl_submit(sh->repl, job->req); /* run by the apply */
		} else {
			/* every document this command reads checks killOp's flag and the
			 * command's maxTimeMS first */
			int32_t opid = wire_req_opid(job->req);
			req_limits lim = {job->req, req_deadline(job->req, x.cmd)};
			sdb_store_set_interrupt(req_killed, &lim);
			shard_ctx_run(&x, job->fn);
			sdb_store_set_interrupt(NULL, NULL);
			shard_curop_drop(sh, opid); /* a $currentOp whose pipeline never ran */
		}
		/* a handler that failed half-way must not leave its transaction open */
		sdb_store_rollback(wa->conn);
		free(job);
	}
	sdb_store_conn_close(wa->conn);
	free(wa);
	return NULL;
}

static sdb_gauge *parked_gauge;
static sdb_counter *loop_reads, *loop_deferred; /* shard_pool_run_inline */
static pthread_once_t metrics_once = PTHREAD_ONCE_INIT;

/* The pool's metrics, registered once per process (shard_pool_start). */
static void metrics_init(void)
{
	parked_gauge = sdb_metrics_gauge("stripedb_shard_parked_getmores",
					 "awaitData getMores waiting for new oplog entries without "
					 "holding a worker",
					 "role=\"shard\"");
	loop_reads = sdb_metrics_counter("stripedb_shard_loop_reads_total",
					 "finds by _id answered on the event loop thread, without a "
					 "worker",
					 "role=\"shard\"");
	loop_deferred = sdb_metrics_counter("stripedb_shard_loop_reads_deferred_total",
					    "finds tried on the event loop thread and handed to a "
					    "worker: not a point read (a view, another plan, the oplog)",
					    "role=\"shard\"");
}

static void *await_main(void *arg);

int shard_pool_workers(void)
{
	cpu_set_t set;
	/* the CPUs this process may run on (taskset, a container's cpuset), else the online
	 * ones; a cgroup CPU quota (cpu.max) is not read */
	long cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
								 : sysconf(_SC_NPROCESSORS_ONLN);
	long n = cpus > 0 ? 2 * cpus : SHARD_WORKERS_MIN;

	if (n < SHARD_WORKERS_MIN)
		n = SHARD_WORKERS_MIN;
	if (n > SHARD_WORKERS_MAX)
		n = SHARD_WORKERS_MAX;
	return (int)n;
}

int shard_pool_start(shard *sh, char *err, size_t errlen)
{
	int workers = shard_pool_workers();

	pthread_once(&metrics_once, metrics_init);

	for (int i = 0; i < workers; i++) {
		worker_arg *wa = sdb_calloc(1, sizeof *wa);
		wa->sh = sh;
		wa->idx = i;
		int rc = sdb_store_conn_open(sh->store, &wa->conn, err, errlen);
		if (rc) {
			free(wa);
			return rc;
		}
		if (sdb_thread_create(&sh->threads[i], worker_main, wa) != 0) {
			sdb_store_conn_close(wa->conn);
			free(wa);
			return sdb_errf(err, errlen, SDB_EIO, "shard: cannot start worker thread");
		}
		sh->n_threads++;
	}
	if (sdb_thread_create(&sh->await_thread, await_main, sh) != 0)
		return sdb_errf(err, errlen, SDB_EIO, "shard: cannot start the await thread");
	sh->await_started = true;
	return 0;
}

static void submit_job(shard *sh, shard_cmd_fn fn, wire_req *req, void *resume,
		       bool replicate)
{
	shard_job *job = sdb_calloc(1, sizeof *job);
	job->fn = fn;
	job->req = req;
	job->resume = resume;
	job->replicate = replicate;
	pthread_mutex_lock(&sh->mu);
	if (sh->tail)
		sh->tail->next = job;
	else
		sh->head = job;
	sh->tail = job;
	pthread_cond_signal(&sh->cv);
	pthread_mutex_unlock(&sh->mu);
}

static void submit(shard *sh, shard_cmd_fn fn, wire_req *req, void *resume)
{
	submit_job(sh, fn, req, resume, false);
}

void shard_pool_submit(shard *sh, shard_cmd_fn fn, wire_req *req)
{
	submit(sh, fn, req, NULL);
}

void shard_pool_run_inline(shard *sh, shard_cmd_fn fn, wire_req *req)
{
	char err[256];
	/* the apply's connection keeps its cache across writes; a pooled one when it is busy
	 * (a read resumed from inside an apply) */
	sdb_store_conn *own = sh->repl ? shard_repl_read_conn(sh->repl) : NULL;
	sdb_store_conn *conn = own ? own : shard_conn_get(sh, err, sizeof err);
	shard_ctx x;

	if (!conn) {
		submit(sh, fn, req, NULL); /* the worker answers the same failure */
		return;
	}
	shard_ctx_init(&x, sh, conn, req);
	x.inline_run = true;
	int32_t opid = wire_req_opid(req);
	shard_sessions_note(sh, x.req, x.cmd);
	/* as on a worker: killOp and maxTimeMS (a read resumed after it waited for
	 * afterClusterTime or a linearizable barrier may already be past it); cleared
	 * before the loop thread goes on (an apply must not see it) */
	req_limits lim = {req, req_deadline(req, x.cmd)};
	sdb_store_set_interrupt(req_killed, &lim);
	shard_ctx_run(&x, fn);
	sdb_store_set_interrupt(NULL, NULL);
	if (own)
		sdb_store_rollback(own);
	else
		shard_conn_put(sh, conn); /* rolled back there */
	/* A disk or memory failure of this read (a corrupt page, EIO, ENOMEM) was answered to
	 * its client. The record of it is per thread, and on this thread the next replicated
	 * apply takes it as its own (repl.c apply_cmd) and stops the member: drop it, as a
	 * worker's stays on the worker. */
	(void)sdb_store_take_io_fault();
	if (x.deferred) {
		sdb_counter_inc(loop_deferred);
		submit(sh, fn, req, NULL);
	} else {
		sdb_counter_inc(loop_reads);
		shard_curop_drop(sh, opid);
	}
}

void shard_pool_submit_write(shard *sh, wire_req *req)
{
	shard_ctx x;

	if (wire_failpoint_primary_write_armed(req)) {
		/* the test fail point reads the session table: a worker's connection */
		submit_job(sh, NULL, req, NULL, true);
		return;
	}
	/* the checks only parse the command: run here, as the worker would, with no store
	 * connection (x.conn NULL: nothing to roll back) */
	shard_ctx_init(&x, sh, NULL, req);
	shard_sessions_note(sh, x.req, x.cmd);
	if (ctx_parse_ext(&x) && !shard_txn_refuse_fields(&x) && shard_filtering_precheck(&x))
		shard_repl_submit(sh->repl, req); /* run by the apply */
}

/* ------------------------------------------------------------ parked awaitData getMores */

/* Queue the waiters for which pick(a, now) holds (every one when pick is NULL).
 * oplog_mu held. Returns the earliest deadline of those left (INT64_MAX if none). */
static int64_t requeue_locked(shard *sh, bool (*pick)(const shard_await *a, int64_t now))
{
	shard_await **pp = &sh->waiters;
	int64_t now = (int64_t)sdb_mono_ms(), next = INT64_MAX;
	while (*pp) {
		shard_await *a = *pp;
		if (pick == NULL || pick(a, now)) {
			*pp = a->next;
			a->next = NULL;
			sdb_gauge_add(parked_gauge, -1);
			submit(sh, a->fn, a->req, a);
		} else {
			if (a->deadline_ms < next)
				next = a->deadline_ms;
			pp = &a->next;
		}
	}
	return next;
}

static bool expired(const shard_await *a, int64_t now)
{
	return a->deadline_ms <= now;
}

/* The await thread: queues parked getMores whose deadline passed (they then answer with
 * an empty batch, as mongod does when maxTimeMS of an awaitData getMore elapses). */
static void *await_main(void *arg)
{
	shard *sh = arg;
	sdb_log_set_thread("shard", "await");
	pthread_mutex_lock(&sh->oplog_mu);
	while (!sh->await_stop) {
		int64_t next = requeue_locked(sh, expired);
		if (next == INT64_MAX) {
			pthread_cond_wait(&sh->oplog_cv, &sh->oplog_mu);
		} else {
			/* oplog_cv waits on CLOCK_MONOTONIC (sdb_cond_init_mono in role.c) */
			sdb_cond_wait_until(&sh->oplog_cv, &sh->oplog_mu, (uint64_t)next);
		}
	}
	pthread_mutex_unlock(&sh->oplog_mu);
	return NULL;
}

bool shard_await_park(shard *sh, shard_await *a, uint64_t after_ts)
{
	bool parked = false;
	pthread_mutex_lock(&sh->oplog_mu);
	if (sh->await_close_ms > 0 && a->deadline_ms > sh->await_close_ms)
		a->deadline_ms = sh->await_close_ms;
	if (!sh->await_closed && a->deadline_ms > (int64_t)sdb_mono_ms()) {
		parked = true;
		if (sdb_store_oplog_committed(sh->store) > after_ts) {
			submit(sh, a->fn, a->req, a); /* a commit raced the scan: rescan now */
		} else {
			a->next = sh->waiters;
			sh->waiters = a;
			sdb_gauge_add(parked_gauge, 1);
			pthread_cond_signal(&sh->oplog_cv); /* the await thread re-reads deadlines */
		}
	}
	pthread_mutex_unlock(&sh->oplog_mu);
	return parked;
}

void shard_await_close_by(shard *sh, int64_t ms)
{
	if (ms <= 0) {
		shard_await_close(sh);
		return;
	}
	pthread_mutex_lock(&sh->oplog_mu);
	sh->await_close_ms = (int64_t)sdb_mono_ms() + ms;
	for (shard_await *a = sh->waiters; a; a = a->next)
		if (a->deadline_ms > sh->await_close_ms)
			a->deadline_ms = sh->await_close_ms;
	pthread_cond_signal(&sh->oplog_cv); /* the await thread re-reads deadlines */
	pthread_mutex_unlock(&sh->oplog_mu);
}

void shard_await_close(shard *sh)
{
	pthread_mutex_lock(&sh->oplog_mu);
	sh->await_closed = true;
	requeue_locked(sh, NULL);
	pthread_mutex_unlock(&sh->oplog_mu);
}

void shard_pool_stop(shard *sh)
{
	/* parked getMores go back to the queue before the workers are told to stop, so each
	 * is answered (a worker leaves only once the queue is empty) */
	shard_await_close(sh);
	if (sh->await_started) {
		pthread_mutex_lock(&sh->oplog_mu);
		sh->await_stop = true;
		pthread_cond_broadcast(&sh->oplog_cv);
		pthread_mutex_unlock(&sh->oplog_mu);
		pthread_join(sh->await_thread, NULL);
		sh->await_started = false;
	}
	pthread_mutex_lock(&sh->mu);
	sh->stopping = true;
	pthread_cond_broadcast(&sh->cv);
	pthread_mutex_unlock(&sh->mu);
	for (int i = 0; i < sh->n_threads; i++)
		pthread_join(sh->threads[i], NULL);
	sh->n_threads = 0;
}

void shard_oplog_notify(shard *sh)
{
	pthread_mutex_lock(&sh->oplog_mu);
	if (sh->waiters)
		requeue_locked(sh, NULL);
	pthread_mutex_unlock(&sh->oplog_mu);
}

sdb_store_conn *shard_conn_get(shard *sh, char *err, size_t errlen)
{
	sdb_store_conn *c = NULL;
	pthread_mutex_lock(&sh->conn_mu);
	if (sh->n_spare > 0)
		c = sh->spare[--sh->n_spare];
	pthread_mutex_unlock(&sh->conn_mu);
	if (!c && sdb_store_conn_open(sh->store, &c, err, errlen) != 0)
		return NULL;
	return c;
}

void shard_conn_put(shard *sh, sdb_store_conn *c)
{
	if (!c)
		return;
	sdb_store_rollback(c);
	pthread_mutex_lock(&sh->conn_mu);
	if (sh->n_spare < (int)(sizeof sh->spare / sizeof sh->spare[0])) {
		sh->spare[sh->n_spare++] = c;
		c = NULL;
	}
	pthread_mutex_unlock(&sh->conn_mu);
	if (c)
		sdb_store_conn_close(c);
}

void shard_conns_close(shard *sh)
{
	pthread_mutex_lock(&sh->conn_mu);
	while (sh->n_spare > 0)
		sdb_store_conn_close(sh->spare[--sh->n_spare]);
	pthread_mutex_unlock(&sh->conn_mu);
}
