"""Database names that differ only in case (issue #20): MongoDB keeps one spelling per
database and refuses to create another with DatabaseDifferCase (13297), on a shard
(insert, update with upsert, create, createIndexes, renameCollection into it) and through
a proxy (the shard's refusal reaches the client; enableSharding / shardCollection of a
name metadata already knows in another case)."""
import pymongo
import pytest
from pymongo.errors import BulkWriteError, OperationFailure, WriteError

from proxy_helpers import ProxyCluster


@pytest.fixture
def cl(start_role, tmp_path):
    c = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    yield c
    c.close()


def code_of(fn):
    with pytest.raises((OperationFailure, WriteError, BulkWriteError)) as e:
        fn()
    d = e.value.details
    if "writeErrors" in d:
        d = d["writeErrors"][0]
    return d.get("code"), d.get("errmsg", "")


def test_shard_refuses_a_database_differing_in_case(cl):
    c = cl.shard_client("shard-a")
    c.dbcase.c.insert_one({"_id": 1})
    code, msg = code_of(lambda: c.DBCase.c.insert_one({"_id": 1}))
    assert code == 13297
    assert msg == ("db already exists with different case already have: [dbcase] trying "
                   "to create [DBCase]")
    assert code_of(lambda: c.DbCase.c.update_one({"_id": 1}, {"$set": {"a": 1}},
                                                  upsert=True))[0] == 13297
    assert code_of(lambda: c.DbCase.create_collection("x"))[0] == 13297
    assert code_of(lambda: c.DbCase.x.create_index("a"))[0] == 13297
    assert code_of(lambda: c.admin.command(
        "renameCollection", "dbcase.c", to="DBCASE.c"))[0] == 13297
    # the internal databases exist for mongod even without collections
    for name in ("Admin", "CONFIG", "Local"):
        code, msg = code_of(lambda: c[name].c.insert_one({"_id": 1}))
        assert code == 13297, (name, msg)
    # nothing was created under the other spelling; the first one works as before
    assert [n for n in c.list_database_names() if n.lower() == "dbcase"] == ["dbcase"]
    c.dbcase.d.insert_one({"_id": 2})
    assert c.dbcase.c.count_documents({}) == 1
    # once the database is gone, the other spelling may be created
    c.drop_database("dbcase")
    c.DBCase.c.insert_one({"_id": 3})
    assert [n for n in c.list_database_names() if n.lower() == "dbcase"] == ["DBCase"]


def test_proxy_refuses_a_database_differing_in_case(cl):
    p = cl.proxy_client()
    p.casedb.c.insert_one({"_id": 1})
    assert code_of(lambda: p.CaseDB.c.insert_one({"_id": 1}))[0] == 13297
    p.admin.command("enableSharding", "shcase")
    code, msg = code_of(lambda: p.admin.command("enableSharding", "ShCase"))
    assert code == 13297, msg
    assert "[shcase]" in msg and "[ShCase]" in msg
    assert code_of(lambda: p.admin.command("shardCollection", "SHCASE.c",
                                           key={"k": 1}))[0] == 13297
    names = [d["name"] for d in p.admin.command("listDatabases")["databases"]]
    assert "ShCase" not in names and "SHCASE" not in names
    # a database only a shard knows (created by a write, never recorded in metadata) counts
    # too: enableSharding of another spelling would lock the real one out of sharding
    p.shop.orders.insert_one({"a": 1})
    assert code_of(lambda: p.admin.command("enableSharding", "Shop"))[0] == 13297
    assert p.admin.command("enableSharding", "shop")["ok"] == 1
    assert p.admin.command("shardCollection", "shop.orders", key={"_id": 1})["ok"] == 1


def test_drop_database_through_a_proxy_forgets_its_sharding(cl):
    """dropDatabase through a proxy drops metadata's record of the database and of its
    sharded collections (they were left behind: sharding the collection again with another
    key was 23, and the name stayed taken for 13297)."""
    p = cl.proxy_client()
    p.admin.command("enableSharding", "dd")
    p.admin.command("shardCollection", "dd.c", key={"k": 1})
    p.dd.c.insert_one({"k": 1})
    p.drop_database("dd")
    assert list(p.config.databases.find({"_id": "dd"})) == []
    assert list(p.config.collections.find({"_id": "dd.c"})) == []
    assert p.dd.c.count_documents({}) == 0
    assert p.admin.command("shardCollection", "dd.c", key={"other": 1})["ok"] == 1
    p.drop_database("dd")
    assert p.admin.command("enableSharding", "DD")["ok"] == 1
