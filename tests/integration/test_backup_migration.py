"""Backups and point-in-time restore of a sharded collection whose chunks move (issue #22):
a shard's backup holds only the documents of the chunks it owns at the snapshot (orphans
a migration left on its source, and documents of a chunk being imported, are not backed
up), and a restore whose window crosses a migration is either exact or refused, never
silently wrong.

Sequence (two shards, a proxy, a coordinator with the embedded CDC log, a file: archive):
  B0      backup of both shards
  move    the chunk [MinKey, 100) moves to the other shard with a 10-minute grace period,
          so the source keeps its copy (orphans, kept current by reverse replication)
  W1, T1  deletes and updates of moved documents through the proxy
  B1      backup of both shards (the source's copy is orphaned: not in B1)
  W2, T2  more writes (reverse-replicated onto the source's orphans, in its oplog)
Restore to T2 (from B1) must equal the collection as the proxy shows it (no write after
T2); restore to T1 (from B0, across the move) must be refused with a clear error.
"""
import json
import os
import subprocess
import time

import pytest
from bson import MinKey

from conftest import BIN, wait_until
from migration_helpers import MigCluster


@pytest.fixture
def cl(start_role, tmp_path):
    c = MigCluster(start_role, tmp_path, shards=2, proxies=1, coordinators=1)
    yield c
    c.close()


def now_ms():
    return int(time.time() * 1000)


def fmt(t):
    return f"{t // 1000}.{t % 1000:03d}"


def ctl(cl, tmp_path, *args, check=True):
    env = dict(os.environ)
    env["STRIPEDB_CDC"] = cl.cdc
    env["STRIPEDB_ARCHIVE"] = f"file:{tmp_path}/arch"
    r = subprocess.run([BIN, "ctl", f"--metadata={cl.metadata}"] + list(args),
                       capture_output=True, env=env, timeout=120)
    if check:
        assert r.returncode == 0, (args, r.stdout.decode(), r.stderr.decode())
    return r


def wait_in_range(cl, tmp_path, t):
    """Until the CDC log holds every shard's history up to t (the restore's range)."""
    def ok():
        r = ctl(cl, tmp_path, "restore", "app.c", f"--to-time={fmt(t)}", "--dry-run",
                check=False)
        if r.returncode == 0:
            return True
        assert b"outside the available range" in r.stderr or \
            b"not supported" in r.stderr, r.stderr
        return b"not supported" in r.stderr
    wait_until(ok, 60, interval=0.2, what=f"CDC log up to {t}")


def manifests(cl, tmp_path):
    out = json.loads(ctl(cl, tmp_path, "--json", "backup", "list").stdout)["backups"]
    return sorted(out, key=lambda m: m["id"])


def test_restore_of_a_sharded_collection_across_a_chunk_migration(cl, tmp_path):
    ns = "app.c"
    cl.shard_collection(ns, {"k": 1}, split_points=[{"k": 100}])
    p = cl.proxy_client(0).app.c
    p.insert_many([{"_id": i, "k": i, "v": 0} for i in range(200)])
    moved = [c for c in cl.chunks(ns) if isinstance(c["min"]["k"], MinKey)][0]
    src = moved["shard"]
    dst = [s for s in cl.shard_ids if s != src][0]
    assert [c["shard"] for c in cl.chunks(ns)].count(src) == 1, "the source owns one chunk"

    ctl(cl, tmp_path, "backup", "create", "--all")  # B0
    mid = cl.migrate(ns, moved["id"], dst, "--grace-ms=600000")
    cl.wait_migration(mid, "switched")
    # W1: writes of moved documents, now on dst
    p.delete_many({"k": {"$lt": 10}})
    p.update_many({"k": {"$gte": 10, "$lt": 20}}, {"$set": {"v": 1}})
    t1 = now_ms()
    # the source still holds the whole chunk (orphans until the grace period ends)
    assert cl.shard_client(src).app.c.count_documents({"k": {"$lt": 100}}) >= 90
    ctl(cl, tmp_path, "backup", "create", "--all")  # B1
    # W2: more writes after B1, on both sides of the old split point
    p.update_many({"k": {"$gte": 20, "$lt": 30}}, {"$set": {"v": 2}})
    p.delete_many({"k": {"$gte": 150, "$lt": 155}})
    p.insert_many([{"_id": 1000 + i, "k": 1000 + i, "v": 3} for i in range(10)])
    # reverse replication reaches the source's orphans: events of the migration in its
    # oplog after B1 and before T2, which the restore must skip (the owner holds them)
    wait_until(lambda: cl.shard_client(src).app.c.count_documents({"v": 2}) == 10, 60,
               what="reverse replication onto the source")
    t2 = now_ms()

    # B1 of the source holds no document of app.c (it owns no chunk of it any more): the
    # orphans are not backed up; B1 of the target holds everything that was live
    b1 = manifests(cl, tmp_path)[-2:]
    coll = {m["shard"]: [c for c in m["collections"] if c["ns"] == ns][0] for m in b1}
    assert coll[src]["ownedOnly"] is True
    assert int(coll[src]["count"]["$numberLong"]) == 0
    assert int(coll[dst]["count"]["$numberLong"]) == 190

    wait_in_range(cl, tmp_path, t2)
    r = ctl(cl, tmp_path, "--json", "restore", ns, f"--to-time={fmt(t2)}", "--into=app.r2",
            f"--uri=mongodb://127.0.0.1:{cl.proxy_ports[0]}/")
    res = json.loads(r.stdout.decode().strip().splitlines()[-1])
    assert res["migrationEventsSkipped"] >= 10, res
    want = sorted(p.find({}), key=lambda d: d["_id"])
    got = sorted(cl.proxy_client(0).app.r2.find({}), key=lambda d: d["_id"])
    assert len(want) == 195 and got == want

    # T1 lies after the move and before B1: only B0 can serve it, and its source copy of
    # the moved chunk meets the target's writes of the same documents
    wait_in_range(cl, tmp_path, t1)
    for extra in (["--dry-run"], ["--into=app.r1", f"--uri=mongodb://127.0.0.1:{cl.proxy_ports[0]}/"]):
        r = ctl(cl, tmp_path, "restore", ns, f"--to-time={fmt(t1)}", *extra, check=False)
        assert r.returncode == 1, r.stdout
        err = r.stderr.decode()
        assert "restore across a migration is not supported" in err, err
        assert err.count("\n") == 1, err
    assert cl.proxy_client(0).app.r1.count_documents({}) == 0
