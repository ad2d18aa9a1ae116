"""Helpers for the CDC tests: a metadata member, embedded shards registered in it,
coordinators with a CDC log, the shard's oplog read raw, and the CDC log read back through
`stripedb ctl cdc read` (the consumer API of src/cdc/reader.h).

    cl = CdcCluster(start_role, tmp_path, shards=1)
    co = cl.start_coordinator(f"embedded:{tmp_path}/cdc")
    cl.shard_client("shard-a").db.c.insert_one({...})
    cl.wait_published(co, "shard-a")          # the log caught up with the oplog head
    events = cl.read_log("shard-a")            # [(ts, raw bytes)] deduped, in log order
"""
import json
import os
import subprocess

import pymongo
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument

from conftest import BIN, http_get, wait_until
from metadata_cluster import Cluster
from conftest import free_port

RAW = CodecOptions(document_class=RawBSONDocument)


def ts_key(ts):
    """bson Timestamp -> (secs, inc)."""
    return (ts.time, ts.inc)


def split_bson(data):
    """Split back-to-back BSON documents."""
    out, i = [], 0
    while i < len(data):
        n = int.from_bytes(data[i:i + 4], "little")
        assert n >= 5 and i + n <= len(data), f"bad BSON length {n} at {i}"
        out.append(data[i:i + n])
        i += n
    return out


def kafka_mock_path():
    p = os.environ.get("STRIPEDB_KAFKA_MOCK")
    if p:
        return p
    return os.path.join(os.path.dirname(os.path.abspath(BIN)), "tests", "integration",
                        "kafka_mock")


class KafkaMock:
    """tests/integration/kafka_mock: librdkafka's mock cluster on loopback."""

    def __init__(self, brokers=1, topics=()):
        self.p = subprocess.Popen([kafka_mock_path(), str(brokers)] + list(topics),
                                  stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE)
        self.bootstrap = self.p.stdout.readline().decode().strip()
        assert self.bootstrap, "kafka_mock printed no bootstrap servers"

    def close(self):
        if self.p.poll() is None:
            self.p.stdin.close()
            try:
                self.p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


class CdcCluster:
    def __init__(self, start_role, tmp_path, shards=1, shard_env=None):
        self.start_role = start_role
        self.tmp_path = tmp_path
        self.meta = Cluster(start_role, tmp_path, 1, election_ms=300)
        self.meta.leader()
        self.metadata = self.meta.seeds()
        self.shard_ports = {}
        self.shard_procs = {}
        self._clients = []
        for i in range(shards):
            sid = f"shard-{chr(ord('a') + i)}"
            port = free_port()
            d = tmp_path / sid
            d.mkdir()
            self.shard_procs[sid] = start_role(
                ["--role=shard", f"--listen=127.0.0.1:{port}", f"--data-dir={d}"],
                env=shard_env)
            self.shard_ports[sid] = port
            self.meta.write({"addShard": sid, "uri": f"mongodb://127.0.0.1:{port}/"})
        self.cdc = None
        self.archive = None

    def start_coordinator(self, cdc, archive=None, extra=()):
        self.cdc, self.archive = cdc, archive
        args = ["--role=coordinator", f"--metadata={self.metadata}", f"--cdc={cdc}"]
        if archive:
            args.append(f"--archive={archive}")
        return self.start_role(args + list(extra))

    def shard_client(self, sid):
        c = pymongo.MongoClient(f"mongodb://127.0.0.1:{self.shard_ports[sid]}/",
                                directConnection=True, serverSelectionTimeoutMS=10000,
                                socketTimeoutMS=60000, retryWrites=False)
        self._clients.append(c)
        return c

    def oplog(self, sid):
        """Every oplog entry of the shard, raw, in ts order: [(ts, bytes)]."""
        coll = self.shard_client(sid).local.get_collection("oplog.rs", codec_options=RAW)
        out = []
        for d in coll.find({}, batch_size=500):
            out.append((ts_key(d["ts"]), d.raw))
        return out

    def status(self, coord):
        st, body = http_get(coord.http_port, "/cdc/status")
        assert st == 200, body
        return json.loads(body)

    def shard_status(self, coord, sid):
        for s in self.status(coord)["shards"]:
            if s["shard"] == sid:
                return s
        return None

    def wait_published(self, coord, sid, timeout=60.0):
        """Wait until coord's publisher of sid has published the oplog head."""
        coll = self.shard_client(sid).local.get_collection("oplog.rs", codec_options=RAW)
        head = ts_key(next(iter(coll.find({}, sort=[("$natural", -1)], limit=1)))["ts"])

        def done():
            s = self.shard_status(coord, sid)
            if s is None:
                return False
            p = s["publishedTs"]["$timestamp"]
            return (p["t"], p["i"]) >= head
        wait_until(done, timeout, what=f"{sid} published up to {head}")
        return head

    def ctl(self, *args, check=True, cdc=None, archive=None, timeout=120):
        env = dict(os.environ)
        env["STRIPEDB_CDC"] = cdc or self.cdc
        if archive or self.archive:
            env["STRIPEDB_ARCHIVE"] = archive or self.archive
        else:
            env.pop("STRIPEDB_ARCHIVE", None)
        r = subprocess.run([BIN, "ctl", f"--metadata={self.metadata}"] + list(args),
                           capture_output=True, env=env, timeout=timeout)
        if check:
            assert r.returncode == 0, r.stderr.decode()
        return r

    def read_log(self, sid, after=None, cdc=None, archive=None):
        """The shard's CDC events after `after` ((secs, inc) or None): [(ts, bytes)]."""
        args = ["cdc", "read", sid]
        if after is not None:
            args.append(f"--after={after[0]}:{after[1]}")
        out = self.ctl(*args, cdc=cdc, archive=archive).stdout
        res = []
        for raw in split_bson(out):
            d = RawBSONDocument(raw)
            res.append((ts_key(d["ts"]), raw))
        return res

    def close(self):
        for c in self._clients:
            c.close()
