"""Issue #15: a CDC publisher follows the primary of a shard replica set.

A 3-member shard set is registered with metadata by its replica-set URI; a coordinator
publishes its oplog into the embedded CDC log. The primary is SIGKILLed under writes; the
publisher's client follows the new primary (libmongoc server discovery) and resumes by ts:
the CDC log must equal the new primary's oplog entry for entry, byte for byte (no gap, no
duplicate), and every acknowledged write is in it.
"""
import signal
import threading

import pymongo
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument

from cdc_helpers import split_bson, ts_key
from conftest import BIN, http_get, wait_until
from metadata_cluster import Cluster
from test_shard_replset import direct, primary_index, start_set

RAW = CodecOptions(document_class=RawBSONDocument)


def oplog(port):
    with direct(port) as c:
        coll = c.local.get_collection("oplog.rs", codec_options=RAW)
        return [(ts_key(d["ts"]), d.raw) for d in coll.find({}, batch_size=500)]


def published(coord):
    import json
    st, body = http_get(coord.http_port, "/cdc/status")
    assert st == 200, body
    for s in json.loads(body)["shards"]:
        if s["shard"] == "shard-a":
            p = s["publishedTs"]["$timestamp"]
            return (p["t"], p["i"])
    return None


def test_cdc_publisher_follows_the_new_primary_without_gap_or_duplicate(start_role, tmp_path):
    import os
    import subprocess
    meta = Cluster(start_role, tmp_path, 1, election_ms=300)
    meta.leader()
    procs, wires, uri = start_set(start_role, tmp_path)
    meta.write({"addShard": "shard-a", "uri": uri})
    cdc = f"embedded:{tmp_path}/cdc"
    coord = start_role(["--role=coordinator", f"--metadata={meta.seeds()}", f"--cdc={cdc}"])
    acked, stop = [], threading.Event()

    def writer():
        with pymongo.MongoClient(uri, retryWrites=False, serverSelectionTimeoutMS=20000) as c:
            i = 0
            while not stop.is_set():
                try:
                    c.app.c.insert_one({"_id": i})
                    acked.append(i)
                except pymongo.errors.PyMongoError:
                    pass
                i += 1
    t = threading.Thread(target=writer)
    t.start()
    try:
        wait_until(lambda: len(acked) > 100, 30, interval=0.05, what="writes before the kill")
        wait_until(lambda: published(coord) is not None, 30, interval=0.1,
                   what="the publisher of shard-a started")
        victim = primary_index(wires)
        procs[victim].signal(signal.SIGKILL)
        procs[victim].p.wait(timeout=10)
        n = len(acked)
        wait_until(lambda: len(acked) > n + 200, 60, interval=0.05,
                   what="writes acknowledged by the new primary")
    finally:
        stop.set()
        t.join()
    p = primary_index(wires)
    assert p is not None and p != victim
    head = oplog(wires[p])
    wait_until(lambda: (published(coord) or (0, 0)) >= head[-1][0], 60, interval=0.1,
               what="the publisher caught up with the new primary's oplog")
    env = dict(os.environ, STRIPEDB_CDC=cdc)
    env.pop("STRIPEDB_ARCHIVE", None)
    r = subprocess.run([BIN, "ctl", f"--metadata={meta.seeds()}", "cdc", "read", "shard-a"],
                       capture_output=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr.decode()
    log = [(ts_key(RawBSONDocument(raw)["ts"]), raw) for raw in split_bson(r.stdout)]
    # the log is the new primary's oplog: same entries in the same order, byte for byte
    assert [t for t, _ in log] == [t for t, _ in head]
    for (t, a), (_, b) in zip(log, head):
        assert a == b, f"event {t} differs from the oplog entry"
    inserted = {RawBSONDocument(raw)["o"]["_id"] for _, raw in log
                if RawBSONDocument(raw)["op"] == "i"}
    assert set(acked) <= inserted
