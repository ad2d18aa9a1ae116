"""Index maintenance of updates, against the shortcuts of issue #19: an update passes the
document its query read as the stored image (sdb_store_update_stored), skips indexes whose
keys did not change, and the apply reloads the catalog cache only when catalog_gen moved.

Random updates of every shape the shard takes (operators, pipelines, arrayFilters, upserts,
replacements, findAndModify with a sort, multi-document transactions) over collections with
plain, compound, multikey, sparse, partial, hashed, unique and collated indexes; then
stripedbCheck must find every index exact (keys, counts, multikey flags) and every index
must answer as a collection scan. A debug build also aborts on a stored image that is not
the stored document. Then DDL and writes from several clients sharing Raft entries on a
three-member set, and a failover."""
import random
import signal
import threading

import pymongo
import pytest
from bson import Int64

from conftest import free_port, start_one_member_set, wait_until
from test_shard_replset import direct, primary_index, start_set


def _val(r):
    k = r.randrange(12)
    if k == 0:
        return None
    if k == 1:
        return [r.randrange(4) for _ in range(r.randrange(4))]
    if k == 2:
        return {"x": r.randrange(3)}
    if k == 3:
        return r.choice(["a", "A", "b", "B", "é", "E"])
    if k == 4:
        return [[r.randrange(2)], r.randrange(2)]
    if k == 5:
        return float(r.randrange(4))
    if k == 6:
        return Int64(r.randrange(4))
    if k == 7:
        return [{"x": r.randrange(3)}, {"x": [r.randrange(3)]}]
    return r.randrange(4)


def _doc(r, i):
    d = {"_id": i}
    for f in "abc":
        if r.random() < 0.7:
            d[f] = _val(r)
    return d


def _update(r):
    """(update, arrayFilters or None)."""
    k = r.randrange(10)
    f = r.choice(["a", "b", "c", "a.x", "c.x", "a.0"])
    if k == 0:
        return {"$set": {f: _val(r)}}, None
    if k == 1:
        return {"$unset": {f: 1}}, None
    if k == 2:
        return {"$push": {r.choice("abc"): _val(r)}}, None
    if k == 3:
        return {"$inc": {"n": 1}}, None
    if k == 4:
        return [{"$set": {r.choice("abc"): _val(r)}}], None
    if k == 5:
        return {"$addToSet": {r.choice("abc"): _val(r)}}, None
    if k == 6:
        return {"$pull": {r.choice("abc"): _val(r)}}, None
    if k == 7:
        return {"$set": {"a.$[e]": _val(r)}}, [{"e": _val(r)}]
    if k == 8:
        return {"$pop": {r.choice("abc"): 1}}, None
    return {"$set": {"n": _val(r)}}, None


def _filter(r):
    k = r.randrange(6)
    f = r.choice(["a", "b", "c", "a.x"])
    if k == 0:
        return {f: _val(r)}
    if k == 1:
        return {f: {"$gte": r.randrange(3)}}
    if k == 2:
        return {"_id": {"$in": [r.randrange(30) for _ in range(3)]}}
    if k == 3:
        return {"$or": [{f: _val(r)}, {"_id": r.randrange(30)}]}
    if k == 4:
        return {f: {"$exists": r.random() < 0.5}}
    return {}


@pytest.fixture(params=["replica-set", "standalone"])
def client(request, start_role, tmp_path):
    if request.param == "replica-set":
        _, port = start_one_member_set(start_role, str(tmp_path / "d"))
    else:
        port = free_port()
        data = tmp_path / "e"
        data.mkdir()
        start_role(["--role=shard", f"--listen=127.0.0.1:{port}", f"--data-dir={data}"])
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true")
    c.txn = request.param == "replica-set"
    yield c
    c.close()


@pytest.mark.parametrize("seed", range(2))
def test_random_updates_keep_every_index_exact(client, seed):
    r = random.Random(seed)
    db = client.t
    db.create_collection("c")
    db.create_collection("k", collation={"locale": "en", "strength": 2})
    for co in (db.c, db.k):
        co.create_index("a")
        co.create_index([("b", 1), ("a", -1)])
        co.create_index("c", sparse=True)
        co.create_index([("b", 1)], name="bpart", partialFilterExpression={"c": {"$gte": 1}})
        co.create_index([("c", "hashed")], collation={"locale": "simple"})
        co.create_index("a.x")
        co.create_index([("a", 1)], name="acoll", collation={"locale": "fr", "strength": 1})
        co.create_index([("n", 1)], unique=True, sparse=True)
        try:  # an array under the hashed index is refused: those documents are left out
            co.insert_many([_doc(r, i) for i in range(30)], ordered=False)
        except pymongo.errors.BulkWriteError:
            pass
    ok = 0
    for step in range(200):
        co = r.choice([db.c, db.k])
        u, af = _update(r)
        f = _filter(r)
        try:
            k = r.randrange(6)
            if k == 0:
                co.update_many(f, u, array_filters=af)
            elif k == 1:
                co.update_one(f, u, upsert=r.random() < 0.3, array_filters=af)
            elif k == 2:
                co.find_one_and_update(f, u, sort=[(r.choice("abc"), r.choice([1, -1]))],
                                       array_filters=af)
            elif k == 3:
                d = _doc(r, r.randrange(35))
                d.pop("_id")
                co.replace_one({"_id": r.randrange(35)}, d, upsert=r.random() < 0.5)
            elif k == 4 and client.txn:
                with client.start_session() as s, s.start_transaction():
                    co.update_many(f, u, session=s, array_filters=af)
                    co.update_one({"_id": r.randrange(30)}, {"$set": {"a": _val(r)}}, session=s)
                    co.update_many(_filter(r), {"$inc": {"n": 1}}, session=s)
            else:
                co.delete_one({"_id": r.randrange(35)})
                co.insert_one(_doc(r, 100 + step))
            ok += 1
        except pymongo.errors.PyMongoError:
            pass  # refused updates (hashed arrays, unique clashes) roll back: checked below
    assert ok > 100, f"only {ok} of 200 operations succeeded: the test exercised too little"
    check = client.admin.command("stripedbCheck")
    assert check["nProblems"] == 0, check
    queries = [{"a": {"$gte": 0}}, {"b": 1}, {"a.x": 1}, {"a": "a"}, {"b": {"$lte": 2}},
               {"a": [1]}]
    for co in (db.c, db.k):
        for name in ("a_1", "b_1_a_-1", "a.x_1"):
            for q in queries:
                want = sorted(str(d["_id"]) for d in co.find(q).hint([("$natural", 1)]))
                got = sorted(str(d["_id"]) for d in co.find(q).hint(name))
                assert got == want, (co.name, name, q)


def test_ddl_and_writes_sharing_entries_keep_members_exact(start_role, tmp_path):
    """Clients run createIndexes, dropIndexes, collMod and writes (multikey marks, refused
    documents, unique clashes) at once, so that they share Raft entries; every member then
    has the same catalog and data with exact indexes, and after a failover the new primary
    applies the validator it last received."""
    procs, wires, uri = start_set(start_role, tmp_path)
    c = pymongo.MongoClient(uri, serverSelectionTimeoutMS=10000)
    c.app.create_collection("c", validator={"v": {"$exists": True}})
    c.app.c.create_index("a")

    def worker(seed):
        r = random.Random(seed)
        with pymongo.MongoClient(uri, serverSelectionTimeoutMS=10000) as cl:
            d = cl.app
            for i in range(150):
                k = r.randrange(10)
                try:
                    if k == 0:
                        d.c.create_index(r.choice(["b", "a", "c.x"]), unique=r.random() < 0.3)
                    elif k == 1:
                        d.c.drop_index(r.choice(["b_1", "a_1", "c.x_1"]))
                    elif k == 2:
                        d.command("collMod", "c",
                                  validator={r.choice(["v", "w"]): {"$exists": True}})
                    elif k == 3:
                        d.c.insert_one({"_id": f"{seed}-{i}", "v": 1, "w": 1,
                                        "a": [r.randrange(5), r.randrange(5)],
                                        "b": r.randrange(50), "c": [{"x": r.randrange(3)}]})
                    elif k == 4:
                        d.c.update_many({"a": r.randrange(5)},
                                        {"$set": {"b": r.randrange(50)},
                                         "$push": {"a": r.randrange(5)}})
                    elif k == 5:
                        d.c.find_one_and_update({"b": {"$gte": r.randrange(50)}},
                                                {"$set": {"b": r.randrange(50),
                                                          "c": {"x": [1, 2]}}})
                    elif k == 6:
                        d.c.insert_one({"_id": f"{seed}-{i}", "a": 1})  # may be refused
                    elif k == 7:
                        d.c.delete_one({"b": r.randrange(50)})
                    else:
                        d.c.update_one({"_id": f"{seed}-{r.randrange(i + 1)}"},
                                       {"$set": {"a": r.randrange(3), "b": r.randrange(50)}})
                except pymongo.errors.PyMongoError:
                    pass

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    def state(port):
        with direct(port) as m:
            check = m.admin.command("stripedbCheck")
            assert check["nProblems"] == 0, check
            opts = m.app.command("listCollections", filter={"name": "c"})
            opts = opts["cursor"]["firstBatch"][0]["options"]
            ix = sorted((i["name"], i.get("unique", False)) for i in m.app.c.list_indexes())
            return opts, ix, list(m.app.c.find({}, sort=[("_id", 1)]))

    def converged():
        states = [state(p) for p in wires]
        return all(s == states[0] for s in states[1:])
    wait_until(converged, 60, interval=0.3, what="every member holding the same state")

    old = primary_index(wires)
    procs[old].signal(signal.SIGKILL)
    procs[old].p.wait(10)
    rest = [p for i, p in enumerate(wires) if i != old]
    wait_until(lambda: primary_index(rest) is not None, 30, what="a new primary")
    c2 = pymongo.MongoClient(uri, serverSelectionTimeoutMS=10000)
    opts = c2.app.command("listCollections", filter={"name": "c"})["cursor"]["firstBatch"][0]
    field = next(iter(opts["options"]["validator"]))
    with pytest.raises(pymongo.errors.WriteError):
        c2.app.c.insert_one({"_id": "refused", "zz": 1})
    c2.app.c.insert_one({"_id": "kept", field: 1, "a": [7, 8], "b": 99})
    c2.app.c.update_many({}, {"$inc": {"n": 1}})
    for p in rest:
        def has_it(port=p):
            with direct(port) as m:
                return m.app.c.find_one({"_id": "kept"}) is not None
        wait_until(has_it, 30, what="the write on every live member")
        state(p)
    c.close()
    c2.close()
