/* rl_* <-> pb.gubernator mapping (see proto.h). */
#include "ratelimit/proto.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"

void rl_proto_req_from_pb(const Pb__Gubernator__RateLimitReq *pb, rl_req *out)
{
	memset(out, 0, sizeof(*out));
	out->name = pb->name ? pb->name : "";
	out->unique_key = pb->unique_key ? pb->unique_key : "";
	out->hits = pb->hits;
	out->limit = pb->limit;
	out->duration = pb->duration;
	out->algorithm = (int32_t)pb->algorithm;
	out->behavior = (int32_t)pb->behavior;
	out->burst = pb->burst;
	out->created_at = pb->created_at;
}

void rl_proto_req_to_pb(const rl_req *req, Pb__Gubernator__RateLimitReq *pb)
{
	pb__gubernator__rate_limit_req__init(pb);
	pb->name = (char *)req->name;
	pb->unique_key = (char *)req->unique_key;
	pb->hits = req->hits;
	pb->limit = req->limit;
	pb->duration = req->duration;
	pb->algorithm = (Pb__Gubernator__Algorithm)req->algorithm;
	pb->behavior = (Pb__Gubernator__Behavior)req->behavior;
	pb->burst = req->burst;
	pb->created_at = req->created_at;
}

void rl_proto_resp_to_pb(const rl_resp *resp, rl_pb_resp *slot)
{
	size_t n = 0;

	pb__gubernator__rate_limit_resp__init(&slot->msg);
	slot->msg.status = (Pb__Gubernator__Status)resp->status;
	slot->msg.limit = resp->limit;
	slot->msg.remaining = resp->remaining;
	slot->msg.reset_time = resp->reset_time;
	slot->msg.error = (char *)resp->error;
	if (resp->owner[0] != '\0') {
		pb__gubernator__rate_limit_resp__metadata_entry__init(&slot->md[n]);
		slot->md[n].key = (char *)RL_MD_OWNER;
		slot->md[n].value = (char *)resp->owner;
		slot->mdp[n] = &slot->md[n];
		n++;
	}
	if (resp->error[0] == '\0') {
		snprintf(slot->retry_after, sizeof(slot->retry_after), "%" PRId64,
			 resp->retry_after);
		pb__gubernator__rate_limit_resp__metadata_entry__init(&slot->md[n]);
		slot->md[n].key = (char *)RL_MD_RETRY_AFTER;
		slot->md[n].value = slot->retry_after;
		slot->mdp[n] = &slot->md[n];
		n++;
	}
	slot->msg.n_metadata = n;
	slot->msg.metadata = n ? slot->mdp : NULL;
}

void rl_proto_resp_from_pb(const Pb__Gubernator__RateLimitResp *pb, rl_resp *out)
{
	size_t i;

	memset(out, 0, sizeof(*out));
	out->status = (int32_t)pb->status;
	out->limit = pb->limit;
	out->remaining = pb->remaining;
	out->reset_time = pb->reset_time;
	if (pb->error != NULL)
		snprintf(out->error, sizeof(out->error), "%s", pb->error);
	for (i = 0; i < pb->n_metadata; i++) {
		const Pb__Gubernator__RateLimitResp__MetadataEntry *e = pb->metadata[i];
		if (e == NULL || e->key == NULL || e->value == NULL)
			continue;
		if (strcmp(e->key, RL_MD_OWNER) == 0)
			snprintf(out->owner, sizeof(out->owner), "%s", e->value);
		else if (strcmp(e->key, RL_MD_RETRY_AFTER) == 0)
			out->retry_after = strtoll(e->value, NULL, 10);
	}
}

uint8_t *rl_proto_pack(const ProtobufCMessage *msg, size_t *len)
{
	size_t n = protobuf_c_message_get_packed_size(msg);
	uint8_t *buf = sdb_malloc(n ? n : 1);

	*len = protobuf_c_message_pack(msg, buf);
	return buf;
}
