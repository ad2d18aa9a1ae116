"""maxTimeMS on a shard's reads (issue #20: accepted, so honoured): a find, count, distinct
or aggregate that is still reading documents when its maxTimeMS (counted from the
request's arrival, as mongod counts it) has passed fails with MaxTimeMSExpired (50)
"operation exceeded time limit"; through a proxy the shard's 50 reaches the client. Before,
the shards parsed maxTimeMS and ran reads to their end.

No timing is asserted: the slow aggregation below reads N^2 = 2.25 M documents (about 20 s
under ASan, seconds in a release build), which no machine does within 50 ms; the finds,
counts and distincts scan BIG = 20,000 documents with a limit of 1 ms (SQLite alone takes
over a microsecond per row); the fast ones read a handful and are given a minute."""
import pymongo
import pytest
from pymongo.errors import ExecutionTimeout, OperationFailure

from proxy_helpers import ProxyCluster

N = 1500
# a correlated sub-pipeline per document with a distinct variable each time: N^2 reads
SLOW = [{"$lookup": {"from": "c", "let": {"k": "$_id"},
                     "pipeline": [{"$match": {"$expr": {"$eq": ["$k", "$$k"]}}}], "as": "j"}},
        {"$count": "n"}]
BIG = 20000
SCAN = {"pad": "matches nothing"}  # no index on pad: every document is read


def load(coll):
    coll.insert_many([{"_id": i, "k": i % 7, "pad": "x" * 50} for i in range(N)])
    coll.database.big.insert_many([{"_id": i, "k": i % 7, "pad": "y"} for i in range(BIG)])


def expired(fn):
    with pytest.raises(OperationFailure) as e:
        fn()
    assert e.value.code == 50, e.value.details
    assert isinstance(e.value, ExecutionTimeout)
    assert e.value.details["errmsg"] == "operation exceeded time limit"


def check(db):
    c = db.c
    expired(lambda: list(c.aggregate(SLOW, maxTimeMS=50)))
    expired(lambda: list(db.big.find(SCAN, max_time_ms=1)))
    expired(lambda: db.command("count", "big", query=SCAN, maxTimeMS=1))
    expired(lambda: db.command("distinct", "big", key="k", query=SCAN, maxTimeMS=1))
    # within the limit: the same reads answer
    assert list(c.find({"_id": {"$lt": 3}}, max_time_ms=60000).sort("_id", 1)) == [
        {"_id": i, "k": i % 7, "pad": "x" * 50} for i in range(3)]
    assert c.count_documents({"k": 1}, maxTimeMS=60000) == len(range(1, N, 7))
    assert list(c.aggregate([{"$match": {"_id": 5}}, {"$project": {"k": 1}}],
                            maxTimeMS=60000)) == [{"_id": 5, "k": 5}]
    # the shard still serves reads afterwards
    assert c.count_documents({}) == N
    # getMore's maxTimeMS is an awaitData cursor's await time: on any other cursor it is
    # refused as mongod (2), and the cursor stays usable
    first = db.command("find", "c", batchSize=2)["cursor"]
    with pytest.raises(OperationFailure) as e:
        db.command("getMore", first["id"], collection="c", maxTimeMS=100)
    assert e.value.code == 2, e.value.details
    assert "non-awaitData cursor" in e.value.details["errmsg"]
    more = db.command("getMore", first["id"], collection="c", batchSize=2)["cursor"]
    assert len(more["nextBatch"]) == 2
    db.command("killCursors", "c", cursors=[first["id"]])


def test_max_time_ms_on_a_shard(shard):
    _, port = shard
    cl = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true")
    try:
        load(cl.mt.c)
        check(cl.mt)
    finally:
        cl.close()


def test_max_time_ms_through_a_proxy(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    try:
        cl.shard_collection("mt.c", {"_id": 1}, split_points=[{"_id": N // 2}])
        cl.shard_collection("mt.big", {"_id": 1}, split_points=[{"_id": BIG // 2}])
        db = cl.proxy_client(0).mt
        load(db.c)
        check(db)
    finally:
        cl.close()
