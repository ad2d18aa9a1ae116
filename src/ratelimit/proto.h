/* Mapping between the limiter's C types (limiter.h: rl_req, rl_resp, rl_state) and the
 * protobuf-c messages generated from gubernator.proto (package pb.gubernator).
 *
 * The generated code is built from gubernator.proto by protoc-c at build time
 * (src/ratelimit/local.mk); protoc-c 1.4 cannot generate proto3 `optional`, so the build
 * feeds it a copy with `optional` removed (gubernator_c.proto). The wire encoding is the
 * same; RateLimitReq.created_at loses presence, and 0 means "not given" (Gubernator
 * treats an unset or zero created_at alike: the receiving peer's clock).
 *
 * Nothing here allocates except where stated; the pb structures filled point into the
 * caller's rl_* values (borrowed), so keep those alive until packing is done.
 */
#ifndef SDB_RATELIMIT_PROTO_H
#define SDB_RATELIMIT_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "ratelimit/gubernator_c.pb-c.h"
#include "ratelimit/limiter.h"

/* Metadata keys of RateLimitResp set by stripedb. */
#define RL_MD_OWNER "owner"             /* Gubernator: address of the deciding peer */
#define RL_MD_RETRY_AFTER "retry_after" /* stripedb extension, ms */

/* gRPC method paths. */
#define RL_METHOD_GET_RATE_LIMITS "/pb.gubernator.V1/GetRateLimits"
#define RL_METHOD_HEALTH_CHECK "/pb.gubernator.V1/HealthCheck"
#define RL_METHOD_LIVE_CHECK "/pb.gubernator.V1/LiveCheck"
#define RL_METHOD_GET_PEER_RATE_LIMITS "/pb.gubernator.PeersV1/GetPeerRateLimits"
#define RL_METHOD_UPDATE_PEER_GLOBALS "/pb.gubernator.PeersV1/UpdatePeerGlobals"

/* View a decoded RateLimitReq as an rl_req (strings borrowed from pb; metadata is not
 * carried: the limiter does not interpret it). */
void rl_proto_req_from_pb(const Pb__Gubernator__RateLimitReq *pb, rl_req *out);

/* Fill pb (initialised here) from req; strings borrowed from req. */
void rl_proto_req_to_pb(const rl_req *req, Pb__Gubernator__RateLimitReq *pb);

/* Storage for one RateLimitResp message with its metadata map. */
typedef struct rl_pb_resp {
	Pb__Gubernator__RateLimitResp msg;
	Pb__Gubernator__RateLimitResp__MetadataEntry md[2];
	Pb__Gubernator__RateLimitResp__MetadataEntry *mdp[2];
	char retry_after[24];
} rl_pb_resp;

/* Fill slot from resp: status, limit, remaining, reset_time, error, and metadata owner
 * (when resp->owner is not empty) and retry_after (when no error). Strings borrowed from
 * resp. */
void rl_proto_resp_to_pb(const rl_resp *resp, rl_pb_resp *slot);

/* Copy a decoded RateLimitResp into out (error truncated to RL_ERROR_MAX - 1 bytes,
 * owner to 63 bytes; retry_after parsed from metadata, 0 when absent). */
void rl_proto_resp_from_pb(const Pb__Gubernator__RateLimitResp *pb, rl_resp *out);

/* Pack a message into a fresh heap buffer (caller frees); *len gets its size. */
uint8_t *rl_proto_pack(const ProtobufCMessage *msg, size_t *len);

#endif
