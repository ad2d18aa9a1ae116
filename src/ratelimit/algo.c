/* Token bucket, leaky bucket and GCRA over one key's state.
 *
 * Reference: Gubernator v2 algorithms.go. Each place where stripedb deliberately differs
 * from Gubernator carries a "Gubernator:" comment naming the defect it avoids.
 *
 * Arithmetic: int64 inputs come from the network, so every sum that mixes them saturates
 * instead of overflowing; double results are clamped before they are converted back.
 */
#include "ratelimit/algo.h"

#include <math.h>
#include <string.h>

#include "common/err.h"

#define MS_MINUTE INT64_C(60000)
#define MS_HOUR INT64_C(3600000)
#define MS_DAY INT64_C(86400000)

/* Tolerance when truncating a fractional token count: 2.9999999999 tokens, the sum of
 * float leaks, count as 3. */
#define TOKEN_EPS 1e-6

static int64_t sat_add(int64_t a, int64_t b)
{
	int64_t r;
	if (__builtin_add_overflow(a, b, &r))
		return b > 0 ? INT64_MAX : INT64_MIN;
	return r;
}

static int64_t sat_mul(int64_t a, int64_t b)
{
	int64_t r;
	if (__builtin_mul_overflow(a, b, &r))
		return (a < 0) != (b < 0) ? INT64_MIN : INT64_MAX;
	return r;
}

static int64_t sat_sub(int64_t a, int64_t b)
{
	int64_t r;
	if (__builtin_sub_overflow(a, b, &r))
		return b < 0 ? INT64_MAX : INT64_MIN;
	return r;
}

/* double -> int64, clamped (a plain cast of an out-of-range double is undefined). */
static int64_t clamp_i64(double v)
{
	if (isnan(v))
		return 0;
	if (v >= 9.2e18)
		return INT64_MAX;
	if (v <= -9.2e18)
		return INT64_MIN;
	return (int64_t)v;
}

static int64_t floor_tokens(double v)
{
	return clamp_i64(floor(v + TOKEN_EPS));
}

static int64_t ceil_ms(double v)
{
	return clamp_i64(ceil(v - TOKEN_EPS));
}

static int64_t floor_div(int64_t a, int64_t b)
{
	int64_t q = a / b;
	if ((a % b != 0) && ((a < 0) != (b < 0)))
		q--;
	return q;
}

/* Howard Hinnant's days_from_civil / civil_from_days (public domain algorithms). */
int64_t rl_days_from_civil(int64_t y, unsigned m, unsigned d)
{
	y -= m <= 2;
	const int64_t era = (y >= 0 ? y : y - 399) / 400;
	const unsigned yoe = (unsigned)(y - era * 400);
	const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
	const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
	return era * 146097 + (int64_t)doe - 719468;
}

void rl_civil_from_days(int64_t z, int64_t *y, unsigned *m, unsigned *d)
{
	z += 719468;
	const int64_t era = (z >= 0 ? z : z - 146096) / 146097;
	const unsigned doe = (unsigned)(z - era * 146097);
	const unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
	const unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
	const unsigned mp = (5 * doy + 2) / 153;
	*d = doy - (153 * mp + 2) / 5 + 1;
	*m = mp < 10 ? mp + 3 : mp - 9;
	*y = (int64_t)yoe + era * 400 + (*m <= 2);
}

int rl_gregorian_bounds(int64_t now, int64_t interval, int64_t *start, int64_t *end)
{
	int64_t y, days;
	unsigned m, d;

	switch (interval) {
	case RL_GREGORIAN_MINUTES:
		*start = sat_mul(floor_div(now, MS_MINUTE), MS_MINUTE);
		*end = sat_add(*start, MS_MINUTE);
		return 0;
	case RL_GREGORIAN_HOURS:
		*start = sat_mul(floor_div(now, MS_HOUR), MS_HOUR);
		*end = sat_add(*start, MS_HOUR);
		return 0;
	case RL_GREGORIAN_DAYS:
		*start = sat_mul(floor_div(now, MS_DAY), MS_DAY);
		*end = sat_add(*start, MS_DAY);
		return 0;
	case RL_GREGORIAN_MONTHS:
		/* Gubernator: GregorianDuration subtracts ms from ns for months and years;
		 * here both ends are real calendar dates, so February is 28 or 29 days. */
		days = floor_div(now, MS_DAY);
		rl_civil_from_days(days, &y, &m, &d);
		*start = sat_mul(rl_days_from_civil(y, m, 1), MS_DAY);
		*end = sat_mul(m == 12 ? rl_days_from_civil(y + 1, 1, 1)
				       : rl_days_from_civil(y, m + 1, 1),
			       MS_DAY);
		return 0;
	case RL_GREGORIAN_YEARS:
		days = floor_div(now, MS_DAY);
		rl_civil_from_days(days, &y, &m, &d);
		*start = sat_mul(rl_days_from_civil(y, 1, 1), MS_DAY);
		*end = sat_mul(rl_days_from_civil(y + 1, 1, 1), MS_DAY);
		return 0;
	default: /* RL_GREGORIAN_WEEKS and anything else */
		return SDB_EINVAL;
	}
}

static bool is_gregorian(int32_t behavior)
{
	return (behavior & RL_DURATION_IS_GREGORIAN) != 0;
}

/* The window a fresh token bucket gets at time now: [now, now + duration), or the
 * Gregorian interval holding now. */
static void window_at(const rl_req *req, int64_t now, int64_t *start, int64_t *end)
{
	if (is_gregorian(req->behavior)) {
		if (rl_gregorian_bounds(now, req->duration, start, end) == 0)
			return;
		/* unreachable after validation; fall back to a one-minute window */
		*start = now;
		*end = sat_add(now, MS_MINUTE);
		return;
	}
	*start = now;
	*end = sat_add(now, req->duration);
}

/* reset_time as reported: Gregorian windows end on the interval's last millisecond
 * (Gubernator's GregorianExpiration returns end - 1 ns, truncated to ms). */
static int64_t token_reset_time(const rl_state *st)
{
	return is_gregorian(st->behavior) ? st->expire_at - 1 : st->expire_at;
}

static void token_bucket(rl_state *st, bool exists, const rl_req *req, int64_t now,
			 rl_resp *out)
{
	const bool reset = (req->behavior & RL_RESET_REMAINING) != 0;
	const int32_t greg = req->behavior & RL_DURATION_IS_GREGORIAN;
	int64_t start, end;

	if (!exists || st->algorithm != RL_TOKEN_BUCKET || now >= st->expire_at) {
		memset(st, 0, sizeof(*st));
		st->algorithm = RL_TOKEN_BUCKET;
		st->behavior = greg;
		st->limit = req->limit;
		st->duration = req->duration;
		st->remaining = req->limit;
		window_at(req, now, &st->created_at, &st->expire_at);
	} else {
		if (reset)
			st->remaining = req->limit;
		/* A changed limit takes effect at once: the difference is added to what is
		 * left (Gubernator's rule), never below 0. */
		if (st->limit != req->limit) {
			st->remaining = sat_add(st->remaining, sat_sub(req->limit, st->limit));
			if (st->remaining < 0)
				st->remaining = 0;
			st->limit = req->limit;
		}
		/* A changed duration moves the window's end. Gubernator: when the new end
		 * has already passed it renews the bucket but then decides the request
		 * against the response it built before the renewal (stale remaining and
		 * status), and computes Gregorian ends from the server clock. Here the
		 * renewed bucket is what the request is decided against. */
		if (st->duration != req->duration || (st->behavior & RL_DURATION_IS_GREGORIAN) != greg) {
			bool renew;
			if (greg) {
				/* calendar windows: a window begun before the current interval
				 * has passed */
				window_at(req, now, &start, &end);
				renew = st->created_at < start;
			} else {
				end = sat_add(st->created_at, req->duration);
				renew = end <= now;
			}
			if (renew) {
				window_at(req, now, &st->created_at, &end);
				st->remaining = st->limit;
			}
			st->expire_at = end;
			st->duration = req->duration;
			st->behavior = greg;
		}
	}

	out->status = RL_UNDER_LIMIT;
	out->retry_after = 0;
	if (reset || req->hits == 0) {
		/* RESET_REMAINING refills without consuming (Gubernator's token bucket);
		 * hits=0 is a query. A query is always UNDER_LIMIT. */
	} else if (req->hits < 0) {
		st->remaining = sat_sub(st->remaining, req->hits); /* tokens given back */
	} else if (req->hits <= st->remaining) {
		st->remaining -= req->hits;
	} else {
		/* Refused without consuming, unless DRAIN_OVER_LIMIT. Gubernator stores
		 * OVER_LIMIT in the bucket and keeps answering it after tokens come back;
		 * here the status is the outcome of this request only. */
		out->status = RL_OVER_LIMIT;
		if (req->behavior & RL_DRAIN_OVER_LIMIT)
			st->remaining = 0;
		out->retry_after = req->hits > st->limit ? -1 : st->expire_at - now;
	}
	st->status = out->status;
	out->limit = st->limit;
	out->remaining = st->remaining;
	out->reset_time = token_reset_time(st);
}

/* ms per token of a leaky bucket / GCRA, and how long a hit keeps the key alive.
 * Gregorian: the whole interval's length divided by limit, and the rest of the interval. */
static void rate_of(const rl_req *req, int64_t now, double *rate, int64_t *alive)
{
	int64_t span = req->duration, start, end;

	*alive = req->duration;
	if (is_gregorian(req->behavior)) {
		window_at(req, now, &start, &end);
		span = end - start;
		*alive = end - now;
	}
	*rate = req->limit > 0 ? (double)span / (double)req->limit : INFINITY;
}

static void leaky_bucket(rl_state *st, bool exists, const rl_req *req, int64_t now,
			 rl_resp *out)
{
	const bool reset = (req->behavior & RL_RESET_REMAINING) != 0;
	const int64_t burst = req->burst > 0 ? req->burst : req->limit;
	double rate;
	int64_t alive, avail;

	rate_of(req, now, &rate, &alive);
	if (!exists || st->algorithm != RL_LEAKY_BUCKET || now >= st->expire_at) {
		memset(st, 0, sizeof(*st));
		st->algorithm = RL_LEAKY_BUCKET;
		st->remaining_f = (double)burst;
		st->updated_at = now;
		st->burst = burst;
		st->expire_at = sat_add(now, alive);
	} else {
		if (reset)
			st->remaining_f = (double)burst;
		/* Gubernator: a larger burst (and burst defaults to limit) sets remaining to
		 * the new burst, refilling a drained bucket. Here a raised burst keeps the
		 * tokens available (they leak in at the new rate); a lowered one caps them. */
		if (st->burst != burst) {
			if (st->remaining_f > (double)burst)
				st->remaining_f = (double)burst;
			st->burst = burst;
		}
		/* Leak since the last whole token leaked (Gubernator's rule: updated_at only
		 * moves when at least one token leaked, so fractions are not lost). */
		if (now > st->updated_at && isfinite(rate)) {
			/* in double: a state installed by a peer may hold any updated_at */
			double leak = ((double)now - (double)st->updated_at) / rate;
			if (leak >= 1.0 - TOKEN_EPS) {
				st->remaining_f += leak;
				st->updated_at = now;
			}
		}
		if (st->remaining_f > (double)burst)
			st->remaining_f = (double)burst;
	}
	st->behavior = req->behavior & RL_DURATION_IS_GREGORIAN;
	st->limit = req->limit;
	st->duration = req->duration;

	out->status = RL_UNDER_LIMIT;
	out->retry_after = 0;
	avail = floor_tokens(st->remaining_f);
	if (reset || req->hits == 0) {
		/* query, or RESET_REMAINING (refill without consuming, as the token bucket) */
	} else if (req->hits < 0) {
		st->remaining_f -= (double)req->hits;
	} else if (req->hits <= avail) {
		st->remaining_f -= (double)req->hits;
		if (st->remaining_f < 0)
			st->remaining_f = 0;
	} else {
		out->status = RL_OVER_LIMIT;
		if (req->behavior & RL_DRAIN_OVER_LIMIT)
			st->remaining_f = 0;
		if (req->hits > burst || !isfinite(rate)) {
			out->retry_after = -1;
		} else {
			/* tokens available at T: remaining + (T - updated_at) / rate, counted
			 * once a whole token leaked; the part of the current leak interval
			 * already elapsed counts (and a drain above keeps it) */
			double need = (double)req->hits - st->remaining_f;
			double at;
			if (need < 1.0 - TOKEN_EPS)
				need = 1.0 - TOKEN_EPS;
			at = (double)st->updated_at + need * rate;
			out->retry_after = at > (double)now ? ceil_ms(at - (double)now) : 0;
		}
	}
	if (req->hits != 0)
		st->expire_at = sat_add(now, alive);
	st->status = out->status;
	out->limit = st->limit;
	out->remaining = floor_tokens(st->remaining_f);
	if (out->remaining < 0)
		out->remaining = 0;
	/* reset_time: when the bucket is full again. Gubernator computes
	 * (limit - remaining) * rate, which goes into the past when burst > limit. */
	if (out->remaining >= burst)
		out->reset_time = now;
	else if (!isfinite(rate))
		out->reset_time = sat_add(now, alive);
	else
		out->reset_time = sat_add(now, ceil_ms((double)(burst - out->remaining) * rate));
}

/* GCRA (stripedb extension, algorithm 2): a virtual-scheduling meter. T = ms per token,
 * capacity = burst (default limit) tokens, tat = the theoretical arrival time; a request
 * of n hits is allowed when tat' = max(tat, now) + n*T - capacity*T <= now. */
static void gcra(rl_state *st, bool exists, const rl_req *req, int64_t now, rl_resp *out)
{
	const bool reset = (req->behavior & RL_RESET_REMAINING) != 0;
	const int64_t burst = req->burst > 0 ? req->burst : req->limit;
	double rate, tau, tat;
	int64_t alive;

	rate_of(req, now, &rate, &alive);
	if (!exists || st->algorithm != RL_GCRA || now >= st->expire_at || reset) {
		memset(st, 0, sizeof(*st));
		st->algorithm = RL_GCRA;
		st->tat = (double)now;
	}
	st->behavior = req->behavior & RL_DURATION_IS_GREGORIAN;
	st->limit = req->limit;
	st->duration = req->duration;
	st->burst = burst;

	out->status = RL_UNDER_LIMIT;
	out->retry_after = 0;
	out->limit = st->limit;
	if (!isfinite(rate) || burst == 0) {
		/* limit 0: nothing is ever allowed */
		if (req->hits > 0 && !reset) {
			out->status = RL_OVER_LIMIT;
			out->retry_after = -1;
		}
		st->tat = (double)now;
		st->expire_at = sat_add(now, 1);
		st->status = out->status;
		out->remaining = 0;
		out->reset_time = now;
		return;
	}
	tau = rate * (double)burst;
	tat = st->tat > (double)now ? st->tat : (double)now;
	if (reset || req->hits == 0) {
		/* query */
	} else if (req->hits < 0) {
		tat += (double)req->hits * rate;
		if (tat < (double)now)
			tat = (double)now;
	} else {
		double next = tat + (double)req->hits * rate;
		double allow_at = next - tau;
		if (allow_at <= (double)now + TOKEN_EPS) {
			tat = next;
		} else {
			out->status = RL_OVER_LIMIT;
			if (req->behavior & RL_DRAIN_OVER_LIMIT) {
				/* drained: the request is allowed once hits tokens came back */
				tat = (double)now + tau;
				allow_at = tat + (double)req->hits * rate - tau;
			}
			out->retry_after = req->hits > burst ? -1 : ceil_ms(allow_at - (double)now);
		}
	}
	st->tat = tat;
	st->status = out->status;
	out->remaining = floor_tokens((tau - (tat - (double)now)) / rate);
	if (out->remaining < 0)
		out->remaining = 0;
	if (out->remaining > burst)
		out->remaining = burst;
	out->reset_time = ceil_ms(tat);
	st->expire_at = out->reset_time > now ? out->reset_time : sat_add(now, 1);
}

void rl_algo_decide(rl_state *st, bool exists, const rl_req *req, int64_t now, rl_resp *out)
{
	switch (req->algorithm) {
	case RL_LEAKY_BUCKET:
		leaky_bucket(st, exists, req, now, out);
		break;
	case RL_GCRA:
		gcra(st, exists, req, now, out);
		break;
	case RL_TOKEN_BUCKET:
	default:
		token_bucket(st, exists, req, now, out);
		break;
	}
}
