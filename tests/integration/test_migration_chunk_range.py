"""A migration reads only its chunk (issue #17): the coordinator's import and cleanup (and
the verification when it reads the chunk again, see migrate_verify.c) send `keyRange: {key,
min, max}` on find / stripedbSnapshot / delete, and the shard answers exactly the chunk's
documents, reading its shard-key index between the bounds (ranged keys; hashed keys on the
hashed index {k: "hashed"} between the chunk's NumberLong bounds), or checking every
document through the hash where a hashed key has no hashed index on the shard.
Measured from the shard's counters stripedb_shard_docs_examined_total and
stripedb_shard_docs_returned_total, and from explain's executionStats."""
import pytest
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from pymongo.errors import OperationFailure

from checker import check
from conftest import free_port, http_get, wait_until
from migration_helpers import MigCluster, Workload, key_cmp, tuple_cmp as _tuple_cmp


def _metrics(port):
    st, body = http_get(port, "/metrics")
    assert st == 200
    out = {}
    for line in body.decode().splitlines():
        if line.startswith("stripedb_shard_docs_") or line.startswith("stripedb_shard_keys_"):
            k, v = line.rsplit(" ", 1)
            out[k] = int(float(v))
    return out


def _key_of(doc, fields):
    out = []
    for f in fields:
        v = doc.get(f)
        out.append(v)
    return out


def _expected(docs, fields, lo, hi):
    return sorted(d["_id"] for d in docs
                  if _tuple_cmp(lo, _key_of(d, fields)) <= 0 and _tuple_cmp(_key_of(d, fields), hi) < 0)


def _find_range(db, key, lo, hi, explain=False):
    cmd = {"find": "c", "filter": {}, "batchSize": 100000,
           "keyRange": {"key": key, "min": lo, "max": hi}}
    if explain:
        return db.command({"explain": cmd, "verbosity": "executionStats"})["executionStats"]
    return sorted(d["_id"] for d in db.command(cmd)["cursor"]["firstBatch"])


def test_key_range_on_a_shard_is_exact_and_reads_the_index(start_role, tmp_path):
    port = free_port()
    d = tmp_path / "s"
    d.mkdir()
    start_role(["--role=shard", f"--listen=127.0.0.1:{port}", f"--data-dir={d}"])
    import pymongo
    cl = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/", directConnection=True)
    db = cl["app"]
    # values of several types, null and missing keys: the range is MongoDB's cross-type
    # order of the index, not a filter with type bracketing
    docs = [{"_id": i, "k": i, "a": i % 10, "b": i} for i in range(2000)]
    docs += [{"_id": 5000 + i, "k": f"s{i:03d}", "a": "x", "b": i} for i in range(50)]
    docs += [{"_id": 6000, "k": None, "a": None, "b": 0}, {"_id": 6001, "b": 1}]
    db.c.insert_many(docs)
    db.c.create_index("k")
    db.c.create_index([("a", 1), ("b", 1)])

    cases = [({"k": 100}, {"k": 120}), ({"k": MinKey()}, {"k": 3}),
             ({"k": 1990}, {"k": MaxKey()}), ({"k": 1500}, {"k": "s010"}),
             ({"k": MinKey()}, {"k": MaxKey()}), ({"k": 7}, {"k": 7})]
    for lo, hi in cases:
        want = _expected(docs, ["k"], [lo["k"]], [hi["k"]])
        assert _find_range(db, {"k": 1}, lo, hi) == want, (lo, hi)
        st = _find_range(db, {"k": 1}, lo, hi, explain=True)
        assert st["nReturned"] == len(want)
        # a one-field range is exact on the index: nothing else is read
        assert st["totalDocsExamined"] == len(want), (lo, hi, st)
    # snapshot reads take the range too, with the shard-key index order
    r = db.command({"stripedbSnapshot": "c", "keyRange": {"key": {"k": 1}, "min": {"k": 10},
                                                           "max": {"k": 20}},
                    "sort": {"k": 1}})
    assert [x["k"] for x in r["cursor"]["firstBatch"]] == list(range(10, 20))
    assert r["cursor"]["atOplogTs"]

    # compound key: not a box per field; the bounds read a's values, the check is exact
    key = {"a": 1, "b": 1}
    for lo, hi in [({"a": 3, "b": 503}, {"a": 5, "b": 15}), ({"a": MinKey(), "b": MinKey()},
                                                             {"a": 0, "b": 1000}),
                   ({"a": 9, "b": 1999}, {"a": MaxKey(), "b": MaxKey()})]:
        want = _expected(docs, ["a", "b"], [lo["a"], lo["b"]], [hi["a"], hi["b"]])
        assert _find_range(db, key, lo, hi) == want, (lo, hi)
        st = _find_range(db, key, lo, hi, explain=True)
        bound = sum(1 for x in docs if key_cmp(lo["a"], x.get("a")) <= 0
                    and key_cmp(x.get("a"), hi["a"]) <= 0)
        assert len(want) <= st["totalDocsExamined"] <= bound, (lo, hi, st)
        assert st["totalDocsExamined"] < len(docs)

    # hashed: two halves of the hash space partition the collection; without a hashed
    # index each examines all (the hash checked on every document), with {k: "hashed"}
    # each examines only its own
    hk = {"k": "hashed"}
    halves = [({"k": MinKey()}, {"k": Int64(0)}), ({"k": Int64(0)}, {"k": MaxKey()}),
              ({"k": Int64(-2**62)}, {"k": Int64(2**62)})]
    lo_half = _find_range(db, hk, *halves[0])
    hi_half = _find_range(db, hk, *halves[1])
    assert lo_half and hi_half and not set(lo_half) & set(hi_half)
    assert sorted(lo_half + hi_half) == sorted(x["_id"] for x in docs)
    st = _find_range(db, hk, *halves[0], explain=True)
    assert st["nReturned"] == len(lo_half) and st["totalDocsExamined"] == len(docs)
    mid = _find_range(db, hk, *halves[2])
    assert db.c.create_index([("k", "hashed")]) == "k_hashed"
    assert {"v": 2, "key": {"k": "hashed"}, "name": "k_hashed"} in list(db.c.list_indexes())
    for (lo, hi), want in zip(halves, [lo_half, hi_half, mid]):
        assert _find_range(db, hk, lo, hi) == want, (lo, hi)
        st = _find_range(db, hk, lo, hi, explain=True)
        assert st["nReturned"] == len(want) and st["totalDocsExamined"] == len(want), st
    # MongoDB's refusals: an array at the hashed path, a unique hashed index
    with pytest.raises(OperationFailure) as e:
        db.c.insert_one({"_id": "arr", "k": [1, 2]})
    assert e.value.code == 16766
    assert "hashed indexes do not currently support array values" in str(e.value)
    with pytest.raises(OperationFailure) as e:
        db.c.create_index([("b", "hashed")], unique=True)
    assert e.value.code == 16764
    # a query on k's values is never bounded by the hashed index (its keys are hashes)
    assert db.c.count_documents({"k": {"$gte": 100, "$lt": 120}}) == 20
    assert [x["k"] for x in db.c.find({"k": {"$lt": 5}}).sort("k", 1)] == [0, 1, 2, 3, 4]
    db.c.drop_index("k_hashed")

    # a migration's cleanup: a range delete in batches (keyRangeLimit), its own writes
    # only ($stripedbOrigin), with the marker q an older shard refuses
    rng = {"key": {"k": 1}, "min": {"k": 100}, "max": {"k": 130}}
    st = {"q": {"$stripedbKeyRange": True}, "limit": 0, "keyRange": rng, "keyRangeLimit": 20}
    r = db.command({"delete": "c", "deletes": [st], "$stripedbOrigin": "mig-t"})
    assert r["n"] == 20
    r = db.command({"delete": "c", "deletes": [st], "$stripedbOrigin": "mig-t"})
    assert r["n"] == 10
    assert db.c.count_documents({"k": {"$gte": 100, "$lt": 130}}) == 0
    assert db.c.count_documents({}) == len(docs) - 30
    assert db.c.count_documents({"k": {"$in": [99, 130]}}) == 2
    for bad_cmd in [{"delete": "c", "deletes": [st]},
                    {"delete": "c", "deletes": [dict(st, q={})], "$stripedbOrigin": "m"},
                    {"delete": "c", "deletes": [dict(st, limit=1)], "$stripedbOrigin": "m"}]:
        with pytest.raises(OperationFailure) as e:
            db.command(bad_cmd)
        assert e.value.code == 2, bad_cmd
    assert db.c.count_documents({}) == len(docs) - 30

    # malformed or misplaced: BadValue, nothing read
    for bad in [{"key": {"k": 1}, "min": {"k": 1}}, {"key": {"k": 1}, "min": 1, "max": {"k": 2}},
                {"key": {"k": 1}, "min": {"k": 1}, "max": {"k": 2}, "x": 1}]:
        with pytest.raises(OperationFailure) as e:
            db.command({"find": "c", "keyRange": bad})
        assert e.value.code == 2, bad
    # keyRange belongs to find and stripedbSnapshot only: elsewhere an unknown field (strict
    # parsing, issue #20)
    with pytest.raises(OperationFailure) as e:
        db.command({"count": "c", "keyRange": {"key": {"k": 1}, "min": {"k": 1},
                                               "max": {"k": 2}}})
    assert e.value.code == 40415 and "count.keyRange" in str(e.value)
    cl.close()


@pytest.mark.parametrize("kind", ["ranged", "compound", "hashed", "hashed-noindex"])
def test_migration_of_one_chunk_reads_only_the_chunk_on_the_source(start_role, tmp_path, kind):
    hashed = kind.startswith("hashed")
    cl = MigCluster(start_role, tmp_path, meta=1, shards=2, proxies=1, coordinators=1)
    try:
        # hashed: fewer documents and chunks (each insert batch is split per chunk)
        ns, n = "app.c", 10000 if hashed else 20000
        if hashed:
            cl.meta_write({"createDatabase": "app"}, ok_codes=(48, 11000))
            cl.meta_write({"shardCollection": ns, "key": {"k": "hashed"}, "numChunks": 50,
                           "shards": ["shard-a"]})
        elif kind == "compound":
            # a = j // 100, b = j: the chunk is a=50 from b=5050, all of a=51, a=52 below
            # b=5210 (160 documents); its bounds read a in [50, 52] (300 documents)
            cl.shard_collection(ns, {"a": 1, "b": 1},
                                split_points=[{"a": 50, "b": 5050}, {"a": 52, "b": 5210}],
                                shards=["shard-a"])
        else:
            cl.shard_collection(ns, {"k": 1}, split_points=[{"k": 10000}, {"k": 10200}],
                                shards=["shard-a"])
        coll = cl.proxy_client()["app"]["c"]
        # the shard key index (MongoDB requires one; shardCollection through the proxy
        # creates it, metadata's own does not: the coordinator's reconciler may have, on
        # the still empty shard, under the same name, which makes this a no-op)
        if kind == "ranged":
            coll.create_index("k")
        elif kind == "compound":
            coll.create_index([("a", 1), ("b", 1)])
        elif kind == "hashed":
            coll.create_index([("k", "hashed")])
        # hashed-noindex: a collection sharded before shards had hashed indexes
        for i in range(0, n, 5000):
            coll.insert_many([{"_id": j, "k": j, "a": j // 100, "b": j, "pad": "x" * 50}
                              for j in range(i, i + 5000)])
        src = cl.shard_client("shard-a")["app"]["c"]
        if kind == "hashed-noindex":
            # the coordinator's reconciler creates {k: "hashed"} on a shard whose collection
            # is still empty, right before it installs the filtering metadata
            # (src/coordinator/reconcile.h): it may have run before the inserts. Once the
            # install is there the reconciler is done with the collection: drop the index
            wait_until(lambda: cl.shard_client("shard-a").admin.command(
                {"stripedbGetFiltering": ns})["installed"], 60, interval=0.2,
                what="the reconciler's install")
            if "k_hashed" in src.index_information():
                src.drop_index("k_hashed")
        if hashed:
            chunk = cl.chunks(ns)[17]
        elif kind == "compound":
            (chunk,) = [c for c in cl.chunks(ns) if c["min"] == {"a": 50, "b": 5050}]
        else:
            (chunk,) = [c for c in cl.chunks(ns) if c["min"] == {"k": 10000}]
        ids = _find_range(src.database, cl.meta_read({"getRoutingTable": ns})["key"],
                          chunk["min"], chunk["max"])
        in_chunk = len(ids)
        assert 0 < in_chunk < n // 20
        port = cl.shard_procs["shard-a"].http_port
        before = _metrics(port)
        mid = cl.migrate(ns, chunk["id"], "shard-b", "--grace-ms=200")
        m = cl.wait_migration(mid)
        assert m["state"] == "complete", m
        after = _metrics(port)
        examined = (after["stripedb_shard_docs_examined_total"]
                    - before["stripedb_shard_docs_examined_total"])
        returned = (after["stripedb_shard_docs_returned_total"]
                    - before["stripedb_shard_docs_returned_total"])
        st = m["stats"]
        print(f"{kind}: n={n} in_chunk={in_chunk} examined={examined} returned={returned}")
        assert st["imported"] == in_chunk and st["verify"]["count"] == in_chunk
        assert st["deleted"] == in_chunk
        # two reads of the chunk's key range on the source, the import's and the
        # cleanup's range deletes (hashed keys: on the hashed index); the verification
        # reads the source's oplog after the import (no write since: 0 entries of the
        # collection) and no document (the import's hashes stand for the source).
        vs = st["verifySource"]
        assert vs == {"mode": "imported", "oplogEntries": 0, "changed": 0, "read": 0,
                      "postImages": 0}, vs
        if kind == "hashed-noindex":
            # no hashed index on the shard: the hash is checked on every document by the
            # two scans (import, the cleanup's read of the chunk's _ids), then the cleanup
            # deletes by _id (one point lookup each)
            assert returned <= 3 * in_chunk + 10, (returned, in_chunk)
            assert 2 * n <= examined <= 2 * n + in_chunk + 10, (examined, n)
        elif kind == "compound":
            assert in_chunk == 160
            assert returned <= 2 * in_chunk + 10, (returned, in_chunk)
            # each read scans the index over a's values 50..52: 300 documents
            assert examined <= 2 * 300 + 10, (examined, in_chunk)
        else:
            assert returned <= 2 * in_chunk + 10, (returned, in_chunk)
            assert examined <= 2 * in_chunk + 10, (examined, in_chunk)
        # exactly the chunk moved
        assert src.count_documents({}) == n - in_chunk
        tgt = cl.shard_client("shard-b")["app"]["c"]
        assert sorted(d["_id"] for d in tgt.find({}, {"_id": 1})) == ids
        assert coll.count_documents({}) == n
    finally:
        cl.close()


def _owned_by_key_range(cl, ns):
    """Every document of ns on the shard that owns its chunk, by a keyRange find per chunk
    (the shard's own test of the range: hashed keys through the hash), keyed by _id."""
    db, coll = ns.split(".", 1)
    key = cl.meta_read({"getRoutingTable": ns})["key"]
    out = {}
    for c in cl.chunks(ns):
        r = cl.shard_client(c["shard"])[db].command(
            {"find": coll, "filter": {}, "batchSize": 1000000,
             "keyRange": {"key": key, "min": c["min"], "max": c["max"]}})
        assert r["cursor"]["id"] == 0
        for d in r["cursor"]["firstBatch"]:
            assert d["_id"] not in out, f"_id {d['_id']} owned twice"
            out[d["_id"]] = d
    return out


def test_hashed_chunk_moves_under_writes_reading_only_the_chunk(start_role, tmp_path):
    """A hashed-key collection sharded through the proxy (which creates {k: "hashed"} on
    every shard), one chunk moved while writers and a reader run: the data checker agrees
    with the acknowledged history, and the source examined about the chunk's documents
    (import and cleanup on the hashed index, the verification's changed _ids, the
    workload's own point operations), not its 10x larger share of the collection."""
    cl = MigCluster(start_role, tmp_path, meta=1, shards=2, proxies=1, coordinators=1)
    try:
        ns, n = "app.c", 10000
        p = cl.proxy_client()
        p.admin.command("shardCollection", ns, key={"k": "hashed"}, numInitialChunks=20)
        for sid in ("shard-a", "shard-b"):
            keys = [ix["key"] for ix in cl.shard_client(sid)["app"]["c"].list_indexes()]
            assert {"k": "hashed"} in keys, (sid, keys)
        coll = p["app"]["c"]
        for i in range(0, n, 5000):
            coll.insert_many([{"_id": j, "k": j, "pad": "x" * 50} for j in range(i, i + 5000)])
        src = cl.shard_client("shard-a")["app"]["c"]
        on_a = src.count_documents({})
        chunks = [c for c in cl.chunks(ns) if c["shard"] == "shard-a"]
        chunk = chunks[len(chunks) // 2]
        hk = {"k": "hashed"}
        # the shard reads the chunk on its hashed index: exactly its documents
        ex = _find_range(src.database, hk, chunk["min"], chunk["max"], explain=True)
        in_chunk = ex["nReturned"]
        assert ex["totalDocsExamined"] == in_chunk
        assert 0 < in_chunk and on_a >= 8 * in_chunk, (in_chunk, on_a)

        port = cl.shard_procs["shard-a"].http_port
        wl = Workload(cl, ns, writers=2, readers=1, keys=300).start()
        # d0..d299: keys 0..299 hash across every chunk, some into the moving one
        before = _metrics(port)
        mid = cl.migrate(ns, chunk["id"], "shard-b", "--grace-ms=200")
        m = cl.wait_migration(mid)
        after = _metrics(port)
        wl.stop()
        assert m["state"] == "complete", m
        st = m["stats"]
        assert st["verify"]["missing"] == 0 and st["verify"]["extra"] == 0
        assert st["verify"]["different"] == 0
        vs = st["verifySource"]
        assert vs["mode"] == "imported", vs
        examined = (after["stripedb_shard_docs_examined_total"]
                    - before["stripedb_shard_docs_examined_total"])
        with wl.lock:
            ops = len(wl.history)
        # each workload operation is a point lookup by _id (at most one document examined,
        # twice if retried after a StaleConfig); the migration itself: the chunk twice
        # (import, cleanup) plus the changed _ids the verification read by _id
        moved = st["imported"]
        budget = 2 * moved + vs["read"] + 2 * ops + 10
        print(f"hashed chunk: in_chunk={in_chunk} imported={moved} deleted={st['deleted']} "
              f"source docs={on_a} examined={examined} workload ops={ops} "
              f"verify read={vs['read']}")
        assert examined <= budget, (examined, budget, moved, ops, vs)
        assert examined < on_a, (examined, on_a)  # before: 3 x on_a (three full scans)
        # the data: no acknowledged write lost or duplicated, every pre-loaded document
        # once, the chunk on shard-b
        owned = _owned_by_key_range(cl, ns)
        final = {k: v for k, v in owned.items() if str(k).startswith("d")}
        verdict = check(wl.history, final)
        assert verdict["ok"], verdict["violations"][:10]
        pre = {k: v for k, v in owned.items() if isinstance(k, int)}
        assert len(pre) == n and all(pre[i]["k"] == i for i in range(n))
        assert [c["shard"] for c in cl.chunks(ns) if c["id"] == chunk["id"]] == ["shard-b"]
        assert coll.count_documents({"_id": {"$type": "int"}}) == n
    finally:
        cl.close()
