"""Integration tests of the proxy role (issue #6): metadata + 3 embedded shards + 2 proxies
on loopback, driven by pymongo (and the Node.js driver when node is installed)."""
import json
import os
import random
import subprocess
import threading
import time

import pymongo
import pytest
from bson import MinKey, MaxKey
from pymongo.errors import BulkWriteError, OperationFailure

from conftest import (MONGOSH, NODE_CLIENTS_REQUIRED, NODE_MODULES, free_port, http_get,
                      needs_node_client, node_clients_present, node_env, wait_until)
from proxy_helpers import ProxyCluster


@pytest.fixture
def cluster(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=3, proxies=2)
    yield cl
    cl.close()


def ranged(cl, ns="db.c"):
    """k in [MinKey,100) on shard-a, [100,200) on shard-b, [200,MaxKey) on shard-c."""
    cl.shard_collection(ns, {"k": 1}, split_points=[{"k": 100}, {"k": 200}],
                        shards=["shard-a", "shard-b", "shard-c"])


def chunk_for(table, k):
    for ch in table["chunks"]:
        lo, hi = ch["min"]["k"], ch["max"]["k"]
        if (isinstance(lo, MinKey) or lo <= k) and (isinstance(hi, MaxKey) or k < hi):
            return ch
    raise AssertionError(f"no chunk for {k}")


def test_hello_is_mongos(cluster):
    hello = cluster.proxy_client(0).admin.command("hello")
    assert hello["msg"] == "isdbgrid"
    assert hello["isWritablePrimary"] is True


def test_documents_land_on_their_chunks_shard(cluster):
    ranged(cluster)
    c = cluster.proxy_client(0).db.c
    c.insert_many([{"_id": i, "k": i * 3, "v": f"x{i}"} for i in range(100)])
    table = cluster.routing("db.c")
    expected = {sid: set() for sid in cluster.shard_ids}
    for i in range(100):
        expected[chunk_for(table, i * 3)["shard"]].add(i)
    for sid in cluster.shard_ids:
        got = {d["_id"] for d in cluster.shard_client(sid).db.c.find({}, {"_id": 1})}
        assert got == expected[sid], sid
    assert [len(expected[s]) for s in cluster.shard_ids] == [34, 33, 33]
    # point read through the other proxy, and a targeted update
    c2 = cluster.proxy_client(1).db.c
    assert c2.find_one({"k": 150}) == {"_id": 50, "k": 150, "v": "x50"}
    assert c2.update_one({"k": 150}, {"$set": {"v": "y"}}).modified_count == 1
    assert cluster.shard_client("shard-b").db.c.find_one({"_id": 50})["v"] == "y"


def test_hashed_collection_spreads_and_routes(cluster):
    cluster.shard_collection("db.h", {"u": "hashed"}, num_chunks=6)
    c = cluster.proxy_client(0).db.h
    c.insert_many([{"_id": i, "u": f"user{i}"} for i in range(300)])
    per_shard = {sid: {d["_id"] for d in cluster.shard_client(sid).db.h.find({}, {"_id": 1})}
                 for sid in cluster.shard_ids}
    assert sum(len(v) for v in per_shard.values()) == 300
    assert set().union(*per_shard.values()) == set(range(300))
    assert all(len(v) > 30 for v in per_shard.values())  # 6 even chunks on 3 shards
    for i in (0, 17, 299):
        assert c.find_one({"u": f"user{i}"}) == {"_id": i, "u": f"user{i}"}
    assert c.count_documents({}) == 300
    assert c.count_documents({"_id": {"$lt": 10}}) == 10


def test_merged_getmore_sort_skip_limit(cluster):
    ranged(cluster)
    c = cluster.proxy_client(0).db.c
    c.insert_many([{"_id": i, "k": (i * 7) % 300, "g": i % 5} for i in range(300)])
    cur = c.find({}, batch_size=7).sort([("g", 1), ("k", -1)]).skip(13).limit(250)
    docs = list(cur)
    expect = sorted(({"_id": i, "k": (i * 7) % 300, "g": i % 5} for i in range(300)),
                    key=lambda d: (d["g"], -d["k"]))[13:263]
    assert docs == expect
    # a raw getMore sequence: firstBatch 10, then batches of 50 until exhausted
    db = cluster.proxy_client(1).db
    r = db.command("find", "c", filter={"k": {"$gte": 50}}, sort={"k": 1}, batchSize=10)
    got = [d["k"] for d in r["cursor"]["firstBatch"]]
    cid = r["cursor"]["id"]
    assert len(got) == 10 and cid != 0
    while cid:
        r = db.command("getMore", cid, collection="c", batchSize=50)
        got += [d["k"] for d in r["cursor"]["nextBatch"]]
        cid = r["cursor"]["id"]
    assert got == list(range(50, 300))
    # batchSize 0: an empty first batch, then everything on getMore (no batchSize)
    r = db.command("find", "c", filter={"k": {"$lt": 20}}, sort={"k": -1}, batchSize=0)
    assert r["cursor"]["firstBatch"] == [] and r["cursor"]["id"] != 0
    r = db.command("getMore", r["cursor"]["id"], collection="c")
    assert [d["k"] for d in r["cursor"]["nextBatch"]] == list(range(19, -1, -1))
    assert r["cursor"]["id"] == 0
    # killCursors
    r = db.command("find", "c", batchSize=2)
    cid = r["cursor"]["id"]
    k = db.command("killCursors", "c", cursors=[cid, 12345])
    assert k["cursorsKilled"] == [cid] and k["cursorsNotFound"] == [12345]
    with pytest.raises(OperationFailure) as e:
        db.command("getMore", cid, collection="c")
    assert e.value.code == 43


def test_ordered_unordered_duplicates_across_shards(cluster):
    ranged(cluster)
    c = cluster.proxy_client(0).db.c
    c.insert_many([{"_id": 1, "k": 1}, {"_id": 150, "k": 150}])
    batch = [{"_id": 2, "k": 2}, {"_id": 151, "k": 151}, {"_id": 150, "k": 150},
             {"_id": 250, "k": 250}, {"_id": 1, "k": 1}, {"_id": 3, "k": 3}]
    with pytest.raises(BulkWriteError) as e:
        c.insert_many(batch, ordered=True)
    res = e.value.details
    assert res["nInserted"] == 2
    assert [(w["index"], w["code"]) for w in res["writeErrors"]] == [(2, 11000)]
    assert sorted(d["_id"] for d in c.find()) == [1, 2, 150, 151]
    c.delete_many({"_id": {"$in": [2, 151]}})
    with pytest.raises(BulkWriteError) as e:
        c.insert_many(batch, ordered=False)
    res = e.value.details
    assert res["nInserted"] == 4
    assert [(w["index"], w["code"]) for w in res["writeErrors"]] == [(2, 11000), (4, 11000)]
    assert sorted(d["_id"] for d in c.find()) == [1, 2, 3, 150, 151, 250]


def test_writes_multi_and_shard_key_rules(cluster):
    ranged(cluster)
    c = cluster.proxy_client(0).db.c
    c.insert_many([{"_id": i, "k": i, "n": 0} for i in range(0, 300, 10)])
    assert c.update_many({"k": {"$gte": 50}}, {"$inc": {"n": 1}}).raw_result["nModified"] == 25
    assert c.count_documents({"n": 1}) == 25
    assert c.update_many({}, {"$inc": {"n": 1}}).modified_count == 30
    assert c.delete_many({"k": {"$gte": 250}}).deleted_count == 5
    # single-document forms without the shard key
    assert c.update_one({"n": 2}, {"$set": {"one": True}}).modified_count == 1
    assert c.count_documents({"one": True}) == 1
    assert c.delete_one({"n": 1}).deleted_count == 1
    assert c.count_documents({}) == 24
    # changing the shard key is refused (MongoDB ImmutableField)
    with pytest.raises(OperationFailure) as e:
        c.update_one({"k": 100}, {"$set": {"k": 101}})
    assert e.value.code == 66
    # upsert needs the full shard key
    with pytest.raises(OperationFailure) as e:
        c.update_one({"n": 99}, {"$set": {"z": 1}}, upsert=True)
    assert e.value.code == 61
    r = c.update_one({"k": 777}, {"$set": {"z": 1}}, upsert=True)
    assert r.upserted_id is not None
    assert cluster.shard_client("shard-c").db.c.count_documents({"k": 777}) == 1
    # $setOnInsert of the pinned key value (what $merge's keepExisting sends): inserted,
    # then a no-op on the existing document; another value is an attempt to change it
    r = c.update_one({"k": 778}, {"$setOnInsert": {"k": 778, "w": 1}}, upsert=True)
    assert r.upserted_id is not None
    r = c.update_one({"k": 778}, {"$setOnInsert": {"k": 778, "w": 2}}, upsert=True)
    assert r.matched_count == 1 and r.modified_count == 0
    assert c.find_one({"k": 778}, {"_id": 0}) == {"k": 778, "w": 1}
    with pytest.raises(OperationFailure) as e:
        c.update_one({"k": 779}, {"$setOnInsert": {"k": 1}}, upsert=True)
    assert e.value.code == 66
    c.delete_one({"k": 778})
    # findAndModify with and without the key
    d = c.find_one_and_update({"k": 120}, {"$set": {"f": 1}}, return_document=True)
    assert d["f"] == 1 and d["k"] == 120
    d = c.find_one_and_update({"n": 2}, {"$set": {"f": 2}}, sort=[("k", -1)],
                              return_document=True)
    assert d["k"] == 240 and d["f"] == 2
    assert sorted(c.distinct("f")) == [1, 2]
    # $where and JavaScript are never accepted
    with pytest.raises(OperationFailure):
        list(c.find({"$where": "this.k > 1"}))
    with pytest.raises(OperationFailure):
        c.count_documents({"$where": "true"})


def test_unsharded_collection_on_primary(cluster):
    c = cluster.proxy_client(0).db2.plain
    c.insert_many([{"_id": i} for i in range(5)])
    assert cluster.shard_client("shard-a").db2.plain.count_documents({}) == 5
    assert [d["_id"] for d in c.find().sort("_id", -1).limit(2)] == [4, 3]
    c.create_index("x")
    names = sorted(ix["name"] for ix in c.list_indexes())
    assert names == ["_id_", "x_1"]


def test_javascript_code_values_are_data_but_js_operators_are_refused(cluster):
    """A document may hold JavaScript code values (BSON types 13 and 15) through every
    write path, as on mongod; only the server-side JavaScript operators ($where,
    $function, $accumulator) are refused (BadValue)."""
    from bson.code import Code
    c = cluster.proxy_client(0).jsdb.c
    c.insert_one({"_id": 1, "f": Code("function() { return 1; }")})
    c.replace_one({"_id": 1}, {"f": Code("x", {"s": 1}), "n": 1})
    c.update_one({"_id": 2}, {"$set": {"f": Code("y")}}, upsert=True)
    c.replace_one({"_id": 3}, {"f": Code("z")}, upsert=True)
    got = {d["_id"]: d["f"] for d in c.find()}
    assert got == {1: Code("x", {"s": 1}), 2: Code("y"), 3: Code("z")}
    for bad in ({"$where": "this.n == 1"},
                {"$expr": {"$function": {"body": "function() { return true; }", "args": [],
                                         "lang": "js"}}}):
        with pytest.raises(OperationFailure) as e:
            c.update_one(bad, {"$set": {"n": 2}})
        assert e.value.code == 2
    with pytest.raises(OperationFailure) as e:
        c.update_one({"_id": 1}, [{"$set": {"n": {"$function": {
            "body": "function() { return 2; }", "args": [], "lang": "js"}}}}])
    assert e.value.code == 2
    assert c.find_one({"_id": 1})["n"] == 1


def test_computed_fields_in_find_projections(cluster):
    """Find projections take aggregation expressions (MongoDB 4.4+) on a sharded
    collection (the proxy projects the merged documents) and an unsharded one (the shard
    projects), and in findAndModify's fields; an expression in an exclusion is refused."""
    ranged(cluster)
    db = cluster.proxy_client(0).db
    docs = [{"_id": i, "k": i * 10, "arr": list(range(i % 4)), "s": {"t": i}} for i in range(30)]
    db.c.insert_many(docs)
    db.u.insert_many(docs)
    proj = {"_id": 0, "k": 1, "n": {"$size": "$arr"}, "t2": {"$multiply": ["$s.t", 2]},
            "tag": "lit"}
    want = [{"k": d["k"], "n": len(d["arr"]), "t2": d["s"]["t"] * 2, "tag": "lit"}
            for d in docs]
    for coll in (db.c, db.u):
        assert list(coll.find({}, proj).sort("k", 1)) == want
    got = db.u.find_one_and_update({"_id": 3}, {"$set": {"x": 1}}, projection=proj)
    assert got == want[3]
    with pytest.raises(OperationFailure) as e:
        list(db.c.find({}, {"k": 0, "n": {"$size": "$arr"}}))
    assert e.value.code == 31252


def test_expr_in_query_filters(cluster):
    """$expr (an aggregation expression over the whole document) in the filters of find,
    count, distinct, update, delete, findAndModify and $match, on a sharded collection
    (through the proxy's merge) and an unsharded one (forwarded to its shard); an
    evaluation error fails the command with the expression's code and writes nothing."""
    ranged(cluster)
    db = cluster.proxy_client(0).db
    docs = [{"_id": i, "k": i * 10, "a": i % 7, "b": i % 5} for i in range(40)]
    for coll in (db.c, db.u):
        coll.insert_many(docs)
        gt = {"$expr": {"$gt": ["$a", "$b"]}}
        want = sorted(d["_id"] for d in docs if d["a"] > d["b"])
        assert sorted(d["_id"] for d in coll.find(gt)) == want
        assert coll.count_documents(gt) == len(want)
        assert sorted(coll.distinct("a", gt)) == sorted({d["a"] for d in docs if d["a"] > d["b"]})
        mixed = {"$or": [{"k": 0}, {"$expr": {"$eq": ["$a", {"$add": ["$b", 2]}]}}]}
        want_mixed = sorted(d["_id"] for d in docs if d["k"] == 0 or d["a"] == d["b"] + 2)
        assert sorted(d["_id"] for d in coll.aggregate([{"$match": mixed}])) == want_mixed
        assert sorted(d["_id"] for d in coll.find(mixed)) == want_mixed
        with pytest.raises(OperationFailure) as e:
            list(coll.find({"$expr": {"$divide": [1, "$b"]}}))
        assert e.value.code == 16608
        with pytest.raises(OperationFailure) as e:
            coll.update_many({"$expr": {"$divide": [1, 0]}}, {"$set": {"hit": 1}})
        assert e.value.code == 16608
        assert coll.count_documents({"hit": 1}) == 0
        r = coll.update_many(gt, {"$set": {"hit": 1}})
        assert r.modified_count == len(want)
        assert sorted(d["_id"] for d in coll.find({"hit": 1})) == want
        got = coll.find_one_and_update({"$expr": {"$eq": ["$_id", 3]}}, {"$set": {"f": 1}},
                                       return_document=True)
        assert got["_id"] == 3 and got["f"] == 1
        r = coll.delete_many({"$expr": {"$lt": ["$a", "$b"]}})
        assert r.deleted_count == sum(1 for d in docs if d["a"] < d["b"])
        with pytest.raises(OperationFailure) as e:
            list(coll.find({"x": {"$elemMatch": {"$expr": {"$eq": ["$a", 1]}}}}))
        assert e.value.code == 2
        # an upsert takes its equality fields from the filter, never the $expr
        r = coll.update_one({"_id": 100, "k": 1000, "$expr": {"$eq": ["$a", 99]}},
                            {"$set": {"up": 1}}, upsert=True)
        assert r.upserted_id == 100
        assert coll.find_one({"_id": 100}) == {"_id": 100, "k": 1000, "up": 1}


def test_int64_max_skip_and_limit(cluster):
    """The largest int64 is a valid $skip/$limit (and find skip): no overflow where the
    proxy and the shards add skip and limit or batch size (UBSan in CI), and the answer is
    what MongoDB gives."""
    from bson.int64 import Int64
    ranged(cluster)
    big = Int64(2 ** 63 - 1)
    for coll in (cluster.proxy_client(0).db.c, cluster.proxy_client(0).db.u):
        coll.insert_many([{"_id": i, "k": i * 60} for i in range(5)])
        ks = [i * 60 for i in range(5)]
        assert list(coll.aggregate([{"$sort": {"k": 1}}, {"$skip": big}, {"$limit": 5}])) == []
        assert list(coll.aggregate([{"$sort": {"k": 1}}, {"$skip": 1}, {"$skip": big}])) == []
        assert [d["k"] for d in coll.aggregate([{"$sort": {"k": 1}}, {"$limit": big}])] == ks
        assert list(coll.find().sort("k", 1).skip(2 ** 63 - 1).batch_size(5)) == []
        assert [d["k"] for d in coll.find().sort("k", 1).limit(2 ** 63 - 1)] == ks


def test_indexes_broadcast_and_aggregate(cluster):
    ranged(cluster)
    c = cluster.proxy_client(0).db.c
    c.insert_many([{"_id": i, "k": i, "g": i % 3} for i in range(300)])
    c.create_index([("g", 1)])
    for sid in cluster.shard_ids:
        names = sorted(ix["name"] for ix in cluster.shard_client(sid).db.c.list_indexes())
        assert names == ["_id_", "g_1"], sid
    out = list(c.aggregate([{"$match": {"k": {"$gte": 90}}},
                            {"$group": {"_id": "$g", "n": {"$sum": 1}, "s": {"$sum": "$k"}}},
                            {"$sort": {"_id": 1}}]))
    exp = {}
    for i in range(90, 300):
        e = exp.setdefault(i % 3, [0, 0])
        e[0] += 1
        e[1] += i
    assert out == [{"_id": g, "n": exp[g][0], "s": exp[g][1]} for g in (0, 1, 2)]
    ranged(cluster, "db.empty")  # sharded, never written: known from metadata only
    assert sorted(cluster.proxy_client(0).db.list_collection_names()) == ["c", "empty"]
    assert "db" in cluster.proxy_client(0).list_database_names()


def test_unknown_index_spec_fields_are_refused_on_a_shard_and_through_a_proxy(cluster):
    # issue #20: {uniqe: true} made a non-unique index; mongod refuses a field it does not
    # know (index_key_validate.cpp validateIndexSpecFieldNames), before building any index
    ranged(cluster)
    spec = "{ key: { u: 1 }, name: \"u_1\", uniqe: true }"
    msg = (f"Error in specification {spec} :: caused by :: The field 'uniqe' is not valid "
           f"for an index specification. Specification: {spec}")
    dbs = [cluster.shard_client("shard-a").mm, cluster.proxy_client(0).mm,  # unsharded
           cluster.proxy_client(0).db]  # db.c is sharded over the 3 shards
    for db, coll in zip(dbs, ["mm", "mm", "c"]):
        with pytest.raises(OperationFailure) as e:
            db.command({"createIndexes": coll, "indexes": [
                {"key": {"ok": 1}, "name": "ok_1"},
                {"key": {"u": 1}, "name": "u_1", "uniqe": True}]})
        assert e.value.code == 197, (coll, e.value.details)
        assert e.value.details["codeName"] == "InvalidIndexSpecificationOption"
        assert e.value.details["errmsg"] == msg, e.value.details
        # nothing was built, not even the valid specification before it
        for sid in cluster.shard_ids:
            names = [ix["name"] for ix in cluster.shard_client(sid)[db.name][coll].list_indexes()]
            assert "ok_1" not in names and "u_1" not in names, (sid, names)
    # nested values are quoted as mongod prints them
    with pytest.raises(OperationFailure) as e:
        cluster.proxy_client(0).mm.command({"createIndexes": "mm", "indexes": [
            {"key": {"a": 1, "b": -1}, "name": "ab", "bogus": [1, "x", {"y": None}],
             "sparse": False}]})
    assert e.value.code == 197
    assert e.value.details["errmsg"].endswith(
        "Specification: { key: { a: 1, b: -1 }, name: \"ab\", bogus: [ 1, \"x\", "
        "{ y: null } ], sparse: false }"), e.value.details
    # the fields mongod knows still reach the index checks as before
    cluster.proxy_client(0).mm.command({"createIndexes": "mm", "indexes": [
        {"key": {"u": 1}, "name": "u_1", "unique": True, "v": 2, "background": True}]})
    ix = {i["name"]: i for i in cluster.proxy_client(0).mm.mm.list_indexes()}
    assert ix["u_1"]["unique"] is True


# ---------------------------------------------------------------- differential test

OPS = ["$lt", "$lte", "$gt", "$gte", "$ne", "$in", "$eq"]


def rand_doc(rng, i):
    d = {"_id": i, "k": rng.randrange(-50, 350), "a": rng.randrange(0, 20),
         "s": rng.choice(["x", "y", "z", "w"]) + str(rng.randrange(0, 5))}
    if rng.random() < 0.3:
        d["arr"] = [rng.randrange(0, 10) for _ in range(rng.randrange(0, 4))]
    if rng.random() < 0.2:
        d["k"] = rng.choice([None, "str", 1.5, 2 ** 40])
    if rng.random() < 0.1:
        del d["a"]
    return d


def rand_query(rng):
    f = {}
    for _ in range(rng.randrange(0, 3)):
        field = rng.choice(["k", "a", "arr", "s"])
        op = rng.choice(OPS)
        if op == "$in":
            f[field] = {op: [rng.randrange(-50, 350) for _ in range(3)]}
        elif field == "s":
            f[field] = {op: rng.choice(["x1", "y2", "z0"])} if op != "$in" else {op: ["x1"]}
        else:
            f[field] = {op: rng.randrange(-50, 350)}
    sort_fields = rng.sample(["k", "a", "s", "arr"], rng.randrange(0, 3))
    sort = [(s, rng.choice([1, -1])) for s in sort_fields] + [("_id", rng.choice([1, -1]))]
    proj = rng.choice([None, {"k": 1, "a": 1}, {"s": 0}, {"_id": 0, "k": 1}])
    return f, sort, rng.randrange(0, 30), rng.choice([0, 0, 5, 50]), proj


SHARDINGS = {
    "ranged": dict(key={"k": 1}, split_points=[{"k": 100}, {"k": 200}]),
    "hashed": dict(key={"_id": "hashed"}, num_chunks=6),
    "compound": dict(key={"a": 1, "k": 1},
                     split_points=[{"a": 5, "k": 0}, {"a": 12, "k": MinKey()}]),
}


@pytest.mark.parametrize("sharding", sorted(SHARDINGS))
def test_differential_vs_one_shard(cluster, start_role, tmp_path, sharding):
    port = free_port()
    d = tmp_path / "solo"
    d.mkdir()
    start_role(["--role=shard", f"--listen=127.0.0.1:{port}", f"--data-dir={d}"])
    solo = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/", directConnection=True).db.c
    cluster.shard_collection("db.c", **SHARDINGS[sharding])
    prox = cluster.proxy_client(0).db.c
    rng = random.Random(6)
    docs = [rand_doc(rng, i) for i in range(600)]
    prox.insert_many(docs)
    solo.insert_many(docs)
    assert prox.count_documents({}) == 600
    for n in range(100):
        f, sort, skip, limit, proj = rand_query(rng)
        a = list(prox.find(f, proj, batch_size=rng.choice([3, 50, 1000])).sort(sort)
                 .skip(skip).limit(limit))
        b = list(solo.find(f, proj).sort(sort).skip(skip).limit(limit))
        assert a == b, f"query {n}: filter={f} sort={sort} skip={skip} limit={limit}"
        assert prox.count_documents(f) == solo.count_documents(f), f
        if n % 10 == 0:
            assert sorted(prox.distinct("a", f)) == sorted(solo.distinct("a", f))


# ---------------------------------------------------------------- routing change

def move_chunk(cl, ns, chunk, target):
    """The migration's switch, done by hand: bump the token on the source (it refuses the
    old token from now on), copy the chunk's documents, update the routing."""
    cid, token, source = chunk["id"], chunk["token"], chunk["shard"]
    src = cl.shard_client(source)
    src.admin.command({"stripedbSetVersion": 1, "chunk": str(cid), "token": token + 1})
    dbname, coll = ns.split(".", 1)
    lo, hi = chunk["min"]["k"], chunk["max"]["k"]
    q = {}
    if not isinstance(lo, MinKey):
        q.setdefault("k", {})["$gte"] = lo
    if not isinstance(hi, MaxKey):
        q.setdefault("k", {})["$lt"] = hi
    docs = list(src[dbname][coll].find(q))
    if docs:
        cl.shard_client(target)[dbname][coll].insert_many(docs)
    cl.meta_cmd({"setChunkShard": cid, "shard": target, "token": token + 1})
    return len(docs)


def test_routing_change_under_load(cluster):
    ranged(cluster)
    c = cluster.proxies_client()
    coll = c.db.c
    acked, errors = [], []
    stop = threading.Event()

    def writer(wid):
        i = 0
        while not stop.is_set():
            doc = {"_id": f"{wid}-{i}", "k": (wid * 37 + i) % 300}
            try:
                coll.insert_one(doc)
                acked.append(doc["_id"])
                if i % 5 == 0:
                    assert coll.find_one({"_id": doc["_id"], "k": doc["k"]}) is not None
            except Exception as e:  # noqa: BLE001 - every error is a failure
                errors.append(repr(e))
            i += 1

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    wait_until(lambda: len(acked) > 200, 30, what="writes before the move")
    table = cluster.routing("db.c")
    chunk = [ch for ch in table["chunks"] if ch["shard"] == "shard-a"][0]
    moved = move_chunk(cluster, "db.c", chunk, "shard-b")
    n_at_move = len(acked)
    wait_until(lambda: len(acked) > n_at_move + 200, 30, what="writes after the move")
    stop.set()
    for t in threads:
        t.join()
    assert errors == []
    assert moved > 0
    got = {d["_id"] for d in coll.find({}, {"_id": 1})}
    assert got == set(acked)
    assert coll.count_documents({}) == len(acked)
    # the chunk's writes after the switch went to shard-b only
    new_table = cluster.routing("db.c")
    assert [ch["shard"] for ch in new_table["chunks"]] == ["shard-b", "shard-b", "shard-c"]
    late = cluster.shard_client("shard-b").db.c.count_documents({"k": {"$lt": 100}})
    assert late >= moved
    # the switch was seen as StaleConfig by at least one proxy, and retried
    retries = sum(cluster.metric(i, "stripedb_proxy_stale_retries_total") for i in (0, 1))
    assert retries >= 1


# ---------------------------------------------------------------- CRUD compatibility

def test_unique_index_must_be_prefixed_by_the_shard_key(cluster):
    """A unique index on a sharded collection must start with the shard key (or _id), else
    67 CannotCreateIndex and no shard builds it (MongoDB's isUniqueIndexCompatible); one that
    is prefixed is enforced across the collection."""
    cluster.shard_collection("uq.c", {"k": 1}, split_points=[{"k": 100}, {"k": 200}])
    coll = cluster.proxy_client(0).uq.c
    for keys in ([("x", 1)], [("x", 1), ("k", 1)], [("x", 1), ("_id", 1)]):
        with pytest.raises(OperationFailure) as e:
            coll.create_index(keys, unique=True)
        assert e.value.code == 67, e.value.details
        assert "shard key pattern" in str(e.value)
    for sid in cluster.shard_ids:
        names = [i["name"] for i in cluster.shard_client(sid).uq.c.list_indexes()]
        assert not any(n.startswith("x_1") for n in names), (sid, names)
    # not unique, or prefixed by the shard key, or by _id: built
    coll.create_index([("x", 1)])
    coll.create_index([("k", 1), ("x", 1)], unique=True)
    coll.create_index([("_id", 1), ("x", 1)], unique=True)
    # the prefixed unique index is enforced: documents with equal (k, x) live on one shard
    coll.insert_many([{"_id": i, "k": k, "x": "a"} for i, k in enumerate((5, 150, 250))])
    for i, k in enumerate((5, 150, 250)):
        with pytest.raises(pymongo.errors.DuplicateKeyError):
            coll.insert_one({"_id": 100 + i, "k": k, "x": "a"})
    assert coll.count_documents({}) == 3
    # an unsharded collection takes any unique index
    cluster.proxy_client(0).uq.plain.create_index([("x", 1)], unique=True)


# ---------------------------------------------------------------- quotas

def test_quota_across_two_proxies(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=3, proxies=0)
    try:
        cl.meta_cmd({"createTenant": "t1"})
        cl.meta_cmd({"createTenant": "t2"})
        # 5 requests per minute: no window ends while the test runs
        cl.meta_cmd({"setQuota": "t1", "quota": {"requestsPerSec": 5, "periodMS": 60000}})
        cl.meta_cmd({"setQuota": "t2", "quota": {"requestsPerSec": 100000}})
        cl.create_database("t1db", tenant="t1")
        cl.create_database("t2db", tenant="t2")
        g = [free_port(), free_port()]
        peers = ",".join(f"127.0.0.1:{p}" for p in g)
        for i in range(2):  # the proxies join one rate-limit peer ring
            cl.add_proxy([f"--grpc-listen=127.0.0.1:{g[i]}", f"--peers={peers}"], wait=False)
        for i in range(2):
            cl.proxy_procs[i].wait_healthy()
        # each proxy has reached its peer once (channels up): quotas are shared from now on
        wait_until(lambda: all(cl.metric(i, "stripedb_proxy_quota_ring_ready") == 1
                               for i in range(2)), 20, what="the rate-limit ring")
        dbs = [cl.proxy_client(i).t1db for i in range(2)]
        ok = 0
        refusal = None
        for n in range(40):  # alternate proxies until the first refusal
            try:
                dbs[n % 2].c.find_one({"_id": n})
                ok += 1
            except OperationFailure as e:
                refusal = e
                break
        # 5 requests for the tenant in total, not 5 per proxy
        if ok != 5:
            for i in range(2):
                st, body = http_get(cl.proxy_procs[i].http_port, "/metrics")
                print("\n".join(l for l in body.decode().splitlines() if "ratelimit" in l and not l.startswith("#")))
        assert ok == 5
        assert refusal.code == 462
        assert refusal.details["retryAfterMS"] > 0
        assert "tenant t1 is over its quota of 5 requests per 60000 ms" in \
            refusal.details["errmsg"]
        # nothing executed: an insert refused by quota leaves no document
        with pytest.raises(OperationFailure) as e:
            dbs[0].c.insert_one({"_id": "refused"})
        assert e.value.code == 462
        # the other tenant is unaffected, through both proxies
        for n in range(20):
            cl.proxy_client(n % 2).t2db.c.insert_one({"_id": n})
        assert cl.proxy_client(1).t2db.c.count_documents({}) == 20
        assert cl.shard_client("shard-a").t1db.c.count_documents({"_id": "refused"}) == 0
        assert cl.metric(0, "stripedb_proxy_quota_rejected_total") + \
            cl.metric(1, "stripedb_proxy_quota_rejected_total") == 2
    finally:
        cl.close()


# ---------------------------------------------------------------- Node.js driver

NODE_SCRIPT = r"""
const { MongoClient } = require('mongodb');
(async () => {
  // both proxies in one URI: the driver sees two mongos and spreads the load
  const c = new MongoClient(process.argv[1], { serverSelectionTimeoutMS: 10000, retryWrites: false });
  await c.connect();
  const coll = c.db('db').collection('c');
  await coll.insertMany(Array.from({ length: 300 }, (_, i) => ({ _id: i, k: (i * 7) % 300 })));
  const sorted = await coll.find({ k: { $gte: 90 } }).sort({ k: -1 }).skip(5).limit(100)
    .batchSize(7).toArray();
  let dupErr = null, inserted = null;
  try {
    await coll.insertMany([{ _id: 1000, k: 1 }, { _id: 5, k: 35 }, { _id: 1001, k: 150 },
      { _id: 1002, k: 250 }], { ordered: false });
  } catch (e) {
    dupErr = e.writeErrors.map((w) => [w.index, w.code]);
    inserted = e.result.insertedCount;
  }
  const upd = await coll.updateMany({ k: { $lt: 100 } }, { $set: { low: true } });
  const n = await coll.countDocuments({});
  const topo = c.topology.description.type;
  console.log(JSON.stringify({ first: sorted[0].k, last: sorted[sorted.length - 1].k,
    len: sorted.length, dupErr, inserted, modified: upd.modifiedCount, n, topo }));
  await c.close();
})().catch((e) => { console.error(e); process.exit(1); });
"""


@needs_node_client("mongodb")
def test_node_driver_through_two_proxies(cluster):
    ranged(cluster)
    hosts = ",".join(f"127.0.0.1:{p}" for p in cluster.proxy_ports)
    r = subprocess.run(["node", "-e", NODE_SCRIPT, f"mongodb://{hosts}/"], capture_output=True,
                       text=True, timeout=120, cwd=os.path.dirname(NODE_MODULES),
                       env=node_env())
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    # k is a permutation of 0..299: k >= 90 descending, skip 5 -> 294 .. 195
    assert out == {"first": 294, "last": 195, "len": 100, "dupErr": [[1, 11000]],
                   "inserted": 3, "modified": 101, "n": 303, "topo": "Sharded"}


# ---------------------------------------------------------------- cursors and failures

def test_idle_cursor_times_out(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=3, proxies=1,
                      proxy_args=["--cursor-timeout-ms=300"])
    try:
        ranged(cl)
        db = cl.proxy_client(0).db
        db.c.insert_many([{"_id": i, "k": i} for i in range(300)])
        cid = db.command("find", "c", sort={"k": 1}, batchSize=2)["cursor"]["id"]
        assert cid != 0
        assert cl.metric(0, "stripedb_proxy_cursors_open") == 1
        # left alone, the cursor is reaped (watching /metrics does not touch it)
        wait_until(lambda: cl.metric(0, "stripedb_proxy_cursors_open") == 0, 15,
                   what="the idle cursor to be killed")
        with pytest.raises(OperationFailure) as e:
            db.command("getMore", cid, collection="c")
        assert e.value.code == 43
        # the shard cursors were killed too: a new query still works
        assert db.c.count_documents({}) == 300
    finally:
        cl.close()


def test_shard_down_fails_only_its_chunks(cluster):
    ranged(cluster)
    c = cluster.proxy_client(0).db.c
    c.insert_many([{"_id": i, "k": i} for i in range(0, 300, 50)])
    cluster.shard_procs["shard-c"].stop()
    assert c.find_one({"k": 50}) == {"_id": 50, "k": 50}
    c.insert_one({"_id": 7, "k": 7})
    # $lt: 199, not 200: a range ending at a chunk bound (200) also asks the chunk above it,
    # where decimals just below 200 that tie it under long double are placed (issue #20,
    # docs/compat.md "Decimal128"); so with shard-c down, $lt: 200 is HostUnreachable
    assert c.count_documents({"k": {"$lt": 199}}) == 5
    with pytest.raises(OperationFailure) as e:
        c.find_one({"k": 250})
    assert e.value.code == 6  # HostUnreachable: drivers retry it
    assert "shard-c" in str(e.value)
    with pytest.raises(OperationFailure) as e:
        list(c.find({}))
    assert e.value.code == 6


def test_collection_policy_switches(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=3, proxies=1)
    try:
        cl.meta_cmd({"createTenant": "t1"})
        cl.create_database("t1db", tenant="t1")
        cl.shard_collection("t1db.c", {"k": 1}, split_points=[{"k": 100}, {"k": 200}])
        strict = {"forbidScatter": True, "forbidUnindexed": True, "forbidUnbounded": True}
        cl.meta_cmd({"setPolicy": "t1", "policy": {"collections": {
            "t1db.c": strict, "t1db.u": {"forbidUnindexed": True}}}})
        db = cl.proxy_client(0).t1db
        db.c.create_index("k")
        db.c.insert_many([{"_id": i, "k": i, "x": i % 7} for i in range(300)])
        db.u.insert_many([{"_id": i, "y": i} for i in range(10)])

        def refused(fn):
            """The error code fn fails with, or None when it succeeds."""
            try:
                fn()
            except OperationFailure as e:
                return e.code
            return None
        # the proxy re-reads policies every second: wait until this one is in force
        wait_until(lambda: refused(lambda: db.c.find_one({"x": 1})) == 20, 15,
                   what="the policy to be loaded")
        assert db.c.find_one({"k": 5}) == {"_id": 5, "k": 5, "x": 5}
        assert len(list(db.c.find({"k": {"$gte": 150}}).limit(500))) == 150
        assert refused(lambda: list(db.c.find({"k": {"$gte": 0}}).limit(5))) == 20
        assert refused(lambda: list(db.c.find({"k": 5}))) == 20       # no limit
        assert refused(lambda: db.c.update_many({"x": 3}, {"$set": {"z": 1}})) == 20
        assert db.c.update_many({"k": {"$in": [3, 250]}}, {"$set": {"z": 1}}).modified_count == 2
        assert refused(lambda: list(db.c.aggregate([{"$match": {"k": 3}}]))) == 20
        assert list(db.c.aggregate([{"$match": {"k": 3}}, {"$limit": 1}])) == \
            [{"_id": 3, "k": 3, "x": 3, "z": 1}]
        # a $sample bounds the result too
        assert list(db.c.aggregate([{"$match": {"k": 3}}, {"$sample": {"size": 1}}])) == \
            [{"_id": 3, "k": 3, "x": 3, "z": 1}]
        # unindexed: an unsharded collection without an index on y
        assert refused(lambda: db.u.find_one({"y": 3})) == 291
        assert db.u.find_one({"_id": 3}) == {"_id": 3, "y": 3}
        db.u.create_index("y")
        assert db.u.find_one({"y": 3}) == {"_id": 3, "y": 3}
    finally:
        cl.close()


def test_routing_refresh_by_long_poll(cluster):
    """A routing change with no StaleConfig (tokens untouched) reaches the proxy through its
    long poll on waitRoutingVersion; with 6 cached collections the proxy reloads them all
    in two metadata calls."""
    p = cluster.proxy_client(0)
    for i in range(6):
        ranged(cluster, f"db.c{i}")
        p.db[f"c{i}"].insert_one({"_id": 1, "k": 1, "where": "a"})
    chunk = [ch for ch in cluster.routing("db.c3")["chunks"] if ch["shard"] == "shard-a"][0]
    # a copy with a different marker on shard-c, then the routing points there
    cluster.shard_client("shard-c").db.c3.insert_one({"_id": 1, "k": 1, "where": "c"})
    cluster.meta_cmd({"setChunkShard": chunk["id"], "shard": "shard-c",
                      "token": chunk["token"]})
    wait_until(lambda: p.db.c3.find_one({"k": 1})["where"] == "c", 10,
               what="the proxy to follow the new routing")
    assert p.db.c2.find_one({"k": 1})["where"] == "a"
    assert cluster.metric(0, "stripedb_proxy_stale_retries_total") == 0


# ---------------------------------------------------------------- collStats, dbStats, explain

@pytest.mark.node_clients
def test_stats_and_explain(cluster):
    """collStats / dbStats / explain as mongos answers them: st.s is sharded over shard-a
    (k < 100) and shard-b (k >= 100); st.u is unsharded (primary shard-a)."""
    cluster.shard_collection("st.s", {"k": 1}, split_points=[{"k": 100}],
                             shards=["shard-a", "shard-b"])
    db = cluster.proxy_client(0).st
    db.s.insert_many([{"_id": i, "k": i, "pad": "x" * (i % 7)} for i in range(150)])
    db.u.insert_many([{"_id": i} for i in range(5)])
    direct = {sid: cluster.shard_client(sid).st for sid in cluster.shard_ids}

    # collStats of the sharded collection: the two owning shards, sums of their replies
    cs = db.command("collStats", "s")
    per = {sid: direct[sid].command("collStats", "s") for sid in ("shard-a", "shard-b")}
    assert cs["ns"] == "st.s" and cs["sharded"] is True and cs["nchunks"] == 2
    assert sorted(cs["shards"]) == ["shard-a", "shard-b"]
    assert [cs["shards"][s]["count"] for s in ("shard-a", "shard-b")] == [100, 50]
    assert cs["count"] == 150
    assert cs["size"] == per["shard-a"]["size"] + per["shard-b"]["size"] > 0
    assert cs["storageSize"] == per["shard-a"]["storageSize"] + per["shard-b"]["storageSize"]
    assert cs["avgObjSize"] == cs["size"] // 150
    assert cs["nindexes"] == per["shard-a"]["nindexes"]
    assert sorted(cs["indexSizes"]) == sorted(per["shard-a"]["indexSizes"])
    assert cs["totalIndexSize"] == sum(p["totalIndexSize"] for p in per.values())
    # unsharded: its primary shard only
    cu = db.command("collStats", "u")
    assert (cu["sharded"], cu["count"], sorted(cu["shards"]), cu["nchunks"]) == \
        (False, 5, ["shard-a"], 1)
    with pytest.raises(OperationFailure) as e:
        db.command("collStats", "nosuch")
    assert e.value.code == 26
    # the $collStats stage (mongosh's coll.stats()): one document per owning shard
    docs = list(db.s.aggregate([{"$collStats": {"storageStats": {}, "count": {}}}]))
    assert [(d["ns"], d["shard"], d["storageStats"]["count"], d["count"])
            for d in docs] == [("st.s", "shard-a", 100, 100), ("st.s", "shard-b", 50, 50)]
    assert docs[0]["storageStats"]["size"] == per["shard-a"]["size"]
    with pytest.raises(OperationFailure) as e:
        list(db.s.aggregate([{"$collStats": {"latencyStats": {}}}]))
    assert e.value.code == 238
    # later stages run over the per-shard documents (as mongos 6.0; it was 9 here)
    assert [d["shard"] for d in db.s.aggregate([{"$collStats": {"storageStats": {}}},
                                                {"$match": {"storageStats.count": 50}}])] == \
        ["shard-b"]
    # mongosh's db.coll.stats() and db.stats() through the proxy
    # (skipped, and said so, only when mongosh is absent and not required: conftest)
    if NODE_CLIENTS_REQUIRED or node_clients_present("mongosh"):
        script = ("const s = db.getSiblingDB('st').s.stats(); const d = db.getSiblingDB('st')"
                  ".stats(); print(JSON.stringify({count: s.count, ns: s.ns, "
                  "shards: Object.keys(s.shards || {}).sort(), objects: Number(d.objects)}))")
        r = subprocess.run([MONGOSH, f"mongodb://127.0.0.1:{cluster.proxy_ports[0]}/",
                            "--quiet", "--norc", "--eval", script],
                           capture_output=True, text=True, timeout=120, env=node_env())
        assert r.returncode == 0, r.stdout + r.stderr
        assert json.loads(r.stdout.strip().splitlines()[-1]) == \
            {"count": 150, "ns": "st.s", "shards": ["shard-a", "shard-b"], "objects": 155}

    # dbStats: every shard, sums, raw per shard
    ds = db.command("dbStats")
    raw = {sid: direct[sid].command("dbStats") for sid in cluster.shard_ids}
    assert sorted(ds["raw"]) == cluster.shard_ids
    assert ds["db"] == "st" and ds["objects"] == 155
    for f in ("collections", "views", "objects", "dataSize", "storageSize", "indexes",
              "indexSize"):
        assert ds[f] == sum(r[f] for r in raw.values()), f
    assert ds["collections"] == 3  # s on shard-a and shard-b, u on shard-a
    assert [ds["raw"][s]["objects"] for s in cluster.shard_ids] == [105, 50, 0]
    # the lower-case aliases mongod accepts
    assert (db.command("dbstats")["objects"], db.command("collstats", "s")["count"]) == (155, 150)

    def shards_of(ex):
        return [s["shardName"] for s in ex["queryPlanner"]["winningPlan"]["shards"]]

    # a one-shard find (pymongo's explain: allPlansExecution)
    ex = db.s.find({"k": 5}).explain()
    assert ex["queryPlanner"]["mongosPlannerVersion"] == 1
    assert ex["queryPlanner"]["winningPlan"]["stage"] == "SINGLE_SHARD"
    assert shards_of(ex) == ["shard-a"]
    one = ex["queryPlanner"]["winningPlan"]["shards"][0]
    assert one["connectionString"] == f"127.0.0.1:{cluster.shard_ports['shard-a']}"
    assert one["namespace"] == "st.s" and one["parsedQuery"] == {"k": 5}
    assert one["winningPlan"]["stage"] in ("IXSCAN", "COLLSCAN")
    assert ex["executionStats"]["nReturned"] == 1
    assert ex["executionStats"]["executionStages"]["stage"] == "SINGLE_SHARD"
    assert [s["shardName"] for s in ex["executionStats"]["executionStages"]["shards"]] == \
        ["shard-a"]
    assert ex["command"]["find"] == "s" and ex["ok"] == 1.0
    # a scatter find, then a sorted one
    ex = db.s.find({"k": {"$gte": 50}}).explain()
    assert ex["queryPlanner"]["winningPlan"]["stage"] == "SHARD_MERGE"
    assert shards_of(ex) == ["shard-a", "shard-b"]
    assert ex["executionStats"]["nReturned"] == 100
    assert [s["nReturned"] for s in ex["executionStats"]["executionStages"]["shards"]] == \
        [50, 50]
    ex = db.s.find({}).sort("k", -1).explain()
    assert ex["queryPlanner"]["winningPlan"]["stage"] == "SHARD_MERGE_SORT"
    # aggregate and count, with explicit verbosities
    ex = db.command("explain", {"aggregate": "s", "cursor": {},
                                "pipeline": [{"$match": {"k": {"$gte": 120}}},
                                             {"$count": "n"}]}, verbosity="queryPlanner")
    assert ex["queryPlanner"]["winningPlan"]["stage"] == "SINGLE_SHARD"
    assert shards_of(ex) == ["shard-b"] and "executionStats" not in ex
    # the aggregate command's own `explain: true` is the same plan (a reviewer got the
    # documents back from a sharded collection: the field was ignored)
    ex2 = db.command({"aggregate": "s", "explain": True,
                      "pipeline": [{"$match": {"k": {"$gte": 120}}}, {"$count": "n"}]})
    assert "cursor" not in ex2 and shards_of(ex2) == ["shard-b"]
    assert ex2["queryPlanner"]["winningPlan"]["stage"] == "SINGLE_SHARD"
    ex2 = db.command({"aggregate": "s", "explain": True, "pipeline": []})
    assert "cursor" not in ex2 and shards_of(ex2) == ["shard-a", "shard-b"]
    with pytest.raises(OperationFailure) as e:
        db.command({"aggregate": "s", "explain": 1, "pipeline": [], "cursor": {}})
    assert e.value.code == 14
    assert db.command({"aggregate": "s", "explain": False, "pipeline": [{"$count": "n"}],
                       "cursor": {}})["cursor"]["firstBatch"] == [{"n": 150}]
    ex = db.command("explain", {"count": "s", "query": {"k": {"$lt": 10}}},
                    verbosity="executionStats")
    assert shards_of(ex) == ["shard-a"] and ex["executionStats"]["nReturned"] == 10
    assert "allPlansExecution" not in ex["executionStats"]
    # writes are explained, not executed
    ex = db.command("explain", {"delete": "s", "deletes": [{"q": {"k": 130}, "limit": 1}]})
    assert shards_of(ex) == ["shard-b"]
    assert db.s.count_documents({}) == 150
    # unsharded collection: its primary
    assert shards_of(db.u.find().explain()) == ["shard-a"]
    # errors as mongod / mongos give them
    with pytest.raises(OperationFailure) as e:
        db.command("explain", {"find": "s"}, verbosity="loud")
    # MongoDB 6.0 parses explain with its IDL (commands/explain.idl, verbosity an enum):
    # 2 BadValue from IDLParserErrorContext::throwBadEnumValue, as a shard answers
    assert e.value.code == 2 and "Enumeration value 'loud' for field 'explain.verbosity' " \
        "is not a valid value." in str(e.value)
    with pytest.raises(OperationFailure) as e:
        db.command("explain", {"insert": "s", "documents": [{"k": 1}]})
    assert (e.value.code, e.value.details["errmsg"]) == (20, "Cannot explain cmd: insert")
    with pytest.raises(OperationFailure) as e:
        db.command("explain", {"frobnicate": "s"})
    assert (e.value.code, e.value.details["errmsg"]) == \
        (59, "Explain failed due to unknown command: frobnicate")
    with pytest.raises(OperationFailure) as e:
        db.command({"explain": "s"})
    assert e.value.code == 9


def test_read_concern_on_a_sharded_collection_is_refused_as_on_a_shard(cluster):
    """issue #20 (a fresh user): the per-chunk commands of a sharded read are built by the
    proxy, which dropped the client's readConcern there: a linearizable or snapshot read,
    atClusterTime or afterOpTime became a plain read. The proxy now refuses them as a shard
    does (common/readconcern.h); the levels shards serve still answer, targeted and
    scattered, and a causal session reads its own writes."""
    import bson
    ranged(cluster)
    client = cluster.proxy_client(0)
    db = client.db
    db.c.insert_many([{"_id": i, "k": i} for i in range(0, 300, 10)])
    future = bson.Timestamp(int(time.time()) + 3600, 1)
    for rc, code in (({"level": "linearizable"}, 72), ({"level": "snapshot"}, 72),
                     ({"level": "majority", "atClusterTime": bson.Timestamp(1, 1)}, 72),
                     ({"afterOpTime": {"ts": bson.Timestamp(1, 1), "t": 1}}, 72),
                     ({"level": "sideways"}, 9), ({"level": 5}, 9), ({"foo": 1}, 9),
                     ({"afterClusterTime": 5}, 14)):
        for flt in ({}, {"k": 150}):  # scattered and targeted
            for cmd in ({"find": "c", "filter": flt}, {"count": "c", "query": flt},
                        {"aggregate": "c", "pipeline": [{"$match": flt}], "cursor": {}},
                        {"distinct": "c", "key": "_id", "query": flt}):
                with pytest.raises(OperationFailure) as e:
                    db.command(dict(cmd, readConcern=rc))
                assert e.value.code == code, (rc, cmd, e.value.details)
    for level in ("local", "majority", "available"):
        assert len(db.command({"find": "c", "filter": {}, "readConcern": {"level": level}})
                   ["cursor"]["firstBatch"]) == 30
        assert db.command({"count": "c", "query": {"k": 150},
                           "readConcern": {"level": level}})["n"] == 1
    with client.start_session(causal_consistency=True) as s:
        db.c.insert_one({"_id": 1000, "k": 255}, session=s)
        assert db.c.find_one({"k": 255}, session=s) == {"_id": 1000, "k": 255}
        assert db.c.count_documents({}, session=s) == 31
    # a time far past everything answered is refused, not waited on or ignored
    with pytest.raises(OperationFailure) as e:
        db.command({"find": "c", "filter": {"k": 150},
                    "readConcern": {"afterClusterTime": future}})
    assert e.value.code in (72, 205), e.value.details


def test_unknown_write_concern_field_on_a_sharded_write_is_refused(cluster):
    """An unknown writeConcern field is 9 FailedToParse on a shard and on an unsharded
    collection; a sharded write, which the proxy splits into commands of its own, accepted
    it (a fresh user). Now refused before the split, with the shard's message."""
    ranged(cluster)
    db = cluster.proxy_client(0).db
    for cmd in ({"insert": "c", "documents": [{"_id": 1, "k": 1}, {"_id": 2, "k": 150}]},
                {"update": "c", "updates": [{"q": {"k": 1}, "u": {"$set": {"x": 1}}}]},
                {"delete": "c", "deletes": [{"q": {"k": 1}, "limit": 1}]}):
        with pytest.raises(OperationFailure) as e:
            db.command(dict(cmd, writeConcern={"w": 1, "bogus": 1}))
        assert e.value.code == 9, e.value.details
        assert "unrecognized write concern field: bogus" in e.value.details["errmsg"]
    assert db.c.count_documents({}) == 0
    r = db.command({"insert": "c", "documents": [{"_id": 1, "k": 1}, {"_id": 2, "k": 150}],
                    "writeConcern": {"w": 1, "j": True, "wtimeout": 1000}})
    assert r["n"] == 2


def test_request_thread_log_lines_name_role_and_node(start_role, tmp_path, monkeypatch):
    """Every log line names its role and node (common/log.h), also those of the threads a
    role starts: the proxy's request threads (proxy/shardconn.c) logged "wire: command
    done" without role= and node= (their thread had no log context). Now every thread
    starts with its creator's (common/thread.h). A proxy without --node-id is named by its
    listen address."""
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=0)
    try:
        monkeypatch.setenv("STRIPEDB_LOG_LEVEL", "debug")  # the proxy's, started now
        cl.add_proxy()
        monkeypatch.delenv("STRIPEDB_LOG_LEVEL")
        cl.shard_collection("db.c", {"k": 1}, split_points=[{"k": 100}],
                            shards=["shard-a", "shard-b"])
        c = cl.proxy_client(0).db.c
        c.insert_many([{"_id": i, "k": i * 10} for i in range(20)])
        # a scatter-gather find and a targeted one: both routed on request threads
        assert len(list(c.find({}))) == 20
        assert c.find_one({"k": 150}) == {"_id": 15, "k": 150}
        node = f"node=127.0.0.1:{cl.proxy_ports[0]}"

        def done_lines():
            return [ln for ln in cl.proxy_procs[0].tail(1 << 22).splitlines()
                    if 'msg="wire: command done"' in ln
                    and any(f" cmd={n} " in ln for n in ("find", "insert"))]
        # the reply may reach the client before its thread writes the line
        wait_until(lambda: sum(" cmd=find " in ln for ln in done_lines()) >= 2,
                   what="the finds' command done lines")
        bad = [ln for ln in done_lines()
               if " role=proxy " not in ln or f" {node} " not in ln]
        assert not bad, bad
    finally:
        cl.close()
