/* The HTTP/JSON gateway codec of the rate limiter (Gubernator's grpc-gateway API).
 *
 * Input (POST /v1/GetRateLimits): a GetRateLimitsReq in protojson, parsed with libbson's
 * JSON reader. Accepted like grpc-gateway's protojson unmarshaller: proto field names
 * (unique_key, created_at) or their camelCase JSON names (uniqueKey, createdAt); int64
 * fields as JSON numbers or decimal strings; enums as names ("LEAKY_BUCKET") or numbers;
 * behavior also as several names joined with '|' or ','; unknown fields ignored; null
 * means unset.
 * Output: proto field names, int64 as strings, enums as names, every field present
 * (protojson EmitUnpopulated), e.g.
 *   {"responses": [{"status": "UNDER_LIMIT", "limit": "2", "remaining": "1",
 *     "reset_time": "1700000005000", "error": "", "metadata": {"retry_after": "0"}}]}
 * Errors use grpc-gateway's body: {"code": <grpc code>, "message": "...", "details": []}.
 */
#ifndef SDB_RATELIMIT_JSON_H
#define SDB_RATELIMIT_JSON_H

#include <stddef.h>

#include "ratelimit/limiter.h"

/* gRPC status codes used in gateway error bodies. */
#define RL_GRPC_INVALID_ARGUMENT 3
#define RL_GRPC_PERMISSION_DENIED 7
#define RL_GRPC_OUT_OF_RANGE 11
#define RL_GRPC_INTERNAL 13
#define RL_GRPC_UNAVAILABLE 14

/* A parsed GetRateLimitsReq. reqs[i] point into storage owned by this struct. */
typedef struct rl_json_reqs {
	rl_req *reqs;
	size_t n;
	void *priv; /* parsed document and metadata arrays */
} rl_json_reqs;

/* Parse body (len bytes, not necessarily NUL-terminated) into *out.
 * Errors: SDB_EPROTO for malformed JSON or a field of the wrong type (message names
 * the field, grpc code INVALID_ARGUMENT); or SDB_ETOOBIG when "requests" holds more than
 * RL_MAX_BATCH items ("Requests.RateLimits list too large; max size is '1000'", grpc code
 * OUT_OF_RANGE, also a body too large to parse), checked before anything is allocated
 * for the items. *out is empty on
 * error. Free with rl_json_reqs_free() (safe on an empty or freed value). */
int rl_json_parse_reqs(const char *body, size_t len, rl_json_reqs *out, char *err,
		       size_t errlen);
void rl_json_reqs_free(rl_json_reqs *r);

/* Render {"responses": [...]} for n responses. Returns a heap string (free()) and its
 * length in *len. */
char *rl_json_render_resps(const rl_resp *resps, size_t n, size_t *len);

/* Render grpc-gateway's error body {"code": code, "message": msg, "details": []}. */
char *rl_json_render_error(int code, const char *msg, size_t *len);

/* Render a HealthCheckResp {"status": ..., "message": ..., "peer_count": N,
 * "advertise_address": ...} (Gubernator >= 2.3 adds advertise_address; NULL renders ""). */
char *rl_json_render_health(const char *status, const char *message, int peer_count,
			    const char *advertise_address, size_t *len);

/* Enum names (proto spelling); NULL for an unknown value. */
const char *rl_algorithm_name(int32_t algorithm);
const char *rl_status_name(int32_t status);

#endif
