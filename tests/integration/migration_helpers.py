"""Helpers for the Data Movement Platform tests (issue #8): a whole cluster on loopback
(metadata group, embedded shards, proxies, coordinators sharing one CDC log), the operator
CLI, and a client workload that records every acknowledged operation for checker.py.

    cl = MigCluster(start_role, tmp_path, meta=3, shards=3, proxies=2, coordinators=2)
    cl.shard_collection("app.c", {"k": 1}, split_points=[{"k": 100}], shards=["shard-a", ...])
    mid = cl.migrate("app.c", chunk_id, "shard-b")      # registered; coordinators run it
    cl.wait_migration(mid, "complete")
"""
import json
import os
import random
import subprocess
import threading
import time

import pymongo
from pymongo.errors import PyMongoError

from conftest import BIN, free_port, wait_until
from metadata_cluster import Cluster

TERMINAL = {"complete", "aborted", "rolled_back"}
# errors after which a write is known not to have been applied: StaleConfig after the
# proxy's retry budget, over quota, shard key rules
DEFINITE_CODES = {13388, 462, 66, 61}


class MigCluster:
    def __init__(self, start_role, tmp_path, meta=1, shards=2, proxies=1, coordinators=1,
                 cdc=None, lease_ms=1500, proxy_args=(), coord_env=None):
        self.start_role = start_role
        self.tmp_path = tmp_path
        self.meta = Cluster(start_role, tmp_path, meta, election_ms=300)
        self.meta.leader()
        self.metadata = self.meta.seeds()
        self.cdc = cdc or f"embedded:{tmp_path}/cdc"
        self.lease_ms = lease_ms
        self.coord_env = coord_env
        self.shard_ids, self.shard_ports, self.shard_procs = [], {}, {}
        for i in range(shards):
            self.add_shard(f"shard-{chr(ord('a') + i)}")
        self.proxy_ports, self.proxy_procs = [], []
        for _ in range(proxies):
            port = free_port()
            self.proxy_procs.append(start_role(
                ["--role=proxy", f"--listen=127.0.0.1:{port}", f"--metadata={self.metadata}"]
                + list(proxy_args)))
            self.proxy_ports.append(port)
        self.coords = [self.start_coordinator() for _ in range(coordinators)]
        self._clients = []

    # ---- processes
    def add_shard(self, sid):
        port = free_port()
        d = self.tmp_path / sid
        d.mkdir()
        self.shard_procs[sid] = self.start_role(
            ["--role=shard", f"--listen=127.0.0.1:{port}", f"--data-dir={d}"])
        self.shard_ids.append(sid)
        self.shard_ports[sid] = port
        self.meta_write({"addShard": sid, "uri": f"mongodb://127.0.0.1:{port}/"})
        return sid

    def start_coordinator(self):
        return self.start_role(["--role=coordinator", f"--metadata={self.metadata}",
                                f"--cdc={self.cdc}", f"--cdc-lease-ms={self.lease_ms}"],
                               env=self.coord_env)

    def restart_shard(self, sid):
        p = self.shard_procs[sid]
        p.kill()
        p.restart()
        p.wait_healthy()

    # ---- metadata
    def meta_write(self, cmd, ok_codes=()):
        return self.meta.write(cmd, ok_codes=ok_codes)

    def meta_read(self, cmd):
        deadline = time.monotonic() + 30
        while True:
            try:
                return self.meta.leader(timeout=max(1.0, deadline - time.monotonic())).cmd(cmd)
            except PyMongoError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def shard_collection(self, ns, key, split_points=None, shards=None):
        self.meta_write({"createDatabase": ns.split(".", 1)[0]}, ok_codes=(48, 11000))
        cmd = {"shardCollection": ns, "key": key, "shards": list(shards or self.shard_ids)}
        if split_points is not None:
            cmd["splitPoints"] = split_points
        return self.meta_write(cmd)

    def chunks(self, ns):
        return self.meta_read({"getRoutingTable": ns, "sinceVersion": 0})["chunks"]

    def chunk_of(self, ns, pred):
        return [c for c in self.chunks(ns) if pred(c)]

    def migration(self, mid):
        return self.meta_read({"getMigration": mid})["migration"]

    # ---- CLI
    def ctl(self, *args, check=True, timeout=120):
        r = subprocess.run([BIN, "ctl", f"--metadata={self.metadata}"] + list(args),
                           capture_output=True, timeout=timeout)
        if check:
            assert r.returncode == 0, (args, r.stdout.decode(), r.stderr.decode())
        return r

    def migrate(self, ns, chunk, to, *extra):
        out = self.ctl("--json", "migrate", ns, "--chunk", str(chunk), "--to", to, *extra)
        return json.loads(out.stdout.decode().splitlines()[0])["id"]

    def wait_migration(self, mid, states=TERMINAL, timeout=90):
        if isinstance(states, str):
            states = {states}

        def done():
            m = self.migration(mid)
            return m if m["state"] in states else None
        return wait_until(done, timeout, interval=0.05, what=f"migration {mid} in {states}")

    # ---- clients
    def _client(self, port, **kw):
        opts = dict(directConnection=True, serverSelectionTimeoutMS=10000,
                    connectTimeoutMS=5000, socketTimeoutMS=60000, retryWrites=False)
        opts.update(kw)
        c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/", **opts)
        self._clients.append(c)
        return c

    def proxy_client(self, i=0, **kw):
        return self._client(self.proxy_ports[i], **kw)

    def shard_client(self, sid):
        return self._client(self.shard_ports[sid])

    def owned_docs(self, ns):
        """Every document of ns read on the shard that owns its chunk now (by the routing
        table), keyed by _id: the data 'on the owning shards'."""
        db, coll = ns.split(".", 1)
        from bson.son import SON  # noqa: F401
        chunks = self.chunks(ns)
        out = {}
        for sid in self.shard_ids:
            mine = [c for c in chunks if c["shard"] == sid]
            if not mine:
                continue
            for d in self.shard_client(sid)[db][coll].find({}):
                if any(in_range(d, c) for c in mine):
                    assert d["_id"] not in out, f"_id {d['_id']} owned twice"
                    out[d["_id"]] = d
        return out

    def close(self):
        for c in self._clients:
            c.close()
        for p in self.proxy_procs:
            p.stop()


def key_cmp(a, b):
    """Compare scalar shard-key values of the kinds the tests use (MinKey, numbers,
    strings, MaxKey), in MongoDB order."""
    from bson.max_key import MaxKey
    from bson.min_key import MinKey

    def rank(v):
        if isinstance(v, MinKey):
            return (0, 0)
        if v is None:
            return (1, 0)
        if isinstance(v, (int, float)):
            return (2, v)
        if isinstance(v, str):
            return (3, v)
        if isinstance(v, MaxKey):
            return (9, 0)
        raise TypeError(f"key type {type(v)}")
    ra, rb = rank(a), rank(b)
    return (ra > rb) - (ra < rb)


def tuple_cmp(a, b):
    """Compare two shard-key tuples field by field in MongoDB's order (key_cmp)."""
    for x, y in zip(a, b):
        c = key_cmp(x, y)
        if c:
            return c
    return 0


def in_range(doc, chunk):
    """Is doc's shard key (one field or several, compared field by field) in chunk's
    [min, max)?"""
    key = []
    for f in chunk["min"]:
        v = doc
        for part in f.split("."):
            v = v.get(part) if isinstance(v, dict) else None
        key.append(v)
    lo, hi = list(chunk["min"].values()), list(chunk["max"].values())
    return tuple_cmp(lo, key) <= 0 and tuple_cmp(key, hi) < 0


class Workload:
    """Writers and readers through the proxies, recording every operation with its outcome
    for checker.py. Each writer owns a disjoint set of _ids; an operation is `ok` only when
    the proxy acknowledged it, `fail` when it returned an error that proves it was not
    applied (DEFINITE_CODES, duplicate key), `unknown` otherwise (network errors, timeouts,
    HostUnreachable from a proxy whose shard connection dropped mid-write)."""

    def __init__(self, cluster, ns, writers=3, readers=1, keys=200, seed=1, key_field="k",
                 fixed=None):
        self.cl = cluster
        # fields set in every document and every filter (e.g. {"t": "acme"}: one tenant
        # of a compound shard key {t: 1, k: 1})
        self.fixed = dict(fixed or {})
        self.db, self.coll = ns.split(".", 1)
        self.ns = ns
        self.keys = keys
        self.key_field = key_field
        self.history = []  # (kind, writer, _id, value, start, end, outcome, result)
        self.lock = threading.Lock()
        self.stop_ev = threading.Event()
        self.threads = []
        self.errors = []
        self.seed = seed
        self.nwriters = writers
        for w in range(writers):
            self.threads.append(threading.Thread(target=self._writer, args=(w,), daemon=True))
        for r in range(readers):
            self.threads.append(threading.Thread(target=self._reader, args=(r,), daemon=True))

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def stop(self):
        self.stop_ev.set()
        for t in self.threads:
            t.join(timeout=60)

    def _rec(self, *e):
        with self.lock:
            self.history.append(e)

    def acked(self):
        with self.lock:
            return sum(1 for e in self.history if e[6] == "ok" and e[0] != "read")

    def _coll(self, i):
        c = self.cl.proxy_client(i % len(self.cl.proxy_ports), socketTimeoutMS=20000)
        return c[self.db][self.coll]

    def _writer(self, w):
        rnd = random.Random(self.seed * 1000 + w)
        coll = self._coll(w)
        n = 0
        while not self.stop_ev.is_set():
            # ids of writer w: w, w + W, w + 2W, ... ; key spread over [0, keys)
            i = rnd.randrange(self.keys // self.nwriters) * self.nwriters + w
            _id = f"d{i}"
            key = i
            op = rnd.choice(["insert", "update", "update", "delete"])
            n += 1
            val = n
            t0 = time.monotonic()
            try:
                if op == "insert":
                    coll.insert_one({"_id": _id, **self.fixed, self.key_field: key, "v": val, "w": w})
                    out, res = "ok", None
                elif op == "update":
                    r = coll.update_one({"_id": _id, **self.fixed, self.key_field: key},
                                         {"$set": {"v": val}})
                    out, res = "ok", r.matched_count
                else:
                    r = coll.delete_one({"_id": _id, **self.fixed, self.key_field: key})
                    out, res = "ok", r.deleted_count
            except pymongo.errors.DuplicateKeyError:
                out, res = "fail", "dup"
            except pymongo.errors.OperationFailure as e:
                # only errors that prove the write was not applied are definite; a shard
                # connection lost mid-write (HostUnreachable 6, RetryableWriteError) may
                # have been applied
                definite = e.code in DEFINITE_CODES and not e.has_error_label(
                    "RetryableWriteError")
                out, res = ("fail" if definite else "unknown"), e.code
            except PyMongoError as e:
                out, res = "unknown", str(e)
            self._rec(op, w, _id, val, t0, time.monotonic(), out, res)

    def _reader(self, r):
        rnd = random.Random(self.seed * 7919 + r)
        coll = self._coll(r + 1)
        while not self.stop_ev.is_set():
            i = rnd.randrange(self.keys)
            _id = f"d{i}"
            t0 = time.monotonic()
            try:
                d = coll.find_one({"_id": _id, **self.fixed, self.key_field: i})
                self._rec("read", -1, _id, d.get("v") if d else None, t0, time.monotonic(),
                          "ok", d is not None)
            except PyMongoError as e:
                self._rec("read", -1, _id, None, t0, time.monotonic(), "unknown", str(e))
