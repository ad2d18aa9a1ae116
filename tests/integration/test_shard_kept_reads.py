"""The loop's reads share a read transaction while nothing commits (issue #19,
storage/store.h sdb_store_keep_reads, src/shard/repl.c read_check_cb): a read that takes
over the transaction the previous read of the same loop round left open must still see
every write acknowledged before it was sent. A history of acknowledged writes is checked
against what readers on other connections saw, under concurrent point reads that keep the
loop's rounds full (so that reads do take transactions over: the test checks the counter
stripedb_shard_read_txns_taken_over_total moved, else it proves nothing)."""
import random
import threading

import pymongo

from conftest import metric_counter as _counter, threads_running


def test_reads_see_every_write_acknowledged_before_them(shard):
    proc, port = shard
    uri = f"mongodb://127.0.0.1:{port}/?directConnection=true"
    setup = pymongo.MongoClient(uri)
    coll = setup.keptreads.c
    coll.insert_many([{"_id": i, "v": 0} for i in range(200)])
    taken0 = _counter(proc, "stripedb_shard_read_txns_taken_over_total")

    stop = threading.Event()
    problems = []
    seen_max = [0] * 6

    def reader(k):
        # monotonic reads on one connection: a kept snapshot is never older than the
        # snapshot of the read before it
        rng = random.Random(k)
        with pymongo.MongoClient(uri, maxPoolSize=1) as c:
            rc = c.keptreads.c
            last = 0
            while not stop.is_set():
                d = rc.find_one({"_id": 0})
                if d["v"] < last:
                    problems.append(f"reader {k}: v went back from {last} to {d['v']}")
                last = d["v"]
                seen_max[k] = max(seen_max[k], last)
                rc.find_one({"_id": rng.randrange(1, 200)})

    acked = 0
    with threads_running(stop, reader, [(k,) for k in range(6)]):
        with pymongo.MongoClient(uri) as wc, pymongo.MongoClient(uri, maxPoolSize=1) as cc:
            w, chk = wc.keptreads.c, cc.keptreads.c
            for i in range(1, 301):
                w.update_one({"_id": 0}, {"$set": {"v": i}})
                w.insert_one({"_id": 1000 + i, "v": i})
                acked = i
                # another connection, after the acknowledgements: must see both
                d = chk.find_one({"_id": 0})
                if d["v"] < i:
                    problems.append(f"after write {i} was acknowledged a read saw v={d['v']}")
                if chk.find_one({"_id": 1000 + i}) is None:
                    problems.append(f"acknowledged insert {1000 + i} not found by a later read")
                if i % 50 == 0:
                    w.delete_one({"_id": 1000 + i - 25})
                    if chk.find_one({"_id": 1000 + i - 25}) is not None:
                        problems.append(f"acknowledged delete of {1000 + i - 25} not seen")
    assert not problems, problems[:10]
    assert acked == 300
    assert max(seen_max) <= 300
    final = coll.find_one({"_id": 0})
    assert final == {"_id": 0, "v": 300}
    assert coll.count_documents({"_id": {"$gte": 1000}}) == 300 - 6
    taken = _counter(proc, "stripedb_shard_read_txns_taken_over_total") - taken0
    assert taken > 0, "no read took a kept transaction over: the test checked nothing"
    setup.close()


def test_a_dropped_and_recreated_collection_is_seen_by_the_next_read(shard):
    """A catalog change (drop, create) is a commit: a read after it does not take over a
    snapshot whose catalog cache still named the old collection's table."""
    proc, port = shard
    uri = f"mongodb://127.0.0.1:{port}/?directConnection=true"
    with pymongo.MongoClient(uri) as c, pymongo.MongoClient(uri, maxPoolSize=1) as r:
        db, rdb = c.keptcat, r.keptcat
        for round_ in range(20):
            db.c.insert_one({"_id": 1, "round": round_})
            assert rdb.c.find_one({"_id": 1}) == {"_id": 1, "round": round_}
            db.c.drop()
            assert rdb.c.find_one({"_id": 1}) is None
            db.create_collection("c")
            assert rdb.c.find_one({"_id": 1}) is None
            db.c.drop()
