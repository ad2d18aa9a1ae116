/* The shard role: `stripedb --role=shard --data-dir=DIR --listen=H:P --http-listen=H:P`.
 * An embedded MongoDB-wire-compatible document store on SQLite (storage/store.h), with an
 * oplog, tailable cursors and version gating (issue #4). See shard.h for the threading
 * model and the stripedb command extensions. */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth/cluster.h"
#include "auth/raftsec.h"
#include "common/clock.h"
#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/role.h"
#include "tls/tls.h"
#include "shard/members.h"
#include "shard/repl.h"
#include "shard/ttl.h"
#include "shard/txn.h"
#include "shard/shard.h"

static int shard_health(void *data, char *msg, size_t msglen)
{
	shard *sh = data;
	if (!sh->store) {
		snprintf(msg, msglen, "store not open");
		return 0;
	}
	if (sh->repl && !shard_repl_healthy(sh->repl, msg, msglen))
		return 0;
	return 1;
}

/* /healthz?format=json: the replica set as the members sampler last saw it. */
static void shard_health_detail(void *data, bson_t *out)
{
	shard *sh = data;
	pthread_mutex_lock(&sh->health_mu);
	if (sh->health_doc)
		BSON_APPEND_DOCUMENT(out, "replicaSet", sh->health_doc);
	pthread_mutex_unlock(&sh->health_mu);
}

static void hello_hook(void *data, const bson_t *cmd, bson_t *reply)
{
	shard *sh = data;
	if (sh->repl)
		shard_repl_hello(sh->repl, cmd, reply);
}

static void reap_cb(uv_timer_t *t)
{
	shard *sh = t->data;
	shard_cursors_reap(sh, sdb_mono_ms(), sh->cursor_idle_ms);
}

/* Metrics hook (before each /metrics render): the store's checkpoints and taken-over
 * reads since the last. */
static void ckpt_metrics(void *arg)
{
	shard *sh = arg;
	uint64_t n[3];

	sdb_store_checkpoint_counts(sh->store, &n[0], &n[1], &n[2]);
	for (int i = 0; i < 3; i++) {
		sdb_counter_add(sh->c_ckpt[i], n[i] - sh->ckpt_seen[i]);
		sh->ckpt_seen[i] = n[i];
	}
	uint64_t kept = sdb_store_reads_taken_over(sh->store);
	sdb_counter_add(sh->c_reads_kept, kept - sh->reads_kept_seen);
	sh->reads_kept_seen = kept;
}

static void shard_free(shard *sh)
{
	shard_cursors_free_all(sh); /* before the connections they hold go */
	shard_conns_close(sh);
	if (sh->c_ckpt[0])
		sdb_metrics_remove_hook(ckpt_metrics, sh);
	if (sh->store)
		sdb_store_close(sh->store);
	pthread_mutex_destroy(&sh->mu);
	pthread_cond_destroy(&sh->cv);
	pthread_mutex_destroy(&sh->oplog_mu);
	pthread_cond_destroy(&sh->oplog_cv);
	pthread_mutex_destroy(&sh->cur_mu);
	pthread_mutex_destroy(&sh->sess_mu);
	pthread_mutex_destroy(&sh->conn_mu);
	pthread_mutex_destroy(&sh->health_mu);
	shard_curop_free_all(sh); /* none left once the workers joined; defensive */
	pthread_mutex_destroy(&sh->curop_mu);
	if (sh->health_doc)
		bson_destroy(sh->health_doc);
	free(sh);
}

static void server_closed(void *arg);

static int shard_start(sdb_role *role)
{
	const char *dir = sdb_config_get(role->cfg, SDB_OPT_data_dir);
	const char *listen = sdb_config_get(role->cfg, SDB_OPT_listen);
	if (!dir)
		return sdb_errf(role->err, sizeof role->err, SDB_EUSAGE,
				"shard: --data-dir is required");
	if (!listen)
		return sdb_errf(role->err, sizeof role->err, SDB_EUSAGE,
				"shard: --listen is required");
	shard *sh = sdb_calloc(1, sizeof *sh);
	sh->role = role;
	pthread_mutex_init(&sh->mu, NULL);
	sdb_cond_init_mono(&sh->cv);
	pthread_mutex_init(&sh->oplog_mu, NULL);
	sdb_cond_init_mono(&sh->oplog_cv);
	pthread_mutex_init(&sh->cur_mu, NULL);
	pthread_mutex_init(&sh->sess_mu, NULL);
	pthread_mutex_init(&sh->conn_mu, NULL);
	pthread_mutex_init(&sh->health_mu, NULL);
	pthread_mutex_init(&sh->curop_mu, NULL);
	char err[256];
	/* oplog caps (--oplog-max-bytes, --oplog-max-age-s) */
	sdb_store_opts so = {0};
	so.oplog_max_bytes = sdb_config_get_int(role->cfg, SDB_OPT_oplog_max_bytes, 256 << 20);
	so.oplog_max_age_s = sdb_config_get_int(role->cfg, SDB_OPT_oplog_max_age_s, 0);
	int64_t sess_min =
		sdb_config_get_int(role->cfg, SDB_OPT_logical_session_timeout_minutes, 30);
	if (sess_min < 1 || sess_min > 60LL * 24 * 365) {
		sdb_errf(role->err, sizeof role->err, SDB_EUSAGE,
			 "shard: --logical-session-timeout-minutes must be between 1 and 525600");
		shard_free(sh);
		return SDB_EUSAGE;
	}
	so.session_timeout_ms = sess_min * 60 * 1000;
	int64_t ttl_s = sdb_config_get_int(role->cfg, SDB_OPT_ttl_monitor_sleep_secs, 60);
	if (ttl_s < 0 || ttl_s > 86400) {
		sdb_errf(role->err, sizeof role->err, SDB_EUSAGE,
			 "shard: --ttl-monitor-sleep-secs must be between 0 (off) and 86400");
		shard_free(sh);
		return SDB_EUSAGE;
	}
	int64_t cursor_ms =
		sdb_config_get_int(role->cfg, SDB_OPT_cursor_timeout_ms, SHARD_CURSOR_IDLE_MS);
	if (cursor_ms < 1 || cursor_ms > 86400LL * 1000) {
		sdb_errf(role->err, sizeof role->err, SDB_EUSAGE,
			 "shard: --cursor-timeout-ms must be between 1 and 86400000");
		shard_free(sh);
		return SDB_EUSAGE;
	}
	sh->cursor_idle_ms = (uint64_t)cursor_ms;
	int64_t txn_limit_s =
		sdb_config_get_int(role->cfg, SDB_OPT_transaction_lifetime_limit_seconds, 60);
	if (txn_limit_s < 1 || txn_limit_s > 86400) {
		sdb_errf(role->err, sizeof role->err, SDB_EUSAGE,
			 "shard: --transaction-lifetime-limit-seconds must be between 1 and 86400");
		shard_free(sh);
		return SDB_EUSAGE;
	}
	sh->test_commands = sdb_config_get_bool(role->cfg, SDB_OPT_enable_test_commands, 0) != 0;
	if (so.oplog_max_bytes < 4096 || so.oplog_max_age_s < 0) {
		sdb_errf(role->err, sizeof role->err, SDB_EUSAGE,
			 "shard: --oplog-max-bytes must be at least 4096 and --oplog-max-age-s at "
			 "least 0");
		shard_free(sh);
		return SDB_EUSAGE;
	}
	/* Buffers of 4 MiB and more (snapshot chunks of 8 MiB, their replies, big documents)
	 * are mmapped and given back to the system when freed. glibc otherwise raises its
	 * mmap threshold to the largest block freed (up to 32 MiB), after which such buffers
	 * come from the per-thread arenas of the workers and stay resident: a snapshot
	 * copy left a source member ~150 MB larger (tests/bench/snapshot_mem_bench.py).
	 * glibc's malloc only: a release build's tcmalloc (configure.ac) ignores mallopt and
	 * returns freed spans to the system itself. */
	mallopt(M_MMAP_THRESHOLD, 4 << 20);
	int rc = sdb_store_open(dir, &so, &sh->store, err, sizeof err);
	if (rc) {
		sdb_errf(role->err, sizeof role->err, rc, "shard: %s", err);
		shard_free(sh);
		return rc;
	}
	sh->c_ckpt[0] = sdb_metrics_counter("stripedb_shard_wal_checkpoints_total",
					    "WAL checkpoints of the shard's store, by who ran them: "
					    "its checkpoint thread, or a commit (the last frames, so "
					    "that the WAL restarts)",
					    "by=\"thread\"");
	sh->c_ckpt[1] = sdb_metrics_counter("stripedb_shard_wal_checkpoints_total",
					    "WAL checkpoints of the shard's store, by who ran them: "
					    "its checkpoint thread, or a commit (the last frames, so "
					    "that the WAL restarts)",
					    "by=\"commit\"");
	sh->c_ckpt[2] = sdb_metrics_counter("stripedb_shard_wal_checkpoint_waits_total",
					    "Commits of the shard's store that waited for its "
					    "checkpoint thread (writes outpaced the copy)",
					    NULL);
	sh->c_reads_kept = sdb_metrics_counter(
		"stripedb_shard_read_txns_taken_over_total",
		"Reads on the loop thread that used the read transaction the previous read of the "
		"same round left open (nothing committed in between), instead of beginning one",
		NULL);
	sdb_metrics_add_hook(ckpt_metrics, sh);
	rc = shard_pool_start(sh, err, sizeof err);
	if (rc) {
		sdb_errf(role->err, sizeof role->err, rc, "shard: %s", err);
		shard_pool_stop(sh);
		shard_free(sh);
		return rc;
	}
	wire_server_opts o = {
		.listen = listen,
		.role = "shard",
		.max_connections = (int)sdb_config_get_int(role->cfg, SDB_OPT_max_connections, 0),
		.role_data = sh,
		.quiesce_ms =
			(uint64_t)sdb_config_get_int(role->cfg, SDB_OPT_shutdown_quiesce_ms, 0),
	};
	/* issue #10: with --cluster-key-file only cluster members may run commands */
	rc = auth_cluster_setup(role->cfg, err, sizeof err);
	if (rc == 0) /* --raft-tls is bad usage in every role (auth/raftsec.h) */
		rc = auth_raft_check_mode(role->cfg, err, sizeof err);
	if (rc == 0) /* issue #10: TLS on the wire listener (tls/tls.h) */
		rc = tls_setup(role->cfg, "shard", TLS_CLIENTS_INTERNAL, err, sizeof err);
	if (rc) {
		sdb_errf(role->err, sizeof role->err, rc, "shard: %s", err);
		shard_pool_stop(sh);
		shard_free(sh);
		return rc;
	}
	o.gate = auth_cluster_gate();
	o.hello = hello_hook;
	o.ct_in = shard_ct_in; /* issue #20: cluster-time gossip (clustertime.c) */
	o.ct_out = shard_ct_out;
	o.tls = tls_listener_get("shard"); /* issue #10: NULL when not set up */
	o.test_commands = sh->test_commands; /* configureFailPoint: wire/failpoint.c */
	rc = wire_server_new(role->loop, &o, &sh->srv, err, sizeof err);
	if (rc) {
		sdb_errf(role->err, sizeof role->err, rc, "shard: %s", err);
		shard_pool_stop(sh);
		shard_free(sh);
		return rc;
	}
	uv_timer_init(role->loop, &sh->reap_timer);
	sh->reap_timer.data = sh;
	uv_timer_init(role->loop, &sh->abandon_timer);
	sh->abandon_timer.data = sh;
	{
		/* the address drivers and the other members use: --advertise, else the
		 * --listen host with the bound port */
		char host[256], *wire_addr;
		int port = 0;
		if (sdb_config_get(role->cfg, SDB_OPT_advertise))
			wire_addr = sdb_strdup(sdb_config_get(role->cfg, SDB_OPT_advertise));
		else if (sdb_addr_split(listen, host, sizeof host, &port, err, sizeof err) == 0)
			wire_addr = sdb_asprintf("%s:%d", host, wire_server_port(sh->srv));
		else
			wire_addr = sdb_strdup(listen);
		rc = shard_repl_start(sh, wire_addr, err, sizeof err);
		free(wire_addr);
	}
	if (rc) {
		sdb_errf(role->err, sizeof role->err, rc, "shard: %s", err);
		/* the runner runs the loop after a failed start: close there */
		role->impl = sh;
		sh->failed_start = true;
		wire_server_close(sh->srv, 0, server_closed, sh);
		return rc;
	}
	sh->txns = shard_txns_start(sh, txn_limit_s);
	shard_register_commands(sh);
	shard_members_start(sh);
	sh->ttl = shard_ttl_start(sh, ttl_s);

	/* the reaper looks a few times per timeout, at most once a minute */
	uint64_t reap_every = sh->cursor_idle_ms / 4 < 60000 ? sh->cursor_idle_ms / 4 : 60000;
	if (reap_every < 50)
		reap_every = 50;
	uv_timer_start(&sh->reap_timer, reap_cb, reap_every, reap_every);
	if (role->http)
		sdb_http_add_health_detail(role->http, "shard", shard_health, shard_health_detail,
					   sh);
	role->impl = sh;
	sdb_info("shard listening", "addr=%s port=%d data_dir=%s", listen,
		 wire_server_port(sh->srv), dir);
	return 0;
}

static void abandon_closed(uv_handle_t *h)
{
	shard *sh = h->data;
	sdb_role *role = sh->role;
	bool failed = sh->failed_start;
	shard_free(sh);
	role->impl = NULL;
	if (!failed)
		sdb_role_stopped(role);
}

static void timer_closed(uv_handle_t *h)
{
	shard *sh = h->data;
	uv_close((uv_handle_t *)&sh->abandon_timer, abandon_closed);
}

static void ttl_stopped(void *arg)
{
	shard *sh = arg;
	uv_close((uv_handle_t *)&sh->reap_timer, timer_closed);
}

static void txns_closed(void *arg)
{
	shard *sh = arg;
	shard_ttl *t = sh->ttl;
	sh->ttl = NULL;
	shard_ttl_stop(t, ttl_stopped, sh);
}

static void repl_closed(void *arg)
{
	shard *sh = arg;
	sh->repl = NULL;
	shard_txns *t = sh->txns;
	sh->txns = NULL;
	shard_txns_stop(t, txns_closed, sh);
}

static void server_closed(void *arg)
{
	shard *sh = arg;
	sh->srv = NULL;
	/* every request has been answered: the workers are idle or finishing awaitData waits */
	shard_pool_stop(sh);
	if (sh->role->http)
		sdb_http_unroute(sh->role->http, sh);
	if (sh->repl)
		shard_repl_close(sh->repl, repl_closed, sh);
	else
		repl_closed(sh);
}

static void abandon_cb(uv_timer_t *t)
{
	shard *sh = t->data;
	/* writes still waiting for a majority (the set lost its quorum) must not hold the
	 * stop forever: their outcome is unknown, say so */
	if (sh->repl)
		shard_repl_abandon(sh->repl);
}

static void transfer_done(void *arg, int status)
{
	(void)arg;
	sdb_info("shard: leadership transfer before stopping", "status=%d", status);
}

static void shard_stop(sdb_role *role)
{
	shard *sh = role->impl;
	if (!sh) {
		sdb_role_stopped(role);
		return;
	}
	uv_timer_stop(&sh->reap_timer);
	shard_members_stop(sh);
	uint64_t timeout = (uint64_t)sdb_config_get_int(role->cfg, SDB_OPT_shutdown_timeout_ms,
							 10000);
	/* rolling restarts: hand the primary role over first, so clients see a new primary
	 * during the quiesce instead of an election after the stop */
	if (sh->repl && shard_repl_writable(sh->repl))
		shard_repl_transfer(sh->repl, transfer_done, sh);
	uv_timer_start(&sh->abandon_timer, abandon_cb, timeout > 200 ? timeout - 200 : 0, 0);
	/* parked awaitData getMores answer by the end of the quiesce, not at their deadline */
	{
		int64_t q = sdb_config_get_int(role->cfg, SDB_OPT_shutdown_quiesce_ms, 0);
		shard_await_close_by(sh, q < (int64_t)timeout ? q : (int64_t)timeout);
		/* reads waiting for afterClusterTime: the same */
		if (sh->repl)
			shard_repl_reads_close_by(sh->repl,
						  q < (int64_t)timeout ? q : (int64_t)timeout);
	}
	wire_server_close(sh->srv, timeout, server_closed, sh);
}

const sdb_role_def sdb_role_shard = {
	.name = "shard",
	.start = shard_start,
	.stop = shard_stop,
};
