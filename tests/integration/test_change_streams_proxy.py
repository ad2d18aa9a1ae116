"""Change streams through the proxy (issue #20, src/proxy/changestream.c): the proxy merges
the `$changeStream` of every shard in resume-token order (mongos' high-water-mark rule),
with pymongo's watch() on a sharded collection, a database and the deployment;
updateLookup; the stages after $changeStream; drop -> invalidate; refused options; a chunk
migration under a write load checked Jepsen-style against the acknowledged writes (every
acknowledged write's event exactly once, per document in the order written, nothing for
the migration's copies and range deletions); a proxy killed (SIGKILL) and started again at
the same address, with the driver's resume and an explicit resume_after."""
import threading
import time

import pymongo
import pytest
from pymongo.errors import OperationFailure

from conftest import wait_until
from migration_helpers import MigCluster, Workload


def tok(event_id):
    """A resume token decoded (src/common/changestream.h): its sort key under
    sdb_cs_token_cmp and its parts."""
    b = bytes.fromhex(event_id["_data"])
    assert b[0] == 1, b
    ts = int.from_bytes(b[1:9], "big")
    kind = b[9]
    n = b[10]
    shard = b[11:11 + n].decode()
    idx = int.from_bytes(b[11 + n:15 + n], "big")
    return {"key": (ts, 1 if kind == 2 else 0, shard.encode(), idx, kind),
            "ts": ts, "kind": kind, "shard": shard, "idx": idx}


def drain(stream, want, timeout=30.0, pred=None):
    """Events of stream until want(events) is true (or the timeout: what came)."""
    out = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not want(out):
        ev = stream.try_next()
        if ev is not None and (pred is None or pred(ev)):
            out.append(ev)
    return out


def assert_token_order(events):
    keys = [tok(e["_id"])["key"] for e in events]
    assert keys == sorted(keys) and len(set(keys)) == len(keys), keys


def make_cluster(start_role, tmp_path, coordinators=0, proxies=1):
    cl = MigCluster(start_role, tmp_path, meta=1, shards=2, proxies=proxies,
                    coordinators=coordinators)
    cl.shard_collection("app.c", {"k": 1}, split_points=[{"k": 100}],
                        shards=["shard-a", "shard-b"])
    return cl


def test_sharded_collection_events_from_both_shards_in_token_order(start_role, tmp_path):
    cl = make_cluster(start_role, tmp_path)
    try:
        coll = cl.proxy_client(maxPoolSize=4).app.c
        with coll.watch(max_await_time_ms=300) as cs:
            for i in range(20):
                coll.insert_one({"_id": i, "k": i * 10, "v": i})  # k < 100 and k >= 100
            coll.update_one({"_id": 3, "k": 30}, {"$set": {"v": 33}})
            coll.delete_one({"_id": 15, "k": 150})
            evs = drain(cs, lambda e: len(e) >= 22)
        # (across shards, writes within one second come in token order, not necessarily
        # in real time: README "Change streams", limits; each document's own are in order)
        ops = sorted(e["operationType"] for e in evs)
        assert ops in (["delete"] + ["insert"] * 20 + ["update"],
                       ["delete"] + ["insert"] * 20 + ["replace"]), ops
        ins = [e for e in evs if e["operationType"] == "insert"]
        assert sorted(e["documentKey"]["_id"] for e in ins) == list(range(20))
        for _id in (3, 15):  # the insert of a document before its update / delete
            mine = [e["operationType"] for e in evs if e["documentKey"]["_id"] == _id]
            assert mine[0] == "insert" and len(mine) == 2, mine
        assert {e["ns"]["coll"] for e in evs} == {"c"}
        assert {tok(e["_id"])["shard"] for e in evs} == {"shard-a", "shard-b"}
        assert_token_order(evs)
        for e in ins:  # each insert comes from the shard that owns its key
            want = "shard-a" if e["fullDocument"]["k"] < 100 else "shard-b"
            assert tok(e["_id"])["shard"] == want, e
        # the client's postBatchResumeToken never goes backwards and ends at or after the
        # last event
        assert tok(cs.resume_token)["key"] >= tok(evs[-1]["_id"])["key"]
    finally:
        cl.close()


def test_database_and_cluster_streams(start_role, tmp_path):
    cl = make_cluster(start_role, tmp_path)
    try:
        cli = cl.proxy_client()
        with cli.app.watch(max_await_time_ms=300) as dbs, \
                cli.watch(max_await_time_ms=300) as cls:
            cli.app.c.insert_one({"_id": 1, "k": 5})
            cli.app.c.insert_one({"_id": 2, "k": 500})
            cli.app.u.insert_one({"_id": 3})          # unsharded: on the primary shard
            cli.other.x.insert_one({"_id": 4})        # another database
            d = drain(dbs, lambda e: len(e) >= 3)
            a = drain(cls, lambda e: len(e) >= 4)
            # nothing else comes to the database stream (other.x is not its)
            assert dbs.try_next() is None
        assert sorted((e["ns"]["coll"], e["documentKey"]["_id"]) for e in d) == [
            ("c", 1), ("c", 2), ("u", 3)]
        assert sorted((e["ns"]["db"], e["documentKey"]["_id"]) for e in a) == [
            ("app", 1), ("app", 2), ("app", 3), ("other", 4)]
        assert_token_order(d)
        assert_token_order(a)
    finally:
        cl.close()


def test_update_lookup_and_stages(start_role, tmp_path):
    cl = make_cluster(start_role, tmp_path)
    try:
        coll = cl.proxy_client().app.c
        coll.insert_many([{"_id": 1, "k": 1, "v": 0}, {"_id": 2, "k": 200, "v": 0}])
        with coll.watch(full_document="updateLookup", max_await_time_ms=300) as cs:
            coll.update_one({"_id": 1, "k": 1}, {"$inc": {"v": 1}})
            coll.update_one({"_id": 2, "k": 200}, {"$inc": {"v": 1}})
            coll.update_one({"_id": 2, "k": 200}, {"$inc": {"v": 1}})
            coll.delete_one({"_id": 1, "k": 1})
            evs = drain(cs, lambda e: len(e) >= 4)
        ups = [e for e in evs if e["operationType"] in ("update", "replace")]
        assert len(ups) == 3, evs
        if all(e["operationType"] == "update" for e in ups):
            # the document as it is when the event is returned (MongoDB's updateLookup):
            # _id 1 is gone by then -> null; _id 2's current document in both events
            by_id = sorted(ups, key=lambda e: (e["documentKey"]["_id"],
                                               tok(e["_id"])["key"]))
            assert by_id[0]["fullDocument"] is None
            assert by_id[1]["fullDocument"] == {"_id": 2, "k": 200, "v": 2}
            assert by_id[2]["fullDocument"] == {"_id": 2, "k": 200, "v": 2}
        else:
            # a shard without oplog update descriptions (wip-cs-diff) reports every
            # update as a replace, whose fullDocument is the post-image
            assert all(e["operationType"] == "replace" for e in ups), ups
            assert sorted(e["fullDocument"]["v"] for e in ups) == [1, 1, 2]
        # stages after $changeStream run on the proxy over each merged event
        pipeline = [{"$match": {"operationType": "insert"}},
                    {"$project": {"fullDocument.k": 1, "operationType": 1}},
                    {"$addFields": {"tag": "x"}}]
        with coll.watch(pipeline, max_await_time_ms=300) as cs:
            coll.insert_one({"_id": 10, "k": 10, "v": 1})
            coll.delete_one({"_id": 10, "k": 10})
            coll.insert_one({"_id": 11, "k": 300, "v": 1})
            evs = drain(cs, lambda e: len(e) >= 2)
        # (two shards' writes within one second: their order is the tokens', README)
        assert sorted(((e["operationType"], e["fullDocument"], e["tag"]) for e in evs),
                      key=lambda t: t[1]["k"]) == [
            ("insert", {"k": 10}, "x"), ("insert", {"k": 300}, "x")]
        assert set(evs[0]) == {"_id", "operationType", "fullDocument", "tag"}
        # a stage that changes _id: 280, the stream is closed
        with coll.watch([{"$project": {"_id": 0}}], max_await_time_ms=300) as cs:
            coll.insert_one({"_id": 12, "k": 12})
            with pytest.raises(OperationFailure) as ei:
                drain(cs, lambda e: len(e) >= 1, timeout=10)
            assert ei.value.code == 280
    finally:
        cl.close()


def test_bad_options_are_refused(start_role, tmp_path):
    cl = make_cluster(start_role, tmp_path)
    try:
        db = cl.proxy_client().app

        def code_of(pipeline, coll="c"):
            with pytest.raises(OperationFailure) as ei:
                db.command({"aggregate": coll, "pipeline": pipeline, "cursor": {}})
            return ei.value.code
        assert code_of([{"$changeStream": {"bogus": 1}}]) == 40415
        assert code_of([{"$changeStream": {"fullDocument": "nope"}}]) == 2
        assert code_of([{"$changeStream": {"fullDocument": "required"}}]) == 238
        assert code_of([{"$changeStream": {"fullDocumentBeforeChange": "required"}}]) == 238
        assert code_of([{"$changeStream": {}}, {"$group": {"_id": 1}}]) == 20
        assert code_of([{"$match": {}}, {"$changeStream": {}}]) == 40602
        assert code_of([{"$changeStream": 1}]) == 50808
        t = {"_data": "01" + "00" * 8 + "02" + "00" + "00000000"}  # HWM(0)
        assert code_of([{"$changeStream": {"resumeAfter": t, "startAfter": t}}]) == 50865
        assert code_of([{"$changeStream": {"resumeAfter": {"_data": "zz"}}}]) == 9
        assert code_of([{"$changeStream": {"resumeAfter": {}}}]) == 40647
        # the internal config database (a fresh user got 40602 from the proxy's config
        # view), and collation, which the stages after $changeStream would not honour
        with pytest.raises(OperationFailure) as e:
            cl.proxy_client().config.chunks.watch()
        assert e.value.code == 73, e.value.details
        with pytest.raises(OperationFailure) as e:
            db.command({"aggregate": "c", "pipeline": [{"$changeStream": {}}], "cursor": {},
                        "collation": {"locale": "en", "strength": 2}})
        assert e.value.code == 238, e.value.details
    finally:
        cl.close()


def test_drop_reports_once_then_invalidate(start_role, tmp_path):
    cl = make_cluster(start_role, tmp_path)
    try:
        cli = cl.proxy_client()
        coll = cli.app.c
        coll.insert_many([{"_id": i, "k": i * 50} for i in range(6)])  # both shards
        # no wait: cluster-time gossip (issue #20) gives the drop on every shard a ts
        # above these inserts, whatever the shards' clocks
        with coll.watch(max_await_time_ms=300) as cs, \
                cli.app.watch(max_await_time_ms=300) as dbs:
            coll.insert_one({"_id": 100, "k": 7})
            coll.drop()
            evs = drain(cs, lambda e: len(e) >= 3 or (e and e[-1]["operationType"] ==
                                                       "invalidate"))
            assert [e["operationType"] for e in evs] == ["insert", "drop", "invalidate"]
            assert_token_order(evs)
            assert not cs.alive  # the invalidate closed the stream
            # the database stream: the drop once (not once per shard), no invalidate
            cli.app.after.insert_one({"_id": 1})
            d = drain(dbs, lambda e: any(x["ns"]["coll"] == "after" for x in e))
            assert [e["operationType"] for e in d] == ["insert", "drop", "insert"], d
            # startAfter the invalidate: a new stream from there
            with coll.watch(start_after=evs[-1]["_id"], max_await_time_ms=300) as again:
                coll.insert_one({"_id": 200, "k": 1})
                e2 = drain(again, lambda e: len(e) >= 1)
                assert [e["documentKey"]["_id"] for e in e2] == [200]
    finally:
        cl.close()


def _expected_per_doc(history):
    """Per _id, the writes in the order written: (op, value, required). Acknowledged
    writes that changed something are required; unknown outcomes optional; a failed
    write, an update or delete that matched nothing give no event."""
    per = {}
    for (kind, _w, _id, val, t0, _t1, outcome, res) in sorted(history, key=lambda e: e[4]):
        if kind == "read" or outcome == "fail":
            continue
        if outcome == "ok" and kind in ("update", "delete") and res != 1:
            continue
        per.setdefault(_id, []).append((kind, val, outcome == "ok"))
    return per


def _event_write(e):
    op = e["operationType"]
    if op == "insert":
        return ("insert", e["fullDocument"]["v"])
    if op == "update":
        return ("update", e["updateDescription"]["updatedFields"].get("v"))
    if op == "replace":
        return ("update", e["fullDocument"]["v"])
    if op == "delete":
        return ("delete", None)
    return (op, None)


def _check_events(per, events):
    """Jepsen-style: every required write's event exactly once, per _id in order, nothing
    else. Returns the violations."""
    got = {}
    for e in events:
        got.setdefault(e["documentKey"]["_id"], []).append(_event_write(e))
    bad = []
    for _id in set(per) | set(got):
        exp, seq, i = per.get(_id, []), got.get(_id, []), 0
        for w in seq:
            while i < len(exp) and not exp[i][2] and (exp[i][0], exp[i][1] if exp[i][0] !=
                                                     "delete" else None) != w:
                i += 1
            if i < len(exp) and (exp[i][0], exp[i][1] if exp[i][0] != "delete" else
                                 None) == w:
                i += 1
            else:
                bad.append((_id, "unexpected or out of order", w, exp, seq))
                break
        else:
            if any(req for (_k, _v, req) in exp[i:]):
                bad.append((_id, "missing", exp[i:], seq))
    return bad


def test_chunk_migration_under_writes_each_write_once(start_role, tmp_path):
    cl = make_cluster(start_role, tmp_path, coordinators=1)
    try:
        ns = "app.c"
        coll = cl.proxy_client().app.c
        # documents before the stream: the migration copies them, no event may say so
        coll.insert_many([{"_id": f"p{i}", "k": i, "v": -i} for i in range(150)])
        cs = coll.watch(max_await_time_ms=200)
        events = []
        stop = threading.Event()
        errors = []

        def reader():
            try:
                while not stop.is_set() or cs.try_next() is not None:
                    ev = cs.try_next()
                    if ev is not None:
                        events.append(ev)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)
        rt = threading.Thread(target=reader, daemon=True)
        rt.start()
        wl = Workload(cl, ns, writers=3, readers=0, keys=200).start()
        wait_until(lambda: wl.acked() >= 60, 30, what="workload running")
        (c0,) = [c for c in cl.chunks(ns) if c["shard"] == "shard-a"]
        mid = cl.migrate(ns, c0["id"], "shard-b", "--grace-ms=500")
        m = cl.wait_migration(mid)
        assert m["state"] == "complete", m
        base = wl.acked()
        wait_until(lambda: wl.acked() >= base + 60, 30, what="writes after the switch")
        wl.stop()
        per = _expected_per_doc(wl.history)
        need = sum(1 for v in per.values() for w in v if w[2])

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _check_events(per, list(events)) \
                and not errors:
            time.sleep(0.2)
        stop.set()
        rt.join(timeout=30)
        cs.close()
        assert not errors, errors
        assert not any(str(e["documentKey"]["_id"]).startswith("p") for e in events), \
            "an event for a migration's copy or range deletion"
        bad = _check_events(per, events)
        assert not bad, bad[:5]
        print(f"events={len(events)} required={need} migration={m['stats'].get('imported')}")
        assert need >= 120
        assert_token_order(events)
        assert {tok(e["_id"])["shard"] for e in events} == {"shard-a", "shard-b"}
    finally:
        cl.close()


def test_proxy_restart_resume_nothing_lost_or_duplicated(start_role, tmp_path):
    cl = make_cluster(start_role, tmp_path)
    try:
        writer = cl.proxy_client()
        reader = cl.proxy_client(socketTimeoutMS=5000)
        coll, rcoll = writer.app.c, reader.app.c
        cs = rcoll.watch(max_await_time_ms=200)
        for i in range(10):
            coll.insert_one({"_id": i, "k": (i * 37) % 200})
        first = drain(cs, lambda e: len(e) >= 10)
        assert sorted(e["documentKey"]["_id"] for e in first) == list(range(10))
        # SIGKILL the proxy, write through... nothing (it is the only one), start it again
        # at the same address, write more: the driver resumes after its last token
        cl.proxy_procs[0].kill()
        cl.proxy_procs[0].restart().wait_healthy()
        for i in range(10, 25):
            coll.insert_one({"_id": i, "k": (i * 37) % 200})
        rest = drain(cs, lambda e: len(e) >= 15, timeout=60)
        cs.close()
        ids = [e["documentKey"]["_id"] for e in first + rest]
        assert sorted(ids) == list(range(25)), ids      # nothing lost, nothing twice
        assert_token_order(first + rest)
        # an explicit resume_after from the 5th event: exactly the events after it
        with rcoll.watch(resume_after=first[4]["_id"], max_await_time_ms=200) as again:
            evs = drain(again, lambda e: len(e) >= 20, timeout=30)
            assert again.try_next() is None
        assert [e["_id"] for e in evs] == [e["_id"] for e in (first + rest)[5:]]
    finally:
        cl.close()


def _insert_until_acked(coll, doc, timeout=60):
    """insert_one retried until acknowledged (a duplicate key: an earlier attempt was)."""
    def once():
        try:
            coll.insert_one(dict(doc))
        except pymongo.errors.DuplicateKeyError:
            pass
        return True
    wait_until(lambda: _quiet(once), timeout, interval=0.2, what=f"insert {doc}")


def _quiet(fn):
    try:
        return fn()
    except pymongo.errors.PyMongoError:
        return False


def test_a_shard_added_later_is_merged_in(start_role, tmp_path):
    cl = make_cluster(start_role, tmp_path, coordinators=1)
    try:
        coll = cl.proxy_client().app.c
        cs = coll.watch(max_await_time_ms=200)
        for i in range(10):
            coll.insert_one({"_id": i, "k": i * 20})
        first = drain(cs, lambda e: len(e) >= 10)
        cl.add_shard("shard-c")
        (c0,) = [c for c in cl.chunks("app.c") if c["shard"] == "shard-a"]
        mid = cl.migrate("app.c", c0["id"], "shard-c", "--grace-ms=200")
        assert cl.wait_migration(mid)["state"] == "complete"
        for i in range(10, 30):
            _insert_until_acked(coll, {"_id": i, "k": (i * 20) % 200})
        rest = drain(cs, lambda e: len(e) >= 20, timeout=60)
        cs.close()
        evs = first + rest
        assert sorted(e["documentKey"]["_id"] for e in evs) == list(range(30))
        assert_token_order(evs)
        # the inserts of k < 100 after the move were executed (and reported) by shard-c
        late = {tok(e["_id"])["shard"] for e in rest if e["fullDocument"]["k"] < 100}
        assert late == {"shard-c"}, late
    finally:
        cl.close()



def test_a_shard_added_behind_the_position_loses_nothing(start_role, tmp_path):
    """A shard found after the open is opened after the merged position, which holds
    another shard's ts: the proxy first notes it above that position, so its writes come
    after it (a reviewer pushed shard-a's clock 30 minutes ahead and lost a new shard's
    first five inserts: their ts were below the position)."""
    from bson.timestamp import Timestamp
    cl = make_cluster(start_role, tmp_path)
    try:
        cli = cl.proxy_client()
        coll = cli.app.c
        cs = cli.watch(max_await_time_ms=200)  # the deployment
        a = pymongo.MongoClient(f"mongodb://127.0.0.1:{cl.shard_ports['shard-a']}/",
                                directConnection=True)
        a.admin.command({"appendOplogNote": 1, "data": {"test": "skew"},
                         "maxClusterTime": Timestamp(int(time.time()) + 1800, 1)})
        coll.insert_one({"_id": 1, "k": 2})  # shard-a, 30 minutes "ahead"
        assert [e["documentKey"]["_id"] for e in drain(cs, lambda e: len(e) >= 1)] == [1]
        cl.add_shard("shard-c")
        cl.meta_write({"createDatabase": "app2", "primary": "shard-c"})
        # once the proxy routes to shard-c, one getMore finds it and opens its stream (a
        # write on a new shard before that is a documented limit: src/proxy/README.md)
        _insert_until_acked(cli.app2.warm, {"_id": 0})
        cs.try_next()
        for i in range(5):
            cli.app2.u.insert_one({"_id": 100 + i})
        coll.insert_one({"_id": 2, "k": 3})
        evs = drain(cs, lambda e: len(e) >= 6, timeout=30,
                    pred=lambda e: e["ns"]["coll"] != "warm")
        cs.close()
        assert sorted((e["ns"]["db"], e["documentKey"]["_id"]) for e in evs) == \
            [("app", 2)] + [("app2", 100 + i) for i in range(5)]
        assert_token_order(evs)
    finally:
        cl.close()


def test_a_stopped_shard_does_not_hang_the_stream(start_role, tmp_path):
    """A shard that stops answering without closing its connection (SIGSTOP) made every
    getMore of the stream wait for libmongoc's 5-minute socket timeout. Each shard round
    now has a deadline (its await + 10 s): the getMore answers (an empty batch, the stopped
    shard holding the merge back), the shard's stream is reopened after its last position
    once it answers again, and nothing is lost."""
    import signal
    cl = make_cluster(start_role, tmp_path)
    try:
        coll = cl.proxy_client(socketTimeoutMS=60000).app.c
        cs = coll.watch(max_await_time_ms=300)
        coll.insert_one({"_id": 1, "k": 1})
        assert [e["documentKey"]["_id"] for e in drain(cs, lambda e: len(e) >= 1)] == [1]
        cl.shard_procs["shard-b"].signal(signal.SIGSTOP)
        try:
            coll.insert_one({"_id": 2, "k": 2})  # shard-a
            got = [cs.try_next(), cs.try_next()]  # answered, not stuck (no exception)
        finally:
            cl.shard_procs["shard-b"].signal(signal.SIGCONT)
        coll.insert_one({"_id": 3, "k": 150})  # shard-b
        rest = drain(cs, lambda e: len(e) >= 2 - sum(1 for g in got if g), timeout=60)
        cs.close()
        ids = sorted([g["documentKey"]["_id"] for g in got if g] +
                     [e["documentKey"]["_id"] for e in rest])
        assert ids == [2, 3]
    finally:
        cl.close()

def test_shard_failover_under_an_open_stream(start_role, tmp_path):
    """shard-a is a 3-member replica set whose primary is SIGKILLed under an open stream:
    the stream goes on (the proxy reopens that shard's stream after its last PBRT, or the
    driver resumes) with every event exactly once."""
    from metadata_cluster import Cluster
    from conftest import free_port
    from test_shard_replset import primary_index, start_set

    procs, wires, rs_uri = start_set(start_role, tmp_path)
    meta = Cluster(start_role, tmp_path, 1)
    meta.leader()
    meta.write({"addShard": "shard-a", "uri": rs_uri})
    bport = free_port()
    (tmp_path / "b").mkdir()
    start_role(["--role=shard", f"--listen=127.0.0.1:{bport}", f"--data-dir={tmp_path / 'b'}"])
    meta.write({"addShard": "shard-b", "uri": f"mongodb://127.0.0.1:{bport}/"})
    meta.write({"createDatabase": "app", "primary": "shard-a"}, ok_codes=(48, 11000))
    meta.write({"shardCollection": "app.c", "key": {"k": 1}, "splitPoints": [{"k": 100}],
                "shards": ["shard-a", "shard-b"]})
    port = free_port()
    start_role(["--role=proxy", f"--listen=127.0.0.1:{port}", f"--metadata={meta.seeds()}"])
    with pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/", serverSelectionTimeoutMS=20000,
                             retryWrites=False) as cli:
        coll = cli.app.c
        wait_until(lambda: _quiet(lambda: coll.insert_one({"_id": -1, "k": 1}) and True),
                   30, what="a first write through the proxy")
        cs = coll.watch(max_await_time_ms=200)
        for i in range(10):
            coll.insert_one({"_id": i, "k": (i * 37) % 200})
        first = drain(cs, lambda e: len(e) >= 10)
        pi = primary_index(wires)
        procs[pi].kill()
        for i in range(10, 30):
            _insert_until_acked(coll, {"_id": i, "k": (i * 37) % 200})
        rest = drain(cs, lambda e: len({x["documentKey"]["_id"] for x in e}) >= 20,
                     timeout=90)
        cs.close()
        ids = [e["documentKey"]["_id"] for e in first + rest]
        assert sorted(ids) == list(range(30)), ids   # nothing lost, nothing twice
        assert_token_order(first + rest)


def test_cursor_commands_and_database_drop(start_role, tmp_path):
    """The raw cursor: batchSize, postBatchResumeToken, killCursors; an unsharded
    collection's stream; a resume point older than the oplog; dropDatabase -> invalidate
    of a database stream."""
    cl = make_cluster(start_role, tmp_path)
    try:
        cli = cl.proxy_client()
        db = cli.app
        r = db.command({"aggregate": "c", "pipeline": [{"$changeStream": {}}],
                        "cursor": {}})
        cid = r["cursor"]["id"]
        assert cid != 0 and r["cursor"]["firstBatch"] == []
        pbrt0 = tok(r["cursor"]["postBatchResumeToken"])
        assert pbrt0["kind"] == 2  # a high-water mark
        for i in range(5):
            db.c.insert_one({"_id": i, "k": i * 60})
        got = []
        deadline = time.monotonic() + 20
        while len(got) < 2 and time.monotonic() < deadline:
            g = db.command({"getMore": cid, "collection": "c", "batchSize": 2,
                            "maxTimeMS": 300})
            got += g["cursor"]["nextBatch"]
        assert len(got) == 2, got                       # batchSize bounds the batch
        # the position: the last event returned when the batch was cut by batchSize,
        # else the shards' smallest high-water mark, at or after it (with cluster-time
        # gossip, issue #20, the third event, on the other shard, sorts above shard-a's
        # mark and may wait for a note round: the batch then ends uncut)
        pbrt = tok(g["cursor"]["postBatchResumeToken"])
        assert pbrt["key"] >= tok(got[-1]["_id"])["key"]
        assert g["cursor"]["postBatchResumeToken"] == got[-1]["_id"] or pbrt["kind"] == 2
        k = db.command({"killCursors": "c", "cursors": [cid]})
        assert k["cursorsKilled"] == [cid]
        with pytest.raises(OperationFailure) as ei:
            db.command({"getMore": cid, "collection": "c"})
        assert ei.value.code == 43
        # an unsharded collection's stream
        with db.u.watch(max_await_time_ms=200) as us:
            db.u.insert_one({"_id": "x"})
            ev = drain(us, lambda e: len(e) >= 1)
            assert [(e["operationType"], e["documentKey"]["_id"]) for e in ev] == [
                ("insert", "x")]
        # a resume point before every shard's oplog (never trimmed here: the whole
        # history is there, so it is not 286): the stream opens, nothing is lost
        old = {"_data": "01" + (1 << 32).to_bytes(8, "big").hex().upper() + "02" + "00"
               + "00000000"}
        with db.c.watch(resume_after=old, max_await_time_ms=200) as hs:
            evs = drain(hs, lambda e: len(e) >= 5)
            assert sorted(e["documentKey"]["_id"] for e in evs) == list(range(5))
        # dropDatabase: the database stream reports it once, then invalidates
        # (no wait: cluster-time gossip orders the drop after the writes above)
        with db.watch(max_await_time_ms=200) as ds:
            cli.drop_database("app")
            evs = drain(ds, lambda e: bool(e) and e[-1]["operationType"] == "invalidate")
            assert not ds.alive
        ops = [e["operationType"] for e in evs]
        assert ops[-2:] == ["dropDatabase", "invalidate"], ops
        assert ops.count("dropDatabase") == 1 and set(ops[:-2]) <= {"drop"}, ops
        assert len(ops[:-2]) == len(set(e["ns"].get("coll") for e in evs[:-2])), ops
    finally:
        cl.close()


def test_an_idle_shard_does_not_hold_the_stream_back(start_role, tmp_path):
    """Every write on shard-a, none on shard-b: shard-b's postBatchResumeToken is moved past
    the waiting events by appendOplogNote (above the newest ts reported), so 500 events
    come in a few rounds, not one per note."""
    cl = make_cluster(start_role, tmp_path)
    try:
        coll = cl.proxy_client().app.c
        with coll.watch(max_await_time_ms=500) as cs:
            for j in range(5):
                coll.insert_many([{"_id": j * 100 + i, "k": i % 100} for i in range(100)])
            t0 = time.monotonic()
            evs = drain(cs, lambda e: len(e) >= 500, timeout=60)
            took = time.monotonic() - t0
        assert len(evs) == 500
        assert {tok(e["_id"])["shard"] for e in evs} == {"shard-a"}
        assert_token_order(evs)
        assert took < 10, took
    finally:
        cl.close()


def test_rename_reported_once_then_invalidate(start_role, tmp_path):
    cl = make_cluster(start_role, tmp_path)
    try:
        cli = cl.proxy_client()
        db = cli.app
        db.create_collection("r")  # broadcast: an empty copy on every shard
        db.r.insert_one({"_id": 1})
        # (no wait: cluster-time gossip orders the rename after the copies' creates)
        with db.r.watch(max_await_time_ms=200) as cs, db.watch(max_await_time_ms=200) as ds:
            cli.admin.command({"renameCollection": "app.r", "to": "app.r2"})
            db.r2.insert_one({"_id": 2})
            evs = drain(cs, lambda e: bool(e) and e[-1]["operationType"] == "invalidate")
            d = drain(ds, lambda e: any(x["operationType"] == "insert" for x in e))
        assert [e["operationType"] for e in evs] == ["rename", "invalidate"], evs
        assert evs[0]["to"] == {"db": "app", "coll": "r2"}
        assert [(e["operationType"], e["ns"]["coll"]) for e in d] == [
            ("rename", "r"), ("insert", "r2")], d
    finally:
        cl.close()


def test_start_without_resume_point_is_one_point_for_every_shard(start_role, tmp_path):
    """shard-a took many writes this second, shard-b none: a stream opened now starts at
    one point for both (the newest of their first PBRTs; shard-b gets a note above it), so
    no write before watch() is reported, none after it is lost, and a resume after its
    first event gives exactly the others."""
    cl = make_cluster(start_role, tmp_path)
    try:
        coll = cl.proxy_client().app.c
        for _ in range(3):
            coll.insert_many([{"k": i % 100} for i in range(40)])      # shard-a, busy
            with coll.watch(max_await_time_ms=200) as cs:
                coll.insert_one({"_id": "b1", "k": 150})              # shard-b
                coll.insert_one({"_id": "a1", "k": 5})                # shard-a
                evs = drain(cs, lambda e: len(e) >= 2)
                assert cs.try_next() is None
            assert sorted(e["documentKey"]["_id"] for e in evs) == ["a1", "b1"], evs
            with coll.watch(resume_after=evs[0]["_id"], max_await_time_ms=200) as again:
                more = drain(again, lambda e: len(e) >= 1)
                assert again.try_next() is None
            assert [e["_id"] for e in more] == [evs[1]["_id"]]
            coll.delete_many({"_id": {"$in": ["a1", "b1"]}})
    finally:
        cl.close()
