/* Cluster-time gossip on a shard member (issue #20; shard.h, common/clustertime.h; mongod's
 * VectorClockMongoD gossip in and out, src/mongo/db/vector_clock_mongod.cpp).
 *
 * In: a request's $clusterTime raises sh->cluster_time (loop thread, before the command
 * is queued). The primary proposes every entry of writes with that clock as the entry's
 * ts floor (repl.c `ctFloor`, storage sdb_store_det.min_ts), so every member's apply
 * gives the entry's oplog entries a ts above it: a write acknowledged after a request
 * that carried time T sorts after T, whatever this shard's wall clock says.
 * Out: every reply carries $clusterTime (the clock, with the newest committed oplog ts
 * max'ed in) and operationTime (the newest committed oplog ts: at or above the ts of the
 * command's own writes, which applied before the reply). */
#include <stdio.h>
#include <string.h>

#include "auth/cluster.h"
#include "auth/gate.h"
#include "common/clock.h"
#include "common/clustertime.h"
#include "shard/shard.h"

uint64_t shard_cluster_time(shard *sh)
{
	uint64_t op = sdb_store_oplog_committed(sh->store);
	uint64_t ct = atomic_load(&sh->cluster_time);

	return op > ct ? op : ct;
}

bool shard_ct_in(wire_req *req, void *role_data)
{
	shard *sh = role_data;
	ct_gossip g;

	if (!wire_req_take_cluster_time(req, &g))
		return false;
	if (!g.present)
		return true;
	/* with a cluster key only cluster members run commands here (auth_cluster_gate):
	 * their gossip is trusted as mongod trusts a client with advanceClusterTime; a
	 * connection that has not authenticated (its hello) does not move the clock */
	if (auth_cluster_enabled()) {
		wire_conn *conn = wire_req_conn(req);
		if (conn == NULL || auth_gate_conn_user(conn) == NULL)
			return true;
	}
	ct_advance(&sh->cluster_time, g.time);
	return true;
}

void shard_ct_out(wire_req *req, void *role_data, bson_t *reply)
{
	shard *sh = role_data;
	uint8_t secret[32];
	bool keyed = auth_cluster_derive(CT_SIGN_LABEL, secret);

	(void)req;
	ct_append(reply, shard_cluster_time(sh), sdb_store_oplog_committed(sh->store),
		  keyed ? secret : NULL);
}
