"""Bugs others hit, as tests (issue #8): a coordinator killed at every step boundary and
mid-step, a switch attempted while replication lags, a write in flight across the token
bump, every BSON type with 15 MiB documents and keys that sort differently as strings and
numbers, a hot shard-key value, a write rate the target cannot match, and rollback after
the switch. Each runs a pymongo workload through a proxy and ends with checker.py's
verdict."""
import signal
import time

import bson
import pytest

from checker import check
from conftest import wait_until
from migration_helpers import MigCluster, Workload, in_range

NS = "app.c"


def make_cluster(start_role, tmp_path, coordinators=1, preload=0, **kw):
    cl = MigCluster(start_role, tmp_path, meta=1, shards=2, proxies=1,
                    coordinators=coordinators, **kw)
    cl.shard_collection(NS, {"k": 1}, split_points=[{"k": 100}], shards=["shard-a", "shard-b"])
    if preload:
        coll = cl.proxy_client()["app"]["c"]
        for s in range(0, preload, 500):
            coll.insert_many([{"_id": f"p{i}", "k": i % 100, "pad": "x" * 100}
                              for i in range(s, min(preload, s + 500))])
    return cl


def chunk_a(cl):
    (c,) = [c for c in cl.chunks(NS) if c["shard"] == "shard-a"]
    return c


def verdict_of(cl, wl):
    final = {k: v for k, v in cl.owned_docs(NS).items() if str(k).startswith("d")}
    return check(wl.history, final)


def test_coordinator_killed_at_every_step_boundary_and_mid_step(start_role, tmp_path):
    points = ["before:importing", "after:importing", "mid:import", "after:replicating",
              "mid:replicate", "after:verifying", "mid:verify", "after:switching",
              "mid:switch", "after:switched", "after:cleaning", "mid:clean"]
    cl = make_cluster(start_role, tmp_path, coordinators=0, preload=1500)
    try:
        wl = Workload(cl, NS, writers=2, readers=1, keys=200).start()
        wait_until(lambda: wl.acked() >= 50, 30, what="workload running")
        c = chunk_a(cl)
        mid = cl.migrate(NS, c["id"], "shard-b", "--grace-ms=300")
        crashed = []
        for pt in points:
            co = cl.start_role(["--role=coordinator", f"--metadata={cl.metadata}",
                                f"--cdc={cl.cdc}", f"--cdc-lease-ms={cl.lease_ms}"],
                               env={"STRIPEDB_MIGRATION_CRASH": pt}, wait=False)
            # a crash point needs the migration to get there: generous on a loaded CI
            # machine, where leases are lost and renewed meanwhile (it timed out once at 60)
            co.p.wait(timeout=180)
            crashed.append((pt, co.p.returncode, cl.migration(mid)["state"]))
            assert co.p.returncode == 86, (pt, co.tail())
        co = cl.start_coordinator()
        m = cl.wait_migration(mid, timeout=60)
        wl.stop()
        assert m["state"] == "complete", m
        assert [x[1] for x in crashed] == [86] * len(points)
        # the crash before entering importing left it registered; after cleaning: cleaning
        assert crashed[0][2] == "registered" and crashed[-2][2] == "cleaning"
        assert m["stats"]["verify"] == {"count": m["stats"]["verify"]["count"], "missing": 0,
                                        "extra": 0, "different": 0}
        owned = cl.owned_docs(NS)
        assert sum(1 for k in owned if str(k).startswith("p")) == 1500
        assert cl.shard_client("shard-a")["app"]["c"].count_documents({}) == 0
        v = verdict_of(cl, wl)
        assert v["ok"], v["violations"][:10]
    finally:
        cl.close()


def crash_at_then_hold_publisher(cl, point):
    """Start a migration of chunk a under a workload, let a coordinator crash at `point`,
    then hold the source's CDC publisher lease as a nemesis (once the crashed holder's lease
    expired). Returns (workload, migration id, chunk a)."""
    wl = Workload(cl, NS, writers=2, readers=1, keys=200).start()
    wait_until(lambda: wl.acked() >= 50, 30, what="workload running")
    c = chunk_a(cl)
    mid = cl.migrate(NS, c["id"], "shard-b", "--grace-ms=300")
    co = cl.start_role(["--role=coordinator", f"--metadata={cl.metadata}",
                        f"--cdc={cl.cdc}", f"--cdc-lease-ms={cl.lease_ms}"],
                       env={"STRIPEDB_MIGRATION_CRASH": point}, wait=False)
    co.p.wait(timeout=180)  # generous on a loaded CI machine
    assert co.p.returncode == 86, co.tail()
    wait_until(lambda: cl.meta_write({"acquireLease": "cdc/shard-a", "holder": "nemesis",
                                      "ttlMS": 600000}, ok_codes=(46,)).get("ok") == 1,
               30, what="nemesis holds cdc/shard-a")
    return wl, mid, c


def test_switch_attempted_while_replication_lags_waits(start_role, tmp_path):
    """The source's CDC publisher is held off while the migration is in switching: the
    replicator cannot see the source's latest writes, so the coordinator must not bump the
    token nor switch; once the publisher runs again the switch happens."""
    cl = make_cluster(start_role, tmp_path, coordinators=0)
    try:
        wl, mid, c = crash_at_then_hold_publisher(cl, "after:switching")
        cl.start_coordinator()
        # writes to the chunk keep arriving on the source; the log does not advance
        t_end = time.monotonic() + 4
        while time.monotonic() < t_end:
            m = cl.migration(mid)
            assert m["state"] == "switching", m["state"]
            assert chunk_a(cl)["token"] == c["token"]  # routing unchanged, no bump routed
            time.sleep(0.1)
        m = cl.migration(mid)
        assert m["stats"]["pausesMS"] == []  # never paused writes
        assert [x["shard"] for x in cl.chunks(NS)] == ["shard-a", "shard-b"]
        cl.meta_write({"releaseLease": "cdc/shard-a", "holder": "nemesis"})
        m = cl.wait_migration(mid, timeout=60)
        wl.stop()
        assert m["state"] == "complete", m
        assert len(m["stats"]["pausesMS"]) == 1
        v = verdict_of(cl, wl)
        assert v["ok"], v["violations"][:10]
    finally:
        cl.close()


def test_replicating_waits_for_a_lagging_publisher(start_role, tmp_path):
    """A coordinator takes a migration over in replicating while the source's CDC publisher
    is held off: the log lags the source's oplog, so replication is not caught up, and the
    migration must stay in replicating (it used to go on to verifying at once, caught up
    with a log older than the import). Once the publisher runs again it completes."""
    cl = make_cluster(start_role, tmp_path, coordinators=0)
    try:
        wl, mid, _ = crash_at_then_hold_publisher(cl, "after:replicating")
        # writes to the chunk after the nemesis took the lease: on the source, not in the log
        n = wl.acked()
        wait_until(lambda: wl.acked() >= n + 20, 30, what="writes while the log lags")
        co = cl.start_coordinator()
        wait_until(lambda: "migration acquired" in co.tail(1 << 20), 60,
                   what="the new coordinator holds the migration")
        t_end = time.monotonic() + 3
        while time.monotonic() < t_end:
            assert cl.migration(mid)["state"] == "replicating"
            time.sleep(0.1)
        cl.meta_write({"releaseLease": "cdc/shard-a", "holder": "nemesis"})
        m = cl.wait_migration(mid, timeout=60)
        wl.stop()
        assert m["state"] == "complete", m
        v = verdict_of(cl, wl)
        assert v["ok"], v["violations"][:10]
    finally:
        cl.close()


def test_write_in_flight_across_the_token_bump(start_role, tmp_path):
    """Writers hammer the migrating chunk through two proxies; after the switch no client
    write of the chunk may appear in the source's oplog after the bump position (bumpTs):
    those writes were refused with StaleConfig and retried on the target."""
    cl = MigCluster(start_role, tmp_path, meta=1, shards=2, proxies=2, coordinators=1)
    try:
        cl.shard_collection(NS, {"k": 1}, split_points=[{"k": 100}],
                            shards=["shard-a", "shard-b"])
        wl = Workload(cl, NS, writers=4, readers=1, keys=100).start()  # all keys in chunk a
        wait_until(lambda: wl.acked() >= 100, 30, what="workload running")
        c = chunk_a(cl)
        mid = cl.migrate(NS, c["id"], "shard-b", "--grace-ms=2000")
        m = cl.wait_migration(mid, {"switched", "complete", "aborted"})
        assert m["state"] in ("switched", "complete"), m
        n = wl.acked()
        wait_until(lambda: wl.acked() >= n + 100, 30, what="writes after the switch")
        bump = m["checkpoint"]["bumpTs"]
        oplog = cl.shard_client("shard-a").local.get_collection("oplog.rs")
        late = [e for e in oplog.find({"ts": {"$gt": bump}, "ns": NS})
                if e.get("origin") is None]
        wl.stop()
        assert late == []
        assert bump.time > 0
        m = cl.wait_migration(mid)
        assert m["state"] == "complete"
        v = verdict_of(cl, wl)
        assert v["ok"], v["violations"][:10]
        assert v["stats"]["acked"] >= 200
    finally:
        cl.close()


def every_type_docs():
    from bson import Binary, Code, DBRef, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex
    from bson.timestamp import Timestamp
    import datetime
    import uuid
    vals = [1.5, -0.0, float("nan"), float("inf"), "str", {"a": {"b": [1, "x"]}}, [1, [2, [3]]],
            Binary(b"\x00\x01"), Binary(b"\x02" * 16, 4), Binary(uuid.uuid4().bytes, 3),
            Binary(b"u", 128), ObjectId(), True, False,
            datetime.datetime(2020, 1, 2, 3, 4, 5, 678000), None, Regex("^a.*b$", "im"),
            DBRef("coll", 5, "db"), Code("function(){}"), Code("f(x)", {"x": 1}), 7,
            Timestamp(1700000000, 3), Int64(2 ** 40), Decimal128("1.000000000000000000001"),
            MinKey(), MaxKey(), "\u00e9\u4e2d\U0001f600"]
    docs = []
    # keys that sort differently as strings and as numbers: 9 < 10 < 100 but "10" < "100" < "9"
    keys = [9, 10, 100, 9.5, Int64(11), "10", "100", "9", "1", "", -1, None]
    for i, v in enumerate(vals):
        docs.append({"_id": i, "k": keys[i % len(keys)], "v": v, "t": type(v).__name__})
    for j, k in enumerate(keys):
        docs.append({"_id": f"{j}", "k": k, "v": j})          # string _ids "0" .. "11"
        docs.append({"_id": 1000 + j, "k": k, "v": str(k)})   # number _ids
    return docs


def raw_docs(cl, sid, chunk):
    """{repr(_id): BSON bytes} of the chunk's documents on shard sid (decoded by pymongo
    and encoded again: every type round-trips, so equal bytes mean equal documents)."""
    out = {}
    for d in cl.shard_client(sid)["app"]["c"].find({}):
        if in_range(d, chunk):
            out[repr(d["_id"])] = bson.encode(d)
    return out


def test_every_bson_type_15mib_docs_and_string_number_keys(start_role, tmp_path):
    """Every BSON type, keys that sort differently as strings and numbers, and two 15 MiB
    documents move byte for byte, with the helpers' short 1.5 s lease while the target is
    stopped (SIGSTOP) for several leases in the middle of the migration: the coordinator
    renews the migration's lease on its own thread whatever its worker is blocked in (a
    15 MiB import batch under load once took 2.7 s; the lease was renewed only between
    batches and the import restarted forever), keeps it and finishes without a restart."""
    cl = MigCluster(start_role, tmp_path, meta=1, shards=2, proxies=1, coordinators=1,
                    lease_ms=1500)
    try:
        # split at "5": numbers, null and strings < "5" ("10", "100", "1") live in the first
        # chunk, "9" in the second
        cl.shard_collection(NS, {"k": 1}, split_points=[{"k": "5"}],
                            shards=["shard-a", "shard-b"])
        coll = cl.proxy_client()["app"]["c"]
        docs = every_type_docs()
        for d in docs:
            coll.insert_one(d)
        big = 15 * 1024 * 1024
        coll.insert_one({"_id": "big1", "k": 42, "blob": bson.Binary(b"\xab" * big)})
        coll.insert_one({"_id": "big2", "k": "1", "s": "y" * big})
        c = chunk_a(cl)
        before = raw_docs(cl, "shard-a", c)
        assert len(before) == sum(1 for d in docs if in_range(d, c)) + 2
        mid = cl.migrate(NS, c["id"], "shard-b", "--grace-ms=300")
        wait_until(lambda: cl.migration(mid)["state"] != "registered", 60,
                   what="migration started")
        assert cl.migration(mid)["state"] in ("importing", "replicating"), cl.migration(mid)
        holder = cl.meta_read({"getLease": f"mig/{mid}"})["lease"]["holder"]
        dst = cl.shard_procs["shard-b"]
        dst.signal(signal.SIGSTOP)
        try:
            # a write to the chunk (on the source) that the worker must copy to the stopped
            # target: whatever step it is in, it blocks on shard-b now
            coll.insert_one({"_id": "during-stop", "k": 7, "v": "x"})
            before[repr("during-stop")] = bson.encode(
                cl.shard_client("shard-a")["app"]["c"].find_one({"_id": "during-stop"}))
            e0 = cl.meta_read({"getLease": f"mig/{mid}"})["lease"]["expiresMS"]
            # renewed for more than two leases while the worker waits on the stopped shard
            wait_until(lambda: cl.meta_read({"getLease": f"mig/{mid}"})["lease"]["expiresMS"]
                       > e0 + 2 * cl.lease_ms, 30, what="lease renewed while shard-b is stopped")
            assert cl.meta_read({"getLease": f"mig/{mid}"})["lease"]["holder"] == holder
        finally:
            dst.signal(signal.SIGCONT)
        m = cl.wait_migration(mid, timeout=120)
        assert m["state"] == "complete", m
        assert m["stats"]["verify"] == {"count": len(before), "missing": 0, "extra": 0,
                                        "different": 0}
        after = raw_docs(cl, "shard-b", c)
        assert after.keys() == before.keys()
        assert all(after[k] == before[k] for k in before)  # byte for byte
        log = cl.coords[0].tail(2000000)
        assert "migration lease lost" not in log and "migration lease unknown" not in log
        assert "migration acquired" in log and log.count("migration acquired") == 1, \
            "the migration was taken up again"
    finally:
        cl.close()


def test_hot_shard_key_value(start_role, tmp_path):
    """3000 documents of one shard-key value (about 6 MB: no split point can divide them)
    move whole while a writer updates them."""
    cl = make_cluster(start_role, tmp_path)
    try:
        coll = cl.proxy_client()["app"]["c"]
        for s in range(0, 3000, 500):
            coll.insert_many([{"_id": f"h{i}", "k": 7, "pad": "h" * 2000}
                              for i in range(s, s + 500)])
        wl = Workload(cl, NS, writers=2, readers=1, keys=100).start()
        wait_until(lambda: wl.acked() >= 50, 30, what="workload running")
        c = chunk_a(cl)
        mid = cl.migrate(NS, c["id"], "shard-b", "--grace-ms=300")
        m = cl.wait_migration(mid, timeout=120)
        wl.stop()
        assert m["state"] == "complete", m
        assert m["stats"]["imported"] >= 3000
        tgt = cl.shard_client("shard-b")["app"]["c"]
        assert tgt.count_documents({"k": 7, "_id": {"$regex": "^h"}}) == 3000
        v = verdict_of(cl, wl)
        assert v["ok"], v["violations"][:10]
    finally:
        cl.close()


def test_catch_up_under_a_write_rate_the_target_cannot_match(start_role, tmp_path):
    """The replicator is throttled to 5 events/s while clients write far faster: the
    migration must abort cleanly (maxCatchUpMS), never pause writes, leave routing on the
    source and delete the target's partial copy."""
    cl = make_cluster(start_role, tmp_path)
    try:
        wl = Workload(cl, NS, writers=3, readers=1, keys=100).start()
        wait_until(lambda: wl.acked() >= 50, 30, what="workload running")
        c = chunk_a(cl)
        mid = "mig-slow"
        cl.meta_write({"registerMigration": mid, "ns": NS, "chunk": c["id"], "from": "shard-a",
                       "to": "shard-b", "applyRate": 5, "maxCatchUpMS": 3000,
                       "graceMS": 300})
        m = cl.wait_migration(mid, timeout=60)
        assert m["state"] == "aborted", m
        assert "maxCatchUpMS=3000" in m["stats"]["error"]
        assert m["stats"]["pausesMS"] == []
        assert chunk_a(cl)["id"] == c["id"] and chunk_a(cl)["token"] == c["token"]
        wait_until(lambda: cl.migration(mid)["checkpoint"].get("targetCleaned") is True, 30,
                   what="target copy deleted")
        wl.stop()
        assert cl.shard_client("shard-b")["app"]["c"].count_documents({"k": {"$lt": 100}}) == 0
        v = verdict_of(cl, wl)
        assert v["ok"], v["violations"][:10]
    finally:
        cl.close()


def test_rollback_after_the_switch(start_role, tmp_path):
    """After the switch, `ctl migration rollback` sends traffic back to the source, which
    reverse replication kept current; writes acknowledged by the target survive."""
    cl = make_cluster(start_role, tmp_path)
    try:
        wl = Workload(cl, NS, writers=2, readers=1, keys=100).start()
        wait_until(lambda: wl.acked() >= 50, 30, what="workload running")
        c = chunk_a(cl)
        mid = cl.migrate(NS, c["id"], "shard-b", "--grace-ms=600000")
        m = cl.wait_migration(mid, {"switched", "aborted"})
        assert m["state"] == "switched", m
        n = wl.acked()
        wait_until(lambda: wl.acked() >= n + 100, 30, what="writes on the target")
        r = cl.ctl("migration", "rollback", mid)
        assert r.stdout.decode().strip() == f"{mid}: switched -> rolling_back"
        m = cl.wait_migration(mid)
        assert m["state"] == "rolled_back", m
        assert chunk_a(cl)["id"] == c["id"]
        assert m["stats"]["reverseApplied"] > 0
        n = wl.acked()
        wait_until(lambda: wl.acked() >= n + 50, 30, what="writes after the rollback")
        wl.stop()
        assert cl.shard_client("shard-b")["app"]["c"].count_documents({"k": {"$lt": 100}}) == 0
        v = verdict_of(cl, wl)
        assert v["ok"], v["violations"][:10]
    finally:
        cl.close()
