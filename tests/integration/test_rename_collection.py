"""renameCollection (issue #20), as MongoDB 6.0: on a shard (atomically, documents and
indexes kept, across databases too, replicated to a shard replica set's secondaries with
MongoDB's oplog entry) and through a proxy (routed to the database's primary shard);
MongoDB's codes for every refusal; sharded collections refused (20)."""
import time

import pymongo
import pytest
from pymongo.errors import OperationFailure

from conftest import no_gossip, wait_until
from proxy_helpers import ProxyCluster
from test_shard_replset import direct, primary_index, start_set


@pytest.fixture
def cl(start_role, tmp_path):
    c = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    yield c
    c.close()


def load(coll, n=50):
    coll.insert_many([{"_id": i, "a": i % 5, "u": i} for i in range(n)])
    coll.create_index("a")
    coll.create_index("u", unique=True)


def indexes(coll):
    return sorted((i["name"], tuple(i["key"].items()), bool(i.get("unique")))
                  for i in coll.list_indexes())


def fails(fn, code, msg=None):
    with pytest.raises(OperationFailure) as e:
        fn()
    assert e.value.code == code, e.value.details
    if msg is not None:
        assert msg in e.value.details["errmsg"], e.value.details
    return e.value.details


def rename_entries(c):
    return [e for e in c.local["oplog.rs"].find({"op": "c"})
            if "renameCollection" in e["o"]]


def test_rename_on_a_shard_keeps_documents_and_indexes(cl):
    c = cl.shard_client("shard-a")
    load(c.r.src)
    before_docs = list(c.r.src.find({}, sort=[("_id", 1)]))
    before_idx = indexes(c.r.src)
    uuid = next(x for x in c.r.list_collections() if x["name"] == "src")["info"]["uuid"]
    assert no_gossip(c.r.src.rename("dst")) == {"ok": 1.0}
    assert "src" not in c.r.list_collection_names()
    assert "dst" in c.r.list_collection_names()
    assert list(c.r.dst.find({}, sort=[("_id", 1)])) == before_docs
    assert indexes(c.r.dst) == before_idx == [
        ("_id_", (("_id", 1),), False), ("a_1", (("a", 1),), False),
        ("u_1", (("u", 1),), True)]
    # the collection is the same one (UUID kept); its indexes work under the new name
    assert next(x for x in c.r.list_collections()
                if x["name"] == "dst")["info"]["uuid"] == uuid
    assert c.r.dst.find({"a": 3}).explain()["queryPlanner"]["winningPlan"]["stage"] == \
        "IXSCAN"
    fails(lambda: c.r.dst.insert_one({"_id": 999, "u": 7}), 11000)  # unique index kept
    c.r.dst.insert_one({"_id": 1000, "u": 1000})
    assert c.r.src.count_documents({}) == 0
    # MongoDB's oplog entry: ns "<db>.$cmd", ui the source's UUID
    (e,) = rename_entries(c)
    assert e["ns"] == "r.$cmd" and e["ui"] == uuid
    assert e["o"] == {"renameCollection": "r.src", "to": "r.dst", "stayTemp": False}
    assert c.admin.command("stripedbCheck")["nProblems"] == 0


def test_drop_target_and_across_databases_on_a_shard(cl):
    c = cl.shard_client("shard-a")
    load(c.r.src, 10)
    c.r.dst.insert_many([{"_id": "old", "v": 1}])
    c.r.dst.create_index("v")
    old_uuid = next(x for x in c.r.list_collections()
                    if x["name"] == "dst")["info"]["uuid"]
    fails(lambda: c.admin.command("renameCollection", "r.src", to="r.dst"), 48,
          "target namespace exists")
    fails(lambda: c.admin.command("renameCollection", "r.src", to="r.dst", dropTarget=False),
          48)
    assert c.r.src.count_documents({}) == 10  # nothing changed
    assert c.admin.command("renameCollection", "r.src", to="r.dst", dropTarget=True,
                           stayTemp=True, writeConcern={"w": 1},
                           comment="c")["ok"] == 1
    assert c.r.dst.count_documents({}) == 10 and c.r.dst.find_one({"_id": "old"}) is None
    assert "v_1" not in [i["name"] for i in c.r.dst.list_indexes()]
    e = rename_entries(c)[-1]
    assert e["o"]["dropTarget"] == old_uuid and e["o"]["stayTemp"] is True
    # pymongo's rename(dropTarget=True) onto a missing target is fine too
    c.r.dst.rename("dst2", dropTarget=True)
    assert "dropTarget" not in rename_entries(c)[-1]["o"]
    # across databases: the same shard, one transaction, indexes kept
    assert c.admin.command("renameCollection", "r.dst2", to="other.moved")["ok"] == 1
    assert c.other.moved.count_documents({}) == 10
    assert indexes(c.other.moved) == [("_id_", (("_id", 1),), False),
                                      ("a_1", (("a", 1),), False),
                                      ("u_1", (("u", 1),), True)]
    assert "dst2" not in c.r.list_collection_names()
    e = rename_entries(c)[-1]
    assert e["ns"] == "r.$cmd" and e["o"]["to"] == "other.moved"
    assert c.admin.command("stripedbCheck")["nProblems"] == 0


REFUSALS = [
    # (command, database, code, message fragment)
    ({"renameCollection": "e.a", "to": "e.b"}, "e", 13,
     "renameCollection may only be run against the admin database."),
    ({"renameCollection": "e.a", "to": "e.a"}, "admin", 20,
     "Can't rename a collection to itself"),
    ({"renameCollection": "e.nosuch", "to": "e.b"}, "admin", 26,
     "Source collection e.nosuch does not exist"),
    ({"renameCollection": "e.a", "to": "e.exists"}, "admin", 48, "target namespace exists"),
    ({"renameCollection": "nodot", "to": "e.b"}, "admin", 73,
     "Invalid source namespace: nodot"),
    ({"renameCollection": "e.a", "to": "bad db.b"}, "admin", 73,
     "Invalid target namespace: bad db.b"),
    ({"renameCollection": "e.a", "to": "e."}, "admin", 73, "Invalid target namespace"),
    ({"renameCollection": "e.a", "to": "e.system.x"}, "admin", 20,
     "error with target namespace: Invalid system namespace: e.system.x"),
    ({"renameCollection": "e.system.views", "to": "e.b"}, "admin", 20,
     "error with source namespace: cannot write to e.system.views"),
    ({"renameCollection": "e.a", "to": "e.b$c"}, "admin", 20,
     "Invalid collection name: b$c"),
    ({"renameCollection": "local.oplog.rs", "to": "local.x"}, "admin", 20,
     "can't rename live oplog while replicating"),
    ({"renameCollection": "e.v", "to": "e.b"}, "admin", 166, "cannot rename view: e.v"),
    ({"renameCollection": "e.a", "to": "e.v"}, "admin", 48,
     "a view already exists with that name: e.v"),
    ({"renameCollection": "e.a", "to": "e.v", "dropTarget": True}, "admin", 48,
     "a view already exists with that name: e.v"),
    ({"renameCollection": "e.a"}, "admin", 40414,
     "BSON field 'renameCollection.to' is missing but a required field"),
    ({"renameCollection": "e.a", "to": 5}, "admin", 14, "renameCollection.to"),
    ({"renameCollection": 5, "to": "e.b"}, "admin", 14, None),
    ({"renameCollection": "e.a", "to": "e.b", "dropTarget": "yes"}, "admin", 14,
     "renameCollection.dropTarget"),
    ({"renameCollection": "e.a", "to": "e.b", "bogus": 1}, "admin", 40415,
     "BSON field 'renameCollection.bogus' is an unknown field."),
    ({"renameCollection": "e.a", "to": "e.b", "collectionUUID": 1}, "admin", 238,
     "collectionUUID"),
    ({"renameCollection": "e.a", "to": "local.a"}, "admin", 20,
     "Cannot rename collections between a replicated and an unreplicated database"),
    # a NUL byte inside a name: C strings stopped at it, so the command acted on a shorter
    # name (renamed e.a, created e.zz; found by a fresh user)
    ({"renameCollection": "e.a\x00junk", "to": "e.q"}, "admin", 73, "null byte"),
    ({"renameCollection": "e.a", "to": "e.zz\x00evil"}, "admin", 73, "null byte"),
    ({"create": "zz\x00q"}, "e", 73, "null byte"),
    ({"drop": "a\x00q"}, "e", 73, "null byte"),
    ({"insert": "a\x00q", "documents": [{"_id": 2}]}, "e", 73, "null byte"),
    ({"create": "w", "viewOn": "a\x00q", "pipeline": []}, "e", 73, "null byte"),
]


@pytest.mark.parametrize("cmd,db,code,msg", REFUSALS,
                         ids=[f"{r[2]}-{i}" for i, r in enumerate(REFUSALS)])
def test_refusals_on_a_shard_and_through_a_proxy(cl, cmd, db, code, msg):
    shard = cl.shard_client("shard-a")  # the primary shard of `e` (lowest shard id)
    shard.e.a.insert_one({"_id": 1})
    shard.e.exists.insert_one({"_id": 1})
    shard.e.create_collection("v", viewOn="a", pipeline=[])
    for client in (shard, cl.proxy_client(0)):
        fails(lambda: client[db].command(dict(cmd)), code, msg)
    # nothing moved
    assert sorted(shard.e.list_collection_names()) == ["a", "exists", "v"]
    assert shard.e.a.count_documents({}) == 1


def test_rename_through_a_proxy(cl):
    p = cl.proxy_client(0)
    load(p.pr.src, 30)
    # unsharded collections live on the database's primary shard (the lowest shard id)
    assert cl.shard_client("shard-a").pr.src.count_documents({}) == 30
    p.pr.src.rename("dst")
    assert p.pr.dst.count_documents({}) == 30
    assert p.pr.src.count_documents({}) == 0
    assert "src" not in p.pr.list_collection_names()
    assert indexes(p.pr.dst) == [("_id_", (("_id", 1),), False), ("a_1", (("a", 1),), False),
                                 ("u_1", (("u", 1),), True)]
    # the new name routes where the old one did: writes and reads work through the proxy
    p.pr.dst.insert_one({"_id": 100, "a": 1, "u": 100})
    assert p.pr.dst.count_documents({"a": 1}) == 7
    assert cl.shard_client("shard-a").pr.dst.count_documents({}) == 31
    # the empty copy that the broadcast createIndexes left on shard-b follows the name
    b = cl.shard_client("shard-b").pr
    assert "src" not in b.list_collection_names() and b.dst.count_documents({}) == 0
    # dropTarget through the proxy
    p.pr.other.insert_one({"_id": "x"})
    fails(lambda: p.admin.command("renameCollection", "pr.dst", to="pr.other"), 48)
    p.admin.command("renameCollection", "pr.dst", to="pr.other", dropTarget=True)
    assert p.pr.other.count_documents({}) == 31 and p.pr.other.find_one({"_id": "x"}) is None
    # across databases with the same primary shard
    p.admin.command("renameCollection", "pr.other", to="pr2.moved")
    assert p.pr2.moved.count_documents({}) == 31


def test_config_database_is_refused_through_a_proxy(cl):
    p = cl.proxy_client(0)
    p.cf.c.insert_one({"_id": 1})
    for cmd in ({"renameCollection": "cf.c", "to": "config.c"},
                {"renameCollection": "config.shards", "to": "cf.shards"}):
        fails(lambda: p.admin.command(dict(cmd)), 20, "read-only view")
    assert p.cf.c.count_documents({}) == 1


def test_across_databases_with_other_primary_shards_is_refused(cl):
    p = cl.proxy_client(0)
    assert p.admin.command("enableSharding", "onb", primaryShard="shard-b")["ok"] == 1
    p.ona.c.insert_one({"_id": 1})  # `ona`: primary shard-a (the default)
    p.onb.c.insert_one({"_id": 2})
    assert cl.shard_client("shard-b").onb.c.count_documents({}) == 1
    fails(lambda: p.admin.command("renameCollection", "ona.c", to="onb.d"), 125,
          "Source and destination collections must be on same shard")
    # within a database whose primary is shard-b: routed there
    p.admin.command("renameCollection", "onb.c", to="onb.d")
    assert p.onb.d.find_one() == {"_id": 2}
    assert cl.shard_client("shard-b").onb.d.count_documents({}) == 1
    assert p.ona.c.count_documents({}) == 1


def test_sharded_collections_are_refused(cl):
    p = cl.proxy_client(0)
    assert p.admin.command("shardCollection", "sh.s", key={"k": 1})["ok"] == 1
    p.sh.s.insert_many([{"_id": i, "k": i} for i in range(5)])
    p.sh.u.insert_one({"_id": 1})
    fails(lambda: p.admin.command("renameCollection", "sh.s", to="sh.t"), 20,
          "source namespace 'sh.s' must not be sharded")
    fails(lambda: p.admin.command("renameCollection", "sh.u", to="sh.s", dropTarget=True),
          20, "cannot rename to sharded collection 'sh.s'")
    # a shard holding the collection's filtering metadata refuses it too
    shard = cl.shard_client("shard-a")
    wait_until(lambda: shard.admin.command("stripedbGetFiltering", "sh.s")["installed"],
               what="filtering metadata installed")
    fails(lambda: shard.admin.command("renameCollection", "sh.s", to="sh.t"), 20,
          "source namespace 'sh.s' is sharded")
    fails(lambda: shard.admin.command("renameCollection", "sh.u", to="sh.s",
                                      dropTarget=True), 20,
          "target namespace 'sh.s' is sharded")
    assert p.sh.s.count_documents({}) == 5 and p.sh.u.count_documents({}) == 1


def test_a_replica_set_secondary_applies_the_rename(start_role, tmp_path):
    procs, wires, uri = start_set(start_role, tmp_path)
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=20000) as c:
        load(c.app.src, 40)
        c.app.dst.insert_one({"_id": "old"})
        c.app.src.rename("dst", dropTarget=True)
        want_docs = list(c.app.dst.find({}, sort=[("_id", 1)]))
        want_idx = indexes(c.app.dst)
    assert len(want_docs) == 40
    p = primary_index(wires)
    with direct(wires[p]) as pc:
        want_entry = rename_entries(pc)[-1]
    for port in wires:
        with direct(port) as m:
            wait_until(lambda: "dst" in m.app.list_collection_names() and
                       "src" not in m.app.list_collection_names() and
                       m.app.dst.count_documents({}) == 40,
                       what=f"the rename applied on member {port}")
            assert list(m.app.dst.find({}, sort=[("_id", 1)])) == want_docs
            assert indexes(m.app.dst) == want_idx
            # every member wrote the same oplog entry (replicated command, same ts)
            assert rename_entries(m)[-1] == want_entry
            assert m.admin.command("stripedbCheck")["nProblems"] == 0
    assert want_entry["o"]["renameCollection"] == "app.src" and "dropTarget" in want_entry["o"]


@pytest.fixture
def sec(start_role, tmp_path):
    """Tenants A (database adb, user alice) and B (bdb, bob) behind a proxy with
    --auth=enabled (as test_security.py's fixture)."""
    c = ProxyCluster(start_role, tmp_path, shards=1, proxies=1, proxy_args=["--auth=enabled"])
    for t, db, user, pw in (("A", "adb", "alice", "alice-pw"), ("B", "bdb", "bob", "bob-pw")):
        c.meta_cmd({"createTenant": t})
        c.create_database(db, tenant=t)
        c.meta_cmd({"createUser": user, "tenant": t, "password": pw})
    bob = sec_client(c, "bob", "bob-pw")
    # the proxy re-reads tenants once a second: wait until bob may write his database
    wait_until(lambda: bob.bdb.c.insert_many([{"_id": i} for i in range(5)]), 20,
               what="bob's first write")
    yield c
    c.close()


def sec_client(c, user, pw):
    return c.proxy_client(0, username=user, password=pw, authSource="admin")


def test_tenants_rename_only_within_what_they_may_administer(sec):
    """--auth=enabled: renameCollection (sent to admin) needs the admin action on both
    namespaces it names (src/auth/gate.c), as drop needs it on its collection."""
    alice = sec_client(sec, "alice", "alice-pw")
    bob = sec_client(sec, "bob", "bob-pw")
    alice.adb.c.insert_one({"_id": 1})
    for cmd in ({"renameCollection": "adb.c", "to": "bdb.stolen"},
                {"renameCollection": "bdb.c", "to": "adb.stolen"},
                {"renameCollection": "bdb.c", "to": "bdb.d"}):
        fails(lambda: alice.admin.command(dict(cmd)), 13)
    assert sorted(bob.bdb.list_collection_names()) == ["c"]
    assert bob.bdb.c.count_documents({}) == 5
    alice.admin.command("renameCollection", "adb.c", to="adb.d")
    assert alice.adb.list_collection_names() == ["d"]
    assert alice.adb.d.find_one() == {"_id": 1}


def test_point_in_time_restore_across_a_rename(start_role, tmp_path):
    """`stripedb ctl restore` replays the CDC log: a rename away from the restored
    collection empties it as a drop does; a rename onto it (whose documents come from
    another collection's history) is refused rather than restored incomplete."""
    import test_backup as tb
    c0 = tb.CdcCluster(start_role, tmp_path, shards=1)
    try:
        co = tb.start(c0, tmp_path)
        c = c0.shard_client("shard-a")
        c.db.p.insert_many([{"_id": i} for i in range(10)])
        c.db.other.insert_many([{"_id": i, "o": 1} for i in range(3)])
        c.db.r.insert_one({"_id": "r"})
        tb.ctl(c0, "backup", "create", "--all")
        c.db.p.insert_many([{"_id": 10}, {"_id": 11}])
        c0.wait_published(co, "shard-a")
        before = tb.now_ms()
        time.sleep(0.05)
        c.admin.command("renameCollection", "db.p", to="db.gone")
        c.admin.command("renameCollection", "db.other", to="db.r", dropTarget=True)
        c.db.after.insert_one({"_id": 1})  # an event after the renames
        c0.wait_published(co, "shard-a")
        t = tb.now_ms()

        def restore(ns, at, into):
            return tb.ctl(c0, "restore", ns, f"--to-time={at // 1000}.{at % 1000:03d}",
                          f"--into={into}", f"--uri={tb.shard_uri(c0)}", check=False)
        r = restore("db.p", before, "db.q1")
        assert r.returncode == 0, r.stderr
        assert c.db.q1.count_documents({}) == 12
        r = restore("db.p", t, "db.q2")
        assert r.returncode == 0, r.stderr
        assert c.db.q2.count_documents({}) == 0  # renamed away: gone at t, as by a drop
        r = restore("db.r", t, "db.q3")
        assert r.returncode != 0
        assert b"renameCollection" in r.stderr and b"db.other" in r.stderr, r.stderr
    finally:
        c0.close()
