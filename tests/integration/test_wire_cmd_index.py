"""A request's command keys are indexed once (src/wire/request.c wire__req_index_cmd) and the
shard's per-command lookups (util_cmd_find, wire_req_cmd_find: hint, let, projection,
filter, maxTimeMS, lsid, $db, ...) answer from that index, or walk the command when it has
more keys than the index holds (WIRE_REQ_KEYS, 24) or a key over 64 KiB. Through a shard,
over raw OP_MSG (so that the number and order of the keys is exactly what is sent), with
the fields that decide the answer placed last:

- the same find answers the same with 20 to 28 top-level keys (both sides of the index's
  size), whether `projection`, `filter`, `sort` and `$db` come first or last;
- `let` (or `hint`) as the last key of a point read keeps it off the loop thread
  (read_inline_candidate, counter stripedb_shard_loop_reads_total), with the index and
  without it, and without them the read is answered on the loop;
- a key longer than 64 KiB (an unknown field: refused) does not hide the `$db` after it.
"""
import socket
import struct

import bson

from conftest import metric_counter as _counter, raw_doc, raw_msg, recv_exact

OP_MSG = 2013
FILLERS = [("skip", 0), ("batchSize", 100), ("singleBatch", True), ("comment", "c"),
           ("maxTimeMS", 60000), ("readConcern", {}), ("returnKey", False),
           ("showRecordId", False), ("tailable", False), ("noCursorTimeout", False),
           ("awaitData", False), ("allowPartialResults", False), ("allowDiskUse", False),
           ("oplogReplay", False), ("collation", {"locale": "simple"}), ("limit", 0),
           ("readOnce", False), ("$readPreference", {"mode": "primaryPreferred"}),
           ("lsid", {"id": bson.Binary(b"\x01" * 16, 4)}),
           ("lsid", {"id": bson.Binary(b"\x02" * 16, 4)})]


def _command(s, rid, pairs):
    s.sendall(raw_msg(rid, raw_doc(pairs)))
    length, _rid, response_to, opcode = struct.unpack("<iiii", recv_exact(s, 16))
    rest = recv_exact(s, length - 16)
    assert opcode == OP_MSG and response_to == rid
    return bson.decode(rest[5:])


def _find(n_fillers, last, first=()):
    """find "c" with first, then n_fillers of FILLERS, then last: (key, value) pairs."""
    return [("find", "c")] + list(first) + FILLERS[:n_fillers] + list(last)


def test_find_answers_the_same_on_both_sides_of_the_key_index(shard):
    proc, port = shard
    with socket.create_connection(("127.0.0.1", port)) as s:
        docs = [{"_id": i, "x": i, "y": -i} for i in range(10)]
        r = _command(s, 1, [("insert", "c"), ("documents", docs), ("$db", "cmdidx")])
        assert r["ok"] == 1.0 and r["n"] == 10, r
        want = [{"_id": 7, "x": 7}, {"_id": 3, "x": 3}]
        tail = [("sort", {"_id": -1}), ("projection", {"y": 0}),
                ("filter", {"_id": {"$in": [3, 7, 11]}}), ("$db", "cmdidx")]
        rid = 10
        for n in range(17, len(FILLERS) + 1):
            for cmd in (_find(n, tail), _find(n, tail[-1:], first=tail[:-1])):
                rid += 1
                assert len(cmd) >= 22
                r = _command(s, rid, cmd)
                assert r.get("ok") == 1.0, (len(cmd), r)
                assert list(r["cursor"]["firstBatch"]) == want, (len(cmd), r)
                assert r["cursor"]["ns"] == "cmdidx.c"
        # two lsids (libmongoc appends its own after a command's): the first is the
        # session's; with more keys than the index holds and with fewer
        multi = [f for f in FILLERS if f[0] not in ("singleBatch", "batchSize")]
        for n in (len(multi), 2):
            rid += 1
            r = _command(s, rid, [("find", "c"), ("batchSize", 2)] + multi[-n:] +
                         [("filter", {}), ("$db", "cmdidx")])
            assert r.get("ok") == 1.0, r
            cid = r["cursor"]["id"]
            assert cid != 0
            rid += 1
            r = _command(s, rid, [("getMore", cid), ("collection", "c"),
                                  ("lsid", FILLERS[-2][1]), ("$db", "cmdidx")])
            assert r.get("ok") == 1.0, r
            assert [d["_id"] for d in r["cursor"]["nextBatch"]] == list(range(2, 10))


def test_let_or_hint_as_the_last_key_keeps_a_point_read_off_the_loop(shard):
    proc, port = shard
    loop = "stripedb_shard_loop_reads_total"
    with socket.create_connection(("127.0.0.1", port)) as s:
        r = _command(s, 1, [("insert", "c"), ("documents", [{"_id": 1, "x": 1}]),
                            ("$db", "cmdidx")])
        assert r["ok"] == 1.0
        rid = 1
        for n in (0, 5, 18, 19, 20, 21, 22):
            for extra, on_loop in (([], True), ([("let", {"a": 1})], False),
                                   ([("hint", {"_id": 1})], False)):
                cmd = _find(n, [("filter", {"_id": 1}), ("$db", "cmdidx")] + extra)
                before = _counter(proc, loop)
                rid += 1
                r = _command(s, rid, cmd)
                assert r.get("ok") == 1.0, (len(cmd), r)
                assert list(r["cursor"]["firstBatch"]) == [{"_id": 1, "x": 1}]
                moved = _counter(proc, loop) - before
                assert moved == (1 if on_loop else 0), (len(cmd), extra, moved)


def test_a_key_over_64_kib_does_not_hide_the_keys_after_it(shard):
    proc, port = shard
    with socket.create_connection(("127.0.0.1", port)) as s:
        long_key = "k" * (70 * 1024)
        r = _command(s, 1, [("find", "c"), (long_key, 1), ("$db", "cmdidx")])
        # refused as an unknown field, not as a request without $db
        assert r["ok"] == 0.0
        assert r["code"] == 40415, r
        r = _command(s, 2, [("ping", 1), ("$db", "admin")])
        assert r["ok"] == 1.0
