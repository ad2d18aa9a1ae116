"""The Data Movement Platform end to end (issue #8): chunks move between embedded shards
through the six steps while pymongo clients write and read through the proxies; the
checker (checker.py) compares the acknowledged history with the final data."""
import json
import os
import time

import pytest

from checker import check
from conftest import http_get, wait_until
from migration_helpers import MigCluster, Workload


def _chunk_on(cl, ns, shard):
    return [c for c in cl.chunks(ns) if c["shard"] == shard]


def test_migrate_one_chunk_under_writes(start_role, tmp_path):
    cl = MigCluster(start_role, tmp_path, meta=1, shards=2, proxies=1, coordinators=1)
    try:
        ns = "app.c"
        cl.shard_collection(ns, {"k": 1}, split_points=[{"k": 100}],
                            shards=["shard-a", "shard-b"])
        coll = cl.proxy_client()["app"]["c"]
        coll.create_index("v")
        coll.insert_many([{"_id": f"p{i}", "k": i, "v": -i} for i in range(200)])
        wl = Workload(cl, ns, writers=2, readers=1, keys=200).start()
        wait_until(lambda: wl.acked() >= 50, 30, what="workload running")
        (c0,) = [c for c in cl.chunks(ns) if c["shard"] == "shard-a"]
        mid = cl.migrate(ns, c0["id"], "shard-b", "--grace-ms=500")
        m = cl.wait_migration(mid)
        wait_until(lambda: wl.acked() >= m["stats"]["applied"] * 0 + 200, 30,
                   what="writes after the switch")
        wl.stop()
        assert m["state"] == "complete", m
        assert [c["shard"] for c in cl.chunks(ns)] == ["shard-b", "shard-b"]
        st = m["stats"]
        assert st["verify"]["missing"] == 0 and st["verify"]["extra"] == 0
        assert st["verify"]["different"] == 0
        assert st["imported"] >= 100  # the 100 preloaded docs of [MinKey, 100) at least
        assert len(st["pausesMS"]) == 1
        # the source no longer holds the chunk
        assert cl.shard_client("shard-a")["app"]["c"].count_documents({}) == 0
        # the index was built on the target
        assert "v_1" in cl.shard_client("shard-b")["app"]["c"].index_information()
        final = {k: v for k, v in cl.owned_docs(ns).items() if str(k).startswith("d")}
        verdict = check(wl.history, final)
        assert verdict["ok"], verdict["violations"][:10]
        assert verdict["stats"]["acked"] >= 200
        pre = {k: v for k, v in cl.owned_docs(ns).items() if str(k).startswith("p")}
        assert len(pre) == 200 and all(pre[f"p{i}"]["v"] == -i for i in range(200))
        st, body = http_get(cl.coords[0].http_port, "/metrics")
        metrics = dict(l.rsplit(" ", 1) for l in body.decode().splitlines()
                       if l.startswith("stripedb_migration_"))
        assert metrics["stripedb_migration_switches_total"] == "1"
        assert metrics["stripedb_migration_completed_total"] == "1"
        assert metrics["stripedb_migration_switch_pause_seconds_count"] == "1"
        # status shows the per-phase counts
        out = cl.ctl("migration", "status", mid).stdout.decode()
        assert f"{mid}  {ns} chunk {c0['id']}  shard-a -> shard-b  state complete" in out
        assert "0 missing, 0 extra, 0 different" in out
    finally:
        cl.close()


def test_import_orders(start_role, tmp_path):
    """Each --import-order (index, arrival, id) copies the same chunk (random _ids, shard
    key k, secondary index v) completely and is stored in the spec; an unknown order is
    refused by ctl (exit 2) and registers nothing."""
    cl = MigCluster(start_role, tmp_path, meta=1, shards=2, proxies=1, coordinators=1)
    try:
        docs = [{"_id": f"{(i * 7919) % 1000:03d}-{i}", "k": (i * 37) % 300, "v": i}
                for i in range(300)]
        bad = cl.ctl("migrate", "app.c0", "--chunk", "1", "--to", "shard-b",
                     "--import-order=rowid", check=False)
        assert bad.returncode == 2
        assert b"--import-order=index|arrival|id" in bad.stderr
        for n, order in enumerate(("index", "arrival", "id")):
            ns = f"app.c{n}"
            cl.shard_collection(ns, {"k": 1}, shards=["shard-a"])
            coll = cl.proxy_client()["app"][f"c{n}"]
            coll.create_index("v")
            coll.insert_many(docs)
            (c,) = cl.chunks(ns)
            mid = cl.migrate(ns, c["id"], "shard-b", f"--import-order={order}",
                             "--grace-ms=0")
            m = cl.wait_migration(mid)
            assert m["state"] == "complete", m
            assert m["spec"]["importOrder"] == order
            assert m["stats"]["imported"] == 300
            v = m["stats"]["verify"]
            assert (v["missing"], v["extra"], v["different"]) == (0, 0, 0)
            tgt = cl.shard_client("shard-b")["app"][f"c{n}"]
            assert sorted(tgt.find({}), key=lambda d: d["_id"]) == \
                sorted(docs, key=lambda d: d["_id"])
            assert tgt.find_one({"v": 123}, {"_id": 0, "k": 1}) == {"k": (123 * 37) % 300}
        # the refused one registered nothing
        assert len(cl.meta_read({"listMigrations": 1})["migrations"]) == 3
    finally:
        cl.close()


def _holder_coord(cl, mid):
    """The coordinator process holding the migration's lease (holder = host/pid/http)."""
    lease = cl.meta_read({"getLease": f"mig/{mid}"})["lease"]
    port = int(lease["holder"].rsplit(":", 1)[1])
    (co,) = [c for c in cl.coords if c.http_port == port]
    return co


def _wait_state(cl, mid, states, timeout=60):
    return cl.wait_migration(mid, set(states) | {"complete", "aborted", "rolled_back"}, timeout)


def run_end_to_end(start_role, tmp_path, cdc=None):
    """metadata x3 + 3 shards + 2 proxies + 2 coordinators; writers and readers through
    both proxies; chunks migrate back and forth, a chunk splits, a shard splits onto a new
    shard, two chunks merge; a nemesis kills a coordinator mid-migration, restarts a target
    shard and the metadata leader. Returns the checker's verdict."""
    cl = MigCluster(start_role, tmp_path, meta=3, shards=3, proxies=2, coordinators=2, cdc=cdc)
    try:
        ns = "app.e"
        cl.shard_collection(ns, {"k": 1}, split_points=[{"k": 50}, {"k": 100}, {"k": 150}],
                            shards=["shard-a", "shard-b", "shard-c", "shard-a"])
        wl = Workload(cl, ns, writers=3, readers=2, keys=200).start()
        wait_until(lambda: wl.acked() >= 100, 30, what="workload running")

        def chunk_at(k):
            (c,) = [c for c in cl.chunks(ns) if c["min"]["k"] == k]
            return c

        from bson.min_key import MinKey
        lo = MinKey()
        done = []
        # 1. a plain move: [MinKey, 50) a -> b
        mid = cl.migrate(ns, chunk_at(lo)["id"], "shard-b", "--grace-ms=300")
        done.append(cl.wait_migration(mid))
        # 2. a coordinator killed mid-migration: [50, 100) b -> c
        mid = cl.migrate(ns, chunk_at(50)["id"], "shard-c", "--grace-ms=300")
        _wait_state(cl, mid, {"importing", "replicating", "verifying", "switching",
                              "switched", "cleaning"})
        victim = _holder_coord(cl, mid)
        victim.kill()
        done.append(cl.wait_migration(mid))
        victim.restart()
        victim.wait_healthy()
        # 3. the target shard restarted while replicating: [100, 150) c -> a
        mid = cl.migrate(ns, chunk_at(100)["id"], "shard-a", "--grace-ms=300")
        _wait_state(cl, mid, {"replicating", "verifying", "switching", "switched"})
        cl.restart_shard("shard-a")
        done.append(cl.wait_migration(mid))
        # 4. back again, with the metadata leader restarted: [MinKey, 50) b -> a
        mid = cl.migrate(ns, chunk_at(lo)["id"], "shard-a", "--grace-ms=300")
        _wait_state(cl, mid, {"importing", "replicating", "verifying", "switching",
                              "switched"})
        leader = cl.meta.leader()
        cl.meta.kill(leader)
        cl.meta.restart(leader)
        done.append(cl.wait_migration(mid))
        # 5. a chunk split in metadata, then a shard split onto a new shard
        cl.meta_write({"splitChunk": chunk_at(150)["id"], "at": {"k": 175}})
        cl.add_shard("shard-d")
        r = cl.ctl("shard", "split", "shard-a", "--to", "shard-d", "--grace-ms=300", "--wait",
                   timeout=180)
        split_ids = [l for l in r.stdout.decode().splitlines() if len(l.split()) == 1]
        assert len(split_ids) >= 1
        # 6. merge two adjacent chunks of one shard (move one next to the other first)
        chunks = sorted(cl.chunks(ns), key=lambda c: 0 if c["min"]["k"] == lo else 1)
        a, b = chunk_at(150), chunk_at(175)
        if a["shard"] != b["shard"]:
            mid = cl.migrate(ns, b["id"], a["shard"], "--grace-ms=300")
            done.append(cl.wait_migration(mid))
        cl.meta_write({"mergeChunks": ns, "ids": [a["id"], b["id"]]})
        n_acked_at_end = wl.acked()
        wait_until(lambda: wl.acked() >= n_acked_at_end + 50, 30, what="writes after merge")
        wl.stop()
        for m in done:
            assert m["state"] == "complete", m
        for mid in split_ids:
            assert cl.migration(mid)["state"] == "complete"
        verdict = check(wl.history, cl.owned_docs(ns))
        # every non-owning shard holds nothing of ns outside its chunks (cleanup ran)
        owned = cl.owned_docs(ns)
        total = sum(cl.shard_client(s)["app"]["e"].count_documents({}) for s in cl.shard_ids)
        verdict["stray"] = total - len(owned)
        verdict["migrations"] = len(done) + len(split_ids)
        return verdict
    finally:
        cl.close()


def test_migrate_an_empty_chunk_of_an_idle_donor(start_role, tmp_path):
    """A chunk with no document, on a donor that gets no write during the migration: the
    migration completes (a fresh-user review saw one wait in replicating until the donor
    got a write); the other chunk's documents stay where they are."""
    cl = MigCluster(start_role, tmp_path, meta=1, shards=2, proxies=1, coordinators=1)
    try:
        ns = "app.e"
        cl.shard_collection(ns, {"k": 1}, split_points=[{"k": 100}],
                            shards=["shard-a", "shard-b"])
        coll = cl.proxy_client()["app"]["e"]
        coll.insert_many([{"_id": i, "k": 100 + i} for i in range(50)])
        (c0,) = [c for c in cl.chunks(ns) if c["shard"] == "shard-a"]
        mid = cl.migrate(ns, c0["id"], "shard-b")
        m = cl.wait_migration(mid, timeout=60)
        assert m["state"] == "complete", m
        assert [c["shard"] for c in cl.chunks(ns)] == ["shard-b", "shard-b"]
        assert sorted(d["_id"] for d in coll.find()) == list(range(50))
    finally:
        cl.close()


def test_end_to_end_embedded(start_role, tmp_path):
    verdict = run_end_to_end(start_role, tmp_path)
    print("verdict:", verdict["ok"], verdict["stats"], "migrations:", verdict["migrations"])
    assert verdict["ok"], verdict["violations"][:10]
    assert verdict["stray"] == 0
    assert verdict["stats"]["acked"] >= 300
    assert verdict["stats"]["reads"] >= 50


def test_end_to_end_kafka(start_role, tmp_path):
    """The same end-to-end run with the CDC log on Kafka (librdkafka's mock cluster)."""
    from cdc_helpers import KafkaMock, kafka_mock_path
    if not os.path.exists(kafka_mock_path()):
        pytest.skip("tests/integration/kafka_mock not built (make check builds it)")
    k = KafkaMock(1, [f"stripedb.cdc.shard-{s}" for s in "abcd"])
    try:
        verdict = run_end_to_end(start_role, tmp_path, cdc=f"kafka:{k.bootstrap}")
        print("verdict:", verdict["ok"], verdict["stats"], "migrations:", verdict["migrations"])
    finally:
        k.close()
    assert verdict["ok"], verdict["violations"][:10]
    assert verdict["stray"] == 0
    assert verdict["stats"]["acked"] >= 300
    assert verdict["stats"]["reads"] >= 50


def test_cli_uses(start_role, tmp_path):
    """The operator commands built on migrations: chunk list/split/merge, migrate --dry-run,
    tenant isolate, rebalance --bin-pack, shard drain, migration list/status, bad usage."""
    cl = MigCluster(start_role, tmp_path, meta=1, shards=3, proxies=1, coordinators=1)
    try:
        cl.meta_write({"createTenant": "acme"})
        cl.meta_write({"createDatabase": "acme_db", "tenant": "acme"})
        ns = "acme_db.c"
        cl.meta_write({"shardCollection": ns, "key": {"k": 1},
                       "splitPoints": [{"k": 50}, {"k": 100}],
                       "shards": ["shard-a", "shard-b", "shard-a"]})
        coll = cl.proxy_client()["acme_db"]["c"]
        coll.insert_many([{"_id": i, "k": i} for i in range(150)])
        out = cl.ctl("chunk", "list", ns).stdout.decode().splitlines()
        assert len(out) == 3
        r = cl.ctl("chunk", "split", ns, "--at", '{"k": 25}')
        assert r.stdout.decode().startswith("split chunk ")
        assert len(cl.chunks(ns)) == 4
        c25 = [c for c in cl.chunks(ns) if c["min"] == {"k": 25}][0]
        r = cl.ctl("migrate", ns, "--chunk", str(c25["id"]), "--to", "shard-c", "--dry-run")
        assert r.stdout.decode() == f"would migrate {ns} chunk {c25['id']} from shard-a to shard-c\n"
        assert cl.meta_read({"listMigrations": 1})["migrations"] == []
        r = cl.ctl("tenant", "isolate", "acme", "--to", "shard-c", "--grace-ms=100", "--wait",
                   timeout=180)
        ids = [l for l in r.stdout.decode().splitlines() if len(l.split()) == 1]
        assert len(ids) == 4
        assert sorted(c["shard"] for c in cl.chunks(ns)) == ["shard-c"] * 4
        assert coll.count_documents({}) == 150
        st = cl.ctl("migration", "status", ids[0]).stdout.decode()
        assert "state complete" in st and "0 missing, 0 extra, 0 different" in st
        listed = json.loads(cl.ctl("--json", "migration", "list").stdout)["migrations"]
        assert sorted(m["id"] for m in listed) == sorted(ids)
        a, b = sorted(cl.chunks(ns), key=lambda c: c["max"]["k"] if isinstance(
            c["max"]["k"], int) else 1 << 60)[:2]
        r = cl.ctl("chunk", "merge", ns, "--chunks", f"{a['id']},{b['id']}")
        assert r.stdout.decode().startswith("merged into chunk ")
        assert len(cl.chunks(ns)) == 3
        # bin-pack: a second collection gives shard-a 1 chunk, shard-b 2, shard-c 3
        cl.shard_collection("app.bp", {"k": 1}, split_points=[{"k": 10}, {"k": 20}],
                            shards=["shard-a", "shard-b", "shard-b"])
        r = cl.ctl("rebalance", "--bin-pack", "--dry-run")
        lines = r.stdout.decode().splitlines()
        (bp,) = [c for c in cl.chunks("app.bp") if c["shard"] == "shard-a"]
        assert lines == ["bin-pack: drain shard-a (1 chunks) into shard-b (2 chunks)",
                         f"would migrate app.bp chunk {bp['id']} from shard-a to shard-b"]
        cl.ctl("rebalance", "--bin-pack", "--grace-ms=100", "--wait", timeout=120)
        assert sorted(c["shard"] for c in cl.chunks("app.bp")) == ["shard-b"] * 3
        cl.ctl("shard", "drain", "shard-b", "--to", "shard-a", "--grace-ms=100", "--wait",
               timeout=180)
        assert [c for c in cl.chunks("app.bp") + cl.chunks(ns) if c["shard"] == "shard-b"] == []
        assert cl.ctl("migrate", ns, check=False).returncode == 2
        assert cl.ctl("migration", "frobnicate", check=False).returncode == 2
    finally:
        cl.close()
