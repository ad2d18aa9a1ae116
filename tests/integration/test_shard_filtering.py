"""Chunk-aware shards (issue #17), shard side: filtering metadata installed with the
replicated stripedbSetFiltering, the shard version gate ($stripedbShardVersion) checked in
the command's own transaction, and orphan filtering in find, count, distinct, aggregate and
multi-document update/delete. Talks to one shard directly (pymongo)."""
import pymongo
import pytest
from bson import MinKey, MaxKey
from pymongo.errors import OperationFailure

from conftest import free_port


def client_for(port):
    return pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true",
                               serverSelectionTimeoutMS=10000, retryWrites=False)


@pytest.fixture
def shard_dir(start_role, tmp_path):
    port = free_port()
    data = tmp_path / "shard"
    data.mkdir()
    p = start_role(["--role=shard", f"--listen=127.0.0.1:{port}", f"--data-dir={data}"])
    return p, port


def install(adm, ns, key, chunks, cver):
    return adm.command({"stripedbSetFiltering": ns, "key": key, "chunks": chunks,
                        "collectionVersion": cver})


def sv(ns, cver, sver):
    return {"$stripedbShardVersion": {"ns": ns, "collectionVersion": cver, "shardVersion": sver}}


RANGES = [{"id": "1", "min": {"k": MinKey()}, "max": {"k": 20}, "token": 3},
          {"id": "7", "min": {"k": 40}, "max": {"k": 50}, "token": 6}]


def owned(k):
    return k < 20 or 40 <= k < 50


def test_orphans_are_filtered_in_every_gated_command(shard_dir):
    _, port = shard_dir
    c = client_for(port)
    db, adm = c.db, c.admin
    db.c.insert_many([{"_id": i, "k": i, "g": i % 3} for i in range(100)])
    db.c.create_index("k")
    r = install(adm, "db.c", {"k": 1}, RANGES, 9)
    assert (r["collectionVersion"], r["shardVersion"], r["nChunks"]) == (9, 6, 2)
    g = sv("db.c", 9, 6)
    want = sorted(i for i in range(100) if owned(i))

    docs = db.command("find", "c", filter={}, batchSize=1000, **g)["cursor"]["firstBatch"]
    assert sorted(d["_id"] for d in docs) == want
    # a filter bounding the shard key uses its index and still drops orphans
    docs = db.command("find", "c", filter={"k": {"$gte": 15, "$lt": 45}}, **g)["cursor"]["firstBatch"]
    assert sorted(d["_id"] for d in docs) == [15, 16, 17, 18, 19, 40, 41, 42, 43, 44]
    ex = db.command("explain", {"find": "c", "filter": {"k": {"$gte": 15, "$lt": 45}}},
                    verbosity="executionStats", **g)
    assert ex["queryPlanner"]["winningPlan"]["stage"] == "IXSCAN"
    assert ex["executionStats"]["nReturned"] == 10
    assert ex["executionStats"]["chunkSkips"] == 20
    assert db.command("count", "c", **g)["n"] == len(want)
    assert db.command("count", "c", query={"g": 0}, **g)["n"] == len([i for i in want if i % 3 == 0])
    vals = db.command("distinct", "c", key="k", **g)["values"]
    assert sorted(vals) == want
    agg = db.command("aggregate", "c", pipeline=[{"$group": {"_id": None, "n": {"$sum": 1}}}],
                     cursor={}, **g)["cursor"]["firstBatch"]
    assert agg[0]["n"] == len(want)
    r = db.command("update", "c", updates=[{"q": {}, "u": {"$set": {"seen": 1}}, "multi": True}], **g)
    assert r["n"] == len(want)
    r = db.command("delete", "c", deletes=[{"q": {"k": {"$gte": 10}}, "limit": 0}], **g)
    assert r["n"] == len([i for i in want if i >= 10])
    # the orphans were never touched: still there, never updated
    orphans = list(db.c.find({"k": {"$gte": 10}}))
    assert sorted(d["_id"] for d in orphans) == [i for i in range(10, 100) if not owned(i)]
    assert all("seen" not in d for d in orphans)
    assert db.c.count_documents({"seen": 1}) == 10  # the owned survivors 0..9


def test_stale_and_malformed_versions_execute_nothing(shard_dir):
    _, port = shard_dir
    c = client_for(port)
    db, adm = c.db, c.admin
    db.c.insert_many([{"_id": i, "k": i} for i in range(30)])
    install(adm, "db.c", {"k": 1}, RANGES, 9)
    upd = dict(updates=[{"q": {}, "u": {"$set": {"x": 1}}, "multi": True}])
    for cver, sver in ((9, 5), (9, 7), (8, 6)):
        with pytest.raises(OperationFailure) as e:
            db.command("update", "c", **upd, **sv("db.c", cver, sver))
        assert e.value.code == 13388, e.value.details
        assert e.value.details["vWanted"] == {"collectionVersion": 9, "shardVersion": 6}
    # a newer collection version with the same shard version is served (a migration
    # between other shards)
    assert db.command("count", "c", **sv("db.c", 12, 6))["n"] == 20
    # a collection the shard has no filtering metadata for: StaleConfig, nothing executed
    db.d.insert_one({"_id": 1, "k": 1})
    with pytest.raises(OperationFailure) as e:
        db.command("delete", "d", deletes=[{"q": {}, "limit": 0}], **sv("db.d", 1, 1))
    assert e.value.code == 13388 and e.value.details["vWanted"] is None
    assert "no filtering metadata" in e.value.details["errmsg"]
    assert db.d.count_documents({}) == 1
    # malformed versions, or a version naming another namespace: BadValue, nothing executed
    bad = [{"ns": "db.c", "collectionVersion": 9},
           {"ns": "db.c", "collectionVersion": "9", "shardVersion": 6},
           {"ns": "db.c", "collectionVersion": 9, "shardVersion": -1},
           {"ns": "db.c", "collectionVersion": 9, "shardVersion": 6, "epoch": 1},
           {"ns": "db.other", "collectionVersion": 9, "shardVersion": 6},
           "db.c"]
    for v in bad:
        with pytest.raises(OperationFailure) as e:
            db.command("update", "c", **upd, **{"$stripedbShardVersion": v})
        assert e.value.code == 2, (v, e.value.details)
    assert db.c.count_documents({"x": 1}) == 0
    # installs never go back; bad installs are refused whole
    with pytest.raises(OperationFailure) as e:
        install(adm, "db.c", {"k": 1}, RANGES[:1], 8)
    assert e.value.code == 13388
    for key, chunks, cver in (({"k": "nope"}, RANGES, 9),
                              ({"k": 1}, [{"id": "1", "min": {"k": 0}, "max": {"k": 10}}], 9),
                              ({"k": 1}, [{"id": "1", "min": {"k": 0}, "max": {"k": 10}, "token": 3},
                                          {"id": "2", "min": {"k": 5}, "max": {"k": 20}, "token": 3}], 9),
                              ({"k": 1}, RANGES, 5),  # a token above the collection version
                              # a descending or zero key field (shardCollection: 1 or "hashed")
                              ({"k": -1}, RANGES, 9), ({"k": 0}, RANGES, 9),
                              # hashed only alone
                              ({"k": "hashed", "j": 1}, RANGES, 9),
                              # an inverted and an empty range
                              ({"k": 1}, [{"id": "1", "min": {"k": 10}, "max": {"k": 0}, "token": 3}], 9),
                              ({"k": 1}, [{"id": "1", "min": {"k": 10}, "max": {"k": 10}, "token": 3}], 9),
                              # bounds on another field, with an extra field, or missing
                              ({"k": 1}, [{"id": "1", "min": {"j": 0}, "max": {"j": 10}, "token": 3}], 9),
                              ({"k": 1}, [{"id": "1", "min": {"k": 0, "j": 0}, "max": {"k": 10}, "token": 3}], 9),
                              ({"k": 1}, [{"id": "1", "min": {"k": 0}, "token": 3}], 9),
                              # compound bounds out of the key's order
                              ({"k": 1, "j": 1}, [{"id": "1", "min": {"j": 0, "k": 0},
                                                   "max": {"k": 10, "j": 0}, "token": 3}], 9),
                              # a repeated chunk id, an unknown chunk field, an empty id
                              ({"k": 1}, [{"id": "1", "min": {"k": 0}, "max": {"k": 10}, "token": 3},
                                          {"id": "1", "min": {"k": 20}, "max": {"k": 30}, "token": 3}], 9),
                              ({"k": 1}, [{"id": "1", "min": {"k": 0}, "max": {"k": 10}, "token": 3,
                                           "shard": "s2"}], 9),
                              ({"k": 1}, [{"id": "", "min": {"k": 0}, "max": {"k": 10}, "token": 3}], 9)):
        with pytest.raises(OperationFailure) as e:
            install(adm, "db.c", key, chunks, cver)
        assert e.value.code == 2, (key, chunks, e.value.details)
    # an unknown top-level field (40415, as every strictly parsed command)
    with pytest.raises(OperationFailure) as e:
        adm.command({"stripedbSetFiltering": "db.c", "key": {"k": 1}, "chunks": RANGES,
                     "collectionVersion": 9, "epoch": 1})
    assert e.value.code == 40415, e.value.details
    # namespaces MongoDB never shards: IllegalOperation
    for ns in ("local.oplog.rs", "admin.c", "config.chunks", "db.system.views"):
        with pytest.raises(OperationFailure) as e:
            install(adm, ns, {"k": 1}, RANGES, 9)
        assert e.value.code == 20, (ns, e.value.details)
    got = adm.command("stripedbGetFiltering", "db.c")
    assert got["installed"] and got["shardVersion"] == 6 and len(got["chunks"]) == 2


def test_filtering_metadata_survives_restart_and_can_be_dropped(shard_dir):
    proc, port = shard_dir
    c = client_for(port)
    db, adm = c.db, c.admin
    db.c.insert_many([{"_id": i, "k": i} for i in range(60)])
    install(adm, "db.c", {"k": 1}, RANGES, 9)
    c.close()
    proc.stop()
    proc.restart().wait_healthy()
    c = client_for(port)
    db, adm = c.db, c.admin
    got = adm.command("stripedbGetFiltering", "db.c")
    assert got["installed"] and (got["collectionVersion"], got["shardVersion"]) == (9, 6)
    assert db.command("count", "c", **sv("db.c", 9, 6))["n"] == 30
    # a new install (the chunk 40..50 moved away, another chunk bumped) changes the owner
    install(adm, "db.c", {"k": 1}, [dict(RANGES[0], token=10)], 10)
    with pytest.raises(OperationFailure) as e:
        db.command("count", "c", **sv("db.c", 9, 6))
    assert e.value.code == 13388
    assert db.command("count", "c", **sv("db.c", 10, 10))["n"] == 20
    adm.command({"stripedbSetFiltering": "db.c", "drop": True})
    assert adm.command("stripedbGetFiltering", "db.c")["installed"] is False
    with pytest.raises(OperationFailure) as e:
        db.command("count", "c", **sv("db.c", 10, 10))
    assert e.value.code == 13388
    # dropping the collection drops its filtering metadata: sharded again under the same
    # name, its new routing (tokens from 1 again) installs
    install(adm, "db.c", {"k": 1}, [dict(RANGES[0], token=10)], 10)
    db.drop_collection("c")
    assert adm.command("stripedbGetFiltering", "db.c")["installed"] is False
    install(adm, "db.c", {"k": 1}, [dict(RANGES[0], token=1)], 1)
    # also where the shard held no document of it, and for a whole database
    install(adm, "db.empty", {"k": 1}, [], 4)
    assert db.command("drop", "empty")["ok"] == 1
    assert adm.command("stripedbGetFiltering", "db.empty")["installed"] is False
    c.drop_database("db")
    assert adm.command("stripedbGetFiltering", "db.c")["installed"] is False


def test_hashed_key_ownership_partitions_the_documents(shard_dir):
    _, port = shard_dir
    c = client_for(port)
    db, adm = c.db, c.admin
    db.h.insert_many([{"_id": i, "u": f"user-{i}"} for i in range(200)])
    halves = []
    for lo, hi in ((MinKey(), 0), (0, MaxKey())):
        install(adm, "db.h", {"u": "hashed"},
                [{"id": "1", "min": {"u": lo}, "max": {"u": hi}, "token": 1}], 1)
        docs = db.command("find", "h", filter={}, batchSize=1000,
                          **sv("db.h", 1, 1))["cursor"]["firstBatch"]
        halves.append({d["_id"] for d in docs})
    assert halves[0] and halves[1]
    assert not (halves[0] & halves[1])
    assert halves[0] | halves[1] == set(range(200))


def test_filtering_metadata_is_replicated_to_every_member(start_role, tmp_path):
    """stripedbSetFiltering is a Raft entry: every member of a shard set holds the same
    filtering metadata and applies the same gated writes (secondaries re-run the gate)."""
    from test_shard_replset import start_set, direct, wait_converged
    _, wires, uri = start_set(start_role, tmp_path)
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=20000) as c:
        c.app.c.insert_many([{"_id": i, "k": i} for i in range(60)])
        install(c.admin, "app.c", {"k": 1}, RANGES, 9)
        r = c.app.command("update", "c", updates=[{"q": {}, "u": {"$set": {"seen": 1}},
                                                   "multi": True}], **sv("app.c", 9, 6))
        assert r["n"] == 30
    docs, _ = wait_converged(wires)
    assert sorted(d["_id"] for d in docs if d.get("seen")) == [i for i in range(60) if owned(i)]
    for p in wires:
        with direct(p) as m:
            got = m.admin.command("stripedbGetFiltering", "app.c",
                                  **{"$readPreference": {"mode": "secondaryPreferred"}})
            assert got["installed"] and (got["collectionVersion"], got["shardVersion"]) == (9, 6)
            assert [ch["id"] for ch in got["chunks"]] == ["1", "7"]
