"""maxTimeMS is the operation's deadline on the proxy too (MongoDB: mongos cancels its
remote calls at the operation's deadline and answers MaxTimeMSExpired, 50). A shard that
stops answering (SIGSTOP: the connection stays open, nothing replies) must not hold a
request that carries maxTimeMS until the socket timeout (libmongoc's 5 minutes): the proxy
answers 50 at the deadline (src/proxy/shardconn.h shardconn_set_op_deadline). The client
here waits up to 60 s for an answer, so without the deadline each command below fails with
a client-side network timeout instead of code 50. A retryable write abandoned that way and
then retried with the same txnNumber is applied exactly once."""
import os
import signal

import bson
import pymongo
import pytest

from conftest import wait_until
from proxy_helpers import ProxyCluster


def code_of(fn):
    with pytest.raises(pymongo.errors.OperationFailure) as ei:
        fn()
    return ei.value.code


def test_max_time_ms_bounds_a_request_on_a_stopped_shard(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    stopped = None
    try:
        cl.shard_collection("m.t", {"k": 1}, split_points=[{"k": 20}],
                            shards=["shard-a", "shard-b"])
        c = cl.proxy_client(0)
        db = c.m
        db.t.insert_many([{"_id": i, "k": i, "n": 0} for i in range(40)])
        assert cl.shard_client("shard-b").m.t.count_documents({}) == 20
        lsid = {"id": bson.Binary(os.urandom(16), 4)}
        upd = {"update": "t", "updates": [{"q": {"k": 30}, "u": {"$inc": {"n": 1}}}],
               "lsid": lsid, "txnNumber": bson.Int64(1)}
        before = cl.metric(0, "stripedb_proxy_shard_calls_abandoned_total")

        stopped = cl.shard_procs["shard-b"].p.pid
        os.kill(stopped, signal.SIGSTOP)
        # a scatter read, a count and an aggregate reach the stopped shard: 50
        assert code_of(lambda: list(db.t.find({}).max_time_ms(1000))) == 50
        assert code_of(lambda: db.command({"count": "t", "query": {},
                                           "maxTimeMS": 1000})) == 50
        assert code_of(lambda: list(db.t.aggregate([{"$match": {}}],
                                                   maxTimeMS=1000))) == 50
        # the retryable write to the stopped shard: 50 (its outcome unknown to the client)
        r = db.command(dict(upd, maxTimeMS=1000), check=False)
        codes = [r.get("code")] + [e["code"] for e in r.get("writeErrors", [])]
        assert 50 in codes, r
        # what only shard-a holds is still served, within the limit
        assert [d["_id"] for d in db.t.find({"k": {"$lt": 3}}).sort("k", 1)
                .max_time_ms(5000)] == [0, 1, 2]
        # calls to the stopped shard were given up on (a call made once the deadline
        # has passed is not sent, and not counted: so at least one, usually four)
        assert cl.metric(0, "stripedb_proxy_shard_calls_abandoned_total") > before

        os.kill(stopped, signal.SIGCONT)
        stopped = None
        # the same statement again (a driver's retry): applied once whatever became of
        # the abandoned attempt
        r = db.command(upd)
        assert r["ok"] == 1 and r["n"] == 1, r
        assert cl.shard_client("shard-b").m.t.find_one({"k": 30})["n"] == 1
        wait_until(lambda: db.t.find_one({"k": 30})["n"] == 1, 10, what="the update read back")
        # without maxTimeMS nothing changes: the read reaches both shards
        assert db.t.count_documents({}) == 40
    finally:
        if stopped:
            os.kill(stopped, signal.SIGCONT)
        cl.close()
