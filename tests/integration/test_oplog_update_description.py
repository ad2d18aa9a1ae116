"""The updateDescription of "u" oplog entries (issue #20, storage/docdiff.c): a modifier or
pipeline update's entry carries MongoDB 6.0's change-event shape {updatedFields,
removedFields, truncatedArrays}, a replacement's carries none, `o` stays the full
post-image. Read back from local.oplog.rs of a real shard (a one-member replica set, so
every write goes through the Raft apply; transactions too) and of a three-member set (every
member writes the same bytes). Expected descriptions are compared as BSON bytes, so field
order and value types count.
"""
import bson
import pymongo
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument

from conftest import wait_until
from test_shard_replset import direct, primary_index, start_set
from test_shard_txn import client, one_member

RAW = CodecOptions(document_class=RawBSONDocument)
ENTRY_KEYS_UD = ["ts", "t", "v", "op", "ns", "ui", "o", "o2", "updateDescription", "docKey",
                 "wall"]
ENTRY_KEYS = ["ts", "t", "v", "op", "ns", "ui", "o", "o2", "docKey", "wall"]


def ud(updated=None, removed=(), truncated=()):
    """The expected description, as BSON bytes in MongoDB's field order."""
    return bson.encode({"updatedFields": updated or {}, "removedFields": list(removed),
                        "truncatedArrays": [{"field": f, "newSize": n} for f, n in truncated]})


def last_entry(c, ns):
    oplog = c.local.get_collection("oplog.rs", codec_options=RAW)
    return next(oplog.find({"ns": ns}).sort("$natural", -1).limit(1))


def check_update(c, coll, before, update, after, want_ud, **kw):
    """Write `before`, run update_one(update) on it; the newest entry of the namespace must be
    a "u" with o == after and exactly want_ud (None: no updateDescription)."""
    coll.replace_one({"_id": before["_id"]}, before, upsert=True)
    r = coll.update_one({"_id": before["_id"]}, update, **kw)
    assert r.modified_count == 1
    e = last_entry(c, coll.full_name)
    assert list(e.keys()) == (ENTRY_KEYS_UD if want_ud is not None else ENTRY_KEYS)
    assert e["op"] == "u"
    assert e["o"].raw == bson.encode(after)
    assert e["o2"].raw == bson.encode({"_id": before["_id"]})
    if want_ud is not None:
        assert e["updateDescription"].raw == want_ud, bson.decode(e["updateDescription"].raw)
    return e


def test_modifier_pipeline_and_replacement_entries(start_role, tmp_path):
    _, _, uri = one_member(start_role, tmp_path)
    c = client(uri, retryWrites=False)  # entries without lsid/txnNumber/stmtId
    coll = c.app.c
    pad = "abcdefghij"
    # $set of a top-level field and of a new one
    check_update(c, coll, {"_id": 1, "a": 1, "b": "x"}, {"$set": {"a": 2, "n": True}},
                 {"_id": 1, "a": 2, "b": "x", "n": True}, ud({"a": 2, "n": True}))
    # $set of a nested field: a dotted path
    check_update(c, coll, {"_id": 1, "s": {"x": 1, "y": 2, "z": pad}}, {"$set": {"s.y": "t"}},
                 {"_id": 1, "s": {"x": 1, "y": "t", "z": pad}}, ud({"s.y": "t"}))
    # $unset of a top-level and of a nested field
    check_update(c, coll, {"_id": 1, "a": 1, "s": {"x": 1, "y": 2, "z": pad}},
                 {"$unset": {"a": "", "s.y": ""}},
                 {"_id": 1, "s": {"x": 1, "z": pad}}, ud(removed=["a", "s.y"]))
    # $inc: the value keeps its type (int64)
    check_update(c, coll, {"_id": 1, "n": bson.Int64(5), "p": pad},
                 {"$inc": {"n": 1}}, {"_id": 1, "n": bson.Int64(6), "p": pad},
                 ud({"n": bson.Int64(6)}))
    # $push: the appended element
    check_update(c, coll, {"_id": 1, "arr": [1, 2, 3]}, {"$push": {"arr": 4}},
                 {"_id": 1, "arr": [1, 2, 3, 4]}, ud({"arr.3": 4}))
    # $pull from a short array: the whole array (its diff would be larger than it)
    check_update(c, coll, {"_id": 1, "arr": [1, 2, 3]}, {"$pull": {"arr": 2}},
                 {"_id": 1, "arr": [1, 3]}, ud({"arr": [1, 3]}))
    # $pull from a longer array: truncatedArrays and the moved element
    check_update(c, coll, {"_id": 1, "arr": list(range(10))}, {"$pull": {"arr": 8}},
                 {"_id": 1, "arr": [0, 1, 2, 3, 4, 5, 6, 7, 9]},
                 ud({"arr.8": 9}, truncated=[("arr", 9)]))
    # $pop of the last element: truncation only
    check_update(c, coll, {"_id": 1, "arr": [1, 2, 3, 4, 5]}, {"$pop": {"arr": 1}},
                 {"_id": 1, "arr": [1, 2, 3, 4]}, ud(truncated=[("arr", 4)]))
    # a pipeline update on a document large enough for the diff: described
    big = "p" * 40
    check_update(c, coll, {"_id": 1, "a": 1, "big": big},
                 [{"$set": {"a": {"$add": ["$a", 1]}}}, {"$unset": "gone"}],
                 {"_id": 1, "a": 2, "big": big}, ud({"a": 2}))
    # a pipeline update whose diff is not smaller than the document: a replacement, as mongod
    check_update(c, coll, {"_id": 1, "a": 1}, [{"$set": {"a": 2}}], {"_id": 1, "a": 2}, None)
    # replace_one: no updateDescription
    coll.replace_one({"_id": 1}, {"_id": 1, "a": 1, "b": 2}, upsert=True)
    coll.replace_one({"_id": 1}, {"_id": 1, "a": 5})
    e = last_entry(c, "app.c")
    assert list(e.keys()) == ENTRY_KEYS
    assert e["o"].raw == bson.encode({"_id": 1, "a": 5})
    # findAndModify: with operators, described; with a replacement, not
    coll.find_one_and_update({"_id": 1}, {"$set": {"a": 6}})
    e = last_entry(c, "app.c")
    assert e["updateDescription"].raw == ud({"a": 6})
    coll.find_one_and_replace({"_id": 1}, {"_id": 1, "z": 1})
    assert "updateDescription" not in last_entry(c, "app.c")
    # an upsert that matched: an update; one that did not: an insert
    coll.update_one({"_id": 1}, {"$set": {"z": 2}}, upsert=True)
    assert last_entry(c, "app.c")["updateDescription"].raw == ud({"z": 2})
    coll.update_one({"_id": 2}, {"$set": {"z": 2}}, upsert=True)
    e = last_entry(c, "app.c")
    assert e["op"] == "i" and "updateDescription" not in e
    # update_many: one described entry per document
    coll.insert_many([{"_id": 10, "g": 1, "v": 1}, {"_id": 11, "g": 1, "v": 2}])
    coll.update_many({"g": 1}, {"$inc": {"v": 10}})
    oplog = c.local.get_collection("oplog.rs", codec_options=RAW)
    es = list(oplog.find({"ns": "app.c", "op": "u", "o2._id": {"$in": [10, 11]}}))
    assert [(e["o2"]["_id"], e["updateDescription"].raw) for e in es] == [
        (10, ud({"v": 11})), (11, ud({"v": 12}))]
    r = c.admin.command("stripedbCheck")
    assert r["nProblems"] == 0, r


def test_large_update_is_logged_as_a_replacement(start_role, tmp_path):
    """An 8 MiB value in both o and updatedFields would not fit in one 16 MiB reply: the
    entry carries no updateDescription and stays readable (CDC tailing goes on)."""
    _, _, uri = one_member(start_role, tmp_path)
    c = client(uri, retryWrites=False)
    c.app.c.insert_one({"_id": 1, "a": 1})
    c.app.c.update_one({"_id": 1}, {"$set": {"big": "x" * (8 * 1024 * 1024 + 1)}})
    c.app.c.update_one({"_id": 1}, {"$set": {"a": 2}})
    oplog = c.local.get_collection("oplog.rs", codec_options=RAW)
    es = list(oplog.find({"ns": "app.c", "op": "u"}))
    assert len(es) == 2
    assert "updateDescription" not in es[0]
    assert len(es[0]["o"]["big"]) == 8 * 1024 * 1024 + 1
    assert es[1]["updateDescription"].raw == ud({"a": 2})


def test_transaction_entries(start_role, tmp_path):
    _, _, uri = one_member(start_role, tmp_path)
    c = client(uri, retryWrites=False)
    acc = c.bank.acc
    acc.insert_many([{"_id": 1, "n": 100, "tags": ["a"]}, {"_id": 2, "n": 0}])

    def txn(s):
        acc.update_one({"_id": 1}, {"$inc": {"n": -30}}, session=s)
        acc.update_one({"_id": 1}, {"$push": {"tags": "b"}}, session=s)
        acc.replace_one({"_id": 2}, {"_id": 2, "n": 30}, session=s)

    with c.start_session() as s:
        s.with_transaction(txn)
    oplog = c.local.get_collection("oplog.rs", codec_options=RAW)
    es = list(oplog.find({"ns": "bank.acc", "txnNumber": {"$exists": True}}))
    assert [e["op"] for e in es] == ["u", "u", "u"]
    assert es[0]["updateDescription"].raw == ud({"n": 70})
    # the second update of the same document is diffed against the first one's result
    assert es[1]["updateDescription"].raw == ud({"tags.1": "b"})
    assert es[1]["o"].raw == bson.encode({"_id": 1, "n": 70, "tags": ["a", "b"]})
    assert "updateDescription" not in es[2]
    r = c.admin.command("stripedbCheck")
    assert r["nProblems"] == 0, r


def test_every_member_writes_the_same_entries(start_role, tmp_path):
    _, wires, uri = start_set(start_role, tmp_path)
    c = client(uri)
    coll = c.app.c
    coll.insert_one({"_id": 1, "s": {"x": 1, "y": 2, "z": "abcdefghij"}, "arr": [1, 2, 3]})
    coll.update_one({"_id": 1}, {"$set": {"s.y": 3}, "$push": {"arr": 4}})
    coll.update_one({"_id": 1}, [{"$set": {"w": "$s.z"}}])
    coll.replace_one({"_id": 1}, {"_id": 1})
    p = primary_index(wires)
    assert p is not None

    def entries(port):
        with direct(port) as m:
            o = m.local.get_collection("oplog.rs", codec_options=RAW)
            return [e.raw for e in o.find({"ns": "app.c"})]

    want = entries(wires[p])
    assert len(want) == 4
    first_u = bson.decode(want[1])
    assert first_u["updateDescription"] == {"updatedFields": {"s.y": 3, "arr.3": 4},
                                            "removedFields": [], "truncatedArrays": []}
    for port in wires:
        wait_until(lambda: entries(port) == want, timeout=30,
                   what=f"member {port} has the primary's entries byte for byte")
