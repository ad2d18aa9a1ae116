"""CDC pipeline (issue #7): shard oplogs published by coordinators to the CDC log
(embedded segments, or Kafka through librdkafka's mock cluster), archived, read back.

Every test checks the log against the shard's own oplog read raw: the same entries, in
the same order, byte for byte.
"""
import datetime
import json
import re
import shutil
import subprocess
import threading
import uuid

import bson
import pytest
from bson import Binary, Code, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from bson.dbref import DBRef

from cdc_helpers import CdcCluster, KafkaMock, kafka_mock_path, split_bson, ts_key
from conftest import http_get, wait_until
import os


@pytest.fixture
def cl(start_role, tmp_path):
    c = CdcCluster(start_role, tmp_path, shards=1)
    yield c
    c.close()


def all_types_doc(i):
    return {
        "_id": i, "double": 1.5, "string": "héllo", "doc": {"b": 1, "a": [1, {"x": None}]},
        "array": [1, "two", 3.0], "binary": Binary(b"\x00\x01\xff", 0),
        "uuid": Binary(uuid.UUID(int=i).bytes, 4), "oid": ObjectId("0123456789abcdef01234567"),
        "bool": True, "date": datetime.datetime(2020, 1, 2, 3, 4, 5, 678000),
        "null": None, "regex": Regex("^a.*b$", "im"), "dbref": DBRef("c", 1, "db"),
        "code": Code("function(){}"), "codews": Code("f()", {"x": 1}), "int32": 7,
        "ts": Timestamp(123, 4), "int64": Int64(1 << 40), "dec": Decimal128("1.10"),
        "min": MinKey(), "max": MaxKey(), "z_field_order": 1, "a_field_order": 2,
    }


def assert_log_equals_oplog(cl, sid, log, oplog):
    assert [t for t, _ in log] == [t for t, _ in oplog]
    for (t, a), (_, b) in zip(log, oplog):
        assert a == b, f"event {t} differs from the oplog entry"


def metric(port, name, labels):
    st, body = http_get(port, "/metrics")
    assert st == 200
    m = re.search(rf"^{name}\{{{re.escape(labels)}\}} (-?[0-9.e+]+)$", body.decode(), re.M)
    return None if m is None else float(m.group(1))


def test_embedded_log_is_the_oplog_byte_for_byte(cl, tmp_path):
    co = cl.start_coordinator(f"embedded:{tmp_path}/cdc", archive=f"file:{tmp_path}/arch")
    c = cl.shard_client("shard-a")
    c.db.c.insert_many([all_types_doc(i) for i in range(20)])
    c.db.c.update_one({"_id": 3}, {"$set": {"string": "changed", "new": [1, 2]}})
    c.db.c.delete_one({"_id": 4})
    c.db.c.create_index([("int32", 1)])
    head = cl.wait_published(co, "shard-a")
    oplog = cl.oplog("shard-a")
    ops = [bson.decode(raw)["op"] for _, raw in oplog]
    assert ops.count("i") == 20 and ops.count("u") == 1 and ops.count("d") == 1
    log = cl.read_log("shard-a")
    assert_log_equals_oplog(cl, "shard-a", log, oplog)
    # from a position in the middle: exactly the suffix
    mid = oplog[10][0]
    assert_log_equals_oplog(cl, "shard-a", cl.read_log("shard-a", after=mid), oplog[11:])

    # operator view: /cdc/status, /metrics, ctl cdc status (text and --json)
    s = cl.shard_status(co, "shard-a")
    assert s["running"] is True
    assert s["nextOffset"] == len(oplog)
    assert (s["publishedTs"]["$timestamp"]["t"], s["publishedTs"]["$timestamp"]["i"]) == head
    wait_until(lambda: cl.shard_status(co, "shard-a")["lagEvents"] == 0, 10, what="lag 0")
    lab = 'shard="shard-a"'
    assert metric(co.http_port, "stripedb_cdc_published_offset", lab) == len(oplog)
    assert metric(co.http_port, "stripedb_cdc_published_ts_seconds", lab) == head[0]
    assert metric(co.http_port, "stripedb_cdc_events_published_total", lab) == len(oplog)
    assert metric(co.http_port, "stripedb_cdc_lag_events", lab) == 0
    assert metric(co.http_port, "stripedb_cdc_publisher_held", lab) == 1
    assert metric(co.http_port, "stripedb_cdc_archive_next_offset", lab) == 0

    out = json.loads(cl.ctl("--json", "cdc", "status").stdout)
    assert out["backend"] == "embedded"
    [sh] = out["shards"]
    assert sh["shard"] == "shard-a"
    assert sh["publisher"] == cl.status(co)["holder"]
    assert (sh["publishedTs"]["t"], sh["publishedTs"]["i"]) == head
    assert sh["nextOffset"] == len(oplog)
    assert sh["lagEvents"] == 0 and sh["lagSeconds"] == 0 and sh["shardReachable"] is True
    assert sh["log"] == {"firstOffset": 0, "nextOffset": len(oplog),
                         "firstTs": {"t": oplog[0][0][0], "i": oplog[0][0][1]}}
    text = cl.ctl("cdc", "status").stdout.decode().splitlines()
    assert text[0].split() == ["SHARD", "PUBLISHER", "PUBLISHED", "OFFSET", "LAG_S", "LAG_EV",
                               "LOG", "ARCHIVE"]
    assert text[1].split() == ["shard-a", sh["publisher"], f"{head[0]}:{head[1]}",
                               str(len(oplog)), "0", "0", f"0..{len(oplog)}", "0..0"]

    # new writes keep flowing after the first catch-up; json format of ctl cdc read
    c.db.c.insert_one({"_id": "late"})
    cl.wait_published(co, "shard-a")
    lines = cl.ctl("cdc", "read", "shard-a", f"--after={head[0]}:{head[1]}",
                   "--format=json").stdout.decode().splitlines()
    assert len(lines) == 1
    ev = json.loads(lines[0])
    assert ev["offset"] == len(oplog)
    assert ev["entry"]["o"] == {"_id": "late"}


def test_16mib_document_is_byte_identical(cl, tmp_path):
    co = cl.start_coordinator(f"embedded:{tmp_path}/cdc")
    c = cl.shard_client("shard-a")
    big = {"_id": "big", "blob": Binary(b"\xab" * (16 * 1024 * 1024 - 100))}
    assert len(bson.encode(big)) > 16 * 1024 * 1024 - 100
    c.db.c.insert_one(big)
    c.db.c.insert_one({"_id": "after"})
    cl.wait_published(co, "shard-a")
    oplog = cl.oplog("shard-a")
    log = cl.read_log("shard-a")
    assert_log_equals_oplog(cl, "shard-a", log, oplog)
    assert max(len(raw) for _, raw in log) > 16 * 1024 * 1024 - 100
    stored = c.db.c.find_one({"_id": "big"})
    assert bson.decode(log[-2][1])["o"] == stored


def test_retention_reads_through_the_archive(cl, tmp_path):
    co = cl.start_coordinator(f"embedded:{tmp_path}/cdc", archive=f"file:{tmp_path}/arch",
                              extra=["--cdc-segment-bytes=4096", "--cdc-retention-bytes=8192"])
    c = cl.shard_client("shard-a")
    for k in range(6):
        c.db.c.insert_many([{"_id": k * 100 + i, "pad": "x" * 200} for i in range(100)])
    cl.wait_published(co, "shard-a")
    oplog = cl.oplog("shard-a")
    assert len(oplog) == 601  # the create and 600 inserts
    # the live log dropped old segments; the archive has them from offset 0
    st = json.loads(cl.ctl("--json", "cdc", "status").stdout)["shards"][0]
    assert st["log"]["firstOffset"] > 0
    assert st["archive"]["firstOffset"] == 0
    assert st["archive"]["nextOffset"] == st["log"]["firstOffset"]
    assert len(os.listdir(tmp_path / "cdc" / "shard-a")) <= 2 * 4 + 1  # .seg/.idx, LOCK
    wait_until(lambda: cl.shard_status(co, "shard-a")["archive"]["nextOffset"]
               == st["archive"]["nextOffset"], 10, what="archive range on /cdc/status")
    assert metric(co.http_port, "stripedb_cdc_archive_first_offset", 'shard="shard-a"') == 0
    # a consumer from the beginning and from a position inside the archive: no gap
    assert_log_equals_oplog(cl, "shard-a", cl.read_log("shard-a"), oplog)
    assert_log_equals_oplog(cl, "shard-a", cl.read_log("shard-a", after=oplog[5][0]),
                            oplog[6:])
    # without the archive, the old position exists nowhere: a clear error
    r = cl.ctl("cdc", "read", "shard-a", f"--after={oplog[5][0][0]}:{oplog[5][0][1]}",
               check=False, archive="file:" + str(tmp_path / "empty-archive"))
    assert r.returncode == 1
    assert b"exists nowhere" in r.stderr
    assert r.stdout == b""


def writer_thread(cl, sid, stop, acked):
    c = cl.shard_client(sid)
    i = 0
    while not stop.is_set():
        c.db.w.insert_one({"_id": i, "v": "x" * (i % 50)})
        acked.append(i)
        i += 1


@pytest.mark.parametrize("backend", ["embedded", "kafka"])
def test_kill9_publisher_coordinator_another_takes_over(cl, tmp_path, backend, request):
    extra = ["--cdc-lease-ms=3000"]
    if backend == "kafka":
        cdc = f"kafka:{request.getfixturevalue('kafka').bootstrap}"
    else:
        cdc = f"embedded:{tmp_path}/cdc"
    co1 = cl.start_coordinator(cdc, extra=extra)
    wait_until(lambda: cl.shard_status(co1, "shard-a") is not None, 20, what="co1 holds")
    co2 = cl.start_coordinator(cdc, extra=extra)
    stop, acked = threading.Event(), []
    t = threading.Thread(target=writer_thread, args=(cl, "shard-a", stop, acked))
    t.start()
    try:
        wait_until(lambda: cl.shard_status(co1, "shard-a")["nextOffset"] > 200, 30,
                   what="co1 published 200 events")
        assert cl.shard_status(co2, "shard-a") is None  # exactly one publisher
        co1.kill()
        n_at_kill = len(acked)
        wait_until(lambda: cl.shard_status(co2, "shard-a") is not None, 30, what="takeover")
        wait_until(lambda: len(acked) > n_at_kill + 200, 30, what="more writes")
    finally:
        stop.set()
        t.join()
    cl.wait_published(co2, "shard-a")
    oplog = cl.oplog("shard-a")
    assert len(oplog) == len(acked) + 1  # the create and one insert per acked write
    # every oplog entry exactly once, in oplog order, after the reader's dedupe on ts
    log = cl.read_log("shard-a")
    assert_log_equals_oplog(cl, "shard-a", log, oplog)
    s = cl.shard_status(co2, "shard-a")
    assert s["leaseEpoch"] >= 2  # 2, or more if a renewal came late under load
    st = json.loads(cl.ctl("--json", "cdc", "status").stdout)["shards"][0]
    assert st["publisher"] == cl.status(co2)["holder"]
    if backend == "embedded":
        assert s["nextOffset"] == len(oplog)  # the embedded log holds no duplicate at all
    else:
        assert s["nextOffset"] >= len(oplog)  # Kafka may hold a re-sent tail, deduped above


@pytest.fixture
def kafka():
    if not os.path.exists(kafka_mock_path()):
        pytest.skip("tests/integration/kafka_mock not built (make check builds it)")
    k = KafkaMock(1, ["stripedb.cdc.shard-a"])
    yield k
    k.close()


def test_kafka_backend_and_kcat(cl, kafka, tmp_path):
    cdc = f"kafka:{kafka.bootstrap}"
    co = cl.start_coordinator(cdc)
    c = cl.shard_client("shard-a")
    c.db.c.insert_many([all_types_doc(i) for i in range(30)])
    c.db.c.update_one({"_id": 1}, {"$inc": {"int32": 1}})
    head = cl.wait_published(co, "shard-a")
    oplog = cl.oplog("shard-a")
    assert_log_equals_oplog(cl, "shard-a", cl.read_log("shard-a"), oplog)
    assert_log_equals_oplog(cl, "shard-a", cl.read_log("shard-a", after=oplog[20][0]),
                            oplog[21:])
    if shutil.which("kcat") is None:
        pytest.skip("kcat not installed")
    r = subprocess.run(["kcat", "-b", kafka.bootstrap, "-C", "-t", "stripedb.cdc.shard-a",
                        "-e", "-q", "-f", "%o %k %S\\n"], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.decode().splitlines()]
    assert [int(o) for o, _, _ in rows] == list(range(len(oplog)))
    assert [int(k) for _, k, _ in rows] == [(t << 32) | i for (t, i), _ in oplog]
    assert [int(s) for _, _, s in rows] == [len(raw) for _, raw in oplog]
    # raw values back to back are the oplog entries
    r = subprocess.run(["kcat", "-b", kafka.bootstrap, "-C", "-t", "stripedb.cdc.shard-a",
                        "-e", "-q", "-f", "%s"], capture_output=True, timeout=60)
    assert split_bson(r.stdout) == [raw for _, raw in oplog]
    out = json.loads(cl.ctl("--json", "cdc", "status").stdout)
    assert out["backend"] == "kafka"
    assert (out["shards"][0]["publishedTs"]["t"], out["shards"][0]["publishedTs"]["i"]) == head
    assert out["shards"][0]["nextOffset"] == len(oplog)


def test_kafka_retention_reads_through_the_archive(cl, kafka, tmp_path):
    # librdkafka's mock broker keeps about 5 MB per partition: 7 MB of events make it
    # drop the oldest; the publisher's archiver copied them to the archive first.
    co = cl.start_coordinator(f"kafka:{kafka.bootstrap}", archive=f"file:{tmp_path}/arch",
                              extra=["--cdc-segment-bytes=1048576"])
    c = cl.shard_client("shard-a")
    for k in range(7):
        c.db.c.insert_many([{"_id": k * 100 + i, "pad": "p" * 10000} for i in range(100)])
        cl.wait_published(co, "shard-a")
    oplog = cl.oplog("shard-a")
    assert len(oplog) == 701
    wait_until(lambda: cl.shard_status(co, "shard-a")["archive"]["nextOffset"] == 701, 30,
               what="everything archived")
    st = json.loads(cl.ctl("--json", "cdc", "status").stdout)["shards"][0]
    assert st["log"]["firstOffset"] > 0  # the broker dropped the oldest events
    assert st["log"]["nextOffset"] == 701
    assert st["archive"]["firstOffset"] == 0 and st["archive"]["nextOffset"] == 701
    assert metric(co.http_port, "stripedb_cdc_archived_events_total", 'shard="shard-a"') == 701
    # from the beginning and from inside the dropped range: archive, then the broker
    assert_log_equals_oplog(cl, "shard-a", cl.read_log("shard-a"), oplog)
    assert_log_equals_oplog(cl, "shard-a", cl.read_log("shard-a", after=oplog[100][0]),
                            oplog[101:])
    # without the archive that position exists nowhere
    r = cl.ctl("cdc", "read", "shard-a", f"--after={oplog[100][0][0]}:{oplog[100][0][1]}",
               check=False, archive="file:" + str(tmp_path / "empty-archive"))
    assert r.returncode == 1 and b"exists nowhere" in r.stderr


def test_oplog_history_lost_is_reported_not_skipped(start_role, tmp_path):
    # a shard whose oplog keeps about 60 KB: while no publisher runs, writes push the
    # published position out of it; the next publisher must refuse to go on
    cl = CdcCluster(start_role, tmp_path, shards=1,
                    shard_env={"STRIPEDB_OPLOG_MAX_BYTES": "60000"})
    try:
        cdc = f"embedded:{tmp_path}/cdc"
        co = cl.start_coordinator(cdc)
        c = cl.shard_client("shard-a")
        c.db.c.insert_many([{"_id": i, "pad": "x" * 100} for i in range(20)])
        head = cl.wait_published(co, "shard-a")
        assert co.stop() == 0
        for k in range(10):
            c.db.c.insert_many([{"_id": 1000 + k * 100 + i, "pad": "y" * 500}
                                for i in range(100)])
        oldest = ts_key(next(iter(c.local["oplog.rs"].find({}, limit=1)))["ts"])
        assert oldest > head  # the oplog was trimmed past the published position
        co2 = cl.start_coordinator(cdc)
        wait_until(lambda: "oplog history lost" in
                   (cl.shard_status(co2, "shard-a") or {}).get("error", ""), 20,
                   what="history lost reported")
        s = cl.shard_status(co2, "shard-a")
        p = s["publishedTs"]["$timestamp"]
        assert (p["t"], p["i"]) == head  # nothing published over the hole
        assert s["nextOffset"] == 21
        assert metric(co2.http_port, "stripedb_cdc_publish_errors_total",
                      'shard="shard-a"') >= 1
        assert [t for t, _ in cl.read_log("shard-a")][-1] == head
    finally:
        cl.close()
