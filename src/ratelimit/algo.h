/* Rate-limit algorithms: pure functions over one key's rl_state (no locking, no clock,
 * no allocation). The limiter (limiter.c) holds the key's shard lock around a call.
 *
 * Reference behaviour: Gubernator v2 algorithms.go (tokenBucket, leakyBucket) and
 * interval.go (GregorianExpiration); the deliberate differences are listed in limiter.h.
 */
#ifndef SDB_RATELIMIT_ALGO_H
#define SDB_RATELIMIT_ALGO_H

#include <stdbool.h>
#include <stdint.h>

#include "ratelimit/limiter.h"

/* Decide req against *st at time now (ms since epoch, the request's clock).
 * exists: whether *st holds a previous state for this key (false: *st is garbage and is
 * initialised here). req must have passed rl_req_validate(). Updates *st in place (the
 * caller stores it back) and fills out (error left ""). Never fails. */
void rl_algo_decide(rl_state *st, bool exists, const rl_req *req, int64_t now, rl_resp *out);

/* The UTC Gregorian interval holding now: [*start, *end) in ms since epoch.
 * interval is an RL_GREGORIAN_* value. Months and years use their real lengths
 * (28..31 days, 365 or 366 days). Errors: SDB_EINVAL for weeks or an unknown value
 * (*start and *end untouched). */
int rl_gregorian_bounds(int64_t now, int64_t interval, int64_t *start, int64_t *end);

/* Days since 1970-01-01 of the civil date y-m-d (proleptic Gregorian, m 1..12), and the
 * inverse. Exposed for tests. */
int64_t rl_days_from_civil(int64_t y, unsigned m, unsigned d);
void rl_civil_from_days(int64_t days, int64_t *y, unsigned *m, unsigned *d);

#endif
