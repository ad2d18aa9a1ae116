"""Adversarial tests of the loop's sharded point commands (src/proxy/forwarder.c
sharded_point, sharded_cmd): each loop answer must be the request thread's for the same
command (`comment` keeps a command off the loop), and no acknowledged write may be lost or
applied twice, across routing changes the proxy has not seen yet, migrations, state-change
answers and many _id types."""
import socket
import struct
import threading

import bson
import pymongo
import pytest

from conftest import wait_until
from forwarder_helpers import FALLBACK, LOOP, sharded_cluster, strip, warm_ids
from migration_helpers import MigCluster

NS = "fwdb.s"


def _fail_next(cl, sid, command, times=1, **data):
    cl.shard_client(sid).admin.command(
        {"configureFailPoint": "failCommand", "mode": {"times": times},
         "data": dict({"failCommands": [command]}, **data)})


def _shard_of(cl, ns, _id):
    """The shard that holds the document _id of ns (read on each shard directly)."""
    db, coll = ns.split(".", 1)
    where = [sid for sid in cl.shard_ids if cl.shard_client(sid)[db][coll].find_one({"_id": _id})]
    assert len(where) == 1, (_id, where)
    return where[0]


def _norm(r):
    r = strip(r)
    for we in r.get("writeErrors", []):
        we["errmsg"] = we["errmsg"].replace("fwdb.s", "X").replace("fwdb.t", "X")
    return r


# ---------------------------------------------------------------------------------------
# a delete of limit 0 carries no session fields to the shard (write.c stmt_cmd: multi
# statements are not recorded), so the shard could not recognise a resend of it: with
# lsid/txnNumber it must never reach the loop (whose hand-offs of a write with session
# fields rely on the shard's record)


@pytest.mark.parametrize("code", [11602, 189])
def test_a_multi_delete_with_session_fields_is_refused_before_the_loop(
        start_role, tmp_path, code):
    cl = sharded_cluster(start_role, tmp_path, {"_id": 1}, test_cmds=True, colls=("s", "t"))
    try:
        c = cl.proxy_client(0)
        db = c.fwdb
        for name in ("s", "t"):
            db[name].insert_many([{"_id": i} for i in (1, 2, 150)])
            warm_ids(db[name], [1, 150])
        sid = _shard_of(cl, NS, 2)
        sess = c.start_session()
        answers = []
        for name, extra in (("s", {}), ("t", {"comment": "thread"})):
            _fail_next(cl, sid, "delete", errorCode=code)
            before = cl.metric(0, LOOP) + cl.metric(0, FALLBACK)
            r = db.command(dict({"delete": name, "deletes": [{"q": {"_id": 2}, "limit": 0}],
                                 "txnNumber": bson.Int64(7 if name == "s" else 8)}, **extra),
                           session=sess, check=False)
            answers.append(_norm(r))
            assert cl.metric(0, LOOP) + cl.metric(0, FALLBACK) == before, name
            cl.shard_client(sid).admin.command(
                {"configureFailPoint": "failCommand", "mode": "off"})
        sess.end_session()
        assert answers[0] == answers[1] and answers[0]["code"] == 72, answers
        assert db.s.find_one({"_id": 2}) == db.t.find_one({"_id": 2}) == {"_id": 2}
    finally:
        cl.close()


# ---------------------------------------------------------------------------------------
# routing the proxy has not seen yet: the shards' filtering metadata moves first


def _move_on_shards(cl, ns, key, chunk, to, filtering=True):
    """Move chunk (a routing entry) to shard `to` on the shards only: its documents
    copied there, each shard's filtering metadata installed with the chunk at `to` and a
    newer token; metadata (and so the proxy) still routes it to its old shard."""
    db, coll = ns.split(".", 1)
    src = chunk["shard"]
    docs = list(cl.shard_client(src)[db][coll].find({}))
    moved = [d for d in docs if chunk_holds(chunk, d["_id"])]
    if moved:
        cl.shard_client(to)[db][coll].insert_many(moved)
    chunks = cl.routing(ns)["chunks"]
    new_token = max(ch["token"] for ch in chunks) + 1
    for ch in chunks:
        if ch["id"] == chunk["id"]:
            ch["shard"], ch["token"] = to, new_token
    for sid in cl.shard_ids:
        # the chunk's fence (a chunk-versioned request: $stripedbVersion) and the shard's
        # filtering metadata (a shard-versioned one), as a migration's commit sets them
        cl.shard_client(sid).admin.command({"stripedbSetVersion": 1, "chunk": str(chunk["id"]),
                                            "token": new_token})
        if not filtering:
            continue
        mine = [{"id": str(ch["id"]), "min": ch["min"], "max": ch["max"], "token": ch["token"]}
                for ch in chunks if ch["shard"] == sid]
        cl.shard_client(sid).admin.command({"stripedbSetFiltering": ns, "key": key,
                                            "chunks": mine, "collectionVersion": new_token})
    return new_token, len(moved)


def chunk_holds(chunk, v):
    from bson.max_key import MaxKey
    from bson.min_key import MinKey
    lo, hi = chunk["min"]["_id"], chunk["max"]["_id"]
    return (isinstance(lo, MinKey) or lo <= v) and (isinstance(hi, MaxKey) or v < hi)


@pytest.mark.parametrize("filtering", [True, False], ids=["filtering", "no-filtering"])
@pytest.mark.parametrize("upsert", [False, True], ids=["update", "upsert"])
@pytest.mark.parametrize("retry", [True, False], ids=["retryable", "plain"])
def test_a_stale_proxy_hands_a_loop_write_and_read_to_a_request_thread(
        start_role, tmp_path, retry, upsert, filtering):
    """The chunk of _id 5 moved to shard-b on the shards; the proxy still routes it to
    shard-a. The loop's update is refused there (StaleConfig, nothing ran) and handed to a
    request thread, which follows the routing once metadata has it: applied once, on
    shard-b, and answered as applied; the loop's read then sees it."""
    key = {"_id": 1}
    cl = sharded_cluster(start_role, tmp_path, key, filtering=filtering)
    try:
        c = cl.proxy_client(0, retryWrites=retry)
        coll = c.fwdb.s
        coll.insert_many([{"_id": i, "v": 0} for i in (1, 5, 150)])
        warm_ids(coll, [1, 150])
        chunk = [ch for ch in cl.routing(NS)["chunks"] if chunk_holds(ch, 5)][0]
        src = chunk["shard"]
        dst = [s for s in cl.shard_ids if s != src][0]
        token, n = _move_on_shards(cl, NS, key, chunk, dst, filtering)
        assert n == 2
        if upsert:  # a new document in the moved chunk: it must be made on dst only
            for sid in cl.shard_ids:
                cl.shard_client(sid).fwdb.s.delete_one({"_id": 5})
        fb = cl.metric(0, FALLBACK)
        out = []

        def run():
            try:
                out.append(coll.update_one({"_id": 5}, {"$inc": {"v": 1}}, upsert=upsert))
            except Exception as e:  # noqa: BLE001 - asserted below
                out.append(e)
        t = threading.Thread(target=run)
        t.start()
        # the loop sent it to the old owner, which refused: handed to a request thread
        wait_until(lambda: cl.metric(0, FALLBACK) >= fb + 1, 20, what="the loop's hand-off")
        cl.meta_cmd({"setChunkShard": chunk["id"], "shard": dst, "token": token})
        t.join(60)
        assert len(out) == 1 and not isinstance(out[0], Exception), out
        if upsert:
            assert (out[0].matched_count, out[0].upserted_id) == (0, 5)
            assert cl.shard_client(dst).fwdb.s.find_one({"_id": 5}) == {"_id": 5, "v": 1}
            assert cl.shard_client(src).fwdb.s.find_one({"_id": 5}) is None
            cl.shard_client(src).fwdb.s.insert_one({"_id": 5, "v": 0})  # an orphan
        else:
            assert (out[0].matched_count, out[0].modified_count) == (1, 1)
        assert cl.shard_client(dst).fwdb.s.find_one({"_id": 5}) == {"_id": 5, "v": 1}
        assert cl.shard_client(src).fwdb.s.find_one({"_id": 5}) == {"_id": 5, "v": 0}
        # the proxy follows; the loop reads and writes the new owner
        wait_until(lambda: coll.find_one({"_id": 5}, comment="x") == {"_id": 5, "v": 1}, 20,
                   what="the proxy's routing")
        before = cl.metric(0, LOOP)
        assert coll.find_one({"_id": 5}) == {"_id": 5, "v": 1}
        assert coll.update_one({"_id": 5}, {"$inc": {"v": 1}}).modified_count == 1
        assert coll.find_one({"_id": 5}) == {"_id": 5, "v": 2}
        assert cl.metric(0, LOOP) >= before + 2
        assert cl.shard_client(src).fwdb.s.find_one({"_id": 5}) == {"_id": 5, "v": 0}
    finally:
        cl.close()


def test_a_stale_proxy_loop_read_is_handed_on_and_answered_from_the_new_owner(
        start_role, tmp_path):
    key = {"_id": 1}
    cl = sharded_cluster(start_role, tmp_path, key)
    try:
        coll = cl.proxy_client(0).fwdb.s
        coll.insert_many([{"_id": i, "v": 0} for i in (1, 5, 150)])
        warm_ids(coll, [1, 150])
        chunk = [ch for ch in cl.routing(NS)["chunks"] if chunk_holds(ch, 5)][0]
        src = chunk["shard"]
        dst = [s for s in cl.shard_ids if s != src][0]
        token, _ = _move_on_shards(cl, NS, key, chunk, dst)
        # the new owner's copy differs: a read answered by the old owner is visible
        cl.shard_client(dst).fwdb.s.update_one({"_id": 5}, {"$set": {"where": "new"}})
        fb = cl.metric(0, FALLBACK)
        out = []
        t = threading.Thread(target=lambda: out.append(coll.find_one({"_id": 5})))
        t.start()
        wait_until(lambda: cl.metric(0, FALLBACK) >= fb + 1, 20, what="the loop's hand-off")
        cl.meta_cmd({"setChunkShard": chunk["id"], "shard": dst, "token": token})
        t.join(60)
        assert out == [{"_id": 5, "v": 0, "where": "new"}]
    finally:
        cl.close()


# ---------------------------------------------------------------------------------------
# _id values of many types, equal across types, on chunk boundaries, hashed


VALUES = [1, 1.0, bson.Int64(1), bson.Decimal128("1"), bson.Decimal128("1.000"),
          0, -0.0, bson.Decimal128("-0"), 100, 100.0, bson.Int64(100),
          bson.Decimal128("100"), 99.99999999999999, 100.00000000000001,
          bson.Decimal128("99.99999999999999999999999999999999"),
          bson.Int64(2 ** 53 + 1), float(2 ** 53), bson.Int64(2 ** 62),
          float("inf"), float("-inf"), float("nan"), bson.Decimal128("NaN"),
          bson.Decimal128("Infinity"), "", "a", "\u00e9", bson.ObjectId("5f0000000000000000000001"),
          True, False, bson.Binary(b"\x00\x01", 0), bson.Binary(b"\x00\x01" * 8, 4),
          bson.Timestamp(5, 1), __import__("datetime").datetime(2020, 1, 1),
          bson.Int64(-(2 ** 63)), -2147483648]


@pytest.mark.parametrize("filtering", [True, False], ids=["filtering", "no-filtering"])
@pytest.mark.parametrize("key", [{"_id": 1}, {"_id": "hashed"}], ids=["range", "hashed"])
def test_many_id_types_loop_and_thread_agree(start_role, tmp_path, key, filtering):
    cl = sharded_cluster(start_role, tmp_path, key, filtering=filtering, colls=("s", "t"))
    try:
        db = cl.proxy_client(0).fwdb
        seen = []
        docs = []
        for v in VALUES:
            # one document per distinct value (those equal across types collide on _id)
            d = {"_id": v, "n": len(docs)}
            try:
                db.s.insert_one(dict(d, c=0))
                db.t.insert_one(dict(d, c=0))
                docs.append(d)
            except pymongo.errors.DuplicateKeyError:
                seen.append(v)
        for name in ("s", "t"):
            warm_ids(db[name], [d["_id"] for d in docs])
        fb = cl.metric(0, FALLBACK)
        for v in VALUES:
            f = {"_id": v}
            before = cl.metric(0, LOOP)
            loop = strip(db.command({"find": "s", "filter": f}, check=False))
            took = cl.metric(0, LOOP) - before
            thread = strip(db.command({"find": "t", "filter": f, "comment": "t"},
                                      check=False))
            for r in (loop, thread):
                if "cursor" in r:
                    r["cursor"]["ns"] = "X"
            assert repr(loop) == repr(thread), (v, took, loop, thread)  # NaN != NaN
            # an update through each
            lu = _norm(db.command({"update": "s", "updates": [
                {"q": f, "u": {"$inc": {"c": 1}}}]}, check=False))
            tu = _norm(db.command({"update": "t", "updates": [
                {"q": f, "u": {"$inc": {"c": 1}}}], "comment": "t"}, check=False))
            assert repr(lu) == repr(tu), (v, lu, tu)
        assert repr(sorted(db.s.find(), key=repr)) == repr(sorted(db.t.find(), key=repr))
        # each document on the same shard in both collections (same chunks)
        for d in docs:
            assert _shard_of(cl, "fwdb.s", d["_id"]) == _shard_of(cl, "fwdb.t", d["_id"]), d
        assert cl.metric(0, FALLBACK) == fb
    finally:
        cl.close()


@pytest.mark.parametrize("key", [{"_id": 1}, {"_id": "hashed"}], ids=["range", "hashed"])
@pytest.mark.parametrize("retry", [True, False], ids=["retryable", "plain"])
def test_loop_upserts_land_on_the_owning_shard(start_role, tmp_path, key, retry):
    cl = sharded_cluster(start_role, tmp_path, key, colls=("s", "t"))
    try:
        c = cl.proxy_client(0, retryWrites=retry)
        db = c.fwdb
        for name in ("s", "t"):
            db[name].insert_many([{"_id": i} for i in range(1, 9)] + [{"_id": 150}])
            warm_ids(db[name], list(range(1, 9)) + [150])  # each shard's primary, hashed too
        vals = [bson.Int64(77), 99.5, bson.Decimal128("100"), 101, "up", -5,
                bson.ObjectId("5f0000000000000000000002"), bson.Int64(2 ** 40),
                bson.Timestamp(0, 0), bson.Timestamp(7, 7)]
        for v in vals:
            before = cl.metric(0, LOOP)
            r = db.s.update_one({"_id": v}, {"$set": {"x": 1}}, upsert=True)
            assert r.upserted_id == v
            assert cl.metric(0, LOOP) == before + 1, v
            db.t.insert_one({"_id": v, "x": 1})  # a request thread's insert routes it
        for v in vals:
            assert _shard_of(cl, "fwdb.s", v) == _shard_of(cl, "fwdb.t", v), v
            assert db.s.find_one({"_id": v}) == {"_id": v, "x": 1}
    finally:
        cl.close()


# ---------------------------------------------------------------------------------------
# a Jepsen-style history under chunk migrations


@pytest.mark.parametrize("hashed", [False, True], ids=["range", "hashed"])
def test_loop_point_writes_under_migrations_lose_and_duplicate_nothing(
        start_role, tmp_path, hashed):
    cl = MigCluster(start_role, tmp_path, shards=2, proxies=1, coordinators=1)
    ns = "app.h"
    try:
        cl.meta_write({"createDatabase": "app"}, ok_codes=(48, 11000))
        if hashed:
            cl.meta_write({"shardCollection": ns, "key": {"_id": "hashed"},
                           "numChunks": 4, "shards": cl.shard_ids})
        else:
            cl.meta_write({"shardCollection": ns, "key": {"_id": 1},
                           "splitPoints": [{"_id": 10}, {"_id": 20}],
                           "shards": cl.shard_ids})
        ids = list(range(30))
        seed = cl.proxy_client(0).app.h
        seed.insert_many([{"_id": i, "a": []} for i in ids])
        for i in ids:
            seed.find_one({"_id": i})
        acked, failed, errors, stale_reads = [], [], [], []
        stop = threading.Event()

        def worker(w):
            coll = cl.proxy_client(0, retryWrites=(w % 2 == 0)).app.h
            k = 0
            while not stop.is_set():
                _id = ids[(w * 7 + k) % len(ids)]
                tok = f"{w}-{k}"
                k += 1
                try:
                    r = coll.update_one({"_id": _id}, {"$push": {"a": tok}})
                    if r.modified_count != 1:
                        errors.append((tok, "modified", r.raw_result))
                    acked.append((_id, tok))
                except pymongo.errors.PyMongoError as e:
                    failed.append((_id, tok, repr(e)))
                    continue
                try:
                    d = coll.find_one({"_id": _id})
                    if d is None or tok not in d["a"]:
                        stale_reads.append((_id, tok, d))
                except pymongo.errors.PyMongoError as e:
                    failed.append((_id, "read", repr(e)))

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        loop0 = cl.proxy_procs and 0
        wait_until(lambda: len(acked) > 100, 60, what="writes before the moves")
        for rnd in range(3):
            chunks = cl.chunks(ns)
            ch = chunks[rnd % len(chunks)]
            to = [s for s in cl.shard_ids if s != ch["shard"]][0]
            mid = cl.migrate(ns, ch["id"], to)
            n0 = len(acked)
            m = cl.wait_migration(mid)
            assert m["state"] == "complete", m
            wait_until(lambda: len(acked) > n0 + 50, 60, what="writes after a move")
        stop.set()
        for t in threads:
            t.join(60)
        del loop0
        final = {d["_id"]: d["a"] for d in cl.proxy_client(0).app.h.find({}, comment="x")}
        if not hashed:  # owned_docs compares _id values with the chunk bounds
            owned = cl.owned_docs(ns)
            assert {k: v["a"] for k, v in owned.items()} == final
        counts = {}
        for _id, arr in final.items():
            for tok in arr:
                counts[(_id, tok)] = counts.get((_id, tok), 0) + 1
        dup = [k for k, n in counts.items() if n > 1]
        lost = [a for a in acked if counts.get(a, 0) != 1]
        assert dup == [], dup[:10]
        assert lost == [], lost[:10]
        assert errors == [], errors[:5]
        assert stale_reads == [], stale_reads[:5]
        # not-acknowledged pushes: at most once (dup above); and what went wrong, if any
        print("acked", len(acked), "failed", len(failed), failed[:5])
        print("loop", cl_metric(cl, LOOP), "fallbacks", cl_metric(cl, FALLBACK))
        assert cl_metric(cl, LOOP) > len(acked) / 2
    finally:
        cl.close()


def cl_metric(cl, name):
    from conftest import http_get
    st, body = http_get(cl.proxy_procs[0].http_port, "/metrics")
    total = 0.0
    for line in body.decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


# ---------------------------------------------------------------------------------------
# the shard's answers under its failCommand fail point: loop and request thread agree


FAILS = [
    dict(errorCode=13388),                      # StaleConfig: not run, retried
    dict(errorCode=11602),                      # interrupted: may have run
    dict(errorCode=91),                         # ShutdownInProgress: not run, resent
    dict(errorCode=10107),                      # NotWritablePrimary: not run, resent
    dict(errorCode=2),                          # BadValue: answered
    dict(errorCode=11000),                      # a duplicate key, as a command error
    dict(writeConcernError={"code": 64, "errmsg": "waiting for replication timed out",
                            "errInfo": {"wtimeout": True}}),
    dict(writeConcernError={"code": 91, "errmsg": "shutting down"}),
    dict(closeConnection=True),                 # no answer: an unknown outcome
]
FAIL_IDS = ["stale", "interrupted", "shutdown", "notprimary", "badvalue", "dupkey",
            "wce64", "wce91", "close"]


def _cmp_ans(r):
    """An answer without what differs between two runs of a command on two collections
    (cluster time, namespaces, the text of a network error naming a connection)."""
    r = _norm(r)
    if r.get("writeErrors"):
        for we in r["writeErrors"]:
            if we.get("code") in (6, 89, 9001):
                we["errmsg"] = "net"
    if r.get("code") in (6, 89, 9001):
        r["errmsg"] = "net"
    if "cursor" in r:
        r["cursor"]["ns"] = "X"
    return r


@pytest.mark.parametrize("fail", FAILS, ids=FAIL_IDS)
@pytest.mark.parametrize("retry", [True, False], ids=["retryable", "plain"])
def test_shard_failures_are_answered_by_the_loop_as_by_a_request_thread(
        start_role, tmp_path, fail, retry):
    cl = sharded_cluster(start_role, tmp_path, {"_id": 1}, test_cmds=True, colls=("s", "t"))
    try:
        c = cl.proxy_client(0)
        db = c.fwdb
        for name in ("s", "t"):
            db[name].insert_many([{"_id": i, "v": 0} for i in (1, 2, 3, 4, 150)])
            warm_ids(db[name], [1, 150])
        sid = _shard_of(cl, NS, 2)
        assert _shard_of(cl, "fwdb.t", 2) == sid
        sess = c.start_session()
        cmds = [
            ("update", {"updates": [{"q": {"_id": 2}, "u": {"$inc": {"v": 1}}}]}),
            ("update", {"updates": [{"q": {"_id": 5}, "u": {"$inc": {"v": 1}},
                                     "upsert": True}]}),
            ("delete", {"deletes": [{"q": {"_id": 3}, "limit": 1}]}),
            ("find", {"filter": {"_id": 4}}),
        ]
        txn = 100
        for name, body in cmds:
            if name == "find" and "writeConcernError" in fail:
                continue
            answers, took = [], []
            for coll, extra in (("s", {}), ("t", {"comment": "thread"})):
                # the shard's primary known again (a state change or a closed connection
                # makes the proxy forget it; a request thread learns it again)
                warm_ids(db[coll], [1, 150])
                _fail_next(cl, sid, name, **fail)
                cmd = dict({name: coll}, **body, **extra)
                kw = {}
                if retry and name != "find":
                    txn += 1
                    cmd["txnNumber"] = bson.Int64(txn)
                    kw["session"] = sess
                before = cl.metric(0, LOOP) + cl.metric(0, FALLBACK)
                try:
                    r = db.command(cmd, check=False, **kw)
                except pymongo.errors.AutoReconnect as e:  # the proxy closed on us?
                    r = {"exception": repr(e)}
                answers.append(_cmp_ans(r))
                took.append(cl.metric(0, LOOP) + cl.metric(0, FALLBACK) - before)
                # the fail point was used up (one command of that name reached the shard)
                cl.shard_client(sid).admin.command(
                    {"configureFailPoint": "failCommand", "mode": "off"})
            assert took[0] >= 1 and took[1] == 0, (name, took)
            assert answers[0] == answers[1], (name, body, answers)
        sess.end_session()
        assert repr(sorted(db.s.find(), key=repr)) == repr(sorted(db.t.find(), key=repr))
        cl.stop_proxy_clean(0)
    finally:
        cl.close()


# ---------------------------------------------------------------------------------------
# a shard SIGKILLed and SIGSTOPped with loop commands in flight


def _history_check(final, acked, failed):
    counts = {}
    for _id, arr in final.items():
        for tok in arr:
            counts[(_id, tok)] = counts.get((_id, tok), 0) + 1
    dup = [k for k, n in counts.items() if n > 1]
    lost = [a for a in acked if counts.get(a, 0) != 1]
    unknown = {(f[0], f[1]) for f in failed}
    extra = [k for k in counts if k not in unknown and k not in set(acked)]
    assert dup == [], dup[:10]
    assert lost == [], lost[:10]
    assert extra == [], extra[:10]


@pytest.mark.parametrize("key", [{"_id": 1}, {"_id": "hashed"}], ids=["range", "hashed"])
@pytest.mark.parametrize("retry", [True, False], ids=["retryable", "plain"])
def test_loop_pushes_through_a_killed_and_a_paused_shard_are_applied_at_most_once(
        start_role, tmp_path, key, retry):
    cl = sharded_cluster(start_role, tmp_path, key)
    try:
        c = cl.proxy_client(0, retryWrites=retry, socketTimeoutMS=60000)
        coll = c.fwdb.s
        ids = list(range(1, 9)) + [150, 151, 152]
        coll.insert_many([{"_id": i, "a": []} for i in ids])
        warm_ids(coll, ids)
        acked, failed = [], []
        stop = threading.Event()
        lock = threading.Lock()

        def worker(w):
            k = 0
            while not stop.is_set():
                _id = ids[(w * 5 + k) % len(ids)]
                tok = f"{w}-{k}"
                k += 1
                try:
                    r = coll.update_one({"_id": _id}, {"$push": {"a": tok}})
                    with lock:
                        (acked if r.modified_count == 1 else failed).append((_id, tok))
                except pymongo.errors.PyMongoError as e:
                    with lock:
                        failed.append((_id, tok, repr(e)))

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        loop0 = cl.metric(0, LOOP)
        wait_until(lambda: len(acked) > 100, 60, what="writes before the faults")
        sid = cl.shard_ids[0]
        # SIGSTOP with loop writes in flight, then SIGKILL, restart
        cl.shard_procs[sid].pause()
        wait_until(lambda: cl.metric(0, "stripedb_proxy_loop_commands_in_flight") >= 1, 20,
                   what="loop writes in flight to the paused shard")
        cl.shard_procs[sid].kill()
        cl.shard_procs[sid].restart()
        cl.shard_procs[sid].wait_healthy()
        n0 = len(acked)
        wait_until(lambda: len(acked) > n0 + 200, 60, what="writes after the restart")
        # SIGKILL outright with writes in flight
        cl.shard_procs[sid].kill()
        cl.shard_procs[sid].restart()
        cl.shard_procs[sid].wait_healthy()
        n0 = len(acked)
        wait_until(lambda: len(acked) > n0 + 200, 60, what="writes after the second restart")
        stop.set()
        for t in threads:
            t.join(60)
        final = {d["_id"]: d["a"] for d in coll.find({}, comment="x")}
        _history_check(final, acked, failed)
        print("acked", len(acked), "failed", len(failed), failed[:3])
        # the loop took a good part of them (before the faults at least; after a restart
        # it waits for a request thread to learn the primary again)
        assert cl.metric(0, LOOP) - loop0 > 50
        if retry:
            assert all(len(f) == 2 for f in failed) or failed == [], failed[:5]
    finally:
        cl.close()


# ---------------------------------------------------------------------------------------
# a driver's resend of a retryable write after its chunk moved


@pytest.mark.parametrize("hashed", [False, True], ids=["range", "hashed"])
def test_a_retryable_loop_write_resent_after_a_migration_is_not_applied_again(
        start_role, tmp_path, hashed):
    """Retryable update, upsert and delete through the loop; their chunk then migrates
    (the coordinator moves the session records with it, src/shard/retry_mig.c); the same
    commands sent again (a driver's retry after a lost answer) reach the new owner
    through the loop: answered as the first time, applied once. The same through a
    request thread (`comment`) on a twin collection gives the same answers."""
    cl = MigCluster(start_role, tmp_path, shards=2, proxies=1, coordinators=1)
    try:
        cl.meta_write({"createDatabase": "app"}, ok_codes=(48, 11000))
        for coll in ("s", "t"):
            if hashed:
                cl.meta_write({"shardCollection": f"app.{coll}", "key": {"_id": "hashed"},
                               "numChunks": 2, "shards": cl.shard_ids})
            else:
                cl.meta_write({"shardCollection": f"app.{coll}", "key": {"_id": 1},
                               "splitPoints": [{"_id": 100}], "shards": cl.shard_ids})
        c = cl.proxy_client(0)
        db = c.app
        ids = list(range(1, 9)) + [150, 151]
        for coll in ("s", "t"):
            db[coll].insert_many([{"_id": i, "v": 0} for i in ids])
            for i in ids:
                db[coll].update_one({"_id": i}, {"$set": {"w": 1}})
                db[coll].find_one({"_id": i})
        sessions = {}  # one per command: a driver resends its session's latest write
        cmds = [
            ("update", {"updates": [{"q": {"_id": 5}, "u": {"$inc": {"v": 1}}}]}),
            ("update", {"updates": [{"q": {"_id": 42}, "u": {"$inc": {"v": 1}},
                                     "upsert": True}]}),
            ("delete", {"deletes": [{"q": {"_id": 6}, "limit": 1}]}),
        ]

        def run(i, coll, extra):
            name, body = cmds[i]
            cmd = dict({name: coll}, **body, **extra,
                       txnNumber=bson.Int64(10 + i + (100 if coll == "t" else 0)))
            sess = sessions.setdefault((coll, i), c.start_session())
            return _norm(db.command(cmd, session=sess, check=False))

        first = {}
        for coll, extra in (("s", {}), ("t", {"comment": "t"})):
            for i in range(len(cmds)):
                before = cl_metric(cl, LOOP)
                first[(coll, i)] = run(i, coll, extra)
                assert (cl_metric(cl, LOOP) > before) == (coll == "s"), (coll, i)
        # move every chunk holding 5, 42 or 6 of both collections to the other shard
        for coll in ("s", "t"):
            ns = f"app.{coll}"
            moved = set()
            for v in (5, 42, 6):
                owner = _shard_of_mig(cl, ns, v)
                if owner is None:
                    continue
                ch = [x for x in cl.chunks(ns) if x["shard"] == owner and
                      (hashed or chunk_holds(x, v))]
                for x in ch:
                    if x["id"] in moved:
                        continue
                    moved.add(x["id"])
                    to = [s for s in cl.shard_ids if s != owner][0]
                    m = cl.wait_migration(cl.migrate(ns, x["id"], to))
                    assert m["state"] == "complete", m
        # the proxy follows the new routing (a request thread's read refreshes it)
        for coll in ("s", "t"):
            for v in (5, 42, 6):
                db[coll].find_one({"_id": v}, comment="refresh")
        fb = cl_metric(cl, FALLBACK)
        for coll, extra in (("s", {}), ("t", {"comment": "t"})):
            for i in range(len(cmds)):
                before = cl_metric(cl, LOOP)
                again = run(i, coll, extra)
                assert (cl_metric(cl, LOOP) > before) == (coll == "s"), (coll, i)
                assert again == first[(coll, i)], (coll, cmds[i], first[(coll, i)], again)
        print("fallbacks on the resends", cl_metric(cl, FALLBACK) - fb)
        for sess in sessions.values():
            sess.end_session()
        for coll in ("s", "t"):
            assert db[coll].find_one({"_id": 5}) == {"_id": 5, "v": 1, "w": 1}
            assert db[coll].find_one({"_id": 42}) == {"_id": 42, "v": 1}
            assert db[coll].find_one({"_id": 6}) is None
        assert first[("s", 0)] == first[("t", 0)]
    finally:
        cl.close()


def _shard_of_mig(cl, ns, _id):
    db, coll = ns.split(".", 1)
    where = [sid for sid in cl.shard_ids
             if cl.shard_client(sid)[db][coll].find_one({"_id": _id}) is not None]
    return where[0] if where else None


PAIRS = [(bson.Decimal128("1"), 1), (bson.Decimal128("2.5"), 2.5),
         (bson.Int64(2 ** 53), float(2 ** 53)), (bson.Decimal128("1E+2"), 100),
         (-0.0, 0), (bson.Decimal128("-5"), bson.Int64(-5)),
         (bson.Decimal128("NaN"), float("nan")), (bson.Decimal128("Infinity"), float("inf")),
         (bson.Int64(7), bson.Decimal128("7.00")), (3.0, bson.Int64(3)),
         (bson.Decimal128("0.1"), 0.1), (bson.Int64(2 ** 53 + 1), float(2 ** 53 + 2))]


@pytest.mark.parametrize("filtering", [True, False], ids=["filtering", "no-filtering"])
@pytest.mark.parametrize("key", [{"_id": 1}, {"_id": "hashed"}], ids=["range", "hashed"])
def test_an_id_stored_as_one_type_and_asked_as_another(start_role, tmp_path, key, filtering):
    """The document's _id is stored as one numeric type and asked for as another that
    compares equal (or nearly): the loop answers what a request thread answers."""
    cl = sharded_cluster(start_role, tmp_path, key, filtering=filtering, colls=("s", "t"))
    try:
        db = cl.proxy_client(0).fwdb
        for name in ("s", "t"):
            # many chunks' worth of documents so that each shard's primary is known
            db[name].insert_many([{"_id": f"w{i}"} for i in range(16)])
            db[name].insert_many([{"_id": a, "stored": repr(a)} for a, _ in PAIRS])
            warm_ids(db[name], [f"w{i}" for i in range(16)])
        for a, b in PAIRS:
            before = cl.metric(0, LOOP) + cl.metric(0, FALLBACK)
            loop = strip(db.command({"find": "s", "filter": {"_id": b}}, check=False))
            took = cl.metric(0, LOOP) + cl.metric(0, FALLBACK) - before
            thread = strip(db.command({"find": "t", "filter": {"_id": b}, "comment": "t"},
                                      check=False))
            for r in (loop, thread):
                r["cursor"]["ns"] = "X"
            assert took == 1, (a, b)
            assert repr(loop) == repr(thread), (a, b, loop, thread)
            # equal values find their document (MongoDB's order: numbers by value)
            equal = not (isinstance(a, bson.Decimal128) and str(a) == "0.1") and \
                not (a == bson.Int64(2 ** 53 + 1))
            assert len(loop["cursor"]["firstBatch"]) == (1 if equal else 0), (a, b, loop)
            lu = _norm(db.command({"update": "s", "updates": [
                {"q": {"_id": b}, "u": {"$inc": {"c": 1}}}]}, check=False))
            tu = _norm(db.command({"update": "t", "updates": [
                {"q": {"_id": b}, "u": {"$inc": {"c": 1}}}], "comment": "t"}, check=False))
            assert repr(lu) == repr(tu), (a, b, lu, tu)
        assert repr(sorted(db.s.find(), key=repr)) == repr(sorted(db.t.find(), key=repr))
    finally:
        cl.close()


def test_the_proxy_stop_with_sharded_loop_commands_in_flight_exits_clean(start_role, tmp_path):
    """A read, a plain update and a retryable delete of a sharded collection in flight on
    the loop to a stopped shard when the proxy is told to stop: each is answered once the
    shard runs again, each write applied once, and the proxy exits with no leak (each
    command holds a routing reference, forwarder.c fw_conn.rc)."""
    import signal
    from forwarder_helpers import IN_FLIGHT, listener_closed
    cl = sharded_cluster(start_role, tmp_path, {"_id": 1})
    try:
        plain = cl.proxy_client(0, retryWrites=False, retryReads=False).fwdb.s
        retry = cl.proxy_client(0, retryWrites=True, retryReads=False).fwdb.s
        plain.insert_many([{"_id": i, "v": 0} for i in (1, 2, 3, 150)])
        warm_ids(plain, [1, 150])
        warm_ids(retry, [1, 150])
        sid = _shard_of(cl, NS, 1)
        # several of the proxy's own connections to the shard, idle for the loop to take
        # (request threads running at once open them)
        db = cl.proxy_client(0, maxPoolSize=16).fwdb
        ws = [threading.Thread(target=lambda: [db.command(
            {"update": "s", "updates": [{"q": {"_id": 1}, "u": {"$set": {"v": 0}}}],
             "comment": "warm"}) for _ in range(30)]) for _ in range(6)]
        for t in ws:
            t.start()
        for t in ws:
            t.join()
        cl.shard_procs[sid].pause()
        out = {}
        fns = {"read": lambda: plain.find_one({"_id": 1}),
               "update": lambda: plain.update_one({"_id": 2}, {"$inc": {"v": 1}}).raw_result,
               "delete": lambda: retry.delete_one({"_id": 3}).raw_result}
        threads = []
        for k, fn in fns.items():
            def run(k=k, fn=fn):
                try:
                    out[k] = fn()
                except Exception as e:  # noqa: BLE001 - asserted below
                    out[k] = e
            t = threading.Thread(target=run)
            t.start()
            threads.append(t)
            n = len(threads)
            wait_until(lambda: cl.metric(0, IN_FLIGHT) == n, 20, what=f"{n} in flight")
        proxy = cl.proxy_procs[0]
        proxy.signal(signal.SIGTERM)
        wait_until(lambda: listener_closed(cl.proxy_ports[0]), 20, what="the stop began")
        assert proxy.p.poll() is None
        cl.shard_procs[sid].signal(signal.SIGCONT)
        for t in threads:
            t.join(60)
        assert out["read"] == {"_id": 1, "v": 0, "warm": 1}, out
        assert out["update"]["n"] == 1 and out["update"]["nModified"] == 1, out
        assert out["delete"]["n"] == 1, out
        assert proxy.p.wait(timeout=30) == 0, proxy.tail()
        log = proxy.tail(1 << 20)
        assert "Sanitizer" not in log and "runtime error" not in log, log[-6000:]
        shard = cl.shard_client(sid).fwdb.s
        assert shard.find_one({"_id": 2})["v"] == 1
        assert shard.find_one({"_id": 3}) is None
    finally:
        cl.close()


WCS = [{"w": 0}, {"w": 1}, {"w": "majority"}, {"w": 1, "j": True}, {"w": 2, "wtimeout": 200},
       {"w": "nosuchtag"}, {"w": -1}, {"wtimeout": "x"}, {}]


@pytest.mark.parametrize("retry", [True, False], ids=["retryable", "plain"])
def test_write_concerns_of_loop_writes_are_answered_as_by_a_request_thread(
        start_role, tmp_path, retry):
    cl = sharded_cluster(start_role, tmp_path, {"_id": "hashed"}, colls=("s", "t"))
    try:
        c = cl.proxy_client(0)
        db = c.fwdb
        ids = list(range(1, 17))
        for name in ("s", "t"):
            db[name].insert_many([{"_id": i, "v": 0} for i in ids])
            warm_ids(db[name], ids)
        sessions = {}
        txn = 0
        for k, wc in enumerate(WCS):
            for name, body in [
                    ("update", {"updates": [{"q": {"_id": 3}, "u": {"$inc": {"v": 1}}}]}),
                    ("update", {"updates": [{"q": {"_id": 900 + k},
                                             "u": {"$set": {"v": 1}}, "upsert": True}]}),
                    ("delete", {"deletes": [{"q": {"_id": 4 + k}, "limit": 1}]})]:
                txn += 1
                answers, took = [], []
                for coll, extra in (("s", {}), ("t", {"comment": "t"})):
                    cmd = dict({name: coll}, **body, **extra, writeConcern=wc)
                    kw = {}
                    if retry:
                        cmd["txnNumber"] = bson.Int64(txn)
                        kw["session"] = sessions.setdefault(coll, c.start_session())
                    before = cl.metric(0, LOOP) + cl.metric(0, FALLBACK)
                    answers.append(_norm(db.command(cmd, check=False, **kw)))
                    took.append(cl.metric(0, LOOP) + cl.metric(0, FALLBACK) - before)
                    if wc == {"w": 0}:  # unacknowledged: wait for it to be applied
                        wait_until(lambda: db[coll].find_one({"_id": 3}, comment="x")
                                   is not None, 10)
                assert answers[0] == answers[1], (wc, name, body, answers, took)
                assert took[1] == 0, (wc, name)
        for sess in sessions.values():
            sess.end_session()
        wait_until(lambda: repr(sorted(db.s.find(), key=repr)) ==
                   repr(sorted(db.t.find(), key=repr)), 10, what="the same documents")
    finally:
        cl.close()


# ---------------------------------------------------------------------------------------
# a statement with its `q` twice (raw BSON: drivers cannot send it)


def _el(key, val):
    return bson.encode({key: val})[4:-1]


def _doc(*elems):
    body = b"".join(elems)
    return struct.pack("<i", len(body) + 5) + body + b"\x00"


def _raw_command(port, body):
    """body (BSON bytes, $db included) as an OP_MSG; the reply document."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        msg = struct.pack("<I", 0) + b"\x00" + body
        s.sendall(struct.pack("<iiii", 16 + len(msg), 7, 0, 2013) + msg)
        buf = b""
        while len(buf) < 16 or len(buf) < struct.unpack("<i", buf[:4])[0]:
            chunk = s.recv(65536)
            assert chunk, "closed"
            buf += chunk
        return bson.decode(buf[21:])
    finally:
        s.close()


@pytest.mark.parametrize("kind", ["update", "delete"])
@pytest.mark.parametrize("field", ["q", "u", "upsert", "limit", "multi"])
def test_a_statement_with_a_field_twice_is_refused(start_role, tmp_path, kind, field):
    """{q: {_id: 1}, q: {_id: 150}, u: ..., upsert: true}: the proxy routed it by the
    first q (the chunk of 1, shard-a) and the shard used the last one: it upserted
    _id 150 on shard-a, which does not own it, next to the _id 150 on shard-b (and the
    delete answered n: 0 for a document that exists). Refused now, as MongoDB's IDL
    refuses a statement's repeated field (40413), by the loop and a request thread alike,
    and nothing is written."""
    if (kind == "update" and field == "limit") or (kind == "delete" and field in
                                                   ("u", "upsert", "multi")):
        pytest.skip("not a field of that statement")
    cl = sharded_cluster(start_role, tmp_path, {"_id": 1}, colls=("s", "t"))
    try:
        db = cl.proxy_client(0).fwdb
        for name in ("s", "t"):
            db[name].insert_many([{"_id": 1, "v": 0}, {"_id": 150, "v": 0}])
            warm_ids(db[name], [1, 150])
        port = cl.proxy_ports[0]
        twice = {"q": [{"_id": 1}, {"_id": 150}], "u": [{"$set": {"hit": 1}}, {"x": 2}],
                 "upsert": [False, True], "limit": [1, 0], "multi": [False, True]}
        answers = []
        for coll, extra in (("s", b""), ("t", _el("comment", "t"))):
            if kind == "update":
                els = [_el("q", {"_id": 1}), _el("u", {"$set": {"hit": 1}}),
                       _el("upsert", True)]
            else:
                els = [_el("q", {"_id": 1}), _el("limit", 1)]
            els = [e for e in els if not e[1:].startswith(field.encode() + b"\x00")]
            els += [_el(field, v) for v in twice[field]]
            body = _doc(_el(kind, coll),
                        b"\x04" + (kind + "s").encode() + b"\x00" +
                        _doc(b"\x030\x00" + _doc(*els)),
                        extra, _el("$db", "fwdb"))
            answers.append(_norm(_raw_command(port, body)))
        assert answers[0] == answers[1], answers
        assert answers[0]["code"] == 40413, answers
        assert answers[0]["errmsg"] == (f"BSON field '{kind}.{kind}s.{field}' is a "
                                        f"duplicate field"), answers
        for sid in cl.shard_ids:
            for coll in ("s", "t"):
                docs = list(cl.shard_client(sid).fwdb[coll].find())
                assert all("hit" not in d and "x" not in d for d in docs), (sid, docs)
        for coll in ("s", "t"):
            assert sorted(d["_id"] for d in db[coll].find()) == [1, 150]
            assert _shard_of(cl, f"fwdb.{coll}", 150) != _shard_of(cl, f"fwdb.{coll}", 1)
    finally:
        cl.close()
