"""listDatabases' filter (MongoDB list_databases.cpp; issue #20: accepted means honoured): a
query over each database's document ({name, sizeOnDisk, empty}; {name} with nameOnly), on a
shard and through a proxy (sizes summed over the shards before the filter runs); totalSize
sums the databases kept and is left out with nameOnly; authorizedDatabases is accepted.
Before this both roles listed every database whatever the filter."""
import pymongo
import pytest
from pymongo.errors import OperationFailure

from proxy_helpers import ProxyCluster

DBS = ("ag", "agx", "zz1", "zz2", "other")


def _load(client):
    for name in DBS:
        client[name].c.insert_one({"_id": 1, "name": name})


def _names(reply):
    return sorted(d["name"] for d in reply["databases"])


def _check(client):
    admin = client.admin
    r = admin.command({"listDatabases": 1, "filter": {"name": "ag"}})
    assert _names(r) == ["ag"], r
    assert r["totalSize"] == r["databases"][0]["sizeOnDisk"] > 0, r
    r = admin.command({"listDatabases": 1, "filter": {"name": {"$regex": "^zz"}}})
    assert _names(r) == ["zz1", "zz2"], r
    assert r["totalSize"] == sum(d["sizeOnDisk"] for d in r["databases"]), r
    # the filter sees the document's other fields
    r = admin.command({"listDatabases": 1, "filter": {"empty": False, "name": {"$in": ["ag", "nope"]}}})
    assert _names(r) == ["ag"], r
    r = admin.command({"listDatabases": 1, "filter": {"sizeOnDisk": {"$lt": 0}}})
    assert r["databases"] == [] and r["totalSize"] == 0, r
    # nameOnly: {name} only, no totalSize (mongod and mongos)
    r = admin.command({"listDatabases": 1, "nameOnly": True, "filter": {"name": {"$regex": "^ag"}}})
    assert r["databases"] == [{"name": "ag"}, {"name": "agx"}] or \
        sorted(r["databases"], key=lambda d: d["name"]) == [{"name": "ag"}, {"name": "agx"}], r
    assert "totalSize" not in r, r
    # authorizedDatabases is accepted
    r = admin.command({"listDatabases": 1, "authorizedDatabases": True, "filter": {"name": "zz1"}})
    assert _names(r) == ["zz1"], r
    # no filter: every database
    r = admin.command({"listDatabases": 1})
    assert set(DBS) <= set(_names(r)), r
    # a bad filter is refused, not ignored
    with pytest.raises(OperationFailure) as e:
        admin.command({"listDatabases": 1, "filter": {"name": {"$nope": 1}}})
    assert e.value.code == 2, e.value.details
    with pytest.raises(OperationFailure) as e:
        admin.command({"listDatabases": 1, "filter": "ag"})
    assert e.value.code == 14, e.value.details
    # the driver helper
    assert sorted(d["name"] for d in client.list_databases(filter={"name": {"$regex": "^zz"}})) \
        == ["zz1", "zz2"]


def test_shard(shard):
    _, port = shard
    client = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true")
    _load(client)
    _check(client)
    client.close()


def test_proxy(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    try:
        client = cl.proxy_client()
        _load(client)
        _check(client)
    finally:
        cl.close()
