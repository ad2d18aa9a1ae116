"""A collection range-sharded on a Decimal128 field whose values differ only past ~19
significant digits, right around a chunk bound (issue #20).

Queries, equality, deletes and unique keys compare decimals exactly (test_decimal_order.py).
Chunk membership keeps one order everywhere — metadata's split/merge checks (op version 4),
the proxy's routing, the shard's ownership filter, the migration's clone, verification and
range deletion by keyRange — the order in which every existing chunk placement was made:
a decimal through its nearest long double (64-bit significand). Two decimals with the same
nearest long double are always in the same chunk; a split point tying a chunk's bound is
refused. Exact membership (MongoDB's) would move a document that ties a bound from below
into the other chunk: on a shard that does not hold it, unreachable, and deleted by the
next import of that chunk onto its shard (an import starts from a clean target).

Every number here is in [2^70, 2^71), where the long doubles are 128 apart, so the tie
classes are computable exactly in Python."""
import threading
import time
from decimal import ROUND_HALF_EVEN, Decimal, getcontext

import pytest
from bson.decimal128 import Decimal128
from bson.max_key import MaxKey
from bson.min_key import MinKey
from pymongo.errors import PyMongoError

from conftest import wait_until
from migration_helpers import MigCluster

getcontext().prec = 60
NS = "pay.tx"
BASE = Decimal("1234567890123456789012")  # 2^70 < BASE < 2^71: long doubles 128 apart
BOUND = BASE + Decimal("0.902")
HIGH = BASE + 100000


def ld(x):
    """The nearest long double of x (x in [2^70, 2^71)), as an exact Decimal."""
    return (x / 128).quantize(Decimal(1), rounding=ROUND_HALF_EVEN) * 128


def d128(x):
    return Decimal128(str(x))


def owner(x):
    """The shard whose chunk holds x by the membership order: chunks [MinKey, BOUND)
    [BOUND, HIGH) [HIGH, MaxKey), placed as the test moves them (`placement`)."""
    if ld(x) < ld(BOUND):
        return 0
    if ld(x) < ld(HIGH):
        return 1
    return 2


def amounts():
    # ties of BOUND below and above it (differ past the 22nd digit), the bound itself,
    # values of the neighbouring long doubles, and far ones on both sides
    out = [BASE + Decimal(f"0.{i:03d}") for i in range(890, 915)]
    out += [BASE - 40, BASE + 40, BASE - 70, BASE + 70, BASE - 1000, BASE + 1000,
            BASE - 10 ** 6, HIGH - Decimal("0.001"), HIGH, HIGH + Decimal("0.001"),
            HIGH + 10 ** 6]
    return out


def test_decimal_shard_key_around_a_chunk_bound_under_migrations(start_role, tmp_path):
    cl = MigCluster(start_role, tmp_path, meta=1, shards=2, proxies=1, coordinators=1)
    try:
        cl.shard_collection(NS, {"amt": 1}, split_points=[{"amt": d128(BOUND)},
                                                         {"amt": d128(HIGH)}],
                            shards=["shard-a", "shard-b"])
        chunks = cl.chunks(NS)
        assert len(chunks) == 3
        # placement: chunk index -> shard
        place = {i: c["shard"] for i, c in enumerate(chunks)}
        coll = cl.proxy_client()["pay"]["tx"]
        coll.create_index("amt")  # the shard-key index: keyRange reads scan it
        vals = amounts()
        docs = {f"p{i}": x for i, x in enumerate(vals)}
        coll.insert_many([{"_id": k, "amt": d128(x), "n": 0} for k, x in docs.items()])
        assert sum(1 for x in vals if owner(x) == 1 and x < BOUND) > 5  # ties below

        # the metadata refuses a split point that ties the chunk's min (not strictly inside
        # by the membership order), and accepts one a long double away
        mid_id = chunks[1]["id"]
        r = cl.meta_write({"splitChunk": mid_id, "at": {"amt": d128(BOUND + 1)}},
                          ok_codes=(2,))
        assert r.get("code") == 2 and "not inside" in r["errmsg"], r

        # writers through the proxy: new tied documents, updates, deletes, all the time
        lock = threading.Lock()
        stop = threading.Event()
        errors = []

        def writer(w):
            getcontext().prec = 60  # a thread starts with the default context (28 digits)
            c = cl.proxy_client()["pay"]["tx"]
            i = 0
            while not stop.is_set():
                k = f"w{w}-{i}"
                # ties of BOUND, distinct from every other amount
                x = BASE + Decimal("0.95") + Decimal(w) / 100 + Decimal(i + 1) / 10 ** 9
                try:
                    c.insert_one({"_id": k, "amt": d128(x), "n": 0})
                    with lock:
                        docs[k] = x
                    c.update_one({"amt": d128(x)}, {"$inc": {"n": 1}})
                    if i % 3 == 0:
                        r = c.delete_one({"amt": d128(x)})
                        assert r.deleted_count == 1
                        with lock:
                            del docs[k]
                except PyMongoError as e:  # a write refused: record and stop the test
                    errors.append(repr(e))
                    return
                i += 1
                time.sleep(0.01)

        ths = [threading.Thread(target=writer, args=(w,)) for w in range(2)]
        for t in ths:
            t.start()
        try:
            # the middle chunk (the tied values) to the other shard, then the low chunk
            for idx in (1, 0):
                c = cl.chunks(NS)[idx]
                to = "shard-a" if c["shard"] == "shard-b" else "shard-b"
                mid = cl.migrate(NS, c["id"], to, "--grace-ms=300")
                m = cl.wait_migration(mid)
                assert m["state"] == "complete", m
                v = m["stats"]["verify"]
                assert v["missing"] == 0 and v["extra"] == 0 and v["different"] == 0, m
                place[idx] = to
        finally:
            stop.set()
            for t in ths:
                t.join()
        assert not errors, errors[:3]

        # every document found exactly once through the proxy, by its exact amount
        got = {d["_id"]: d for d in coll.find({})}
        assert set(got) == set(docs), (set(got) ^ set(docs))
        for k, x in docs.items():
            found = list(coll.find({"amt": d128(x)}))
            assert [d["_id"] for d in found] == [k], (k, x, found)
        assert coll.count_documents({}) == len(docs)
        # per shard: exactly the documents of the chunks it owns, no orphans
        chunks = cl.chunks(NS)
        assert [c["shard"] for c in chunks] == [place[0], place[1], place[2]]
        for sid in ("shard-a", "shard-b"):
            on = {d["_id"] for d in cl.shard_client(sid)["pay"]["tx"].find({})}
            want = {k for k, x in docs.items() if place[owner(x)] == sid}
            assert on == want, (sid, sorted(on ^ want)[:10])
        # the clone read the shard-key index from below the bound (ties below it)
        for sid in ("shard-a", "shard-b"):
            plan = cl.shard_client(sid)["pay"]["tx"].find({"amt": d128(BOUND)}).explain()
            assert plan["queryPlanner"]["winningPlan"]["stage"] == "IXSCAN", plan
        # a range query straddling the bound targets correctly: the exact result
        lo, hi = BASE + Decimal("0.900"), BOUND
        res = {d["_id"] for d in coll.find({"amt": {"$gte": d128(lo), "$lt": d128(hi)}})}
        assert res == {k for k, x in docs.items() if lo <= x < hi}
    finally:
        cl.close()


def test_hashed_decimal_shard_key_keeps_routing(start_role, tmp_path):
    """A hashed shard key over decimals: the hash is the frozen one (storage/keyenc.h),
    so every document is reachable by its exact value, on the shard its chunk names."""
    cl = MigCluster(start_role, tmp_path, meta=1, shards=2, proxies=1, coordinators=0)
    try:
        cl.meta_write({"createDatabase": "pay"}, ok_codes=(48, 11000))
        coll = cl.proxy_client()["pay"]["h"]
        cl.proxy_client().admin.command("shardCollection", "pay.h", key={"amt": "hashed"})
        vals = [BASE + Decimal(f"0.{i:03d}") for i in range(0, 1000, 37)] + \
            [(Decimal(i) / 7).quantize(Decimal("1e-30")) for i in range(1, 40)]
        coll.insert_many([{"_id": i, "amt": d128(x)} for i, x in enumerate(vals)])
        for i, x in enumerate(vals):
            assert [d["_id"] for d in coll.find({"amt": d128(x)})] == [i], x
        assert coll.count_documents({}) == len(vals)
        per = sum(cl.shard_client(s)["pay"]["h"].count_documents({})
                  for s in ("shard-a", "shard-b"))
        assert per == len(vals)
        r = coll.delete_one({"amt": d128(vals[3])})
        assert r.deleted_count == 1
        assert coll.count_documents({"amt": d128(vals[3])}) == 0
        assert coll.count_documents({}) == len(vals) - 1
    finally:
        cl.close()


@pytest.mark.parametrize("bound,above", [
    (Decimal128("18446744073709551616"), Decimal128("18446744073709551617")),
    (1, Decimal128("1.00000000000000000001"))])
def test_compound_key_move_keeps_documents_tying_the_upper_bound(start_role, tmp_path, bound,
                                                                 above):
    """A compound key {acct, ts} whose chunk bound is {acct: B, ts: 100}: documents whose
    acct is just above B exactly but has B's nearest long double, and whose ts is below 100,
    belong to the lower chunk (chunk placement keeps the long-double order). Moving that
    chunk must move them: a review found the migration's read stopped at B exactly and left
    them behind as orphans no query could reach (verify reported nothing)."""
    cl = MigCluster(start_role, tmp_path, meta=1, shards=2, proxies=1, coordinators=1)
    try:
        cl.shard_collection("bank.tx", {"acct": 1, "ts": 1},
                            split_points=[{"acct": bound, "ts": 100}],
                            shards=["shard-a", "shard-a"])
        coll = cl.proxy_client().bank.tx
        coll.create_index([("acct", 1), ("ts", 1)])
        coll.insert_many([{"_id": f"t{t}", "acct": above, "ts": t} for t in range(0, 200, 20)])
        before = sorted(x["_id"] for x in coll.find({}))
        assert len(before) == 10
        lo = cl.chunks("bank.tx")[0]
        m = cl.wait_migration(cl.migrate("bank.tx", lo["id"], "shard-b", "--grace-ms=200"))
        assert m["state"] == "complete", m
        assert sorted(x["_id"] for x in coll.find({})) == before
        on_b = sorted(x["_id"] for x in cl.shard_client("shard-b").bank.tx.find({}))
        assert on_b == sorted(f"t{t}" for t in range(0, 100, 20))
        # the source kept only the upper chunk's documents once the range deletion ran
        wait_until(lambda: sorted(x["_id"] for x in cl.shard_client("shard-a").bank.tx.find({}))
                   == sorted(f"t{t}" for t in range(100, 200, 20)), 30,
                   what="the moved documents deleted from shard-a")
    finally:
        cl.close()
