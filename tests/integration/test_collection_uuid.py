"""MongoDB 6.0's collectionUUID (issue #20: accepted means honoured). A shard runs find,
aggregate, count, distinct, insert, update, delete and findAndModify only when the named
collection has that UUID (listCollections' info.uuid); otherwise 361 CollectionUUIDMismatch
with {db, collectionUUID, expectedCollection, actualCollection} and nothing is done. A proxy
refuses the field (238): each shard holds its part of a collection under its own UUID.
Before this, both accepted the field and ignored it (a delete with a random UUID removed
every document)."""
import uuid

import pymongo
import pytest
from bson.binary import Binary
from pymongo.errors import OperationFailure

from proxy_helpers import ProxyCluster


def _uuid_of(db, name):
    for c in db.command("listCollections")["cursor"]["firstBatch"]:
        if c["name"] == name:
            u = c["info"]["uuid"]
            return u if isinstance(u, Binary) else Binary.from_uuid(u)
    raise AssertionError(name)


def _as_uuid(v):
    return v.as_uuid() if isinstance(v, Binary) else v


def _commands(coll):
    return [
        {"find": coll, "filter": {}},
        {"aggregate": coll, "pipeline": [], "cursor": {}},
        {"count": coll},
        {"distinct": coll, "key": "_id"},
        {"insert": coll, "documents": [{"_id": 100}]},
        {"update": coll, "updates": [{"q": {}, "u": {"$set": {"x": 1}}, "multi": True}]},
        {"delete": coll, "deletes": [{"q": {}, "limit": 0}]},
        {"findAndModify": coll, "query": {"_id": 1}, "remove": True},
    ]


@pytest.fixture
def shard_client(shard):
    _, port = shard
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true",
                            uuidRepresentation="standard")
    yield c
    c.close()


def test_shard_refuses_a_mismatch_and_does_nothing(shard_client):
    db = shard_client.cu
    db.c.insert_many([{"_id": i} for i in range(5)])
    db.other.insert_one({"_id": 0})
    other = _uuid_of(db, "other")
    random = Binary.from_uuid(uuid.uuid4())
    for cmd in _commands("c"):
        for given, actual in ((random, None), (other, "other")):
            with pytest.raises(OperationFailure) as e:
                db.command(dict(cmd, collectionUUID=given))
            d = e.value.details
            assert e.value.code == 361, (cmd, d)
            assert d["codeName"] == "CollectionUUIDMismatch"
            assert "does not match that of the collection cu.c" in d["errmsg"]
            assert d["db"] == "cu" and d["expectedCollection"] == "c", d
            assert d["actualCollection"] == actual, d
            assert _as_uuid(d["collectionUUID"]) == _as_uuid(given), d
    # nothing was inserted, updated or deleted
    assert sorted(d["_id"] for d in db.c.find()) == [0, 1, 2, 3, 4]
    assert db.c.count_documents({"x": 1}) == 0
    # a collection that does not exist: no insert creates it
    with pytest.raises(OperationFailure) as e:
        db.command({"insert": "missing", "documents": [{}], "collectionUUID": random})
    assert e.value.code == 361 and e.value.details["actualCollection"] is None
    assert "missing" not in db.list_collection_names()


def test_shard_runs_with_the_right_uuid(shard_client):
    db = shard_client.cu
    db.c.insert_many([{"_id": i} for i in range(5)])
    mine = _uuid_of(db, "c")
    r = db.command({"find": "c", "filter": {}, "collectionUUID": mine})
    assert len(r["cursor"]["firstBatch"]) == 5
    r = db.command({"count": "c", "collectionUUID": mine})
    assert r["n"] == 5
    r = db.command({"insert": "c", "documents": [{"_id": 100}], "collectionUUID": mine})
    assert r["n"] == 1
    r = db.command({"delete": "c", "deletes": [{"q": {"_id": {"$gte": 3}}, "limit": 0}],
                    "collectionUUID": mine})
    assert r["n"] == 3
    assert sorted(d["_id"] for d in db.c.find()) == [0, 1, 2]


def test_shard_checks_the_type(shard_client):
    db = shard_client.cu
    db.c.insert_one({"_id": 1})
    for bad, frag in ((1, "expected type 'binData'"),
                      (Binary(b"0123456789abcdef", 0), "wrong binData type")):
        with pytest.raises(OperationFailure) as e:
            db.command({"find": "c", "collectionUUID": bad})
        assert e.value.code == 14 and frag in str(e.value), e.value.details


@pytest.fixture
def cluster(start_role, tmp_path):
    c = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    yield c
    c.close()


def test_proxy_refuses_it(cluster):
    client = cluster.proxy_client(uuidRepresentation="standard")
    db = client.cu
    db.c.insert_many([{"_id": i} for i in range(5)])
    mine = _uuid_of(db, "c")
    for cmd in _commands("c"):
        for given in (mine, Binary.from_uuid(uuid.uuid4())):
            with pytest.raises(OperationFailure) as e:
                db.command(dict(cmd, collectionUUID=given))
            assert e.value.code == 238, (cmd, e.value.details)
            assert "collectionUUID is not supported" in str(e.value)
    assert sorted(d["_id"] for d in db.c.find()) == [0, 1, 2, 3, 4]
    assert db.c.count_documents({"x": 1}) == 0


def test_shard_drop_checks_it_and_the_index_commands_refuse_it(shard_client):
    db = shard_client.cu
    db.d.insert_one({"_id": 1})
    random = Binary.from_uuid(uuid.uuid4())
    with pytest.raises(OperationFailure) as e:
        db.command({"drop": "d", "collectionUUID": random})
    assert e.value.code == 361, e.value.details
    assert "d" in db.list_collection_names()
    for cmd in ({"createIndexes": "d", "indexes": [{"key": {"a": 1}, "name": "a_1"}]},
                {"dropIndexes": "d", "index": "*"}):
        with pytest.raises(OperationFailure) as e:
            db.command(dict(cmd, collectionUUID=_uuid_of(db, "d")))
        assert e.value.code == 238, e.value.details
    assert [i["name"] for i in db.d.list_indexes()] == ["_id_"]
    db.command({"drop": "d", "collectionUUID": _uuid_of(db, "d")})
    assert "d" not in db.list_collection_names()


def test_shard_drop_refuses_a_mistyped_uuid_and_explain_refuses_it(shard_client):
    """A collectionUUID of the wrong type on drop is 14 and drops nothing (a fresh user:
    drop ran with collectionUUID: "x"); an explained command's is refused (238), never
    explained as if it matched."""
    db = shard_client.cu
    db.t.insert_one({"_id": 1})
    for bad in ("x", 5, None, Binary(b"abc", 0)):
        with pytest.raises(OperationFailure) as e:
            db.command({"drop": "t", "collectionUUID": bad})
        assert e.value.code == 14, (bad, e.value.details)
    assert db.t.count_documents({}) == 1
    with pytest.raises(OperationFailure) as e:
        db.command({"explain": {"find": "t", "collectionUUID": Binary.from_uuid(uuid.uuid4())}})
    assert e.value.code == 238, e.value.details
