/* Steps switching, switched and rolling_back: the token bump, the catch-up within
 * spec.maxPauseMS, the routing change (compare-and-set on the token), the filtering
 * metadata of both shards (issue #17, filtering.h), the reverse replication during the
 * grace period and the switch back of a rollback. See migrate.h for the states. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "coordinator/filtering.h"
#include "coordinator/migrate_int.h"

/* Bump the token of the chunk on client c to at least tok; *stored = the shard's token. */
static int bump(mig *m, mongoc_client_t *c, int64_t tok, int64_t *stored)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	BSON_APPEND_INT32(&cmd, "stripedbSetVersion", 1);
	BSON_APPEND_UTF8(&cmd, "chunk", m->chunk_s);
	BSON_APPEND_INT64(&cmd, "token", tok);
	bson_error_t e;
	int rc = 0;
	if (!mongoc_client_command_simple(c, "admin", &cmd, NULL, &reply, &e))
		rc = sdb_errf(m->err, sizeof m->err, SDB_EUNAVAILABLE, "stripedbSetVersion: %s",
			      e.message);
	else
		*stored = mig_it_int(&reply, "token", tok);
	bson_destroy(&reply);
	bson_destroy(&cmd);
	return rc;
}

/* setChunkShard with compare-and-set. Returns 0, SDB_ECONFLICT (token moved), SDB_EIO. */
static int route_to(mig *m, const char *shard, int64_t token, int64_t expect)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	BSON_APPEND_INT64(&cmd, "setChunkShard", m->chunk);
	BSON_APPEND_UTF8(&cmd, "shard", shard);
	BSON_APPEND_INT64(&cmd, "token", token);
	BSON_APPEND_INT64(&cmd, "expectToken", expect);
	int rc = mig_meta_run(m->meta, &cmd, &reply, m->err, sizeof m->err);
	bson_destroy(&reply);
	bson_destroy(&cmd);
	if (rc == WRITE_CONFLICT)
		return SDB_ECONFLICT;
	return rc ? SDB_EIO : 0;
}

static void record_pause(mig *m, int64_t us)
{
	sdb_histogram_observe_ns(m->r->h_pause, (uint64_t)us * 1000);
	int64_t ms = (us + 999) / 1000;
	m->last_pause_ms = ms;
	if (m->npauses == 64)
		memmove(m->pauses, m->pauses + 1, 63 * sizeof m->pauses[0]);
	else
		m->npauses++;
	m->pauses[m->npauses - 1] = ms;
}

/* The switch in one direction: from (routed now, token `cur`) to `to`; p replicates from
 * -> to. Returns 0 (routed to `to`), SDB_ETIMEOUT (pause bound: routing stays on `from`
 * with the newer token), or an error (state unchanged: retried; bump is idempotent). */
static int do_switch(mig *m, repl *p, uint64_t start, mongoc_client_t *from_c,
		     const char *from, mongoc_client_t *to_c, const char *to, int64_t cur,
		     uint64_t *to_head)
{
	int rc;
	/* never switch while replication lags: drain first */
	rc = mig_repl_catch_up(m, p, start, NULL, (int64_t)sdb_mono_ms() + 1000);
	if (rc == SDB_ETIMEOUT || (rc == 0 && !p->caught_up))
		return SDB_EBUSY;
	if (rc)
		return rc;
	/* the CDC log itself may lag the source's oplog (a slow publisher): catch up with
	 * the oplog head as of now before pausing writes, else do not switch */
	uint64_t head = 0;
	if ((rc = mig_oplog_head(m, from_c, &head)) != 0)
		return rc;
	rc = mig_repl_run(m, p, start, head, (int64_t)sdb_mono_ms() + 1000);
	if (rc == SDB_ETIMEOUT)
		return SDB_EBUSY;
	if (rc)
		return rc;
	/* issue #17 (coordinator/filtering.h): the chunk's new token is above every token of
	 * the collection, and the donor's filtering metadata loses the chunk in the same step
	 * as the bump, before the oplog head is read */
	cfilt_table ft;
	if (cfilt_load(m->meta, m->ns, &ft, m->err, sizeof m->err) != 0) {
		cfilt_table_destroy(&ft);
		return SDB_EUNAVAILABLE;
	}
	int64_t t0 = (int64_t)sdb_mono_us(), stored = 0;
	rc = bump(m, from_c, cfilt_switch_token(&ft, cur), &stored);
	if (rc == 0)
		rc = cfilt_install(from_c, m->ns, from, &ft, m->chunk, stored, m->err, sizeof m->err);
	cfilt_table_destroy(&ft);
	if (rc != 0)
		return rc;
	if ((rc = mig_oplog_head(m, from_c, &head)) != 0)
		return rc;
	m->bump_ts = head;
	mig_crash_point("mid", "switch");
	rc = mig_repl_run(m, p, start, head, (int64_t)sdb_mono_ms() + m->max_pause_ms);
	/* change streams merge shards by oplog ts: the new owner's writes after the switch
	 * must sort after the old owner's writes before it (the old owner's head is `head`) */
	if (rc == 0)
		rc = mig_ts_floor(m, to_c, head);
	if (rc == 0)
		rc = mig_oplog_head(m, to_c, to_head);
	if (rc == 0) {
		rc = route_to(m, to, stored, cur);
		record_pause(m, (int64_t)sdb_mono_us() - t0);
		if (rc == 0)
			rc = cfilt_after_route(m->meta, m->ns, from, from_c, to, to_c, m->chunk, stored,
					       m->err, sizeof m->err);
		if (rc == 0)
			sdb_info("migration switched", "id=%s to=%s token=%" PRId64 " pause_ms=%" PRId64,
				 m->id, to, stored, m->last_pause_ms);
		return rc;
	}
	/* pause bound exceeded (or the catch-up failed): routing stays on `from`, with the
	 * bumped token so proxies reach it again */
	int rc2 = route_to(m, from, stored, cur);
	record_pause(m, (int64_t)sdb_mono_us() - t0);
	if (rc2 == 0 && cfilt_refresh(m->meta, m->ns, from, from_c, m->err, sizeof m->err) != 0)
		return SDB_EUNAVAILABLE; /* retried: the switch runs again from the donor */
	sdb_warn("migration switch rolled back", "id=%s pause_ms=%" PRId64 " reason=\"%s\"", m->id,
		 m->last_pause_ms, m->err);
	if (rc2 != 0 && rc2 != SDB_ECONFLICT)
		return rc2;
	return SDB_ETIMEOUT;
}

int mig_step_switch(mig *m)
{
	int rc;
	char shard[64] = "";
	int64_t token = 0;
	if ((rc = mig_connect_shards(m)) != 0 || (rc = mig_build_view(m)) != 0)
		return rc;
	if (mig_catchup_paused(m))
		return 0;
	rc = mig_routing_chunk(m, shard, sizeof shard, &token);
	if (rc == SDB_ENOTFOUND)
		return mig_fail(m, "chunk vanished from routing before the switch (split or merged)");
	if (rc)
		return rc;
	if (strcmp(shard, m->dst) == 0) {
		/* a previous holder switched and crashed before saving */
		if (!m->rev_ts && (rc = mig_oplog_head(m, m->dc, &m->rev_ts)) != 0)
			return rc;
		if ((rc = cfilt_after_route(m->meta, m->ns, m->src, m->sc, m->dst, m->dc, m->chunk,
					    token, m->err, sizeof m->err)) != 0)
			return rc;
		m->token = token;
		return mig_save(m, MIG_SWITCHED);
	}
	uint64_t to_head = 0;
	rc = do_switch(m, &m->fwd, m->ts, m->sc, m->src, m->dc, m->dst, token, &to_head);
	if (rc == 0) {
		m->lag_since = 0;
		m->token = token + 1;
		m->rev_ts = to_head;
		m->rev.pos = 0;
		m->error[0] = '\0';
		return mig_save(m, MIG_SWITCHED);
	}
	if (rc == SDB_ETIMEOUT) {
		m->attempts++;
		if (m->attempts >= m->max_attempts) {
			char why[200];
			snprintf(why, sizeof why,
				 "catch-up did not finish within maxPauseMS=%" PRId64 " in %" PRId64
				 " attempts",
				 m->max_pause_ms, m->attempts);
			return mig_fail(m, why);
		}
		return mig_save(m, MIG_REPLICATING);
	}
	if (rc == SDB_EBUSY) {
		/* lagging: never switch; stay in switching while the replicator catches up,
		 * abort cleanly when it cannot within maxCatchUpMS */
		if (m->lag_since == 0)
			m->lag_since = (int64_t)sdb_mono_ms();
		if ((int64_t)sdb_mono_ms() - m->lag_since > m->max_catchup_ms) {
			char why[200];
			snprintf(why, sizeof why,
				 "replication could not catch up with the source within maxCatchUpMS=%" PRId64,
				 m->max_catchup_ms);
			return mig_fail(m, why);
		}
		if ((int64_t)sdb_mono_ms() - m->last_ckpt >= CHECKPOINT_EVERY_MS)
			return mig_save(m, m->state);
		return 0;
	}
	return rc;
}

int mig_step_switched(mig *m, int64_t *since)
{
	int rc;
	if ((rc = mig_connect_shards(m)) != 0 || (rc = mig_build_view(m)) != 0)
		return rc;
	if (*since == 0)
		*since = (int64_t)sdb_mono_ms();
	rc = mig_repl_run(m, &m->rev, m->rev_ts, 0, (int64_t)sdb_mono_ms() + 500);
	if (rc && rc != SDB_ETIMEOUT)
		return rc;
	if ((int64_t)sdb_mono_ms() - *since >= m->grace_ms)
		return mig_save(m, MIG_CLEANING);
	if ((int64_t)sdb_mono_ms() - m->last_ckpt >= CHECKPOINT_EVERY_MS)
		return mig_save(m, m->state);
	return 0;
}

int mig_step_rollback(mig *m)
{
	int rc;
	char shard[64] = "";
	int64_t token = 0;
	if ((rc = mig_connect_shards(m)) != 0 || (rc = mig_build_view(m)) != 0)
		return rc;
	if ((rc = mig_routing_chunk(m, shard, sizeof shard, &token)) != 0)
		return rc;
	if (strcmp(shard, m->src) != 0) {
		uint64_t head = 0;
		rc = do_switch(m, &m->rev, m->rev_ts, m->dc, m->dst, m->sc, m->src, token, &head);
		if (rc == SDB_ETIMEOUT)
			return mig_save(m, MIG_SWITCHED);
		if (rc)
			return rc == SDB_EBUSY ? 0 : rc;
		m->token = token + 1;
	}
	/* routed to the source: drop the target's copy */
	if ((rc = mig_delete_chunk(m, m->dc)) != 0)
		return rc;
	m->target_cleaned = true;
	return mig_save(m, MIG_ROLLED_BACK);
}
