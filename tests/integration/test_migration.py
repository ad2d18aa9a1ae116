"""The Data Movement Platform end to end (issue #8): chunks move between embedded shards
through the six steps while pymongo clients write and read through the proxies; the
checker (checker.py) compares the acknowledged history with the final data."""
import os
import time

import pytest

from checker import check
from conftest import wait_until
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
    finally:
        cl.close()
