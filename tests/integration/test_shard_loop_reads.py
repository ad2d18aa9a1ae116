"""A shard answers a find by _id on its event loop thread, without the hand-off to a worker
and back (src/shard/pool.c shard_pool_run_inline, issue #19); any find that turns out not
to be a point read (a view, a plan that is not an _id lookup, the oplog) goes to a worker.
Both paths must answer exactly what the worker path answers. The split is visible in two
counters of /metrics: stripedb_shard_loop_reads_total and
stripedb_shard_loop_reads_deferred_total."""
import threading

import pymongo
import pytest
from pymongo.errors import OperationFailure

from conftest import metric_counter as _counter


def _counts(proc):
    return (_counter(proc, "stripedb_shard_loop_reads_total"),
            _counter(proc, "stripedb_shard_loop_reads_deferred_total"))


@pytest.fixture
def shard_db(shard):
    proc, port = shard
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true")
    db = c.loopreads
    db.c.insert_many([{"_id": i, "x": i, "s": f"v{i}"} for i in range(200)])
    yield proc, c, db
    c.close()


def test_point_reads_answered_on_the_loop(shard_db):
    proc, c, db = shard_db
    before = _counts(proc)
    assert db.c.find_one({"_id": 7}) == {"_id": 7, "x": 7, "s": "v7"}
    assert db.c.find_one({"_id": 1000}) is None
    assert db.c.find_one({"_id": 7, "x": 8}) is None        # the rest of the filter holds
    assert db.c.find_one({"_id": 7}, {"s": 0}) == {"_id": 7, "x": 7}
    assert list(db.c.find({"_id": {"$in": [3, 4]}}).sort("_id", -1)) == [
        {"_id": 4, "x": 4, "s": "v4"}, {"_id": 3, "x": 3, "s": "v3"}]
    assert list(db.c.find({"_id": None})) == []
    assert list(db.nosuchcoll.find({"_id": 1})) == []
    after = _counts(proc)
    assert after[0] - before[0] >= 6, (before, after)
    # the missing collection has no plan: deferred to a worker, answered the same
    assert after[1] - before[1] <= 1, (before, after)


def test_other_finds_go_to_a_worker_with_the_same_answers(shard_db):
    proc, c, db = shard_db
    db.command("create", "v", viewOn="c", pipeline=[{"$match": {"x": {"$lt": 10}}}])
    db.create_collection("ci", collation={"locale": "en", "strength": 2})
    db.ci.insert_many([{"_id": "A"}, {"_id": "b"}])
    before = _counts(proc)
    # three _id values: more than a point read may look up on the loop
    assert [d["_id"] for d in db.c.find({"_id": {"$in": [5, 6, 9]}})] == [5, 6, 9]
    # a view: an aggregation over its source
    assert list(db.v.find({"_id": 3})) == [{"_id": 3, "x": 3, "s": "v3"}]
    assert list(db.v.find({"_id": 30})) == []
    # a string _id under a case-insensitive default collation: not an _id lookup here
    assert list(db.ci.find({"_id": "a"})) == [{"_id": "A"}]
    assert list(db.ci.find({"_id": "B"})) == [{"_id": "b"}]
    # a range on _id
    assert [d["_id"] for d in db.c.find({"_id": {"$gte": 197}})] == [197, 198, 199]
    # the oplog
    c.local["oplog.rs"].find_one({"_id": 1})
    after = _counts(proc)
    assert after[1] - before[1] >= 7, (before, after)
    assert after[0] == before[0], (before, after)
    # with a hint: straight to a worker, not tried on the loop
    assert db.c.find_one({"_id": 8}, hint=[("_id", 1)]) == {"_id": 8, "x": 8, "s": "v8"}
    assert _counts(proc) == after


def test_errors_on_the_loop_path(shard_db):
    proc, c, db = shard_db
    with pytest.raises(OperationFailure) as e:
        db.c.find_one({"_id": {"$foo": 1}})
    assert e.value.code == 2
    with pytest.raises(OperationFailure) as e:
        db.c.find_one({"_id": 3}, {"a": 1, "b": 0})
    assert e.value.code in (31253, 31254, 2)
    # the shard still answers after the failures
    assert db.c.find_one({"_id": 3})["x"] == 3


def test_point_reads_see_whole_updates(shard_db):
    """Readers on the loop and writers through the Raft apply: every document read has
    x == y (one update sets both), and each reader's values of a key never go back."""
    proc, c, db = shard_db
    db.pair.insert_many([{"_id": k, "x": 0, "y": 0} for k in range(8)])
    stop = threading.Event()
    bad = []

    def writer(k):
        cl = pymongo.MongoClient(c.address[0], c.address[1], directConnection=True)
        for n in range(1, 150):
            cl.loopreads.pair.update_one({"_id": k}, {"$set": {"x": n, "y": n}})
        cl.close()

    def reader(k):
        cl = pymongo.MongoClient(c.address[0], c.address[1], directConnection=True)
        last = -1
        while not stop.is_set():
            d = cl.loopreads.pair.find_one({"_id": k})
            if d["x"] != d["y"] or d["x"] < last:
                bad.append((k, d, last))
            last = d["x"]
        cl.close()

    readers = [threading.Thread(target=reader, args=(k % 8,)) for k in range(8)]
    writers = [threading.Thread(target=writer, args=(k,)) for k in range(8)]
    for t in readers + writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in readers:
        t.join()
    assert not bad, bad[:5]
    assert [db.pair.find_one({"_id": k})["x"] for k in range(8)] == [149] * 8


def _quadratic(n):
    """An aggregation expression of n * n steps whatever the document: the sum of n
    arrays of n values' sizes."""
    return {"$reduce": {"input": {"$range": [0, n]}, "initialValue": 0,
                        "in": {"$add": ["$$value", {"$size": {"$range": [0, n]}}]}}}


def test_finds_by_id_with_expressions_keep_maxtimems_and_leave_the_loop(shard_db):
    """A plan by _id bounds the documents read, not the work per document: `let`, $expr
    in the filter and a projection expression run as long as their expressions do. On
    the loop thread they ignored maxTimeMS (answered after seconds) and held the thread
    (Raft's heartbeats: a replica set's primary lost its term). They go to a worker,
    which stops them at maxTimeMS (MaxTimeMSExpired, 50) as it does without the _id."""
    proc, c, db = shard_db
    slow = _quadratic(8000)  # 6.4e7 steps: seconds, far above maxTimeMS
    cases = [
        dict(filter={"_id": 1}, let={"v": slow}),
        dict(filter={"_id": 1, "$expr": {"$gt": [slow, 0]}}),
        dict(filter={"$and": [{"_id": 1}, {"$expr": {"$gt": [slow, 0]}}], "_id": 1}),
        dict(filter={"_id": 1}, projection={"v": slow}),
    ]
    before = _counts(proc)
    for kw in cases:
        with pytest.raises(OperationFailure) as e:
            db.command("find", "c", maxTimeMS=50, **kw)
        assert e.value.code == 50, (kw.keys(), e.value.details)
    assert _counts(proc)[0] == before[0], (before, _counts(proc))
    # cheap ones still run on the loop, with the same answers as before
    small = _quadratic(3)
    assert db.command("find", "c", filter={"_id": 2}, let={"v": small},
                      projection={"x": 1})["cursor"]["firstBatch"] == [{"_id": 2, "x": 2}]
    assert db.command("find", "c", filter={"_id": 2, "$expr": {"$eq": ["$x", 2]}}
                      )["cursor"]["firstBatch"] == [{"_id": 2, "x": 2, "s": "v2"}]
    assert db.command("find", "c", filter={"_id": 2}, projection={"v": small}
                      )["cursor"]["firstBatch"] == [{"_id": 2, "v": 9}]
    mid = _counts(proc)
    assert db.c.find_one({"_id": 3}, {"x": 1, "s": {"$slice": 1}}) == {"_id": 3, "x": 3,
                                                                       "s": "v3"}
    assert db.c.find_one({"_id": 4}, {"s": 0}) == {"_id": 4, "x": 4}
    assert _counts(proc)[0] == mid[0] + 2, (mid, _counts(proc))


def test_big_finds_by_id_are_not_tried_on_the_loop(shard_db):
    """Parsing and planning a find costs time in proportion to its size, on the loop thread
    too before the plan sends it to a worker: a filter {_id: {$in: [900,000 ids]}} held it
    2-7 s. A command over a few KiB goes to a worker without a try on the loop: neither
    counter moves; the answers are the worker's."""
    proc, c, db = shard_db
    ids = list(range(-1500, 1500))  # 3,000 ids: ~30 KB
    before = _counts(proc)
    assert [d["_id"] for d in db.c.find({"_id": {"$in": ids}}).sort("_id", 1)] == \
        list(range(200))
    assert db.c.find_one({"_id": 5, "s": {"$nin": [f"w{i}" for i in range(2000)]}}) == \
        {"_id": 5, "x": 5, "s": "v5"}
    assert _counts(proc) == before, (before, _counts(proc))


def test_a_failed_point_read_does_not_stop_the_next_apply(shard, tmp_path):
    """A point read that meets a corrupt page answers its error (InternalError) and
    nothing more. On the loop thread its SQLite failure was left in the thread's fault
    record (storage/store.c sdb_store_take_io_fault), which the next replicated apply
    there took as its own: the member aborted at the next write ("cannot apply a
    replicated entry, stopping this member"), where the same read on a worker left it
    serving."""
    import os
    import struct
    proc, port = shard
    uri = f"mongodb://127.0.0.1:{port}/?directConnection=true"
    marker = b"MARKERQZ"
    with pymongo.MongoClient(uri) as c:
        c.cor.c.insert_one({"_id": 1, "s": (marker * 40000).decode()})
        c.cor.c.insert_one({"_id": 2, "s": "small"})
    assert proc.stop() == 0
    path = os.path.join(str(tmp_path / "shard"), "shard.db")
    with open(path, "rb") as f:
        data = f.read()
    ps = struct.unpack(">H", data[16:18])[0]
    ps = 65536 if ps == 1 else ps
    # the overflow pages of the document (in its collection and in the oplog): their
    # first 4 bytes are the next page's number; point two of them past the file's end
    pages = [i // ps for i in range(0, len(data), ps)
             if data[i + 8:i + 808].count(marker) >= 90]
    assert len(pages) >= 8, len(pages)
    with open(path, "r+b") as f:
        for q in (pages[len(pages) // 4], pages[3 * len(pages) // 4]):
            f.seek(q * ps)
            f.write(struct.pack(">I", 0x7FFFFFF0))
    proc.restart().wait_healthy()
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=5000, socketTimeoutMS=10000) as c:
        with pytest.raises(OperationFailure) as e:
            c.cor.c.find_one({"_id": 1})
        assert e.value.code == 1 and "malformed" in str(e.value), e.value.details
        c.cor.other.insert_one({"_id": 3})
        c.cor.other.insert_one({"_id": 4})
        assert [d["_id"] for d in c.cor.other.find()] == [3, 4]
    assert proc.p.poll() is None
