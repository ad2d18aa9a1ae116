"""Integer command arguments at the edges of int64 (issue #24).

`limit = -limit` on INT64_MIN was undefined behaviour in the proxy (merge.c, exec.c) and the
shard (cmd_read.c); under the ASan+UBSan build (-fno-sanitize-recover) it aborted the
process. Every integer argument now goes through common/bsonget.h: find's skip, limit and
batchSize must be >= 0 (find_command.idl `validator: { gte: 0 }`, code 51024), count's
limit may be negative but not INT64_MIN (count_request.cpp countParseLimit: BadValue).
Each case must be a clear error and the process must stay up and stop cleanly.
"""
import pymongo
import pytest
from bson.int64 import Int64
from pymongo.errors import OperationFailure

from conftest import assert_clean_exit
from proxy_helpers import ProxyCluster

INT64_MIN = Int64(-(2 ** 63))

# (command, expected code, text the message must contain)
CASES = [
    ({"find": "c", "limit": INT64_MIN}, 51024, "limit' value must be >= 0"),
    ({"find": "c", "batchSize": INT64_MIN}, 51024, "batchSize' value must be >= 0"),
    ({"find": "c", "skip": INT64_MIN}, 51024, "skip' value must be >= 0"),
    ({"find": "c", "limit": -1}, 51024, "limit' value must be >= 0"),
    ({"find": "c", "limit": 1.5}, 9, "Expected an integer"),
    ({"find": "c", "limit": "1"}, 14, "is the wrong type 'string'"),
    ({"count": "c", "limit": INT64_MIN}, 2, "limit value for count cannot be min long"),
]


def check_cases(db):
    for cmd, code, text in CASES:
        with pytest.raises(OperationFailure) as ei:
            db.command(dict(cmd))
        assert ei.value.code == code, (cmd, ei.value.details)
        assert text in str(ei.value), (cmd, ei.value.details)
    # what stays valid: a count's negative limit is its absolute value
    assert db.command({"count": "c", "limit": -2})["n"] == 2
    assert len(db.command({"find": "c", "limit": Int64(2 ** 63 - 1)})
               ["cursor"]["firstBatch"]) == 5


def test_int64_min_on_a_shard(shard):
    proc, port = shard
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/", directConnection=True,
                            serverSelectionTimeoutMS=10000)
    db = c.db
    db.c.insert_many([{"_id": i} for i in range(5)])
    check_cases(db)
    with pytest.raises(OperationFailure) as ei:
        db.command({"aggregate": "c", "pipeline": [], "cursor": {"batchSize": INT64_MIN}})
    assert ei.value.code == 51024
    c.close()
    assert_clean_exit(proc)


@pytest.mark.parametrize("sharded", [True, False])
def test_int64_min_through_a_proxy(start_role, tmp_path, sharded):
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    try:
        if sharded:
            cl.shard_collection("db.c", {"_id": 1}, split_points=[{"_id": 3}])
        db = cl.proxy_client(0).db
        db.c.insert_many([{"_id": i} for i in range(5)])
        check_cases(db)
        # explain pushed limit + skip down to the shards through merge_pushdown_limit,
        # which negated INT64_MIN (UBSan abort at merge.c:131). The explained command is
        # now parsed first, as mongod parses it (find_command.idl `gte: 0`), sharded or not.
        with pytest.raises(OperationFailure) as ei:
            db.command({"explain": {"find": "c", "skip": 1, "limit": INT64_MIN}})
        assert ei.value.code == 51024, ei.value.details
        cl.stop_proxy_clean(0)
    finally:
        cl.close()
