/* The rate limiter's decision library: Gubernator v2 semantics, in process.
 *
 * This is the C API that the proxy calls directly (tenant quotas) and that the
 * ratelimit role's HTTP/JSON gateway and gRPC service (pb.gubernator.V1) sit on.
 * Requests and responses mirror Gubernator's proto messages RateLimitReq and
 * RateLimitResp (gubernator.proto, field by field, same enum values).
 *
 * Threading: every function here is thread-safe. State lives in a bounded LRU cache
 * (ratelimit/cache.h) sharded by key hash with one mutex per shard, so callers on many
 * threads (libmicrohttpd's pool, gRPC completion threads, proxy loops) decide in parallel.
 *
 * Time: the only time input is a request's created_at (ms since the Unix epoch), which is
 * the request's clock. When a request has no created_at (0), the limiter's clock is read
 * once per request; the default clock is rl_clock_realtime_ms(), the single place in the
 * rate limiter that reads the wall clock (epoch ms is what the protocol demands), through
 * common/clock.h's sdb_wall_ms.
 *
 * Where stripedb differs from Gubernator on purpose (each is a Gubernator defect; see
 * src/ratelimit/README.md):
 *  - the cache key is unambiguous (length-prefixed), Gubernator's name+"_"+unique_key
 *    makes ("a_b","c") and ("a","b_c") share one bucket;
 *  - OVER_LIMIT is computed per request, never stored: it does not stick after tokens
 *    come back (negative hits, leak, limit raised);
 *  - a changed duration whose window has already passed renews the bucket and the
 *    request is decided against the renewed bucket;
 *  - raising a leaky bucket's limit/burst keeps the bucket's level (tokens in use), it
 *    does not refill the bucket to the new burst;
 *  - Gregorian months and years use the real calendar length in UTC (Gubernator mixes
 *    ns and ms in GregorianDuration), and Gregorian intervals are computed from the
 *    request's created_at, not from the server's wall clock.
 * Extensions: algorithm RL_GCRA (2) and response metadata retry_after (ms).
 */
#ifndef SDB_RATELIMIT_LIMITER_H
#define SDB_RATELIMIT_LIMITER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Algorithm (gubernator.proto enum Algorithm). RL_GCRA is a stripedb extension. */
typedef enum {
	RL_TOKEN_BUCKET = 0,
	RL_LEAKY_BUCKET = 1,
	RL_GCRA = 2, /* generic cell rate algorithm (a sliding window without counters) */
} rl_algorithm;
#define RL_ALGORITHM_MAX 2

/* Behavior bit flags (gubernator.proto enum Behavior). BATCHING is 0 (the default). */
enum {
	RL_BATCHING = 0,
	RL_NO_BATCHING = 1,
	RL_GLOBAL = 2,
	RL_DURATION_IS_GREGORIAN = 4,
	RL_RESET_REMAINING = 8,
	RL_MULTI_REGION = 16,
	RL_DRAIN_OVER_LIMIT = 32,
};
#define RL_BEHAVIOR_MASK 63 /* any other bit is an invalid request */

/* Gregorian intervals: with RL_DURATION_IS_GREGORIAN, duration holds one of these
 * (Gubernator's GregorianMinutes.. constants, iota from 0). Weeks is refused, as in
 * Gubernator. Intervals are in UTC; reset_time is the interval's last millisecond
 * (end - 1 ms), as Gubernator's GregorianExpiration returns. */
enum {
	RL_GREGORIAN_MINUTES = 0,
	RL_GREGORIAN_HOURS = 1,
	RL_GREGORIAN_DAYS = 2,
	RL_GREGORIAN_WEEKS = 3, /* error: not supported */
	RL_GREGORIAN_MONTHS = 4,
	RL_GREGORIAN_YEARS = 5,
};

/* Response status (gubernator.proto enum Status). */
typedef enum {
	RL_UNDER_LIMIT = 0,
	RL_OVER_LIMIT = 1,
} rl_status;

/* At most this many requests per decide call (Gubernator's maxBatchSize; more is a
 * call error: gRPC OUT_OF_RANGE, HTTP 400 code 11). */
#define RL_MAX_BATCH 1000

/* Longest name + unique_key (bytes, together) a request may have: the cache is bounded in
 * keys, not bytes, so without this a client pins cache-size times any key length in
 * memory (issue #23 retest: 60 keys of 1 MB). 4096 is far above any real key (Gubernator
 * has no limit; its keys are short identifiers) and keeps a full cache of the default
 * 50,000 keys under ~200 MB of key text. A longer one is a per-item error (rl_req_validate). */
#define RL_MAX_KEY_LEN 4096

/* Bound on a per-item error message, bytes including the NUL. */
#define RL_ERROR_MAX 160

/* A metadata pair (proto map<string,string>). */
typedef struct rl_kv {
	const char *key;
	const char *value;
} rl_kv;

/* RateLimitReq. All pointers are borrowed for the duration of the call; strings are
 * NUL-terminated UTF-8. created_at == 0 means "not given" (then the limiter's clock). */
typedef struct rl_req {
	const char *name;       /* field 1: required, non-empty */
	const char *unique_key; /* field 2: required, non-empty */
	int64_t hits;           /* field 3: may be 0 (query) or negative (give tokens back) */
	int64_t limit;          /* field 4: >= 0 */
	int64_t duration;       /* field 5: ms > 0, or an RL_GREGORIAN_* value */
	int32_t algorithm;      /* field 6: rl_algorithm */
	int32_t behavior;       /* field 7: RL_* bit flags */
	int64_t burst;          /* field 8: leaky bucket capacity; 0 = limit */
	const rl_kv *metadata;  /* field 9: n_metadata pairs (not interpreted here) */
	size_t n_metadata;
	int64_t created_at; /* field 10: ms since epoch; 0 = now from the limiter's clock */
} rl_req;

/* RateLimitResp. Filled by the limiter; no heap memory inside, nothing to free.
 * error is "" on success; when it is set, the other fields are zero. retry_after is
 * our extension (rendered as metadata "retry_after" by the gateways): ms from the
 * request's created_at until this request (with the same hits) would be UNDER_LIMIT;
 * 0 when UNDER_LIMIT now, -1 when it can never succeed (hits > limit/burst).
 * owner: the "owner" metadata (HOST:PORT of the deciding peer), "" when local-only;
 * the cluster layer fills it. */
typedef struct rl_resp {
	int32_t status;     /* field 1: rl_status */
	int64_t limit;      /* field 2 */
	int64_t remaining;  /* field 3 */
	int64_t reset_time; /* field 4: ms since epoch, absolute */
	char error[RL_ERROR_MAX]; /* field 5 */
	int64_t retry_after;      /* field 6 metadata "retry_after" (stripedb extension) */
	char owner[64];           /* field 6 metadata "owner" */
} rl_resp;

/* The stored state of one key, as the cluster layer moves it around (GLOBAL broadcast,
 * UpdatePeerGlobals). Plain data; copy freely. Fields per algorithm:
 *  token bucket: limit, duration, remaining, created_at (window start), expire_at
 *    (window end, exclusive);
 *  leaky bucket: limit, duration, burst, remaining_f (tokens available, fractional),
 *    updated_at (last leak), expire_at;
 *  GCRA: limit, duration, burst, tat (theoretical arrival time, ms, fractional), expire_at.
 * expire_at: ms since epoch at which the key's state is void (a request at or after it
 * starts afresh) and the cache may drop it. status is the status of the last decision;
 * it is carried for the broadcast (a non-owner's hits=0 answer) and never used to decide.
 * behavior keeps RL_DURATION_IS_GREGORIAN of the request that created the window. */
typedef struct rl_state {
	int32_t algorithm;
	int32_t behavior;
	int32_t status;
	int64_t limit;
	int64_t duration;
	int64_t burst;
	int64_t remaining;
	double remaining_f;
	double tat;
	int64_t created_at;
	int64_t updated_at;
	int64_t expire_at;
} rl_state;

/* An epoch-ms clock (injectable for tests). */
typedef int64_t (*rl_clock_fn)(void *clock_data);

/* sdb_wall_ms(): ms since the Unix epoch (CLOCK_REALTIME unless a test installed a clock
 * with sdb_clock_set_wall): the rate limiter's only wall-clock read. */
int64_t rl_clock_realtime_ms(void *unused);

typedef struct rl_limiter rl_limiter;

typedef struct rl_limiter_opts {
	size_t cache_size;   /* max keys held; 0 = 50000 (Gubernator's GUBER_CACHE_SIZE default) */
	size_t cache_shards; /* mutex stripes, rounded up to a power of two; 0 = 64 */
	rl_clock_fn clock;   /* NULL = rl_clock_realtime_ms */
	void *clock_data;
} rl_limiter_opts;

/* Create a limiter (opts may be NULL for the defaults). Never fails (allocation aborts);
 * free with rl_limiter_free() once no thread uses it. */
rl_limiter *rl_limiter_new(const rl_limiter_opts *opts);
void rl_limiter_free(rl_limiter *lim);

/* Check one request without deciding: fills err (errlen bytes) with Gubernator-style text
 * and returns SDB_EINVAL when it is invalid (empty name or unique_key, unknown algorithm,
 * negative limit or burst, negative duration, zero duration without
 * DURATION_IS_GREGORIAN, a Gregorian duration that is weeks or unknown, behaviour bits
 * outside RL_BEHAVIOR_MASK, name and unique_key longer than RL_MAX_KEY_LEN bytes together);
 * returns 0 when valid. Errors: SDB_EINVAL (those cases). */
int rl_req_validate(const rl_req *req, char *err, size_t errlen);

/* Decide n requests locally, in order: out[i] answers reqs[i]. Each request is validated
 * (an invalid one gets out[i].error and does not touch state; the others proceed) and
 * decided atomically against its key's state. GLOBAL/BATCHING bits are not interpreted
 * here (that is the cluster layer's job): every key is decided as if this node owned it.
 * Errors: SDB_EINVAL when n > RL_MAX_BATCH (nothing decided; err says
 * "Requests.RateLimits list too large; max size is '1000'"). err may be NULL. */
int rl_limiter_decide(rl_limiter *lim, const rl_req *reqs, size_t n, rl_resp *out,
		      char *err, size_t errlen);

/* Decide one request as the key's owner and also return the key's state after the
 * decision in *state (for the GLOBAL broadcast to peers: UpdatePeerGlobals). Returns 0
 * (out and *state filled). Errors: SDB_EINVAL for an invalid request (out->error set,
 * *state untouched). */
int rl_limiter_decide_owner(rl_limiter *lim, const rl_req *req, rl_resp *out,
			    rl_state *state);

/* Apply a GLOBAL broadcast received from the owner: replace the state of key
 * (name, unique_key) by *state (inserting it when absent). Later requests for the key on
 * this node are decided from that state. Any other field values are safe (a peer's
 * state is not trusted: arithmetic on it saturates). Errors: SDB_EINVAL (empty name/key,
 * an unknown algorithm, a non-finite remaining_f or tat). */
int rl_limiter_set_state(rl_limiter *lim, const char *name, const char *unique_key,
			 const rl_state *state);

/* Read the state of key (name, unique_key) into *state. Errors: SDB_ENOTFOUND when the key
 * is absent or expired (as of the limiter's clock). */
int rl_limiter_get_state(rl_limiter *lim, const char *name, const char *unique_key,
			 rl_state *state);

/* Render state as the response a hits=0 query at time now_ms would get (what a non-owner
 * answers from a broadcast state). */
void rl_state_to_resp(const rl_state *state, int64_t now_ms, rl_resp *out);

/* The unambiguous cache key of (name, unique_key): a 4-byte little-endian length of name,
 * name, then unique_key. Writes at most buflen bytes into buf and returns the full length
 * (so a return > buflen means "too small"). Peers use the same bytes for ring hashing. */
size_t rl_key_make(const char *name, const char *unique_key, char *buf, size_t buflen);
/* xxh64 of those key bytes (seed 0): the cache shard and the peer ring use it. */
uint64_t rl_key_hash(const char *name, const char *unique_key);

/* Number of keys currently cached (approximate under concurrency). */
size_t rl_limiter_size(rl_limiter *lim);

/* The decision entry point a gateway calls: by default the local limiter
 * (rl_limiter_decide with ctx = the rl_limiter); the cluster layer substitutes its own
 * (owner forwarding, BATCHING, GLOBAL) with the same contract: out[i] answers reqs[i],
 * return 0 or an SDB_E* call error with a message. Must be thread-safe. */
typedef int (*rl_decide_fn)(void *ctx, const rl_req *reqs, size_t n, rl_resp *out,
			    char *err, size_t errlen);

/* The front door shared by the HTTP gateway and the gRPC service of one ratelimit role.
 * role.c fills it with the local limiter; rl_grpc_start() may replace decide/ctx with the
 * cluster entry point and peer_count before the HTTP routes are registered. */
typedef struct rl_frontend {
	rl_limiter *limiter;
	rl_decide_fn decide;
	void *decide_ctx;
	/* Peers in the ring including self (HealthCheck peer_count); NULL = 1. */
	int (*peer_count)(void *ctx);
	void *peer_ctx;
	/* HealthCheck status: return true when healthy, else false with a reason in msg
	 * (Gubernator's "unhealthy" message); NULL = always healthy. ctx is peer_ctx. */
	bool (*health)(void *ctx, char *msg, size_t msglen);
} rl_frontend;

/* rl_decide_fn adapter over rl_limiter_decide (ctx is an rl_limiter *). Errors: as
 * rl_limiter_decide (SDB_EINVAL when n > RL_MAX_BATCH). */
int rl_decide_local(void *ctx, const rl_req *reqs, size_t n, rl_resp *out, char *err,
		    size_t errlen);

#endif
