"""Change streams on the shard (issue #20): pymongo's watch() against 1- and 3-member shard
sets, raw aggregate/getMore replies (postBatchResumeToken), appendOplogNote, resume after a
token and after the primary's SIGKILL (no event lost, none duplicated), and MongoDB 6.0's
errors. The contract with the proxy: common/changestream.h, src/shard/README.md
"Change streams"."""
import signal
import threading
import time

import pymongo
import pytest
from bson import MaxKey, MinKey, Timestamp
from pymongo.errors import OperationFailure, PyMongoError

from conftest import wait_until
from test_shard_replset import direct, primary_index, start_set


def client(uri):
    return pymongo.MongoClient(uri, serverSelectionTimeoutMS=20000)


def token_ts(tok):
    """(secs, inc) of a resume token of ours (common/changestream.h)."""
    raw = bytes.fromhex(tok["_data"])
    assert raw[0] == 1
    ts = int.from_bytes(raw[1:9], "big")
    return ts >> 32, ts & 0xFFFFFFFF


def token_kind(tok):
    return bytes.fromhex(tok["_data"])[9]


def uuid_bytes(v):
    """The 16 bytes of a UUID decoded as uuid.UUID or as Binary subtype 4."""
    return v.bytes if hasattr(v, "bytes") else bytes(v)


def strip(ev):
    """An event without the fields whose values depend on time."""
    return {k: v for k, v in ev.items() if k not in ("_id", "clusterTime", "wallTime")}


def fail_code(fn):
    with pytest.raises(OperationFailure) as e:
        fn()
    return e.value.code, str(e.value)


@pytest.fixture
def one(start_role, tmp_path):
    procs, wires, uri = start_set(start_role, tmp_path, n=1)
    with client(uri) as c:
        yield c


def test_crud_events_have_mongodb_shapes(one):
    c = one
    db = c.app
    db.c.insert_one({"_id": 0, "before": True})
    with db.c.watch(max_await_time_ms=300) as s:
        db.c.insert_one({"_id": 1, "a": 1})
        db.c.update_one({"_id": 1}, {"$set": {"a": 2}})
        db.c.replace_one({"_id": 1}, {"b": 1})
        db.c.delete_one({"_id": 1})
        db.other.insert_one({"_id": 9})  # another collection: not in this stream
        evs = [s.next() for _ in range(4)]
        assert s.try_next() is None
    assert [e["operationType"] for e in evs[:1]] == ["insert"]
    assert strip(evs[0]) == {"operationType": "insert", "fullDocument": {"_id": 1, "a": 1},
                             "ns": {"db": "app", "coll": "c"}, "documentKey": {"_id": 1}}
    # a modifier update's entry has updateDescription: an update event without the
    # document; a replacement's has none: a replace with the new document
    assert strip(evs[1]) == {"operationType": "update", "ns": {"db": "app", "coll": "c"},
                             "documentKey": {"_id": 1},
                             "updateDescription": {"updatedFields": {"a": 2},
                                                   "removedFields": [],
                                                   "truncatedArrays": []}}
    # retryable writes (pymongo sends lsid and txnNumber) are not transactions: no lsid
    assert all("lsid" not in e and "txnNumber" not in e for e in evs)
    assert strip(evs[2]) == {"operationType": "replace", "fullDocument": {"_id": 1, "b": 1},
                             "ns": {"db": "app", "coll": "c"}, "documentKey": {"_id": 1}}
    assert strip(evs[3]) == {"operationType": "delete", "ns": {"db": "app", "coll": "c"},
                             "documentKey": {"_id": 1}}
    # clusterTime is the entry's ts, the token carries it; tokens increase
    for e in evs:
        assert isinstance(e["clusterTime"], Timestamp)
        assert token_ts(e["_id"]) == (e["clusterTime"].time, e["clusterTime"].inc)
        assert token_kind(e["_id"]) == 0
    assert [token_ts(e["_id"]) for e in evs] == sorted(token_ts(e["_id"]) for e in evs)
    # the oplog says the same
    ts = [e["clusterTime"] for e in evs]
    ops = [x["op"] for x in c.local["oplog.rs"].find({"ts": {"$in": ts}})]
    assert ops == ["i", "u", "u", "d"]


def test_post_batch_resume_token_on_every_reply(one):
    db = one.app
    db.c.insert_one({"_id": 1})
    r = db.command("aggregate", "c", pipeline=[{"$changeStream": {}}], cursor={})
    cur = r["cursor"]
    assert cur["firstBatch"] == [] and cur["id"] != 0 and cur["ns"] == "app.c"
    pbrt0 = cur["postBatchResumeToken"]
    assert token_kind(pbrt0) == 2  # a high-water mark: nothing newer yet
    last = one.local["oplog.rs"].find_one(sort=[("$natural", -1)])["ts"]
    assert token_ts(pbrt0) == (last.time, last.inc)
    db.c.insert_one({"_id": 2})
    g = db.command("getMore", cur["id"], collection="c", maxTimeMS=2000)["cursor"]
    assert [e["documentKey"] for e in g["nextBatch"]] == [{"_id": 2}]
    assert token_kind(g["postBatchResumeToken"]) == 2
    assert token_ts(g["postBatchResumeToken"]) == token_ts(g["nextBatch"][0]["_id"])
    # nothing new: the getMore waits for maxTimeMS, then answers an empty batch
    t0 = time.monotonic()
    g2 = db.command("getMore", cur["id"], collection="c", maxTimeMS=400)["cursor"]
    assert g2["nextBatch"] == [] and 0.3 < time.monotonic() - t0 < 5
    assert g2["postBatchResumeToken"] == g["postBatchResumeToken"]
    # appendOplogNote moves the watermark of an idle stream past maxClusterTime
    tsn = Timestamp(last.time + 100, 7)
    one.admin.command("appendOplogNote", data={"why": "test"}, maxClusterTime=tsn)
    g3 = db.command("getMore", cur["id"], collection="c", maxTimeMS=2000)["cursor"]
    assert g3["nextBatch"] == []
    assert token_ts(g3["postBatchResumeToken"]) > (tsn.time, tsn.inc)
    # a batch cut by batchSize reports the last event returned (here as the high-water
    # mark at its ts: each insert is its own entry, so every event up to it was returned)
    db.c.insert_many([{"_id": 10 + i} for i in range(5)])
    g4 = db.command("getMore", cur["id"], collection="c", batchSize=2)["cursor"]
    assert [e["documentKey"]["_id"] for e in g4["nextBatch"]] == [10, 11]
    assert token_ts(g4["postBatchResumeToken"]) == token_ts(g4["nextBatch"][-1]["_id"])
    g5 = db.command("getMore", cur["id"], collection="c")["cursor"]
    assert [e["documentKey"]["_id"] for e in g5["nextBatch"]] == [12, 13, 14]
    assert token_kind(g5["postBatchResumeToken"]) == 2
    db.command("killCursors", "c", cursors=[cur["id"]])


def test_append_oplog_note(one):
    adm = one.admin
    one.app.c.insert_one({"_id": 0})
    last = one.local["oplog.rs"].find_one(sort=[("$natural", -1)])["ts"]
    assert adm.command("appendOplogNote", data={"a": 1})["ok"] == 1
    e = one.local["oplog.rs"].find_one(sort=[("$natural", -1)])
    assert e["op"] == "n" and e["ns"] == "" and e["o"] == {"a": 1} and e["ts"] > last
    # above maxClusterTime
    floor = Timestamp(e["ts"].time + 50, 3)
    adm.command("appendOplogNote", data={"b": 1}, maxClusterTime=floor)
    e2 = one.local["oplog.rs"].find_one(sort=[("$natural", -1)])
    assert e2["o"] == {"b": 1} and e2["ts"] > floor
    # the newest ts already above: nothing written, ok
    adm.command("appendOplogNote", data={"c": 1}, maxClusterTime=Timestamp(1, 1))
    assert one.local["oplog.rs"].find_one(sort=[("$natural", -1)])["ts"] == e2["ts"]
    # later writes keep increasing ts
    one.app.c.insert_one({"_id": 1})
    assert one.local["oplog.rs"].find_one(sort=[("$natural", -1)])["ts"] > e2["ts"]
    # no-ops are not events, and the integrity check ignores them
    assert adm.command("stripedbCheck")["nProblems"] == 0
    code, _ = fail_code(lambda: adm.command("appendOplogNote"))
    assert code == 4
    code, _ = fail_code(lambda: adm.command("appendOplogNote", data="x"))
    assert code == 14
    code, _ = fail_code(lambda: adm.command("appendOplogNote", data={}, maxClusterTime=5))
    assert code == 14
    code, _ = fail_code(lambda: one.app.command("appendOplogNote", data={}))
    assert code == 13
    code, _ = fail_code(lambda: adm.command("appendOplogNote", data={},
                                            maxClusterTime=Timestamp(4000000000, 1)))
    assert code == 2


def test_update_lookup_resume_and_start_points(one):
    db = one.app
    with db.c.watch(full_document="updateLookup", max_await_time_ms=300) as s:
        db.c.insert_one({"_id": 1, "v": 0})
        db.c.update_one({"_id": 1}, {"$inc": {"v": 1}})
        db.c.update_one({"_id": 1}, {"$inc": {"v": 1}})
        db.c.delete_one({"_id": 1})
        evs = [s.next() for _ in range(4)]
    # update events look the document up now (it is gone: null), replaces carry theirs
    for e in evs[1:3]:
        assert e["operationType"] == "update" and e["fullDocument"] is None
        assert e["updateDescription"]["updatedFields"] in ({"v": 1}, {"v": 2})
    assert evs[3]["operationType"] == "delete"
    # resumeAfter / startAfter: the events after the token, exactly
    with db.c.watch(resume_after=evs[1]["_id"], max_await_time_ms=300) as s:
        assert [s.next()["_id"] for _ in range(2)] == [evs[2]["_id"], evs[3]["_id"]]
        assert s.try_next() is None
    with db.c.watch(start_after=evs[0]["_id"], max_await_time_ms=300) as s:
        assert [s.next()["_id"] for _ in range(3)] == [e["_id"] for e in evs[1:]]
    # startAtOperationTime: the events at that time and after
    with db.c.watch(start_at_operation_time=evs[2]["clusterTime"], max_await_time_ms=300) as s:
        assert [s.next()["_id"] for _ in range(2)] == [evs[2]["_id"], evs[3]["_id"]]
    # a token from another shard's stream resumes after its key
    other = {"_data": "01" + format((evs[1]["clusterTime"].time << 32) | evs[1]["clusterTime"].inc, "016X")
             + "00" + "02" + "7A7A" + "00000000"}  # shard "zz" sorts after ours at equal ts
    with db.c.watch(resume_after=other, max_await_time_ms=300) as s:
        assert [s.next()["_id"] for _ in range(2)] == [evs[2]["_id"], evs[3]["_id"]]
    # the lookup reads the current document (at the time the event is produced)
    with db.c.watch(full_document="updateLookup", max_await_time_ms=300) as s:
        db.c.insert_one({"_id": 2, "v": 0})
        db.c.update_one({"_id": 2}, {"$inc": {"v": 1}})
        db.c.update_one({"_id": 2}, {"$set": {"w": 1}})
        assert s.next()["fullDocument"] == {"_id": 2, "v": 0}
        assert s.next()["fullDocument"] == {"_id": 2, "v": 1, "w": 1}
        assert s.next()["fullDocument"] == {"_id": 2, "v": 1, "w": 1}


def test_database_and_cluster_streams_ddl_and_invalidate(one):
    c = one
    c.app.c.insert_one({"_id": 0})
    c.app.d.insert_one({"_id": 0})
    with c.app.c.watch(max_await_time_ms=300) as coll_s, \
            c.app.watch(max_await_time_ms=300) as db_s, \
            c.watch(max_await_time_ms=300) as all_s:
        c.app.d.insert_one({"_id": 1})
        c.other.x.insert_one({"_id": 2})
        c.admin.command("renameCollection", "app.d", to="app.e")
        c.app.c.drop()
        c.other.command("dropDatabase")
        # the collection stream: drop, then invalidate, then the cursor is closed
        drop = coll_s.next()
        assert strip(drop) == {"operationType": "drop", "ns": {"db": "app", "coll": "c"}}
        inv = coll_s.next()
        assert inv["operationType"] == "invalidate" and token_kind(inv["_id"]) == 1
        assert inv["clusterTime"] == drop["clusterTime"]
        with pytest.raises(StopIteration):
            coll_s.next()
        assert not coll_s.alive
        dbev = [strip(db_s.next()) for _ in range(3)]
        assert dbev == [
            {"operationType": "insert", "fullDocument": {"_id": 1},
             "ns": {"db": "app", "coll": "d"}, "documentKey": {"_id": 1}},
            {"operationType": "rename", "ns": {"db": "app", "coll": "d"},
             "to": {"db": "app", "coll": "e"}},
            {"operationType": "drop", "ns": {"db": "app", "coll": "c"}},
        ]
        assert db_s.try_next() is None
        # dropDatabase: each collection's drop, then the database's, as mongod's oplog
        allev = [strip(all_s.next()) for _ in range(6)]
        assert [(e["operationType"], e["ns"]) for e in allev] == [
            ("insert", {"db": "app", "coll": "d"}),
            ("insert", {"db": "other", "coll": "x"}),
            ("rename", {"db": "app", "coll": "d"}),
            ("drop", {"db": "app", "coll": "c"}),
            ("drop", {"db": "other", "coll": "x"}),
            ("dropDatabase", {"db": "other"}),
        ]
        assert all_s.try_next() is None
    # startAfter the invalidate: a new stream on the re-created collection
    with c.app.c.watch(start_after=inv["_id"], max_await_time_ms=300) as s:
        c.app.c.insert_one({"_id": 7})
        assert s.next()["documentKey"] == {"_id": 7}
    # resumeAfter an invalidate is refused as mongod does
    code, _ = fail_code(lambda: c.app.c.watch(resume_after=inv["_id"]))
    assert code == 260
    # resumeAfter the drop: the invalidate again, then the end
    with c.app.c.watch(resume_after=drop["_id"], max_await_time_ms=300) as s:
        assert s.next()["operationType"] == "invalidate"


def test_transactions_migration_copies_and_document_key(one):
    c = one
    db = c.app
    db.t.insert_one({"_id": 0})
    # filtering metadata for app.s: documentKey gains the shard key
    c.admin.command({"stripedbSetFiltering": "app.s", "key": {"k": 1},
                     "chunks": [{"id": "1", "min": {"k": MinKey()}, "max": {"k": MaxKey()},
                                 "token": 1}],
                     "collectionVersion": 1})
    with db.watch(max_await_time_ms=300) as s:
        with c.start_session() as sess:
            with sess.start_transaction():
                db.t.insert_one({"_id": 1}, session=sess)
                db.t.update_one({"_id": 0}, {"$set": {"x": 1}}, session=sess)
                db.t.delete_one({"_id": 1}, session=sess)
            lsid = sess.session_id
        # a migration's copy (origin) is no event
        db.command({"insert": "t", "documents": [{"_id": 50}], "$stripedbOrigin": "mig-1"})
        db.s.insert_one({"_id": 5, "k": 3, "y": 1})
        db.s.delete_one({"_id": 5})
        evs = [s.next() for _ in range(5)]
        assert s.try_next() is None
    txn = evs[:3]
    assert [e["operationType"] for e in txn][0::2] == ["insert", "delete"]
    for i, e in enumerate(txn):
        assert uuid_bytes(e["lsid"]["id"]) == uuid_bytes(lsid["id"])
        assert isinstance(e["txnNumber"], int)
        assert int.from_bytes(bytes.fromhex(e["_id"]["_data"])[-4:], "big") == i  # idx
    assert evs[3]["documentKey"] == {"k": 3, "_id": 5}
    assert list(evs[3]["documentKey"].keys()) == ["k", "_id"]
    # a delete's too: its oplog entry's o is the document key, as mongod writes it
    assert evs[4]["operationType"] == "delete"
    assert list(evs[4]["documentKey"].items()) == [("k", 3), ("_id", 5)]
    d = c.local["oplog.rs"].find_one({"op": "d", "ns": "app.s"})
    assert list(d["o"].items()) == [("k", 3), ("_id", 5)]
    assert c.admin.command("stripedbCheck")["nProblems"] == 0


def test_pipeline_after_change_stream(one):
    db = one.app
    with db.c.watch([{"$match": {"operationType": "insert"}},
                     {"$project": {"fullDocument.a": 1, "operationType": 1}}],
                    max_await_time_ms=300) as s:
        db.c.insert_one({"_id": 1, "a": 1, "b": 2})
        db.c.delete_one({"_id": 1})
        db.c.insert_one({"_id": 2, "a": 3})
        e1, e2 = s.next(), s.next()
        assert {k: v for k, v in e1.items() if k != "_id"} == {
            "operationType": "insert", "fullDocument": {"a": 1}}
        assert e2["fullDocument"] == {"a": 3}
        assert s.try_next() is None
    # a pipeline that changes _id fails when the event is produced (280)
    r = db.command("aggregate", "c", pipeline=[{"$changeStream": {}},
                                               {"$project": {"_id": 0}}], cursor={})
    cid = r["cursor"]["id"]
    db.c.insert_one({"_id": 3})
    code, msg = fail_code(lambda: db.command("getMore", cid, collection="c", maxTimeMS=2000))
    assert code == 280 and "modified by the pipeline" in msg
    code, _ = fail_code(lambda: db.command("getMore", cid, collection="c"))
    assert code == 43  # the cursor is gone


@pytest.mark.parametrize("spec,stages,code", [
    ({"fullDocument": "whenAvailable"}, [], 238),
    ({"fullDocument": "required"}, [], 238),
    ({"fullDocumentBeforeChange": "whenAvailable"}, [], 238),
    ({"fullDocumentBeforeChange": "off"}, [], 0),
    ({"fullDocument": "bogus"}, [], 2),
    ({"fullDocument": 1}, [], 14),
    ({"showExpandedEvents": True}, [], 238),
    ({"showExpandedEvents": False}, [], 0),
    ({"bogus": 1}, [], 40415),
    ({"resumeAfter": {"_data": "zz"}}, [], 9),
    ({"resumeAfter": {"x": 1}}, [], 40647),
    ({"resumeAfter": 5}, [], 14),
    ({"startAtOperationTime": 5}, [], 14),
    ({"resumeAfter": {"_data": "01000000010000000102000000000000"[:30]},
      "startAfter": {"_data": "01000000010000000102000000000000"[:30]}}, [], 50865),
    ({"resumeAfter": {"_data": "010000000100000001020000000000"},
      "startAtOperationTime": Timestamp(1, 1)}, [], 40674),
    ({"allChangesForCluster": True}, [], 72),
    ({}, [{"$group": {"_id": 1}}], 20),
    ({}, [{"$limit": 1}], 20),
    ({}, [{"$changeStream": {}}], 40602),
    ({}, [{"$addFields": {"x": 1}}, {"$unset": "x"}, {"$set": {"y": 1}},
          {"$replaceWith": "$$ROOT"}], 0),
])
def test_option_errors(one, spec, stages, code):
    db = one.app
    cmd = {"aggregate": "c", "pipeline": [{"$changeStream": spec}] + stages, "cursor": {}}
    if code == 0:
        r = db.command(cmd)
        db.command("killCursors", "c", cursors=[r["cursor"]["id"]])
    else:
        got, _ = fail_code(lambda: db.command(cmd))
        assert got == code


def test_namespace_errors(one):
    c = one
    c.app.command("create", "v", viewOn="c", pipeline=[])
    cases = [
        (c.app, {"aggregate": "v"}, 166),
        (c.app, {"aggregate": "system.views"}, 73),
        (c.admin, {"aggregate": 1}, 73),
        (c.admin, {"aggregate": "x", "allChangesForCluster": True}, 72),
        (c.local, {"aggregate": 1}, 73),
        (c.config, {"aggregate": "x"}, 73),
    ]
    for db, base, code in cases:
        spec = {"allChangesForCluster": True} if base.pop("allChangesForCluster", False) else {}
        cmd = dict(base, pipeline=[{"$changeStream": spec}], cursor={})
        got, msg = fail_code(lambda: db.command(cmd))
        assert got == code, (cmd, msg)
    # a stage document of two fields
    got, _ = fail_code(lambda: c.app.command(
        {"aggregate": "c", "pipeline": [{"$changeStream": {}, "$match": {}}], "cursor": {}}))
    assert got == 40323
    # a later $changeStream in an ordinary pipeline
    got, _ = fail_code(lambda: c.app.command(
        {"aggregate": "c", "pipeline": [{"$match": {}}, {"$changeStream": {}}], "cursor": {}}))
    assert got == 40602


def test_history_lost(start_role, tmp_path):
    procs, wires, uri = start_set(start_role, tmp_path, n=1, extra=("--oplog-max-bytes=65536",))
    with client(uri) as c:
        db = c.app
        with db.c.watch(max_await_time_ms=300) as s:
            db.c.insert_one({"_id": "first"})
            first = s.next()
        start = first["clusterTime"]
        pad = "x" * 2000
        got = []
        with db.c.watch(max_await_time_ms=100) as live:
            # a stream that keeps up is never told its history is lost, however much
            # the trimming deletes behind it (the newest ts trimmed is recorded)
            for i in range(200):
                db.c.insert_one({"_id": i, "pad": pad})
                if i % 10 == 9:
                    while True:
                        e = live.try_next()
                        if e is None:
                            break
                        got.append(e["documentKey"]["_id"])
        assert got == list(range(200))
        oldest = c.local["oplog.rs"].find_one()["ts"]
        assert oldest > start  # trimmed past the event
        code, msg = fail_code(lambda: db.c.watch(resume_after=first["_id"]))
        assert code == 286 and "ChangeStreamHistoryLost" in msg or code == 286
        code, _ = fail_code(lambda: db.c.watch(start_at_operation_time=start))
        assert code == 286
        # from a point still in the oplog: fine
        with db.c.watch(start_at_operation_time=oldest, max_await_time_ms=300) as s:
            assert s.next()["clusterTime"] >= oldest


def test_resume_across_primary_sigkill_loses_and_duplicates_nothing(start_role, tmp_path):
    procs, wires, uri = start_set(start_role, tmp_path, n=3)
    acked, seen, errors = [], [], []
    stop = threading.Event()
    with client(uri) as c:
        c.app.c.insert_one({"_id": "start"})
        # a secondary streams its own (applied) oplog as well
        sec = wires[(primary_index(wires) + 1) % 3]
        with direct(sec) as d:
            with d.app.c.watch(start_at_operation_time=Timestamp(1, 0),
                               max_await_time_ms=300) as s2:
                wait_until(lambda: s2.try_next() is not None, 20,
                           what="the insert on a secondary's stream")
        ready = threading.Event()

        def watcher():
            try:
                with client(uri) as wc:
                    with wc.app.c.watch(max_await_time_ms=200) as s:
                        ready.set()
                        while True:
                            e = s.try_next()
                            if e is not None:
                                seen.append(e["documentKey"]["_id"])
                            elif stop.is_set() and (time.monotonic() > deadline[0] or
                                                    set(acked) <= set(seen)):
                                break
            except Exception as e:  # noqa: BLE001 - reported by the assertion below
                errors.append(repr(e))
                ready.set()

        deadline = [float("inf")]
        t = threading.Thread(target=watcher)
        t.start()
        assert ready.wait(30)

        def writer(w):
            with client(uri) as wc:
                i = 0
                while not stop.is_set():
                    k = f"w{w}-{i}"
                    try:
                        wc.app.c.insert_one({"_id": k})
                        acked.append(k)
                    except PyMongoError:
                        pass
                    i += 1

        ws = [threading.Thread(target=writer, args=(w,)) for w in range(2)]
        for w in ws:
            w.start()
        wait_until(lambda: len(acked) > 100, 30, what="writes before the kill")
        p = primary_index(wires)
        procs[p].signal(signal.SIGKILL)
        n_at_kill = len(acked)
        wait_until(lambda: len(acked) > n_at_kill + 100, 60, interval=0.1,
                   what="writes after the failover")
        stop.set()
        for w in ws:
            w.join(30)
        deadline[0] = time.monotonic() + 30
        t.join(60)
    assert not errors, errors
    print(f"acked {len(acked)} ({n_at_kill} before the kill), events {len(seen)}")
    assert len(seen) == len(set(seen)), "duplicated events"
    missing = set(acked) - set(seen)
    assert not missing, f"{len(missing)} acknowledged writes without an event"
    # every event is a write that was attempted (an unacknowledged one may have committed)
    assert all(k.startswith("w") for k in seen)


def test_malformed_input_gets_an_error_never_a_crash(one):
    db = one.app
    bad_specs = [[], "x", 1, None, {"resumeAfter": {"_data": "01" * 200}},
                 {"resumeAfter": {"_data": ""}}, {"startAfter": {"_data": None}},
                 {"$stripedbShardId": ""}, {"$stripedbShardId": "x" * 100},
                 {"$stripedbMerge": "yes"}, {"allChangesForCluster": 1},
                 {"fullDocumentBeforeChange": 5}]
    for spec in bad_specs:
        with pytest.raises(OperationFailure):
            db.command({"aggregate": "c", "pipeline": [{"$changeStream": spec}], "cursor": {}})
            print("accepted:", spec)
    for cmd in ({"aggregate": "c", "pipeline": [{"$changeStream": {}}]},
                {"aggregate": "c", "pipeline": [{"$changeStream": {}}], "cursor": 5},
                {"aggregate": "c", "pipeline": [{"$changeStream": {}}],
                 "cursor": {"batchSize": -1}},
                {"aggregate": "c", "pipeline": [{"$changeStream": {}}, 7], "cursor": {}},
                {"aggregate": 2, "pipeline": [{"$changeStream": {}}], "cursor": {}},
                {"aggregate": "c", "pipeline": [{"$changeStream": {}}], "cursor": {},
                 "explain": True}):
        with pytest.raises(OperationFailure):
            db.command(cmd)
    # still serving
    db.c.insert_one({"_id": "alive"})
    assert db.c.find_one({"_id": "alive"}) == {"_id": "alive"}
