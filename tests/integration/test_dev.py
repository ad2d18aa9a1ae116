"""`stripedb dev`: a complete local cluster as child processes (issue #9).

up prints the connection string and metrics endpoints; a real driver writes through the
proxies into a collection sharded by the metadata service; status reports every process;
kill/restart work; down stops everything gracefully and leaves nothing running; two
clusters on one machine do not clash.
"""
import json
import os
import subprocess

import pymongo

from conftest import BIN, OP_VERSION_MAX, alive


def dev(*args, timeout=180):
    env = dict(os.environ, STRIPEDB_CONFIG="/dev/null")
    return subprocess.run([BIN, "dev", *args], capture_output=True, text=True, timeout=timeout, env=env)


def test_dev_cluster_lifecycle(tmp_path):
    d1, d2 = tmp_path / "one", tmp_path / "two"
    r = dev("up", "--dir", str(d1), "--shards", "2", "--shard-members", "1", "--proxies", "2",
            "--coordinators", "0")
    try:
        assert r.returncode == 0, r.stderr
        assert "applications:  mongodb://127.0.0.1:" in r.stdout
        assert r.stdout.count("/metrics") == 3 + 2 + 1 + 2
        state = json.loads((d1 / "cluster.json").read_text())
        procs = {p["name"]: p for p in state["processes"]}
        assert sorted(procs) == ["metadata-1", "metadata-2", "metadata-3", "proxy-1", "proxy-2",
                                 "ratelimit-1", "shard-a", "shard-b"]
        # a second cluster on the same machine gets its own ports
        r2 = dev("up", "--dir", str(d2), "--shards", "1", "--shard-members", "1", "--proxies", "1",
                 "--coordinators", "0")
        assert r2.returncode == 0, r2.stderr
        ports1 = {p[k] for p in state["processes"] for k in ("wire", "http", "raft", "grpc") if p[k]}
        state2 = json.loads((d2 / "cluster.json").read_text())
        ports2 = {p[k] for p in state2["processes"] for k in ("wire", "http", "raft", "grpc") if p[k]}
        assert not ports1 & ports2
        px2 = [f"127.0.0.1:{p['wire']}" for p in state2["processes"] if p["role"] == "proxy"]
        c2 = pymongo.MongoClient(f"mongodb://{px2[0]}/")
        c2.keep.c.insert_one({"_id": "kept"})
        c2.close()
        assert dev("down", "--dir", str(d2)).returncode == 0
        # `dev up` on a stopped cluster resumes it: same processes, ports and data (new
        # ports would strand the metadata group's Raft log on the old addresses)
        r2 = dev("up", "--dir", str(d2), "--shards", "3")
        assert r2.returncode == 0, r2.stderr
        assert r2.stdout.startswith(f"resuming the stopped cluster in {d2}")
        resumed = json.loads((d2 / "cluster.json").read_text())
        assert [(p["name"], p["wire"], p["http"]) for p in resumed["processes"]] == \
            [(p["name"], p["wire"], p["http"]) for p in state2["processes"]]
        c2 = pymongo.MongoClient(f"mongodb://{px2[0]}/")
        assert c2.keep.c.find_one({}) == {"_id": "kept"}
        c2.close()
        assert dev("down", "--dir", str(d2)).returncode == 0

        # a sharded collection through the metadata service, written through both proxies
        meta = ",".join(f"127.0.0.1:{p['wire']}" for p in state["processes"] if p["role"] == "metadata")
        m = pymongo.MongoClient(f"mongodb://{meta}/?replicaSet=stripedb-meta")
        assert [s["id"] for s in m.admin.command("listShards")["shards"]] == ["shard-a", "shard-b"]
        # `dev up` raised the cluster op version to the binary's highest (raft/migstate.h)
        assert m.admin.command("setOpVersion", OP_VERSION_MAX)["previousVersion"] == \
            OP_VERSION_MAX
        m.admin.command("createDatabase", "pay")
        m.admin.command("shardCollection", "pay.charges", key={"merchant": 1},
                        splitPoints=[{"merchant": "m5"}])
        px = ",".join(f"127.0.0.1:{p['wire']}" for p in state["processes"] if p["role"] == "proxy")
        c = pymongo.MongoClient(f"mongodb://{px}/")
        c.pay.charges.insert_many([{"_id": i, "merchant": f"m{i % 10}", "amount": i} for i in range(200)])
        assert c.pay.charges.count_documents({}) == 200
        # write results carry n/nModified as int32, as mongos does (libmongoc ignores an
        # int64 n: update_one then reported matchedCount 0)
        r = c.pay.command("update", "charges",
                          updates=[{"q": {"_id": 7, "merchant": "m7"}, "u": {"$set": {"x": 1}}}])
        assert (r["n"], r["nModified"]) == (1, 1)
        assert type(r["n"]) is int and type(r["nModified"]) is int  # bson Int64 would differ
        per_shard = [pymongo.MongoClient(f"mongodb://127.0.0.1:{procs[s]['wire']}/?directConnection=true")
                     .pay.charges.count_documents({}) for s in ("shard-a", "shard-b")]
        assert per_shard == [100, 100]  # m0..m4 below the split point, m5..m9 above
        m.close()
        c.close()

        r = dev("status", "--dir", str(d1), "--json")
        assert r.returncode == 0
        rows = [json.loads(l) for l in r.stdout.splitlines()]
        assert {row["state"] for row in rows} == {"healthy"}

        r = dev("kill", "shard-b", "--dir", str(d1))
        assert r.returncode == 0 and "killed shard-b" in r.stdout
        r = dev("status", "--dir", str(d1))
        assert r.returncode == 1
        assert [l.split()[3] for l in r.stdout.splitlines() if l.startswith("shard-b")] == ["down"]
        r = dev("restart", "shard-b", "--dir", str(d1))
        assert r.returncode == 0, r.stderr
        assert dev("status", "--dir", str(d1)).returncode == 0
        # the restarted shard kept its data (kill -9 loses no acknowledged write)
        state = json.loads((d1 / "cluster.json").read_text())
        procs = {p["name"]: p for p in state["processes"]}
        sc = pymongo.MongoClient(f"mongodb://127.0.0.1:{procs['shard-b']['wire']}/?directConnection=true")
        assert sc.pay.charges.count_documents({}) == 100
        sc.close()
    finally:
        r = dev("down", "--dir", str(d1))
        dev("down", "--dir", str(d2))
    assert r.returncode == 0
    state = json.loads((d1 / "cluster.json").read_text())
    assert not any(alive(p["pid"]) for p in state["processes"])
    # graceful: every process logged a clean stop
    for p in state["processes"]:
        log = (d1 / "logs" / f"{p['name']}.log").read_text()
        assert "msg=stopped" in log.splitlines()[-1] or "msg=stopped" in log, p["name"]


def test_dev_usage_errors(tmp_path):
    r = dev("up", "--shards", "0", "--dir", str(tmp_path))
    assert r.returncode == 2 and "--shards: '0' is not an integer in 1..16" in r.stderr
    r = dev("up", "--cdc", "carrier-pigeon", "--dir", str(tmp_path))
    assert r.returncode == 2 and "--cdc must be embedded or kafka" in r.stderr
    r = dev("up", "--shard-members", "2", "--dir", str(tmp_path))
    assert r.returncode == 2 and "--shard-members must be 1, 3 or 5" in r.stderr
    r = dev("up", "--shard-members", "7", "--dir", str(tmp_path))
    assert r.returncode == 2 and "--shard-members: '7' is not an integer in 1..5" in r.stderr
    r = dev("status", "--dir", str(tmp_path / "nothing"))
    assert r.returncode == 1 and "no cluster in" in r.stderr
    r = dev("frob")
    assert r.returncode == 2 and "unknown subcommand 'frob'" in r.stderr


def test_dev_shard_replica_sets_fail_over_under_the_proxy(tmp_path):
    """Issue #15: by default each shard is a 3-member replica set registered by its
    replica-set URI; `dev kill shard-a` SIGKILLs its primary and writes through the proxy
    go on on the new primary; the restarted member catches up; nothing acknowledged is
    lost on any member."""
    import threading
    import time
    from conftest import wait_until
    d = tmp_path / "rs"
    r = dev("up", "--dir", str(d), "--shards", "1", "--proxies", "1", "--coordinators", "0")
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        state = json.loads((d / "cluster.json").read_text())
        procs = {p["name"]: p for p in state["processes"]}
        members = [procs[f"shard-a-{i}"] for i in (1, 2, 3)]
        assert all(p["set"] == "shard-a" and p["raft"] for p in members)
        meta = ",".join(f"127.0.0.1:{p['wire']}" for p in state["processes"] if p["role"] == "metadata")
        m = pymongo.MongoClient(f"mongodb://{meta}/?replicaSet=stripedb-meta")
        uri = m.admin.command("listShards")["shards"][0]["uri"]
        assert uri == "mongodb://" + ",".join(f"127.0.0.1:{p['wire']}" for p in members) + \
            "/?replicaSet=shard-a"
        proxy = [p["wire"] for p in state["processes"] if p["role"] == "proxy"][0]
        c = pymongo.MongoClient(f"mongodb://127.0.0.1:{proxy}/", retryWrites=False,
                                serverSelectionTimeoutMS=10000)
        acked, stop = [], threading.Event()

        def writer():
            i = 0
            while not stop.is_set():
                try:
                    c.app.c.insert_one({"_id": i})
                    acked.append(i)
                except pymongo.errors.PyMongoError:
                    pass  # outcome unknown or refused: only acknowledged ids are checked
                i += 1
        t = threading.Thread(target=writer)
        t.start()
        try:
            wait_until(lambda: len(acked) > 50, 30, interval=0.05, what="writes before the kill")
            r = dev("kill", "shard-a", "--dir", str(d))
            assert r.returncode == 0, r.stderr
            assert "primary of shard-a" in r.stdout
            killed = r.stdout.split()[1]
            n = len(acked)
            wait_until(lambda: len(acked) > n + 50, 30, interval=0.05,
                       what="writes through the proxy on the new primary")
        finally:
            stop.set()
            t.join()
        # ctl shard list: the dead member unreachable, a new primary among the others
        env = dict(os.environ, STRIPEDB_CONFIG="/dev/null")
        r = subprocess.run([BIN, "ctl", f"--metadata={meta}", "--json", "shard", "list"],
                           capture_output=True, text=True, timeout=60, env=env)
        assert r.returncode == 0, r.stderr
        sl = json.loads(r.stdout)["shards"][0]
        dead = f"127.0.0.1:{procs[killed]['wire']}"
        assert [x["reachable"] for x in sl["members"] if x["host"] == dead] == [False]
        assert sum(x.get("primary", False) for x in sl["members"]) == 1
        r = dev("restart", killed, "--dir", str(d))
        assert r.returncode == 0, r.stderr

        def members_state():
            out = []
            for p in members:
                with pymongo.MongoClient(f"mongodb://127.0.0.1:{p['wire']}/?directConnection=true",
                                         readPreference="secondaryPreferred",
                                         serverSelectionTimeoutMS=3000) as mc:
                    out.append(sorted(x["_id"] for x in mc.app.c.find({}, {"_id": 1})))
            return out
        wait_until(lambda: len({tuple(x) for x in members_state()}) == 1, 30, interval=0.2,
                   what="every member holds the same documents")
        for docs in members_state():
            assert set(acked) <= set(docs)
        # dev status names each shard member's set and the one primary
        r = dev("status", "--dir", str(d), "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        rows = [json.loads(line) for line in r.stdout.splitlines()]
        assert sorted(row["name"] for row in rows if row["set"] == "shard-a") == \
            ["shard-a-1", "shard-a-2", "shard-a-3"]
        assert sum(row["primary"] for row in rows if row["set"] == "shard-a") == 1
    finally:
        dev("down", "--dir", str(d))
