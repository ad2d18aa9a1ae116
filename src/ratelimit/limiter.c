/* The decision library: validation, keys, locking, and the algorithms (see limiter.h). */
#include "ratelimit/limiter.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "common/clock.h"
#include "common/alloc.h"
#include "common/err.h"
#include "common/metrics.h"
#include "ratelimit/algo.h"
#include "ratelimit/cache.h"

struct rl_limiter {
	rl_cache *cache;
	rl_clock_fn clock;
	void *clock_data;
	sdb_counter *m_under;
	sdb_counter *m_over;
	sdb_counter *m_invalid;
	sdb_gauge *m_size;
};

static const sdb_metric_def limiter_metrics[] = {
	SDB_METRIC_COUNTER_L(rl_limiter, m_under, "stripedb_ratelimit_decisions_total",
			     "Rate-limit decisions by outcome", "status=\"under_limit\""),
	SDB_METRIC_COUNTER_L(rl_limiter, m_over, "stripedb_ratelimit_decisions_total",
			     "Rate-limit decisions by outcome", "status=\"over_limit\""),
	SDB_METRIC_COUNTER_L(rl_limiter, m_invalid, "stripedb_ratelimit_decisions_total",
			     "Rate-limit decisions by outcome", "status=\"error\""),
	SDB_METRIC_GAUGE(rl_limiter, m_size, "stripedb_ratelimit_cache_keys",
			 "Keys held in the rate limiter's cache"),
};

/* Render hook: fold the cache shards' decision tallies into the shared counters (the hot
 * path counts under the shard lock it already holds; one shared atomic per decision cost
 * the second thread most of its gain, tests/bench/README.md). */
static void fold_tallies(void *arg)
{
	rl_limiter *lim = arg;
	uint64_t t[RL_TALLIES] = {0};

	rl_cache_take_tallies(lim->cache, t);
	if (t[RL_TALLY_UNDER])
		sdb_counter_add(lim->m_under, t[RL_TALLY_UNDER]);
	if (t[RL_TALLY_OVER])
		sdb_counter_add(lim->m_over, t[RL_TALLY_OVER]);
}

int64_t rl_clock_realtime_ms(void *unused)
{
	(void)unused;
	/* The protocol's reset_time and created_at are epoch ms: the one wall-clock read. */
	return sdb_wall_ms();
}

rl_limiter *rl_limiter_new(const rl_limiter_opts *opts)
{
	rl_limiter *lim = sdb_calloc(1, sizeof(*lim));
	rl_limiter_opts def = {0};

	if (opts == NULL)
		opts = &def;
	lim->cache = rl_cache_new(opts->cache_size, opts->cache_shards);
	lim->clock = opts->clock != NULL ? opts->clock : rl_clock_realtime_ms;
	lim->clock_data = opts->clock_data;
	SDB_METRICS_REGISTER(lim, limiter_metrics, NULL);
	sdb_metrics_add_hook(fold_tallies, lim);
	return lim;
}

void rl_limiter_free(rl_limiter *lim)
{
	if (lim == NULL)
		return;
	sdb_metrics_remove_hook(fold_tallies, lim);
	fold_tallies(lim);
	rl_cache_free(lim->cache);
	free(lim);
}

size_t rl_limiter_size(rl_limiter *lim)
{
	return rl_cache_size(lim->cache);
}

int rl_req_validate(const rl_req *req, char *err, size_t errlen)
{
	/* Messages for empty fields are Gubernator's own (gubernator.go). */
	if (req->name == NULL || req->name[0] == '\0')
		return sdb_errf(err, errlen, SDB_EINVAL, "field 'namespace' cannot be empty");
	if (req->unique_key == NULL || req->unique_key[0] == '\0')
		return sdb_errf(err, errlen, SDB_EINVAL, "field 'unique_key' cannot be empty");
	if (strnlen(req->name, RL_MAX_KEY_LEN + 1) +
		    strnlen(req->unique_key, RL_MAX_KEY_LEN + 1) >
	    RL_MAX_KEY_LEN)
		return sdb_errf(err, errlen, SDB_EINVAL,
				"fields 'name' and 'unique_key' are longer than %d bytes together",
				RL_MAX_KEY_LEN);
	if (req->algorithm < 0 || req->algorithm > RL_ALGORITHM_MAX)
		return sdb_errf(err, errlen, SDB_EINVAL,
				"invalid rate limit algorithm '%d'; want TOKEN_BUCKET (0), "
				"LEAKY_BUCKET (1) or GCRA (2)",
				(int)req->algorithm);
	if (req->behavior & ~RL_BEHAVIOR_MASK)
		return sdb_errf(err, errlen, SDB_EINVAL,
				"invalid behavior '%d'; known bits are 1, 2, 4, 8, 16 and 32",
				(int)req->behavior);
	if (req->limit < 0)
		return sdb_errf(err, errlen, SDB_EINVAL, "field 'limit' cannot be negative");
	if (req->burst < 0)
		return sdb_errf(err, errlen, SDB_EINVAL, "field 'burst' cannot be negative");
	if (req->created_at < 0)
		return sdb_errf(err, errlen, SDB_EINVAL, "field 'created_at' cannot be negative");
	if (req->behavior & RL_DURATION_IS_GREGORIAN) {
		if (req->duration == RL_GREGORIAN_WEEKS)
			return sdb_errf(err, errlen, SDB_EINVAL,
					"`Duration = GregorianWeeks` not yet supported");
		if (req->duration < RL_GREGORIAN_MINUTES || req->duration > RL_GREGORIAN_YEARS)
			return sdb_errf(err, errlen, SDB_EINVAL,
					"behavior DURATION_IS_GREGORIAN is set; but `Duration` is "
					"not a valid gregorian interval");
		return 0;
	}
	if (req->duration < 0)
		return sdb_errf(err, errlen, SDB_EINVAL, "field 'duration' cannot be negative");
	if (req->duration == 0)
		return sdb_errf(err, errlen, SDB_EINVAL,
				"field 'duration' must be greater than 0 (ms) unless "
				"DURATION_IS_GREGORIAN is set");
	return 0;
}

size_t rl_key_make(const char *name, const char *unique_key, char *buf, size_t buflen)
{
	size_t nl = strlen(name), kl = strlen(unique_key), total = 4 + nl + kl;
	unsigned char hdr[4] = {(unsigned char)(nl & 0xff), (unsigned char)((nl >> 8) & 0xff),
				(unsigned char)((nl >> 16) & 0xff),
				(unsigned char)((nl >> 24) & 0xff)};

	if (total > buflen)
		return total;
	memcpy(buf, hdr, 4);
	memcpy(buf + 4, name, nl);
	memcpy(buf + 4 + nl, unique_key, kl);
	return total;
}

/* A key in a stack buffer, or on the heap when long. */
typedef struct keybuf {
	char stack[256];
	char *p;
	size_t len;
} keybuf;

static void keybuf_make(keybuf *kb, const char *name, const char *unique_key)
{
	kb->p = kb->stack;
	kb->len = rl_key_make(name, unique_key, kb->stack, sizeof(kb->stack));
	if (kb->len > sizeof(kb->stack)) {
		kb->p = sdb_malloc(kb->len);
		rl_key_make(name, unique_key, kb->p, kb->len);
	}
}

static void keybuf_free(keybuf *kb)
{
	if (kb->p != kb->stack)
		free(kb->p);
}

uint64_t rl_key_hash(const char *name, const char *unique_key)
{
	keybuf kb;
	uint64_t h;

	keybuf_make(&kb, name, unique_key);
	h = XXH64(kb.p, kb.len, 0);
	keybuf_free(&kb);
	return h;
}

static void resp_clear(rl_resp *out)
{
	out->status = RL_UNDER_LIMIT;
	out->limit = 0;
	out->remaining = 0;
	out->reset_time = 0;
	out->retry_after = 0;
	out->error[0] = '\0';
	out->owner[0] = '\0';
}

/* Decide one valid request; copy the state after the decision into *snap if non-NULL.
 * Returns true when the key was new to the cache. */
static bool decide_one(rl_limiter *lim, const rl_req *req, rl_resp *out, rl_state *snap)
{
	int64_t now = req->created_at != 0 ? req->created_at : lim->clock(lim->clock_data);
	rl_cache_shard *s;
	rl_state *st;
	uint64_t h;
	keybuf kb;
	bool exists;

	keybuf_make(&kb, req->name, req->unique_key);
	h = XXH64(kb.p, kb.len, 0);
	s = rl_cache_lock(lim->cache, h);
	st = rl_cache_find(s, h, kb.p, kb.len);
	exists = st != NULL;
	if (!exists)
		st = rl_cache_insert(s, h, kb.p, kb.len, now);
	rl_algo_decide(st, exists, req, now, out);
	if (snap != NULL)
		*snap = *st;
	rl_cache_tally(s, out->status == RL_OVER_LIMIT ? RL_TALLY_OVER : RL_TALLY_UNDER);
	rl_cache_unlock(s);
	keybuf_free(&kb);
	return !exists;
}

int rl_limiter_decide(rl_limiter *lim, const rl_req *reqs, size_t n, rl_resp *out,
		      char *err, size_t errlen)
{
	uint64_t invalid = 0;
	bool inserted = false;
	size_t i;

	if (n > RL_MAX_BATCH)
		return sdb_errf(err, errlen, SDB_EINVAL,
				"Requests.RateLimits list too large; max size is '%d'",
				RL_MAX_BATCH);
	for (i = 0; i < n; i++) {
		resp_clear(&out[i]);
		if (rl_req_validate(&reqs[i], out[i].error, sizeof(out[i].error)) != 0) {
			invalid++;
			continue;
		}
		inserted |= decide_one(lim, &reqs[i], &out[i], NULL);
	}
	/* under/over are tallied per cache shard (fold_tallies) */
	if (invalid)
		sdb_counter_add(lim->m_invalid, invalid);
	if (inserted)
		sdb_gauge_set(lim->m_size, (int64_t)rl_cache_size(lim->cache));
	return 0;
}

int rl_decide_local(void *ctx, const rl_req *reqs, size_t n, rl_resp *out, char *err,
		    size_t errlen)
{
	return rl_limiter_decide(ctx, reqs, n, out, err, errlen);
}

int rl_limiter_decide_owner(rl_limiter *lim, const rl_req *req, rl_resp *out,
			    rl_state *state)
{
	resp_clear(out);
	if (rl_req_validate(req, out->error, sizeof(out->error)) != 0) {
		sdb_counter_inc(lim->m_invalid);
		return SDB_EINVAL;
	}
	if (decide_one(lim, req, out, state))
		sdb_gauge_set(lim->m_size, (int64_t)rl_cache_size(lim->cache));
	return 0;
}

int rl_limiter_set_state(rl_limiter *lim, const char *name, const char *unique_key,
			 const rl_state *state)
{
	rl_cache_shard *s;
	rl_state *st;
	uint64_t h;
	keybuf kb;

	if (name == NULL || name[0] == '\0' || unique_key == NULL || unique_key[0] == '\0' ||
	    state->algorithm < 0 || state->algorithm > RL_ALGORITHM_MAX ||
	    !isfinite(state->remaining_f) || !isfinite(state->tat))
		return SDB_EINVAL;
	keybuf_make(&kb, name, unique_key);
	h = XXH64(kb.p, kb.len, 0);
	s = rl_cache_lock(lim->cache, h);
	st = rl_cache_find(s, h, kb.p, kb.len);
	if (st == NULL)
		st = rl_cache_insert(s, h, kb.p, kb.len, lim->clock(lim->clock_data));
	*st = *state;
	rl_cache_unlock(s);
	keybuf_free(&kb);
	return 0;
}

int rl_limiter_get_state(rl_limiter *lim, const char *name, const char *unique_key,
			 rl_state *state)
{
	int64_t now = lim->clock(lim->clock_data);
	rl_cache_shard *s;
	rl_state *st;
	uint64_t h;
	keybuf kb;
	int rc = SDB_ENOTFOUND;

	if (name == NULL || unique_key == NULL)
		return SDB_ENOTFOUND;
	keybuf_make(&kb, name, unique_key);
	h = XXH64(kb.p, kb.len, 0);
	s = rl_cache_lock(lim->cache, h);
	st = rl_cache_find(s, h, kb.p, kb.len);
	if (st != NULL && st->expire_at > now) {
		*state = *st;
		rc = 0;
	}
	rl_cache_unlock(s);
	keybuf_free(&kb);
	return rc;
}

void rl_state_to_resp(const rl_state *state, int64_t now_ms, rl_resp *out)
{
	rl_state copy = *state;
	rl_req q = {
		.name = "-",
		.unique_key = "-",
		.hits = 0,
		.limit = state->limit,
		.duration = state->duration,
		.algorithm = state->algorithm,
		.behavior = state->behavior & RL_DURATION_IS_GREGORIAN,
		.burst = state->burst,
		.created_at = now_ms,
	};

	resp_clear(out);
	rl_algo_decide(&copy, true, &q, now_ms, out);
	/* The owner's last verdict (what Gubernator's non-owners answer from a broadcast),
	 * unless the window has ended since. */
	if (now_ms < state->expire_at)
		out->status = state->status;
}
