"""Change stream documentKey as the write recorded it (issue #20, MongoDB 5.3+/6.0): every
insert, update, replace and delete oplog entry of a shard carries the document's
documentKey of the time of the write (o2 of i/u, o of d: the shard key's fields then _id
for a collection the shard had filtering metadata for, else {_id}; an update's and a
delete's from the stored pre-image), and change events report that key, not one built with
the shard key known when the event is read. Through a proxy: a stream resumed from before
a shardCollection, a drop and a re-creation sharded on another key shows each event with
its own key. On a shard: the entries themselves, an update that changes the shard key
value, and a migration's writes (fromMigrate: no events)."""
from bson import MaxKey, MinKey

from migration_helpers import MigCluster
from test_change_streams_proxy import drain
from test_change_streams_shard import client
from test_shard_replset import start_set


def keyed(events):
    """(operationType, documentKey as an ordered list of items) of each event."""
    return [(e["operationType"], list(e["documentKey"].items()) if "documentKey" in e
             else None) for e in events]


def test_resume_across_shard_collection_drop_and_reshard(start_role, tmp_path):
    cl = MigCluster(start_role, tmp_path, meta=1, shards=2, proxies=1, coordinators=0)
    try:
        cli = cl.proxy_client()
        admin, coll = cli.admin, cli.app.c
        cli.app.before.insert_one({"_id": "x"})  # the database exists; the resume point
        with cli.app.watch(max_await_time_ms=300) as s0:
            cli.app.before.insert_one({"_id": "y"})
            first = drain(s0, lambda e: len(e) >= 1)
        start = first[0]["_id"]
        # unsharded at the time of the write: {_id}, even read after shardCollection
        coll.insert_one({"_id": 0, "k": 0, "j": 0})
        coll.create_index("k")
        admin.command("shardCollection", "app.c", key={"k": 1})
        coll.insert_one({"_id": 1, "k": 10, "j": 100})
        coll.update_one({"_id": 1, "k": 10}, {"$set": {"v": 1}})
        coll.replace_one({"_id": 1, "k": 10}, {"k": 10, "j": 100, "v": 2})
        coll.delete_one({"_id": 1, "k": 10})
        coll.update_one({"_id": 0, "k": 0}, {"$set": {"v": 1}})  # sharded now: k
        coll.drop()
        admin.command("shardCollection", "app.c", key={"j": 1})
        coll.insert_one({"_id": 2, "k": 20, "j": 200})
        coll.update_one({"_id": 2, "j": 200}, {"$set": {"v": 1}})
        coll.delete_one({"_id": 2, "j": 200})
        cli.app.after.insert_one({"_id": "z"})
        want = [
            ("insert", [("_id", 0)]),
            ("insert", [("k", 10), ("_id", 1)]),
            ("update", [("k", 10), ("_id", 1)]),
            ("replace", [("k", 10), ("_id", 1)]),
            ("delete", [("k", 10), ("_id", 1)]),
            ("update", [("k", 0), ("_id", 0)]),
            ("drop", None),
            ("insert", [("j", 200), ("_id", 2)]),
            ("update", [("j", 200), ("_id", 2)]),
            ("delete", [("j", 200), ("_id", 2)]),
            ("insert", [("_id", "z")]),
        ]
        # a database stream resumed from before all of it (written and read afterwards:
        # the shard key now is {j: 1}, the events keep theirs)
        with cli.app.watch(resume_after=start, max_await_time_ms=300) as s:
            evs = drain(s, lambda e: len(e) >= len(want))
            assert s.try_next() is None
        assert keyed(evs) == want, keyed(evs)
        # a collection stream from the first of them: the same events up to the drop
        with coll.watch(start_at_operation_time=evs[0]["clusterTime"],
                        max_await_time_ms=300) as s:
            evs = drain(s, lambda e: e and e[-1]["operationType"] == "invalidate")
        assert keyed(evs) == want[:7] + [("invalidate", None)], keyed(evs)
        # the shards' oplogs hold those keys (o2 of i/u, o of d) with docKey: true
        for sid in cl.shard_ids:
            for e in cl.shard_client(sid).local["oplog.rs"].find(
                    {"ns": "app.c", "op": {"$in": ["i", "u", "d"]}}):
                assert e["docKey"] is True, e
                key = e["o"] if e["op"] == "d" else e["o2"]
                assert list(key)[-1] == "_id", e
    finally:
        cl.close()


def test_shard_entries_record_the_key_of_their_time(start_role, tmp_path):
    procs, wires, uri = start_set(start_role, tmp_path, n=1)
    with client(uri) as c:
        db = c.app

        def install(key, version):
            c.admin.command({"stripedbSetFiltering": "app.s", "key": key,
                             "chunks": [{"id": str(version),
                                         "min": {f: MinKey() for f in key},
                                         "max": {f: MaxKey() for f in key},
                                         "token": 1}],
                             "collectionVersion": version})

        with db.watch(max_await_time_ms=300) as s:
            db.s.insert_one({"_id": 1, "k": 1, "a": {"b": 5}})   # no metadata: {_id}
            install({"k": 1, "a.b": 1}, 1)
            db.s.insert_one({"_id": 2, "k": 2, "a": {"b": 6}})
            # an update that changes the shard key's value: the key as it was (pre-image)
            db.s.update_one({"_id": 2}, {"$set": {"k": 3}})
            db.s.replace_one({"_id": 2}, {"k": 4, "a": {"b": 6}})
            db.s.delete_one({"_id": 2})
            # a migration's writes (origin): in the oplog, no events
            db.command({"insert": "s", "documents": [{"_id": 3, "k": 7, "a": {"b": 1}}],
                        "$stripedbOrigin": "mig-1"})
            db.command({"update": "s", "updates": [{"q": {"_id": 3},
                                                    "u": {"$set": {"v": 1}}}],
                        "$stripedbOrigin": "mig-1"})
            db.command({"delete": "s", "deletes": [{"q": {"_id": 3}, "limit": 1}],
                        "$stripedbOrigin": "mig-1"})
            db.s.insert_one({"_id": 4, "k": 8, "a": {"b": 2}})
            evs = [s.next() for _ in range(6)]
            assert s.try_next() is None
        assert keyed(evs) == [
            ("insert", [("_id", 1)]),
            ("insert", [("k", 2), ("a.b", 6), ("_id", 2)]),
            ("update", [("k", 2), ("a.b", 6), ("_id", 2)]),
            ("replace", [("k", 3), ("a.b", 6), ("_id", 2)]),
            ("delete", [("k", 4), ("a.b", 6), ("_id", 2)]),
            ("insert", [("k", 8), ("a.b", 2), ("_id", 4)]),
        ], keyed(evs)
        ops = list(c.local["oplog.rs"].find({"ns": "app.s", "op": {"$in": ["i", "u", "d"]}}))
        mig = [(e["op"], list((e["o"] if e["op"] == "d" else e["o2"]).items()))
               for e in ops if e.get("origin") == "mig-1"]
        # a migration's copy and range deletion carry the shard key (this shard's
        # metadata, as mongod's fromMigrate entries), its update {_id} (an internal write)
        assert mig == [("i", [("k", 7), ("a.b", 1), ("_id", 3)]),
                       ("u", [("_id", 3)]),
                       ("d", [("k", 7), ("a.b", 1), ("_id", 3)])], mig
        assert all(e["docKey"] is True for e in ops)
        # re-installed with another key: the events read now keep the old ones
        install({"a.b": 1}, 2)
        with db.s.watch(start_at_operation_time=ops[0]["ts"], max_await_time_ms=300) as s:
            again = [s.next() for _ in range(6)]
        assert keyed(again) == keyed(evs)
        assert c.admin.command("stripedbCheck")["nProblems"] == 0


def test_a_migrated_document_keeps_its_key(start_role, tmp_path):
    """moveChunk through the proxy: the migration's copies (recipient) and range deletions
    (donor) are no events (mongod's fromMigrate); the documents' later writes, on the
    recipient, report {k, _id}, as their earlier ones on the donor did."""
    cl = MigCluster(start_role, tmp_path, meta=1, shards=2, proxies=1, coordinators=1)
    try:
        cli = cl.proxy_client()
        admin, coll = cli.admin, cli.app.m
        admin.command("shardCollection", "app.m", key={"k": 1})
        admin.command("split", "app.m", middle={"k": 50})
        with coll.watch(max_await_time_ms=300) as s:
            coll.insert_many([{"_id": i, "k": i * 10} for i in range(10)])  # k 0..90
            low = [ch for ch in cl.chunks("app.m") if ch["max"] == {"k": 50}][0]
            to = [x for x in cl.shard_ids if x != low["shard"]][0]
            r = admin.command("moveChunk", "app.m", find={"k": 7}, to=to,
                              _waitForDelete=True)
            assert r["ok"] == 1
            coll.update_one({"_id": 2, "k": 20}, {"$set": {"v": 1}})
            coll.delete_one({"_id": 3, "k": 30})
            coll.update_one({"_id": 7, "k": 70}, {"$set": {"v": 1}})
            evs = drain(s, lambda e: len(e) >= 13)
            assert s.try_next() is None  # nothing for the copies or the range deletion
        assert sorted(keyed(evs)[:10]) == sorted(
            ("insert", [("k", i * 10), ("_id", i)]) for i in range(10))
        assert keyed(evs)[10:] == [("update", [("k", 20), ("_id", 2)]),
                                   ("delete", [("k", 30), ("_id", 3)]),
                                   ("update", [("k", 70), ("_id", 7)])]
        # the moved documents' writes came from the recipient
        from test_change_streams_proxy import tok
        assert [tok(e["_id"])["shard"] for e in evs[10:12]] == [to, to]
        # the migration's own entries: copies on the recipient, range deletions on the
        # donor, with origin (not events) and a documentKey recorded too: the donor's
        # range deletions with k (it holds the filtering metadata), the recipient's copies
        # with what it knew then (no filtering metadata before the switch: {_id};
        # src/shard/README.md "Oplog")
        copies = list(cl.shard_client(to).local["oplog.rs"].find(
            {"ns": "app.m", "op": "i", "origin": {"$exists": True}}))
        assert sorted(e["o"]["_id"] for e in copies) == [0, 1, 2, 3, 4]
        assert all(e["docKey"] is True and e["o2"]["_id"] == e["o"]["_id"] for e in copies)
        dels = list(cl.shard_client(low["shard"]).local["oplog.rs"].find(
            {"ns": "app.m", "op": "d", "origin": {"$exists": True}}))
        assert sorted((e["o"]["_id"], list(e["o"])) for e in dels) == [
            (i, ["k", "_id"]) for i in range(5)]
    finally:
        cl.close()
