"""$out and $merge (issue #20), as MongoDB 6.0: on a shard (written through the replicated
write path: in the oplog, on every member of a shard replica set) and through a proxy (to an
unsharded target on the source's primary shard: the whole pipeline goes there; otherwise the
proxy writes the results through its own write path). Every whenMatched / whenNotMatched
combination with its final contents, $out replacing a collection with its indexes kept, and
MongoDB's codes for the refusals."""
import threading

import pymongo
import pytest
from pymongo.errors import OperationFailure

from conftest import wait_until
from proxy_helpers import ProxyCluster
from test_shard_replset import direct, primary_index, start_set

SRC = [{"_id": 1, "k": "a", "v": 10}, {"_id": 2, "k": "b", "v": 20},
       {"_id": 3, "k": "c", "v": 30}]
# the target before each $merge: _id 1 and 2 match the source, 9 does not
TARGET = [{"_id": 1, "k": "a", "v": 1, "old": True}, {"_id": 2, "k": "b", "v": 2, "old": True},
          {"_id": 9, "k": "z", "v": 9, "old": True}]

# (whenMatched, whenNotMatched) -> the target's final contents, or the error code
WANT = {
    ("replace", "insert"): [{"_id": 1, "k": "a", "v": 10}, {"_id": 2, "k": "b", "v": 20},
                            {"_id": 3, "k": "c", "v": 30}, TARGET[2]],
    ("replace", "discard"): [{"_id": 1, "k": "a", "v": 10}, {"_id": 2, "k": "b", "v": 20},
                             TARGET[2]],
    ("replace", "fail"): 13113,
    ("merge", "insert"): [{"_id": 1, "k": "a", "v": 10, "old": True},
                          {"_id": 2, "k": "b", "v": 20, "old": True},
                          {"_id": 3, "k": "c", "v": 30}, TARGET[2]],
    ("merge", "discard"): [{"_id": 1, "k": "a", "v": 10, "old": True},
                           {"_id": 2, "k": "b", "v": 20, "old": True}, TARGET[2]],
    ("merge", "fail"): 13113,
    ("keepExisting", "insert"): [TARGET[0], TARGET[1], {"_id": 3, "k": "c", "v": 30},
                                 TARGET[2]],
    ("fail", "insert"): 11000,
    ("pipeline", "insert"): [{"_id": 1, "k": "a", "v": 11, "old": True},
                             {"_id": 2, "k": "b", "v": 22, "old": True},
                             {"_id": 3, "k": "c", "v": 30}, TARGET[2]],
    ("pipeline", "discard"): [{"_id": 1, "k": "a", "v": 11, "old": True},
                              {"_id": 2, "k": "b", "v": 22, "old": True}, TARGET[2]],
    ("pipeline", "fail"): 13113,
    ("keepExisting", "discard"): 51181,
    ("keepExisting", "fail"): 51181,
    ("fail", "discard"): 51181,
    ("fail", "fail"): 51181,
}
# target v + source v / 10 (1 + 10 = 11, 2 + 20 = 22)
PIPE = [{"$set": {"v": {"$add": ["$v", "$$new.v"]}}}]


def fails(fn, code, msg=None):
    with pytest.raises(OperationFailure) as e:
        fn()
    assert e.value.code == code, e.value.details
    if msg is not None:
        assert msg in e.value.details["errmsg"], e.value.details
    return e.value.details


def indexes(coll):
    return sorted((i["name"], tuple(i["key"].items()), bool(i.get("unique")))
                  for i in coll.list_indexes())


def contents(coll):
    return sorted(coll.find({}), key=lambda d: d["_id"])


def check_modes(db, src, tgt):
    """Every combination against a fresh target: src holds SRC."""
    for (m, nm), want in WANT.items():
        db[tgt].delete_many({})  # not drop: a sharded target stays sharded
        db[tgt].insert_many([dict(d) for d in TARGET])
        spec = {"into": tgt, "whenMatched": PIPE if m == "pipeline" else m,
                "whenNotMatched": nm}
        run = lambda: list(db[src].aggregate([{"$sort": {"_id": 1}}, {"$merge": spec}]))
        if isinstance(want, int):
            fails(run, want)
            if want == 51181:
                assert contents(db[tgt]) == sorted(TARGET, key=lambda d: d["_id"])
        else:
            assert run() == []
            assert contents(db[tgt]) == sorted(want, key=lambda d: d["_id"]), (m, nm)


def check_merge_on(db, src, tgt):
    """`on` other than _id: needs a unique index on exactly those fields (51183)."""
    db[tgt].drop()
    db[tgt].insert_many([{"_id": 100, "k": "a", "w": 1}])
    spec = {"into": tgt, "on": "k", "whenMatched": "merge", "whenNotMatched": "insert"}
    pipe = [{"$project": {"_id": 0, "k": 1, "v": 1}}, {"$merge": spec}]
    fails(lambda: list(db[src].aggregate(pipe)), 51183,
          "Cannot find index to verify that join fields will be unique")
    db[tgt].create_index("k")  # not unique: still refused
    fails(lambda: list(db[src].aggregate(pipe)), 51183)
    db[tgt].drop_indexes()
    db[tgt].create_index("k", unique=True)
    assert list(db[src].aggregate(pipe)) == []
    got = {d["k"]: d for d in db[tgt].find({}, {"_id": 0})}
    assert got == {"a": {"k": "a", "v": 10, "w": 1}, "b": {"k": "b", "v": 20},
                   "c": {"k": "c", "v": 30}}
    # an `on` value missing from an output document
    fails(lambda: list(db[src].aggregate([{"$project": {"k": 0}}, {"$merge": spec}])), 51132)


def check_out(db, src, tgt):
    """$out replaces the target with its indexes kept; creates a missing one."""
    db[tgt].drop()
    db.create_collection(tgt, collation={"locale": "en", "strength": 2})
    db[tgt].insert_many([{"_id": i, "x": i, "v": 100 + i} for i in range(5)])
    db[tgt].create_index("x")
    db[tgt].create_index("v", unique=True, name="v_unique")
    before = indexes(db[tgt])
    assert list(db[src].aggregate([{"$match": {"v": {"$gte": 20}}}, {"$out": tgt}])) == []
    assert contents(db[tgt]) == SRC[1:]
    assert indexes(db[tgt]) == before
    # the target's options are kept
    (opts,) = [x["options"] for x in db.list_collections() if x["name"] == tgt]
    assert opts["collation"]["locale"] == "en" and opts["collation"]["strength"] == 2, opts
    assert not [n for n in db.list_collection_names() if n.startswith("tmp.agg_out")]
    # a unique index of the target refuses the output: the target is left as it was
    fails(lambda: list(db[src].aggregate([{"$set": {"v": 1}}, {"$out": tgt}])), 11000)
    assert contents(db[tgt]) == SRC[1:]
    assert not [n for n in db.list_collection_names() if n.startswith("tmp.agg_out")]
    # a new target, object form
    db.fresh.drop()
    list(db[src].aggregate([{"$out": {"db": db.name, "coll": "fresh"}}]))
    assert contents(db.fresh) == SRC
    # an empty result still replaces (an empty collection)
    list(db[src].aggregate([{"$match": {"nothing": 1}}, {"$out": "fresh"}]))
    assert "fresh" in db.list_collection_names() and db.fresh.count_documents({}) == 0


def check_refusals(db, src):
    agg = lambda p: list(db[src].aggregate(p))
    fails(lambda: agg([{"$out": "o"}, {"$match": {}}]), 40601,
          "$out can only be the final stage in the pipeline")
    fails(lambda: agg([{"$merge": {"into": "o"}}, {"$match": {}}]), 40601)
    fails(lambda: agg([{"$out": 1}]), 16990)
    # a writing stage under readConcern linearizable: InvalidOptions, as MongoDB (its
    # message, not stripedb's refusal of linearizable reads)
    for stage, name in (({"$out": "o"}, "$out"), ({"$merge": "o"}, "$merge")):
        fails(lambda: db.command("aggregate", src, pipeline=[stage], cursor={},
                                 readConcern={"level": "linearizable"}), 72,
              f"{name} cannot be used with a 'linearizable' read concern level")
    fails(lambda: agg([{"$out": {"coll": "o"}}]), 40414)
    fails(lambda: agg([{"$out": "system.x"}]), 17385)
    fails(lambda: agg([{"$out": {"db": "admin", "coll": "x"}}]), 31321)
    fails(lambda: agg([{"$merge": 1}]), 51182)
    fails(lambda: agg([{"$merge": {"on": "_id"}}]), 40414)
    fails(lambda: agg([{"$merge": {"into": "o", "bogus": 1}}]), 40415)
    fails(lambda: agg([{"$merge": {"into": "o", "whenMatched": "nope"}}]), 2)
    fails(lambda: agg([{"$merge": {"into": "o", "whenMatched": 5}}]), 51191)
    fails(lambda: agg([{"$merge": {"into": "o", "on": []}}]), 51187)
    fails(lambda: agg([{"$merge": {"into": "o", "on": 1}}]), 51186)
    fails(lambda: agg([{"$merge": {"into": "o", "let": {"a": 1}}}]), 51199)
    fails(lambda: agg([{"$merge": {"into": "o", "whenMatched": [], "let": {"new": 1}}}]), 51273)
    fails(lambda: agg([{"$merge": {"into": "o", "whenMatched": "fail",
                                   "whenNotMatched": "discard"}}]), 51181)
    fails(lambda: agg([{"$facet": {"f": [{"$out": "o"}]}}]), 40600)
    fails(lambda: agg([{"$lookup": {"from": "o", "pipeline": [{"$merge": {"into": "x"}}],
                                    "as": "l"}}]), 51047)
    fails(lambda: agg([{"$unionWith": {"coll": "o", "pipeline": [{"$out": "x"}]}}]), 31441)
    db.create_collection("view_t", viewOn=src, pipeline=[])
    fails(lambda: agg([{"$out": "view_t"}]), 166)
    fails(lambda: agg([{"$merge": "view_t"}]), 166)


def check_validation(db, src):
    """A target's validator applies to what $out/$merge write (121), unless
    bypassDocumentValidation; $out keeps the validator."""
    db.val.drop()
    db.create_collection("val", validator={"v": {"$lt": 5}})  # every output fails it
    db.val.insert_one({"_id": "keep", "v": 1})
    for stage in ({"$out": "val"}, {"$merge": "val"}):
        fails(lambda: list(db[src].aggregate([stage])), 121)
    assert contents(db.val) == [{"_id": "keep", "v": 1}]
    for stage in ({"$merge": "val"}, {"$out": "val"}):
        r = db.command("aggregate", src, pipeline=[stage], cursor={},
                       bypassDocumentValidation=True)
        assert r["cursor"]["firstBatch"] == []
    assert contents(db.val) == SRC
    opts = [x["options"] for x in db.list_collections() if x["name"] == "val"]
    assert opts == [{"validator": {"v": {"$lt": 5}}}], opts
    db.val.drop()


def check_all(db):
    db.src.insert_many([dict(d) for d in SRC])
    check_validation(db, "src")
    check_modes(db, "src", "tgt")
    check_merge_on(db, "src", "tgt2")
    check_out(db, "src", "outc")
    check_refusals(db, "src")
    # explain shows the pipeline before the stage and writes nothing
    for stage in ({"$out": "never"}, {"$merge": "never"}):
        r = db.command("explain", {"aggregate": "src", "pipeline": [{"$match": {"v": 10}},
                                                                     stage], "cursor": {}})
        assert r["ok"] == 1
    assert "never" not in db.list_collection_names()
    # $merge into the source itself (allowed since 4.4), default modes: merge / insert
    list(db.src.aggregate([{"$project": {"w": {"$multiply": ["$v", 2]}}},
                           {"$merge": "src"}]))
    assert [d["w"] for d in contents(db.src)] == [20, 40, 60]


def test_on_a_shard(shard):
    _, port = shard
    with pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true") as c:
        check_all(c.om)
        # the writes are ordinary replicated writes: in the oplog
        ops = [e for e in c.local["oplog.rs"].find({"ns": "om.tgt"})]
        assert ops and {e["op"] for e in ops} <= {"i", "u", "d", "c"}
        assert c.admin.command("stripedbCheck")["nProblems"] == 0
        # writeConcern and bypassDocumentValidation are accepted
        r = c.om.command("aggregate", "src", pipeline=[{"$merge": "wc"}], cursor={},
                         writeConcern={"w": 1}, bypassDocumentValidation=True)
        assert r["cursor"]["firstBatch"] == [] and r["cursor"]["id"] == 0
        assert c.om.wc.count_documents({}) == 3
        # a writeConcern the one-member set cannot satisfy: written, writeConcernError
        for stage in ({"$merge": "wc2"}, {"$out": "wc3"}):
            r = c.om.command("aggregate", "src", pipeline=[stage], cursor={},
                             writeConcern={"w": 5})
            assert r["writeConcernError"]["code"] == 100, r
        assert c.om.wc2.count_documents({}) == 3 and c.om.wc3.count_documents({}) == 3


def test_in_a_transaction_is_refused(start_role, tmp_path):
    procs, wires, uri = start_set(start_role, tmp_path, n=1)
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=20000) as c:
        c.t.src.insert_many([dict(d) for d in SRC])
        for stage, name in (({"$out": "o"}, "$out"), ({"$merge": "o"}, "$merge")):
            with c.start_session() as s:
                s.start_transaction()
                fails(lambda: list(c.t.src.aggregate([stage], session=s)), 263,
                      f"{name} cannot be used in a transaction")
                s.abort_transaction()


def test_a_replica_set_secondary_sees_the_results(start_role, tmp_path):
    procs, wires, uri = start_set(start_role, tmp_path)
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=20000) as c:
        c.app.src.insert_many([dict(d) for d in SRC])
        c.app.tgt.insert_many([dict(d) for d in TARGET])
        c.app.outc.insert_one({"_id": "old"})
        c.app.outc.create_index("v")
        list(c.app.src.aggregate([{"$merge": {"into": "tgt", "whenMatched": "replace"}}]))
        list(c.app.src.aggregate([{"$out": "outc"}]))
        want_tgt = contents(c.app.tgt)
        want_out = contents(c.app.outc)
        assert want_out == SRC
    p = primary_index(wires)
    for i, port in enumerate(wires):
        with direct(port) as m:
            wait_until(lambda: contents(m.app.tgt) == want_tgt and
                       contents(m.app.outc) == want_out,
                       what=f"$merge/$out applied on member {port}")
            assert indexes(m.app.outc) == [("_id_", (("_id", 1),), False),
                                           ("v_1", (("v", 1),), False)]
            assert m.admin.command("stripedbCheck")["nProblems"] == 0
            if i != p:
                # a secondary does not write: NotWritablePrimary, nothing written
                for stage in ({"$merge": "x"}, {"$out": "x"}):
                    with direct(port) as m2:  # a client per error: it forgets the server
                        with pytest.raises(pymongo.errors.AutoReconnect) as e:
                            list(m2.app.src.aggregate([stage]))
                        assert "NotWritablePrimary" in str(e.value), str(e.value)
                with direct(port) as m2:
                    assert "x" not in m2.app.list_collection_names()


def test_through_a_proxy_to_unsharded_targets(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    try:
        check_all(cl.proxy_client(0).pom)
        # the writes went to the database's primary shard
        assert cl.shard_client("shard-a").pom.tgt.count_documents({}) > 0
        # in a transaction: refused (263)
        p = cl.proxy_client(0)
        for stage, name in (({"$out": "o"}, "$out"), ({"$merge": "o"}, "$merge")):
            with p.start_session() as s:
                s.start_transaction()
                fails(lambda: list(p.pom.src.aggregate([stage], session=s)), 263,
                      f"{name} cannot be used in a transaction")
                s.abort_transaction()
    finally:
        cl.close()


def test_through_a_proxy_from_a_sharded_source(start_role, tmp_path):
    """The proxy runs the pipeline over every shard and writes the output itself."""
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    try:
        cl.shard_collection("psh.src", {"_id": 1}, split_points=[{"_id": 2}])
        db = cl.proxy_client(0).psh
        db.src.insert_many([dict(d) for d in SRC])
        check_modes(db, "src", "tgt")
        check_merge_on(db, "src", "tgt2")
        check_out(db, "src", "outc")
        # the unsharded targets live on the database's primary shard, not on shard-b
        # (which holds the empty copy a broadcast createIndexes leaves)
        a, b = cl.shard_client("shard-a").psh, cl.shard_client("shard-b").psh
        assert a.outc.count_documents({}) == 2 and b.outc.count_documents({}) == 0
        assert a.tgt.count_documents({}) == 3  # the last combination (51181) left TARGET
        # into a sharded target: routed writes; $out refused (28769)
        cl.shard_collection("psh.stgt", {"_id": 1}, split_points=[{"_id": 2}])
        check_modes(db, "src", "stgt")
        assert a.stgt.count_documents({}) + b.stgt.count_documents({}) == 3
        assert b.stgt.count_documents({}) > 0 and a.stgt.count_documents({}) > 0
        fails(lambda: list(db.src.aggregate([{"$out": "stgt"}])), 28769,
              "psh.stgt cannot be sharded")
        assert db.stgt.count_documents({}) == 3
        # a target sharded on another field: `on` defaults to its document key {k, _id}
        cl.shard_collection("psh.kt", {"k": 1}, split_points=[{"k": "b"}])
        db.kt.insert_one({"_id": 1, "k": "a", "v": 0, "old": True})
        list(db.src.aggregate([{"$merge": {"into": "kt", "whenMatched": "merge"}}]))
        assert contents(db.kt) == [{"_id": 1, "k": "a", "v": 10, "old": True},
                                   {"_id": 2, "k": "b", "v": 20}, {"_id": 3, "k": "c", "v": 30}]
        assert b.kt.count_documents({}) == 2
        # the client's writeConcern reaches the writes the proxy makes
        for stage in ({"$merge": "stgt"}, {"$merge": "wcp"}, {"$out": "wco"}):
            r = db.command("aggregate", "src", pipeline=[stage], cursor={},
                           writeConcern={"w": 5})
            # 64 when several shard commands reported one (mongos' merged form)
            assert r["writeConcernError"]["code"] in (64, 100), (stage, r)
        assert db.wcp.count_documents({}) == 3 and db.wco.count_documents({}) == 3
    finally:
        cl.close()


def test_through_a_proxy_to_another_primary_shard(start_role, tmp_path):
    """Source and target unsharded, in databases whose primary shards differ."""
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    try:
        p = cl.proxy_client(0)
        assert p.admin.command("enableSharding", "onb", primaryShard="shard-b")["ok"] == 1
        p.ona.src.insert_many([dict(d) for d in SRC])  # `ona`: primary shard-a
        p.onb.t.insert_many([dict(d) for d in TARGET])
        p.onb.t.create_index("v")
        list(p.ona.src.aggregate([{"$merge": {"into": {"db": "onb", "coll": "t"},
                                              "whenMatched": "replace"}}]))
        assert contents(p.onb.t) == sorted(WANT[("replace", "insert")], key=lambda d: d["_id"])
        b = cl.shard_client("shard-b")
        assert b.onb.t.count_documents({}) == 4
        list(p.ona.src.aggregate([{"$match": {"v": {"$gt": 10}}},
                                  {"$out": {"db": "onb", "coll": "t"}}]))
        assert contents(b.onb.t) == SRC[1:]
        assert indexes(b.onb.t) == [("_id_", (("_id", 1),), False), ("v_1", (("v", 1),), False)]
        assert cl.shard_client("shard-a").onb.t.count_documents({}) == 0
    finally:
        cl.close()


def _set_behind_proxy(start_role, tmp_path):
    """A 3-member shard set behind a proxy: (procs, wires, proxy uri)."""
    from conftest import free_port
    from metadata_cluster import Cluster
    procs, wires, rs_uri = start_set(start_role, tmp_path)
    meta = Cluster(start_role, tmp_path, 1)
    meta.leader()
    meta.write({"addShard": "shard-a", "uri": rs_uri})
    port = free_port()
    start_role(["--role=proxy", f"--listen=127.0.0.1:{port}", f"--metadata={meta.seeds()}"])
    uri = f"mongodb://127.0.0.1:{port}/"
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=20000) as c:
        wait_until(lambda: c.app.warm.insert_one({}), 30, what="a first write through the proxy")
    return procs, wires, uri


def test_merge_through_a_proxy_is_never_applied_twice_on_a_failover(start_role, tmp_path):
    """The shard writes $merge's output in batches, each committed before the next; a
    leadership transfer between two batches must not make the proxy resend the aggregate
    (mongos: kNoRetry for a writing pipeline) nor the shard answer "not executed": every
    document is incremented at most once; ok:1 means exactly once, an error a prefix."""
    n = 20000
    procs, wires, uri = _set_behind_proxy(start_role, tmp_path)
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=20000, socketTimeoutMS=120000,
                             retryReads=False, retryWrites=False) as c:
        for lo in range(0, n, 5000):
            c.app.src.insert_many([{"_id": i, "v": 1} for i in range(lo, lo + 5000)])
            c.app.tgt.insert_many([{"_id": i, "v": 0} for i in range(lo, lo + 5000)])
        outcome = {}

        def run():
            try:
                list(c.app.src.aggregate([
                    {"$sort": {"_id": 1}},
                    {"$merge": {"into": "tgt", "whenMatched": PIPE, "whenNotMatched": "insert"}}]))
                outcome["ok"] = True
            except pymongo.errors.PyMongoError as e:
                outcome["error"] = e
        old = primary_index(wires)
        t = threading.Thread(target=run)
        with direct(wires[old]) as m:
            t.start()
            # transfer once some batches are committed
            wait_until(lambda: m.app.tgt.find_one({"v": {"$gte": 1}}), 60, interval=0.01,
                       what="a first batch of the $merge committed")
            target = (old + 1) % 3 + 1
            try:
                m.admin.command({"transferLeadership": target})
            except (OperationFailure, pymongo.errors.AutoReconnect):
                pass
        t.join(180)
        assert not t.is_alive()
        wait_until(lambda: primary_index(wires) is not None, 30, what="a primary")
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=20000) as c:
        docs = wait_until(lambda: list(c.app.tgt.find({}, sort=[("_id", 1)])), 30,
                          what="reading the target")
    assert len(docs) == n
    twice = [d["_id"] for d in docs if d["v"] > 1]
    assert not twice, f"{len(twice)} documents incremented twice ({outcome})"
    done = [d["_id"] for d in docs if d["v"] == 1]
    if outcome.get("ok"):
        assert len(done) == n, f"ok:1 but {n - len(done)} documents not incremented"
    else:
        err = outcome["error"]
        # the shard wrote in _id order: what was applied is a prefix
        assert done == list(range(len(done))), (err, len(done))
        if isinstance(err, OperationFailure):
            # the shard's state-change code, passed on masked as HostUnreachable (a
            # shard's state-change error is not the proxy's: test_proxy_state_change.py)
            assert err.code == 6, err.details
            assert any(f"({k}) from a shard" in err.details.get("errmsg", "")
                       for k in (11602, 10107, 13435, 189, 91)), err.details


def _out_while_target_changes(client, db, change, n=20000, prepare=None):
    """Run a $out of n documents into db.outx while change(db) runs once the temporary
    collection exists; return the aggregate's outcome (None or the OperationFailure)."""
    db.outx.drop()
    db.big.drop()
    if prepare:
        prepare()
    db.outx.insert_one({"_id": "old"})
    for lo in range(0, n, 5000):
        db.big.insert_many([{"_id": i, "v": i} for i in range(lo, lo + 5000)])
    outcome = {}

    def run():
        try:
            list(db.big.aggregate([{"$out": "outx"}]))
            outcome["ok"] = True
        except OperationFailure as e:
            outcome["error"] = e
    t = threading.Thread(target=run)
    t.start()
    wait_until(lambda: any(n.startswith("tmp.agg_out.") for n in db.list_collection_names()),
               60, interval=0.005, what="the temporary collection of $out")
    change(db)
    t.join(120)
    assert not t.is_alive()
    return outcome


def _check_out_refused_on_change(db, prepare=None):
    for i, change in enumerate((
            lambda d: d.outx.create_index("late"),
            lambda d: d.command("collMod", "outx", validator={"x": {"$exists": False}}))):
        outcome = _out_while_target_changes(db.client, db, change, prepare=prepare)
        assert "error" in outcome, "the $out finished before the target changed"
        e = outcome["error"]
        assert e.code == 125, e.details
        assert "changed during processing" in e.details["errmsg"], e.details
        assert f"{db.name}.outx" in e.details["errmsg"], e.details
        # the target is as it was (the new index kept), no temporary collection is left
        assert contents(db.outx) == [{"_id": "old"}]
        assert not [n for n in db.list_collection_names() if n.startswith("tmp.agg_out.")]
        if i == 0:
            assert "late_1" in [x["name"] for x in db.outx.list_indexes()]
    # unchanged (its index kept): it replaces the target
    db.outx.create_index("late")
    list(db.big.aggregate([{"$limit": 10}, {"$out": "outx"}]))
    assert db.outx.count_documents({}) == 10
    assert "late_1" in [x["name"] for x in db.outx.list_indexes()]


def test_out_fails_when_the_target_changes_while_it_runs_on_a_shard(shard):
    _, port = shard
    with pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true") as c:
        _check_out_refused_on_change(c.om)


def test_out_through_a_proxy_checks_the_target_before_and_at_the_rename(start_role, tmp_path):
    """The proxy writes $out (a sharded source): into a view 166 naming the target (no
    temporary view), and 125 when the target's indexes or options change meanwhile."""
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    try:
        cl.shard_collection("psh.big", {"_id": 1}, split_points=[{"_id": 10000}])
        db = cl.proxy_client(0).psh
        db.big.insert_one({"_id": -1})
        db.create_collection("v", viewOn="big", pipeline=[])
        e = fails(lambda: list(db.big.aggregate([{"$out": "v"}])), 166)
        assert "psh.v is a view" in e["errmsg"] and "tmp." not in e["errmsg"], e
        a = cl.shard_client("shard-a").psh
        assert not [n for n in a.list_collection_names() if n.startswith("tmp.")]
        _check_out_refused_on_change(db, prepare=lambda: cl.shard_collection(
            "psh.big", {"_id": 1}, split_points=[{"_id": 10000}]))
        assert cl.shard_client("shard-b").psh.big.count_documents({}) > 0
    finally:
        cl.close()


def test_leftover_temporary_collection_is_dropped_when_a_primary_starts(shard):
    """SIGKILL during a large $out leaves `tmp.agg_out.*`; the restarted member drops it
    when it becomes primary (mongod's dropTempCollections), through the oplog."""
    proc, port = shard
    uri = f"mongodb://127.0.0.1:{port}/?directConnection=true"
    c = pymongo.MongoClient(uri, socketTimeoutMS=60000)
    db = c.om
    db.outk.insert_one({"_id": "old"})
    for lo in range(0, 20000, 5000):
        db.big.insert_many([{"_id": i, "v": i} for i in range(lo, lo + 5000)])

    def run():
        try:
            list(db.big.aggregate([{"$out": "outk"}]))
        except pymongo.errors.PyMongoError:
            pass
    t = threading.Thread(target=run)
    t.start()

    def tmp_with_docs():
        names = [n for n in db.list_collection_names() if n.startswith("tmp.agg_out.")]
        return names and db[names[0]].estimated_document_count() > 0 and names
    tmps = wait_until(tmp_with_docs, 60, interval=0.005, what="the temporary collection filled")
    proc.p.kill()
    proc.p.wait(timeout=10)
    t.join(60)
    c.close()
    proc.log.close()
    proc.restart().wait_healthy()
    with pymongo.MongoClient(uri) as c2:
        wait_until(lambda: not [n for n in c2.om.list_collection_names()
                                if n.startswith("tmp.agg_out.")], 30,
                   what="the leftover temporary collection dropped")
        assert contents(c2.om.outk) == [{"_id": "old"}]
        drops = [e for e in c2.local["oplog.rs"].find({"op": "c", "o.drop": tmps[0]})]
        assert drops, "the drop is a replicated write (in the oplog)"
        # a new $out works
        list(c2.om.big.aggregate([{"$limit": 3}, {"$out": "outk"}]))
        assert c2.om.outk.count_documents({}) == 3
        # a dropped temporary collection does not come back implicitly under a later
        # insert (a proxy writing an $out's output across a change of primary): 26, so
        # that $out fails instead of renaming an incomplete output over its target
        with pytest.raises(pymongo.errors.OperationFailure) as e:
            c2.om[tmps[0]].insert_one({"_id": 1})
        assert e.value.code == 26, e.value.details
        assert tmps[0] not in c2.om.list_collection_names()
        c2.om.create_collection(tmps[0])  # created explicitly (as $out does): writable
        c2.om[tmps[0]].insert_one({"_id": 1})
        c2.om.drop_collection(tmps[0])


def check_merge_sees_command_let(db):
    db.lsrc.drop()
    db.ltgt.drop()
    db.lsrc.insert_many([{"_id": 1, "v": 10}, {"_id": 2, "v": 20}])
    db.ltgt.insert_many([{"_id": 1}, {"_id": 2}])
    db.command("aggregate", "lsrc", let={"inc": 5}, cursor={}, pipeline=[{"$merge": {
        "into": "ltgt", "let": {"a": {"$add": ["$v", "$$inc"]}},
        "whenMatched": [{"$set": {"w": "$$a"}}], "whenNotMatched": "discard"}}])
    assert contents(db.ltgt) == [{"_id": 1, "w": 15}, {"_id": 2, "w": 25}]
    # without $merge's let: the command's variables and $$new
    db.command("aggregate", "lsrc", let={"inc": 5}, cursor={}, pipeline=[{"$merge": {
        "into": "ltgt", "whenMatched": [{"$set": {"z": {"$add": ["$$new.v", "$$inc"]}}}],
        "whenNotMatched": "discard"}}])
    assert contents(db.ltgt) == [{"_id": 1, "w": 15, "z": 15}, {"_id": 2, "w": 25, "z": 25}]


def test_merge_sees_the_commands_let(shard, start_role, tmp_path):
    _, port = shard
    with pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true") as c:
        check_merge_sees_command_let(c.om)
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    try:
        db = cl.proxy_client(0).psh
        check_merge_sees_command_let(db)  # the whole aggregate forwarded to one shard
        cl.shard_collection("psh.lsrc2", {"_id": 1}, split_points=[{"_id": 2}])
        db.lsrc2.insert_many([{"_id": 1, "v": 10}, {"_id": 2, "v": 20}])
        db.ltgt.delete_many({})
        db.ltgt.insert_many([{"_id": 1}, {"_id": 2}])
        db.command("aggregate", "lsrc2", let={"inc": 5}, cursor={}, pipeline=[{"$merge": {
            "into": "ltgt", "let": {"a": {"$add": ["$v", "$$inc"]}},
            "whenMatched": [{"$set": {"w": "$$a", "z": "$$inc"}}],
            "whenNotMatched": "discard"}}])
        assert contents(db.ltgt) == [{"_id": 1, "w": 15, "z": 5}, {"_id": 2, "w": 25, "z": 5}]
    finally:
        cl.close()
