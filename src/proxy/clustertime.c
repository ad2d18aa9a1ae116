/* Cluster-time gossip on a proxy (issue #20; proxy.h, common/clustertime.h; mongos'
 * VectorClock gossip, src/mongo/db/vector_clock.cpp and logical_time_validator.cpp).
 *
 * The proxy's clock is shardconn's (shardconn_cluster_time): raised by every shard reply
 * and by every client's $clusterTime, attached to every command sent to a shard. Clients
 * get it back in $clusterTime and operationTime, and drivers gossip it with their next
 * command, through this proxy or another: one client's sequential writes get increasing
 * oplog ts on whatever shards they land.
 *
 * Trust (the decision of issue #20): without --auth every gossiped time is taken (up to
 * a year ahead of the wall clock, as mongod's maxAcceptableLogicalClockDriftSecs). With
 * --auth and a cluster key, as mongos with keyFile: a time at or below this proxy's clock
 * needs nothing (mongod's "last seen valid time" shortcut); one above it must carry a
 * valid signature (HMAC of the cluster key's derived secret: any proxy or shard of the
 * cluster signs with it, so a driver moving between proxies keeps working) unless the
 * connection is the cluster user __system (mongod's advanceClusterTime privilege);
 * otherwise TimeProofMismatch (204). With --auth and no cluster key nothing can sign or
 * verify: times are taken as without auth. An unauthenticated connection's time (its
 * hello) never moves the clock. */
#include <stdio.h>
#include <string.h>

#include <openssl/crypto.h>

#include "auth/cluster.h"
#include "auth/gate.h"
#include "common/clock.h"
#include "common/clustertime.h"
#include "proxy/proxy.h"
#include "proxy/shardconn.h"

/* Does g carry a signature made with one of the cluster key's derived secrets? */
static bool signature_ok(const ct_gossip *g)
{
	uint8_t secrets[8][32], hash[CT_HASH_LEN];
	size_t n = auth_cluster_derive_all(CT_SIGN_LABEL, secrets, 8);

	if (!g->signed_ || g->key_id != 1)
		return false;
	for (size_t i = 0; i < n; i++) {
		ct_sign(secrets[i], g->time, hash);
		if (CRYPTO_memcmp(hash, g->hash, CT_HASH_LEN) == 0)
			return true;
	}
	return false;
}

bool proxy_ct_in(wire_req *req, void *role_data)
{
	proxy *p = role_data;
	ct_gossip g;

	if (!wire_req_take_cluster_time(req, &g))
		return false;
	if (!g.present)
		return true;
	if (p->auth) {
		wire_conn *conn = wire_req_conn(req);
		const char *user = conn ? auth_gate_conn_user(conn) : NULL;
		if (user == NULL)
			return true; /* unauthenticated: its time is not taken */
		if (auth_cluster_enabled() && g.time > shardconn_cluster_time(p->sc) &&
		    strcmp(user, "__system") != 0 && !signature_ok(&g)) {
			wire_req_error(req, CT_ERR_TIME_PROOF_MISMATCH, "Time proof mismatch");
			return false;
		}
	}
	shardconn_advance_cluster_time(p->sc, g.time);
	return true;
}

void proxy_ct_out(wire_req *req, void *role_data, bson_t *reply)
{
	proxy *p = role_data;
	uint64_t ct = shardconn_cluster_time(p->sc);

	(void)req;
	/* operationTime: the clock when answering, at or above the ts of every write and
	 * read this command made on a shard (their replies raised it) */
	/* the signed $clusterTime kept per thread (issue #19) */
	bson_t ctdoc;
	shardconn_cluster_time_doc(ct, &ctdoc);
	ct_append_doc(reply, &ctdoc, ct);
}
