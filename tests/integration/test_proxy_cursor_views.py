"""A proxy cursor's documents are views into the shard's reply (src/proxy/cursor.c, issue #19):
a stream keeps the shard's whole batch and proxy_cursor_next hands out a borrowed document,
valid until the next call. These tests drive every consumer of those views through real
processes and check the answers against a single shard holding the same documents (the
differential of test_proxy.py), batch by batch with raw find/getMore commands, so that a
document read after its batch was replaced (a shard getMore refilling the stream under a
caller), a batch freed or kept too long, or a view into the wrong stream shows up as a wrong,
missing or duplicated document, or as a sanitizer report in the proxy's log
(stop_proxy_clean: ASan/UBSan/LSan under --enable-sanitizers).

Streams refill often here: shards answer a getMore with at most 1,000 documents
(CURSOR_SHARD_BATCH) or 16 MiB, documents are of mixed sizes (a few over 100 KB), and the
clients ask for odd batch sizes so that the proxy's batches end mid shard batch."""
import os
import random

import bson
import pymongo
import pytest
from bson import MinKey
from bson.son import SON
from pymongo.errors import OperationFailure

from conftest import free_port, vm_rss_kb
from proxy_helpers import ProxyCluster, install_filtering

MAX_BSON = 16 * 1024 * 1024


@pytest.fixture(autouse=True)
def fill_freed_memory(monkeypatch):
    """Under ASan, freed memory is filled (max_free_fill_size): a view read after its batch
    was freed by code ASan does not instrument (libbson's bson_copy, bson_append_document)
    then reads garbage instead of the old bytes, and the answer shows it."""
    asan = os.environ.get("ASAN_OPTIONS", "")
    monkeypatch.setenv("ASAN_OPTIONS", (asan + ":" if asan else "") + "max_free_fill_size=4194304")


def solo_shard(start_role, tmp_path):
    port = free_port()
    d = tmp_path / "solo"
    d.mkdir()
    start_role(["--role=shard", f"--listen=127.0.0.1:{port}", f"--data-dir={d}"])
    return pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/", directConnection=True)


def mixed_doc(rng, i):
    """Small documents mostly, some of 2-40 KB and a few of ~150 KB: shard batches of very
    different byte sizes, replies both inline-small and large."""
    r = rng.random()
    plen = 150_000 if r < 0.004 else (rng.randrange(2_000, 40_000) if r < 0.05 else
                                      rng.randrange(0, 60))
    return {"_id": i, "k": rng.randrange(0, 3000), "a": rng.randrange(0, 25),
            "s": rng.choice("pqrst") + str(rng.randrange(0, 7)),
            "pad": chr(ord("a") + i % 26) * plen, "n": {"i": i, "sq": i * i}}


def batches(db, cmd, get_more_sizes):
    """Run a cursor command, then getMores with the batch sizes of get_more_sizes (cycled;
    None = no batchSize). Returns the list of batches; asserts each reply under 16 MiB."""
    r = db.command(cmd)
    assert len(bson.encode(r)) <= MAX_BSON + 16 * 1024
    cur = r["cursor"]
    out = [cur["firstBatch"]]
    coll = cur["ns"].split(".", 1)[1]
    i = 0
    while cur["id"] != 0:
        gm = SON([("getMore", cur["id"]), ("collection", coll)])
        bs = get_more_sizes[i % len(get_more_sizes)]
        i += 1
        if bs is not None:
            gm["batchSize"] = bs
        r = db.command(gm)
        assert len(bson.encode(r)) <= MAX_BSON + 16 * 1024
        cur = r["cursor"]
        if bs is not None:
            assert len(cur["nextBatch"]) <= bs
        out.append(cur["nextBatch"])
    return out


def flat(bs):
    return [d for b in bs for d in b]


def find_cmd(coll, f=None, sort=None, proj=None, skip=0, limit=0, batch=None, **extra):
    cmd = SON([("find", coll)])
    if f:
        cmd["filter"] = f
    if sort:
        cmd["sort"] = SON(sort)
    if proj is not None:
        cmd["projection"] = proj
    if skip:
        cmd["skip"] = skip
    if limit:
        cmd["limit"] = limit
    if batch is not None:
        cmd["batchSize"] = batch
    cmd.update(extra)
    return cmd


def check_batch_sizes(bs, batch, get_more_sizes, total):
    """The first batch holds exactly min(batch, total) documents (the documents are far
    under the 8 MiB batch budget at these sizes except the 150 KB ones, so only when none
    of those is in it): a proxy batch that ended early or late would show here."""
    if batch is not None and all(len(d.get("pad", "")) < 100_000 for d in bs[0]):
        assert len(bs[0]) == min(batch, total), (len(bs[0]), batch, total)


QUERIES = [
    # (filter, sort, projection, skip, limit)
    ({}, [("a", 1), ("_id", 1)], None, 0, 0),
    ({}, [("k", -1), ("_id", -1)], {"pad": 0}, 0, 0),
    ({"a": {"$lt": 12}}, [("s", 1), ("k", 1), ("_id", 1)], {"k": 1, "s": 1}, 7, 0),
    ({}, [("a", -1), ("_id", 1)], {"_id": 0, "n": 1, "a": 1}, 1500, 0),
    ({"k": {"$gte": 500}}, [("n.sq", -1)], None, 0, 2100),
    ({}, [("s", -1), ("_id", -1)], {"pad": 0, "n": 0}, 333, 1777),
    ({"a": {"$in": [1, 3, 5, 24]}}, [("_id", 1)], {"len": {"$strLenCP": "$pad"}, "a": 1}, 0, 0),
]


def test_sorted_merges_skip_limit_projection_against_one_shard(start_role, tmp_path):
    """Sorted k-way merges over 3 shards (one request per shard, with filtering metadata)
    whose streams refill at different moments, with skip, limit and a projection run on
    the proxy (its output is the cursor's, one per cursor), batch by batch."""
    solo = solo_shard(start_role, tmp_path).db.c
    cl = ProxyCluster(start_role, tmp_path, shards=3, proxies=1)
    try:
        cl.shard_collection("db.c", {"k": 1}, split_points=[{"k": 700}, {"k": 1400},
                                                           {"k": 2100}])
        install_filtering(cl, "db.c", {"k": 1})
        rng = random.Random(57)
        docs = [mixed_doc(rng, i) for i in range(4200)]
        db = cl.proxy_client(0).db
        db.c.insert_many(docs)
        solo.insert_many(docs)
        assert db.c.count_documents({}) == len(docs)
        for qi, (f, sort, proj, skip, limit) in enumerate(QUERIES):
            want = list(solo.find(f, proj).sort(sort).skip(skip).limit(limit))
            for batch, gms in ((None, [None]), (7, [1, 999, None, 2]), (1000, [1001, 3])):
                bs = batches(db, find_cmd("c", f, sort, proj, skip, limit, batch), gms)
                got = flat(bs)
                assert len(got) == len(want), (qi, batch, len(got), len(want))
                assert got == want, (qi, batch)
                check_batch_sizes(bs, batch, gms, len(want))
        # unsorted: every document once (stream order, each stream's order)
        bs = batches(db, find_cmd("c", batch=5), [3, 1000, None])
        ids = [d["_id"] for d in flat(bs)]
        assert len(ids) == len(set(ids)) == len(docs)
        byid = {d["_id"]: d for d in docs}
        assert all(d == byid[d["_id"]] for d in flat(bs))
        # the driver's cursor, and a cursor killed mid-way (its batch freed with it)
        got = list(db.c.find({}, {"pad": 0}, batch_size=11).sort([("k", 1), ("_id", 1)]))
        assert got == list(solo.find({}, {"pad": 0}).sort([("k", 1), ("_id", 1)]))
        r = db.command(find_cmd("c", sort=[("a", 1), ("_id", 1)], batch=3))
        cid = r["cursor"]["id"]
        db.command("getMore", cid, collection="c", batchSize=1200)
        k = db.command("killCursors", "c", cursors=[cid])
        assert k["cursorsKilled"] == [cid]
        with pytest.raises(OperationFailure) as e:
            db.command("getMore", cid, collection="c")
        assert e.value.code == 43
        # a projection failing mid-batch after others were returned: an error, no crash
        with pytest.raises(OperationFailure):
            list(db.c.find({}, {"x": {"$divide": [1, "$a"]}}, batch_size=50)
                 .sort([("a", -1), ("_id", 1)]))
        cl.stop_proxy_clean(0)
    finally:
        cl.close()


def test_per_chunk_streams_drop_orphans_in_and_out_of_transactions(start_role, tmp_path):
    """Without filtering metadata the proxy sends one request per chunk and drops the
    documents of the shard's other chunks and its orphans (index_docs): those dropped
    documents stay in the batch, the views skip them. Also inside a transaction (per-chunk
    requests, getMores one at a time, on one shard)."""
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    try:
        # chunks [Min,500) [500,1000) [1000,1500) on shard-a, [1500,Max) on shard-b
        cl.shard_collection("db.c", {"k": 1},
                            split_points=[{"k": 500}, {"k": 1000}, {"k": 1500}],
                            shards=["shard-a", "shard-a", "shard-a", "shard-b"])
        owner = {}
        for ch in cl.routing("db.c")["chunks"]:
            lo = ch["min"]["k"]
            owner[-1 if isinstance(lo, MinKey) else lo] = ch["shard"]
        db = cl.proxy_client(0).db
        docs = [{"_id": i, "k": (i * 7919) % 2000, "v": i % 13, "pad": "p" * (i % 300)}
                for i in range(3000)]
        db.c.insert_many(docs)
        # orphans: copies on each shard of documents the other shard owns
        on_b = [d for d in docs if d["k"] >= 1500][:400]
        on_a = [d for d in docs if d["k"] < 1500][:400]
        assert {owner[lo] for lo in owner if lo < 1500} == {"shard-a"}, owner
        if owner[1500] == "shard-b":
            cl.shard_client("shard-a").db.c.insert_many(
                [dict(d, _id=f"orphan-{d['_id']}") for d in on_b])
            cl.shard_client("shard-b").db.c.insert_many(
                [dict(d, _id=f"orphan-{d['_id']}") for d in on_a])
        want = sorted(docs, key=lambda d: (d["v"], -d["k"], d["_id"]))
        for batch, gms in ((4, [1, 1000, None]), (999, [2, 3])):
            bs = batches(db, find_cmd("c", sort=[("v", 1), ("k", -1), ("_id", 1)],
                                      batch=batch), gms)
            assert flat(bs) == want
        got = flat(batches(db, find_cmd("c", batch=2), [5, 1000]))
        assert sorted(d["_id"] for d in got) == list(range(3000))
        # a transaction reads the three chunks of shard-a: per-chunk streams, one shard
        in_a = sorted((d for d in docs if d["k"] < 1400), key=lambda d: (-d["k"], d["_id"]))
        c = cl.proxy_client(0)
        with c.start_session() as s:
            s.start_transaction()
            got = list(c.db.c.find({"k": {"$lt": 1400}}, session=s, batch_size=3)
                       .sort([("k", -1), ("_id", 1)]))
            assert got == in_a
            got = list(c.db.c.find({"k": {"$lt": 1400}}, {"pad": 0}, session=s,
                                   batch_size=1001).skip(10).limit(1700))
            assert len(got) == min(1700, len(in_a) - 10)
            assert len({d["_id"] for d in got}) == len(got)
            byid = {d["_id"]: d for d in docs}
            assert all(dict(byid[d["_id"]], pad=None) == dict(d, pad=None) for d in got)
            assert all(d["k"] < 1400 for d in got)
            s.commit_transaction()
        cl.stop_proxy_clean(0)
    finally:
        cl.close()


def test_pipelines_run_on_the_proxy_over_cursors(start_role, tmp_path):
    """Aggregates whose rest runs on the proxy, reading a proxy cursor (agg_next: views
    into the shards' batches) and materialised into one array (run_to_stream, taken as
    the stream's batch): $lookup and $unionWith of a sharded collection, $group, $sort,
    $skip, $limit, answered in batches and compared with one shard holding it all."""
    solo = solo_shard(start_role, tmp_path).db
    cl = ProxyCluster(start_role, tmp_path, shards=3, proxies=1)
    try:
        cl.shard_collection("db.orders", {"k": 1}, split_points=[{"k": 1000}, {"k": 2000}])
        cl.shard_collection("db.items", {"_id": 1}, split_points=[{"_id": 100}, {"_id": 200}])
        rng = random.Random(7)
        orders = [{"_id": i, "k": rng.randrange(0, 3000), "item": rng.randrange(0, 300),
                   "q": rng.randrange(1, 9), "pad": "o" * rng.randrange(0, 400)}
                  for i in range(4500)]
        items = [{"_id": i, "name": f"item{i}", "price": (i * 37) % 101,
                  "blob": "b" * (i % 7 * 300)} for i in range(300)]
        db = cl.proxy_client(0).db
        for coll, d in (("orders", orders), ("items", items)):
            db[coll].insert_many(d)
            solo[coll].insert_many(d)
        pipelines = [
            [{"$match": {"q": {"$gte": 3}}},
             {"$lookup": {"from": "items", "localField": "item", "foreignField": "_id",
                          "as": "it"}},
             {"$sort": {"k": 1, "_id": 1}}, {"$skip": 5}, {"$limit": 1900}],
            [{"$unionWith": {"coll": "items", "pipeline": [{"$project": {"blob": 0}}]}},
             {"$sort": {"_id": -1, "k": 1}}],
            [{"$group": {"_id": "$item", "n": {"$sum": "$q"}, "ks": {"$push": "$k"}}},
             {"$project": {"n": 1, "ks": {"$sortArray": {"input": "$ks", "sortBy": 1}}}},
             {"$sort": {"n": -1, "_id": 1}}],
            [{"$sort": {"q": 1, "k": -1, "_id": 1}}, {"$skip": 100},
             {"$project": {"pad": 0}}],
            [{"$lookup": {"from": "items", "let": {"i": "$item"},
                          "pipeline": [{"$match": {"$expr": {"$eq": ["$_id", "$$i"]}}},
                                       {"$project": {"price": 1}}], "as": "p"}},
             {"$unwind": "$p"}, {"$group": {"_id": "$p.price", "c": {"$sum": 1}}},
             {"$sort": {"_id": 1}}],
            # outputs of a few bytes: the array held inline in its bson_t (bson_steal
            # copies those bytes instead of taking a buffer)
            [{"$match": {"_id": {"$lt": 3}}}, {"$group": {"_id": None, "n": {"$sum": 1}}}],
            [{"$lookup": {"from": "items", "localField": "item", "foreignField": "_id",
                          "as": "it"}}, {"$match": {"_id": {"$in": [4, 9]}}},
             {"$project": {"_id": 1, "q": 1}}],
        ]
        for pi, pl in enumerate(pipelines):
            want = list(solo.orders.aggregate(pl))
            for batch, gms in ((3, [1, 1000, None]), (101, [None]), (0, [7])):
                cmd = SON([("aggregate", "orders"), ("pipeline", pl),
                           ("cursor", {"batchSize": batch})])
                bs = batches(db, cmd, gms)
                got = flat(bs)
                assert len(got) == len(want), (pi, batch, len(got), len(want))
                assert got == want, (pi, batch)
                assert len(bs[0]) == min(batch, len(want)), (pi, batch, len(bs[0]))
        cl.stop_proxy_clean(0)
    finally:
        cl.close()


def test_config_reads_and_large_documents(start_role, tmp_path):
    """config.chunks / config.collections through the proxy (answer_docs: one array taken
    as the stream's batch), and documents near 16 MiB with huge batch sizes (the answer
    pre-sized from the buffered documents, never over 16 MiB a reply)."""
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    try:
        cl.shard_collection("db.many", {"k": 1}, split_points=[{"k": i} for i in range(1, 60)])
        cl.shard_collection("db.big", {"k": 1}, split_points=[{"k": 3}])
        db = cl.proxy_client(0)
        nchunks = len(cl.routing("db.many")["chunks"])
        assert nchunks == 60
        for batch in (1, 7, 1000):
            bs = batches(db.config, find_cmd("chunks", {"ns": "db.many"},
                                             sort=[("min", 1)], batch=batch), [2, None])
            got = flat(bs)
            assert len(got) == nchunks
            assert [c["min"]["k"] for c in got[1:]] == list(range(1, 60))
            assert len({str(c["_id"]) for c in got}) == nchunks
        agg = list(db.config.chunks.aggregate(
            [{"$match": {"ns": {"$in": ["db.many", "db.big"]}}},
             {"$group": {"_id": "$ns", "n": {"$sum": 1}}}, {"$sort": {"_id": 1}}],
            batchSize=1))
        assert agg == [{"_id": "db.big", "n": 2}, {"_id": "db.many", "n": 60}]
        colls = flat(batches(db.config, find_cmd("collections", batch=1), [1]))
        assert {"db.many", "db.big"} <= {c["_id"] for c in colls}
        # near-16 MiB documents: each batch holds what fits, every document once, intact
        big = db.db.big
        # (in every order a batch closes at 8 MiB before a document that would take it
        # over 16 MiB: see test_a_batch_never_goes_over_16_mib for the other case)
        sizes = [15 * 1024 * 1024, 9 * 1024 * 1024, 5 * 1024 * 1024, 100, 3 * 1024 * 1024,
                 12 * 1024 * 1024]
        for i, n in enumerate(sizes):
            big.insert_one({"_id": i, "k": i, "p": chr(ord("A") + i) * n})
        for batch, gms in ((2 ** 31 - 1, [2 ** 31 - 1]), (None, [None]), (1, [1000000])):
            for sort in ([("k", 1)], [("k", -1)], None):
                bs = batches(db.db, find_cmd("big", sort=sort, batch=batch), gms)
                got = flat(bs)
                order = list(range(len(sizes)))
                if sort == [("k", -1)]:
                    order.reverse()
                if sort is None:
                    got.sort(key=lambda d: d["_id"])
                assert [d["_id"] for d in got] == order, (batch, sort)
                assert all(d["p"] == chr(ord("A") + d["_id"]) * sizes[d["_id"]] for d in got)
        bs = batches(db.db, SON([("aggregate", "big"), ("pipeline", [{"$sort": {"k": -1}}]),
                                 ("cursor", {"batchSize": 2 ** 31 - 1})]), [None])
        assert [d["_id"] for d in flat(bs)] == list(range(len(sizes)))[::-1]
        cl.stop_proxy_clean(0)
    finally:
        cl.close()


def test_allow_partial_results_drops_a_shard_mid_merge(start_role, tmp_path):
    """allowPartialResults: a shard killed while the cursor holds views into the batches
    of the others; the remaining documents come once each, in order."""
    cl = ProxyCluster(start_role, tmp_path, shards=3, proxies=1)
    try:
        cl.shard_collection("db.c", {"k": 1}, split_points=[{"k": 1000}, {"k": 2000}])
        install_filtering(cl, "db.c", {"k": 1})
        db = cl.proxy_client(0).db
        docs = [{"_id": i, "k": (i * 613) % 3000, "g": i % 17, "pad": "z" * (i % 500)}
                for i in range(4500)]
        db.c.insert_many(docs)
        owners = {sid: {d["_id"] for d in cl.shard_client(sid).db.c.find({}, {"_id": 1})}
                  for sid in cl.shard_ids}
        down = cl.shard_ids[2]
        r = db.command(find_cmd("c", sort=[("g", 1), ("_id", 1)], batch=5,
                                allowPartialResults=True))
        got = list(r["cursor"]["firstBatch"])
        cid = r["cursor"]["id"]
        cl.shard_procs[down].kill()
        while cid != 0:
            r = db.command("getMore", cid, collection="c", batchSize=777)
            got += r["cursor"]["nextBatch"]
            cid = r["cursor"]["id"]
        ids = [d["_id"] for d in got]
        assert len(ids) == len(set(ids))
        keys = [(d["g"], d["_id"]) for d in got]
        assert keys == sorted(keys)
        live = set().union(*(owners[s] for s in cl.shard_ids if s != down))
        assert live <= set(ids)
        byid = {d["_id"]: d for d in docs}
        assert all(d == byid[d["_id"]] for d in got)
        cl.stop_proxy_clean(0)
    finally:
        cl.close()


def test_per_chunk_streams_hold_their_own_documents_not_the_shards_batch(start_role,
                                                                        tmp_path):
    """Per-chunk requests (a shard without filtering metadata, or any transaction) each
    get ALL the shard's matching documents back and keep those of their chunk only. A
    stream holding the whole reply as its batch then held a copy of the shard's batch per
    chunk: 16 chunks on one shard, 1,000 documents of 16 KB, and one open cursor held
    16 x 16 MB where its documents are 16 MB in all. The proxy's RSS while such cursors are
    open stays near what their documents take. (ASan's quarantine of freed memory is kept
    small, so that RSS measures what is held.)"""
    cl = ProxyCluster(start_role, tmp_path, shards=1, proxies=0)
    try:
        asan = os.environ.get("ASAN_OPTIONS", "")
        port = free_port()
        proxy = start_role(["--role=proxy", f"--listen=127.0.0.1:{port}",
                            f"--metadata={cl.metadata_addr}"],
                           env={"ASAN_OPTIONS": (asan + ":" if asan else "") +
                                "quarantine_size_mb=1"})
        cl.proxy_ports.append(port)
        cl.proxy_procs.append(proxy)
        cl.shard_collection("db.c", {"k": 1}, split_points=[{"k": 64 * i} for i in range(1, 16)])
        db = cl.proxy_client(0).db
        pad = "q" * 16_000
        db.c.insert_many([{"_id": i, "k": i, "pad": pad} for i in range(1000)])
        db.c.insert_many([{"_id": 1000 + i, "k": -1 - i} for i in range(16)])  # tiny
        rss0 = vm_rss_kb(proxy.p.pid)
        cursors = []
        for _ in range(2):  # two cursors open at once
            r = db.command(find_cmd("c", batch=1))
            assert r["cursor"]["id"] != 0
            r2 = db.command("getMore", r["cursor"]["id"], collection="c", batchSize=1)
            assert len(r2["cursor"]["nextBatch"]) == 1
            cursors.append(r["cursor"]["id"])
        grown_mb = (vm_rss_kb(proxy.p.pid) - rss0) / 1024
        got = []
        for cid in cursors:
            while cid:
                r = db.command("getMore", cid, collection="c")
                got += r["cursor"]["nextBatch"]
                cid = r["cursor"]["id"]
        assert len(got) == 2 * 1016 - 4
        # the documents are 16 MB: a copy of the shard's batch per chunk is 256 MB a cursor
        assert grown_mb < 120, f"proxy RSS grew {grown_mb:.0f} MB with two cursors open"
        cl.stop_proxy_clean(0)
    finally:
        cl.close()


def test_a_batch_never_goes_over_16_mib(start_role, tmp_path):
    """A batch under the proxy's 8 MiB budget took the next document whatever its size:
    5 MiB then 15 MiB made a reply of 20 MiB, which the wire answered BSONObjectTooLarge
    (10334), the batch's documents consumed and lost. As mongod
    (FindCommon::haveSpaceForNext), a document that would take the batch over 16 MiB opens
    the next one; with a limit, the last document is not lost either."""
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    try:
        cl.shard_collection("db.big", {"k": 1}, split_points=[{"k": 2}])
        db = cl.proxy_client(0).db
        mib = 1024 * 1024
        sizes = [5 * mib, 15 * mib, 7 * mib, 10 * mib, 100, 12 * mib]
        for i, n in enumerate(sizes):
            db.big.insert_one({"_id": i, "k": i, "p": chr(ord("A") + i) * n})
        for sort, proj, limit in (([("k", 1)], None, 0), ([("k", 1)], {"p": 1}, 2),
                                  ([("_id", 1)], {"_id": 1, "k": 1, "p": 1}, 4),
                                  ([("k", 1)], None, 6)):
            want = list(range(len(sizes)))[:limit or None]
            bs = batches(db, find_cmd("big", sort=sort, proj=proj, limit=limit), [None])
            got = flat(bs)
            assert [d["_id"] for d in got] == want, (sort, proj, limit)
            assert all(d["p"] == chr(ord("A") + d["_id"]) * sizes[d["_id"]] for d in got)
            assert all(sum(len(bson.encode(d)) for d in b) <= MAX_BSON for b in bs)
        got = list(db.big.find({}, {"p": 0}).sort("k", 1))
        assert [d["_id"] for d in got] == list(range(len(sizes)))
        cl.stop_proxy_clean(0)
    finally:
        cl.close()
