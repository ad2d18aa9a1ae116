"""`stripedb bench` (issue #9): YCSB and payments workloads through libmongoc against a real
shard, the text and JSON report, the JSON-lines history and the built-in checker.
"""
import json
import os
import subprocess

from conftest import BIN


def bench(*args, timeout=120):
    env = dict(os.environ, STRIPEDB_CONFIG="/dev/null")
    return subprocess.run([BIN, "bench", *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


def uri(port):
    return f"mongodb://127.0.0.1:{port}/?directConnection=true"


def test_bench_ycsb_a_report_history_and_check(shard, tmp_path):
    _, port = shard
    j, h = tmp_path / "r.json", tmp_path / "h.jsonl"
    r = bench("--uri", uri(port), "--workload", "a", "--records", "300", "--threads", "2",
              "--seconds", "1.5", "--json", str(j), "--history", str(h), "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "checker: OK: 300 keys" in r.stdout, r.stdout
    rep = json.loads(j.read_text())
    assert rep["workload"] == "a"
    assert rep["threads"] == 2
    assert rep["records"] == 300
    assert [p["label"] for p in rep["phases"]] == ["run"]
    ph = rep["phases"][0]
    assert set(ph["latencyMS"]) == {"read", "update"}
    assert ph["errors"] == {"quota_462": 0, "duplicate_key": 0, "network": 0, "routing": 0,
                            "timeout": 0, "other": 0}
    assert ph["ops"] == ph["latencyMS"]["read"]["n"] + ph["latencyMS"]["update"]["n"]
    assert rep["check"]["ok"] is True
    assert rep["check"]["violations"] == 0
    assert rep["check"]["docs"] == 300

    events = [json.loads(line) for line in h.read_text().splitlines()]
    inserts = [e for e in events if e["op"] == "insert"]
    assert len(inserts) == 300
    assert {e["ok"] for e in inserts} == {"ok"}
    assert sorted(e["key"] for e in inserts) == [f"user{k:012d}" for k in range(300)]
    updates = [e for e in events if e["op"] == "update"]
    assert len(updates) == ph["latencyMS"]["update"]["n"]
    # one writer per key: the versions of a key's updates are 2, 3, 4, ... in start order
    by_key = {}
    for e in sorted(updates, key=lambda e: e["start_ns"]):
        by_key.setdefault(e["key"], []).append(e["value"])
    for vals in by_key.values():
        assert vals == list(range(2, 2 + len(vals)))
    assert all(e["n"] == 1 for e in updates)
    assert all(e["start_ns"] <= e["end_ns"] for e in events)

    # the same history through the migration tests' checker (tests/integration/checker.py):
    # (kind, writer, _id, value, start, end, outcome, result); a read of an absent key is None
    import checker
    import pymongo
    hist = [(e["op"], 0, e["key"], (e["value"] or None) if e["op"] == "read" else e["value"],
             e["start_ns"], e["end_ns"], e["ok"], e["n"] if e["op"] == "update" else None)
            for e in events]
    final = {d["_id"]: d for d in pymongo.MongoClient(uri(port)).ycsb.usertable.find({}, {"v": 1})}
    verdict = checker.check(hist, final)
    assert verdict["ok"], verdict["violations"][:5]
    assert verdict["stats"]["ids"] == 300
    # and it notices a lost write: drop the last acknowledged update of one key
    k = updates[0]["key"]
    last = max((e for e in updates if e["key"] == k), key=lambda e: e["start_ns"])
    final[k] = dict(final[k], v=last["value"] - 1)
    assert not checker.check(hist, final)["ok"]


def test_bench_payments_documents_and_queries(shard, tmp_path):
    import pymongo
    _, port = shard
    j = tmp_path / "r.json"
    r = bench("--uri", uri(port), "--workload", "payments", "--records", "400", "--threads", "2",
              "--seconds", "1.5", "--merchants", "20", "--json", str(j), "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "checker: OK" in r.stdout
    rep = json.loads(j.read_text())
    assert set(rep["phases"][0]["latencyMS"]) == {"read", "update", "insert", "query"}
    c = pymongo.MongoClient(uri(port))
    doc = c.pay.charges.find_one({"_id": {"$regex": "^ch_m"}})
    assert set(doc) >= {"_id", "v", "merchant", "customer", "amount", "currency", "status",
                        "amountRefunded", "created", "card", "billingAddress", "metadata"}
    assert doc["_id"].startswith("ch_" + doc["merchant"] + "_")
    names = [ix["name"] for ix in c.pay.charges.list_indexes()]
    assert "merchant_1_created_1" in names
    # zipfian merchants: m0000 is the busiest
    counts = {m: c.pay.charges.count_documents({"merchant": m}) for m in ("m0000", "m0019")}
    assert counts["m0000"] > counts["m0019"]


def test_bench_compare_two_endpoints(start_role, tmp_path):
    from conftest import free_port
    ports = []
    for name in ("s1", "s2"):
        port = free_port()
        d = tmp_path / name
        d.mkdir()
        start_role(["--role=shard", f"--listen=127.0.0.1:{port}", f"--data-dir={d}"])
        ports.append(port)
    r = bench("--uri", uri(ports[0]), "--label", "first", "--uri", uri(ports[1]), "--label",
              "second", "--workload", "c", "--records", "200", "--threads", "1", "--seconds", "1",
              "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith("comparison"))
    rows = [line.split()[0] for line in lines[i + 1:i + 3]]
    assert rows == ["first", "second"]
    assert lines[i + 1].split()[-1] == "OK" and lines[i + 2].split()[-1] == "OK"


def test_bench_usage_errors():
    r = bench("--workload", "a")
    assert r.returncode == 2
    assert "--uri is required" in r.stderr
    r = bench("--uri", "mongodb://127.0.0.1:1/", "--workload", "z")
    assert r.returncode == 1
    assert "unknown workload 'z'" in r.stderr
    r = bench("--uri", "mongodb://127.0.0.1:1/", "--threads", "0")
    assert r.returncode == 2
    r = bench("--frobnicate")
    assert r.returncode == 2


class _FindReplyRewriter:
    """A TCP relay in front of a shard that replaces the reply to every `find` on
    ycsb.usertable with a `find` filter on _id (the bench's point read) by one that is
    not a closed one-batch cursor: mode "no_cursor" ({ok: 1}), "no_batch" (a cursor
    without firstBatch) or "open_empty" (an empty firstBatch on an open cursor, whose
    document would come in a getMore). Everything else passes byte for byte."""

    def __init__(self, target_port, mode):
        import socket
        import threading
        from conftest import free_port
        self.target, self.mode, self.port = target_port, mode, free_port()
        self.ls = socket.socket()
        self.ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.ls.bind(("127.0.0.1", self.port))
        self.ls.listen(64)
        self.rewritten = 0
        self.socks = []
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self):
        for s in [self.ls] + self.socks:
            s.close()

    @staticmethod
    def _read(s):
        import struct
        buf = b""
        while len(buf) < 16 or len(buf) < struct.unpack("<i", buf[:4])[0]:
            k = s.recv(65536 if len(buf) < 16 else struct.unpack("<i", buf[:4])[0] - len(buf))
            if not k:
                raise ConnectionError("eof")
            buf += k
        return buf

    def _accept(self):
        import socket
        import threading
        while True:
            try:
                c, _ = self.ls.accept()
            except OSError:
                return
            s = socket.create_connection(("127.0.0.1", self.target))
            self.socks += [c, s]
            points = set()  # request ids of point reads on this connection
            threading.Thread(target=self._pump, args=(c, s, points, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(s, c, points, False), daemon=True).start()

    def _pump(self, a, b, points, to_server):
        import struct
        import bson
        try:
            while True:
                msg = self._read(a)
                _, req, resp, op = struct.unpack("<iiii", msg[:16])
                if op == 2013 and msg[20] == 0:
                    n = struct.unpack("<i", msg[21:25])[0]
                    doc = bson.decode(msg[21:21 + n])
                    if to_server:
                        if (doc.get("find") == "usertable" and doc.get("$db") == "ycsb"
                                and "_id" in doc.get("filter", {})):
                            points.add(req)
                    elif resp in points:
                        points.discard(resp)
                        cur = doc.get("cursor", {})
                        doc = {"no_cursor": {"ok": 1.0},
                               "no_batch": {"cursor": {"id": bson.Int64(0),
                                                       "ns": cur.get("ns", "")},
                                            "ok": 1.0},
                               "open_empty": {"cursor": {"id": bson.Int64(4242),
                                                         "ns": cur.get("ns", ""),
                                                         "firstBatch": []},
                                              "ok": 1.0}}[self.mode]
                        self.rewritten += 1
                        payload = struct.pack("<I", 0) + b"\x00" + bson.encode(doc)
                        msg = struct.pack("<iiii", 16 + len(payload), req, resp, op) + payload
                b.sendall(msg)
        except (OSError, ConnectionError):
            for s in (a, b):
                try:
                    s.close()
                except OSError:
                    pass


def test_bench_point_read_of_a_malformed_reply_is_a_failure(shard, tmp_path):
    """A point read whose reply is not the closed one-batch cursor of a find with limit 1
    is an error (as libmongoc's cursor made it), never a read that saw the key absent: the
    history has no such read and the report counts it under "other"."""
    _, port = shard
    r = bench("--uri", uri(port), "--workload", "c", "--records", "50", "--threads", "1",
              "--seconds", "0.2", "--no-check", "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    for mode in ("no_cursor", "no_batch", "open_empty"):
        relay = _FindReplyRewriter(port, mode)
        try:
            j, h = tmp_path / f"{mode}.json", tmp_path / f"{mode}.jsonl"
            r = bench("--uri", uri(relay.port), "--workload", "c", "--records", "50",
                      "--threads", "1", "--seconds", "0.4", "--no-load", "--no-check",
                      "--json", str(j), "--history", str(h), "--quiet")
            assert r.returncode == 0, r.stdout + r.stderr
            assert relay.rewritten > 0, mode
            reads = [e for e in map(json.loads, h.read_text().splitlines())
                     if e["op"] == "read"]
            assert reads == [], (mode, reads[:3])
            ph = json.loads(j.read_text())["phases"][0]
            assert ph["errors"]["other"] == relay.rewritten, (mode, ph)
        finally:
            relay.close()
