"""Backups and point-in-time restore of a sharded collection whose chunks move (issue #22):
a shard's backup holds only the documents of the chunks it owns at its snapshot (orphans
a migration left on its source, and documents of a chunk being imported, are not backed
up), and a restore whose backups and events meet a chunk migration of the collection is
refused (each shard's snapshot has its own ownership: a chunk that switched between two
snapshots would be in neither), never silently wrong.

Sequence (two shards, a proxy, a coordinator with the embedded CDC log, a file: archive):
  B0      backup of both shards
  move    the chunk [MinKey, 100) moves to the other shard with a 10-minute grace period
  W1, T1  deletes and updates of moved documents through the proxy
  B1      backup during the grace period: the source's copy is orphaned, not in B1
  restore to T1: refused, dry run or not, nothing left behind
  rollback the migration ends (rolled back: the chunk is the source's again)
  B2, W2, T2  a backup after it, more writes; restore to T2 equals the live collection
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
    p.create_index([("v", 1), ("k", 1)], name="v_k")
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
    # a backup while the migration is not over (its source keeps orphans, kept current by
    # reverse replication): B1 of the source holds no document of app.c (it owns no chunk
    # of it any more), B1 of the target everything that is live
    ctl(cl, tmp_path, "backup", "create", "--all")  # B1
    b1 = manifests(cl, tmp_path)[-2:]
    coll = {m["shard"]: [c for c in m["collections"] if c["ns"] == ns][0] for m in b1}
    assert coll[src]["ownedOnly"] is True
    assert int(coll[src]["count"]["$numberLong"]) == 0
    assert int(coll[dst]["count"]["$numberLong"]) == 190
    # while the migration is not over, every restore of app.c meets it: refused, with the
    # migration named, dry run or not, and nothing left behind
    wait_in_range(cl, tmp_path, t1)
    for extra in (["--dry-run"], ["--into=app.r1", f"--uri=mongodb://127.0.0.1:{cl.proxy_ports[0]}/"]):
        r = ctl(cl, tmp_path, "restore", ns, f"--to-time={fmt(t1)}", *extra, check=False)
        assert r.returncode == 1, r.stdout
        err = r.stderr.decode()
        assert "restore across a migration is not supported" in err and mid in err, err
        assert err.count("\n") == 1, err
    assert cl.proxy_client(0).app.r1.count_documents({}) == 0

    # the migration ends (rolled back within its grace period: the chunk is the source's
    # again, with the writes made on the target); B2 is taken once the clock slack after
    # its end has passed (cli/restore.c MIGRATION_CLOCK_SLACK_MS)
    cl.ctl("migration", "rollback", mid)
    m = cl.wait_migration(mid, "rolled_back")
    wait_until(lambda: now_ms() > m["updatedMS"] + 5500, 30, what="the migration's slack")
    ctl(cl, tmp_path, "backup", "create", "--all")  # B2
    # W2: more writes after B2, on both sides of the old split point
    p.update_many({"k": {"$gte": 20, "$lt": 30}}, {"$set": {"v": 2}})
    p.delete_many({"k": {"$gte": 150, "$lt": 155}})
    p.insert_many([{"_id": 1000 + i, "k": 1000 + i, "v": 3} for i in range(10)])
    t2 = now_ms()
    wait_in_range(cl, tmp_path, t2)
    r = ctl(cl, tmp_path, "--json", "restore", ns, f"--to-time={fmt(t2)}", "--into=app.r2",
            f"--uri=mongodb://127.0.0.1:{cl.proxy_ports[0]}/")
    res = json.loads(r.stdout.decode().strip().splitlines()[-1])
    want = sorted(p.find({}), key=lambda d: d["_id"])
    got = sorted(cl.proxy_client(0).app.r2.find({}), key=lambda d: d["_id"])
    assert len(want) == 195 and got == want, res
    # the collection's index came back with the documents
    ix = {i["name"]: i["key"] for i in cl.proxy_client(0).app.r2.list_indexes()}
    assert ix.get("v_k") == {"v": 1, "k": 1}, ix
    # a time before B2 but after the migration's start is still refused
    r = ctl(cl, tmp_path, "restore", ns, f"--to-time={fmt(t1)}", "--dry-run", check=False)
    assert r.returncode == 1 and b"restore across a migration" in r.stderr
