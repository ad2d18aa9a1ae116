"""The proxies' DDL lock (issue #20, src/proxy/ddllock.h): shardCollection and
renameCollection of the same namespace, run at the same moment through two proxies, happen
one wholly before the other, as mongos's DDL lock makes them.

Before the lock, both could succeed with the rename landing between shardCollection's
checks of the collection and its commit in metadata: metadata then listed db.a as sharded
(its chunks on the shard that held the documents, no shard-key index created since the
collection had one) while the documents and that index had moved to the unsharded db.b,
so the sharded db.a had no shard-key index anywhere. The two serial orders leave:
  - rename first: db.b holds the documents, unsharded; shardCollection then shards an
    absent db.a and creates its key index on every shard;
  - shardCollection first: db.a holds the documents, sharded; the rename is refused (20).
The race test checks every round's end state is one of these two."""
import threading

import pytest
from pymongo.errors import OperationFailure

from proxy_helpers import ProxyCluster

ROUNDS = 8
DOCS = 40


@pytest.fixture
def cl(start_role, tmp_path):
    c = ProxyCluster(start_role, tmp_path, shards=2, proxies=2)
    yield c
    c.close()


def key_index_on(shard, db, coll):
    """Whether the shard holds an index on db.coll whose key starts with k."""
    return any(next(iter(i["key"])) == "k" for i in shard[db][coll].list_indexes())


def test_shard_collection_and_rename_race_serialise(cl):
    p0, p1 = cl.proxy_client(0), cl.proxy_client(1)
    shards = {sid: cl.shard_client(sid) for sid in cl.shard_ids}
    outcomes = set()
    for r in range(ROUNDS):
        db = f"race{r}"
        p0[db].a.insert_many([{"_id": i, "k": i} for i in range(DOCS)])
        p0[db].a.create_index("k")
        results = {}
        go = threading.Barrier(2)

        def run(name, fn):
            go.wait()
            try:
                results[name] = fn()
            except OperationFailure as e:
                results[name] = e

        ts = [threading.Thread(target=run, args=("shard", lambda: p0.admin.command(
                  "shardCollection", f"{db}.a", key={"k": 1}))),
              threading.Thread(target=run, args=("rename", lambda: p1.admin.command(
                  "renameCollection", f"{db}.a", to=f"{db}.b")))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        # shardCollection never fails here: either order shards db.a
        assert not isinstance(results["shard"], OperationFailure), results
        sharded = {c["_id"] for c in p0.config.collections.find({"_id": {"$regex": f"^{db}\\."}})}
        assert sharded == {f"{db}.a"}, sharded
        renamed = not isinstance(results["rename"], OperationFailure)
        if renamed:
            # rename first: the documents are in the unsharded db.b on the primary, and the
            # sharded db.a is new and empty, with its key index on every shard
            outcomes.add("rename first")
            assert p1[db].b.count_documents({}) == DOCS
            assert p0[db].a.count_documents({}) == 0
            for sid, s in shards.items():
                assert key_index_on(s, db, "a"), (r, sid, "sharded db.a has no key index")
        else:
            # shardCollection first: the rename was refused as a sharded source's
            outcomes.add("shard first")
            assert results["rename"].code == 20, results["rename"].details
            assert "must not be sharded" in results["rename"].details["errmsg"]
            assert p1[db].a.count_documents({}) == DOCS
            assert p1[db].b.count_documents({}) == 0
        # every document is where the proxies route: the sum over the shards' own copies
        total = sum(s[db][c].count_documents({}) for s in shards.values() for c in ("a", "b"))
        assert total == DOCS
    print("orders seen:", sorted(outcomes))


def test_a_held_lock_makes_shard_collection_wait_then_time_out(cl):
    """A DDL lock held elsewhere (here taken on metadata directly, as another proxy's
    command would hold it): shardCollection waits for it; with maxTimeMS it gives up with
    50 and shards nothing; once the lock is released it goes through."""
    p = cl.proxy_client(0)
    p.held.a.insert_one({"_id": 1, "k": 1})
    cl.meta_cmd({"acquireLease": "ddl/held.a", "holder": "someone else", "ttlMS": 600000})
    with pytest.raises(OperationFailure) as e:
        p.admin.command("shardCollection", "held.a", key={"_id": 1}, maxTimeMS=300)
    assert e.value.code == 50, e.value.details
    assert "DDL lock of held.a" in e.value.details["errmsg"]
    with pytest.raises(OperationFailure) as e:
        p.admin.command("renameCollection", "held.a", to="held.b", maxTimeMS=300)
    assert e.value.code == 50, e.value.details
    # a rename whose target is locked waits too
    with pytest.raises(OperationFailure) as e:
        p.admin.command("renameCollection", "held.c", to="held.a", maxTimeMS=300)
    assert e.value.code == 50, e.value.details
    assert p.config.collections.find_one({"_id": "held.a"}) is None
    assert p.held.a.count_documents({}) == 1
    cl.meta_cmd({"releaseLease": "ddl/held.a", "holder": "someone else"})
    assert p.admin.command("shardCollection", "held.a", key={"_id": 1})["ok"] == 1
    # the command released its own lock: the next DDL of the name does not wait
    with pytest.raises(OperationFailure) as e:
        p.admin.command("renameCollection", "held.a", to="held.b", maxTimeMS=5000)
    assert e.value.code == 20, e.value.details
