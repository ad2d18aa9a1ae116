"""`stripedb demo` (issue #9): the whole job on one command, with a short --seconds.

Checks the report (three migrations completed with a measured write pause, the SIGKILL of
the busiest shard's primary with its failover time and nothing lost (issue #15), a tenant
refused with 462, the checker's verdict OK), and that no process is left, also after Ctrl-C.
"""
import json
import os
import re
import signal
import subprocess

import pytest

from conftest import BIN, alive, wait_until


def pids(d):
    cl = json.loads((d / "cluster.json").read_text())
    return [p["pid"] for p in cl["processes"]] + ([cl["kafkaPid"]] if cl["kafkaPid"] else [])


def run_demo(d, cdc):
    env = dict(os.environ, STRIPEDB_CONFIG="/dev/null")
    r = subprocess.run([BIN, "demo", "--dir", str(d), "--cdc", cdc, "--seconds", "20",
                        "--records", "2000", "--threads", "3"],
                       capture_output=True, text=True, timeout=400, env=env)
    return r


def check_report(r, d):
    out = r.stdout
    assert r.returncode == 0, out[-4000:] + r.stderr[-2000:]
    # a write in flight on the killed primary may end unknown (the proxy does not retry a
    # write whose outcome it cannot know); the checker still finds nothing
    assert re.search(r"^checker verdict: OK: \d+ keys, \d+ writes \(\d+ acknowledged, \d+ failed, "
                     r"\d+ unknown\), \d+ reads, \d+ final documents, 0 violations$", out, re.M), out
    migs = re.findall(r"^  (bin-pack|split)\s+chunk (\d+)\s+(shard-\w) -> (shard-\w)\s+(\w+)\s.*"
                      r"write pause (\d+ ms(?:, \d+ ms)*)$", out, re.M)
    # drain shard-d (its one chunk) into shard-c, then half of shard-a's four chunks to shard-d;
    # each with the pause of every switch attempt (more than one when the pause bound was hit)
    assert [(m[0], m[1], m[2], m[3], m[4]) for m in migs] == [
        ("bin-pack", "8", "shard-d", "shard-c", "complete"),
        ("split", "1", "shard-a", "shard-d", "complete"),
        ("split", "2", "shard-a", "shard-d", "complete")], out
    assert re.search(r"^quota: tenant burst \(20 requests/s\): 200 inserts sent, \d+ accepted, "
                     r"[1-9]\d* refused with 462 \(retryAfterMS [1-9]\d*\)$", out, re.M), out
    # issue #15: the primary of the busiest shard is SIGKILLed under load; the probe client
    # through the proxies saw a new primary acknowledge writes, nothing lost or duplicated
    fo = re.search(r"^failover: SIGKILL of (shard-\w-\d) \(primary of (shard-\w), the busiest "
                   r"shard\) under load: first acknowledged write on the new primary "
                   r"(shard-\w-\d) after (\d+) ms; \S+ rejoined and caught up in (\d+) ms$",
                   out, re.M)
    assert fo, out
    assert fo.group(1).startswith(fo.group(2)) and fo.group(3).startswith(fo.group(2))
    assert fo.group(1) != fo.group(3)
    assert re.search(r"^  probe .*: (\d+) sent, [1-9]\d* acknowledged, \d+ refused, \d+ unknown; "
                     r"\d+ documents found, 0 acknowledged missing, 0 unexpected or duplicated: "
                     r"nothing lost or duplicated$", out, re.M), out
    for label in ("before", "bin-pack d->c (during)", "between", "split a->d (during)",
                  "failover (during)", "after"):
        assert re.search(r"^phase " + re.escape(label) + r"\s+[\d.]+ s\s+[1-9]\d* ops", out,
                         re.M), label
    assert "== 7. stripedb dev down: every process stopped" in out
    assert [p for p in pids(d) if alive(p)] == []


def test_demo_embedded(tmp_path):
    d = tmp_path / "demo"
    check_report(run_demo(d, "embedded"), d)


def test_demo_kafka(tmp_path):
    d = tmp_path / "demo"
    r = run_demo(d, "kafka")
    check_report(r, d)
    assert "kafka (mock):" in r.stdout


def ours_alive(d):
    """Live stripedb processes whose command line names the directory d."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
        except OSError:
            continue
        if str(d) in cmd and alive(int(pid)):
            found.append((int(pid), cmd.replace("\0", " ")))
    return found


@pytest.mark.parametrize("when", ["starting a local stripedb cluster", "== 3."])
def test_demo_ctrl_c_leaves_nothing_running(tmp_path, when):
    """Ctrl-C on a terminal: SIGINT to the whole foreground process group, during `dev up`
    and during the workload."""
    d = tmp_path / "demo"
    env = dict(os.environ, STRIPEDB_CONFIG="/dev/null")
    out = tmp_path / "out.txt"
    log = open(out, "w+")
    p = subprocess.Popen([BIN, "demo", "--dir", str(d), "--seconds", "60", "--records", "500"],
                         stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        wait_until(lambda: when in out.read_text(), timeout=120, what=when)
        os.killpg(p.pid, signal.SIGINT)
        assert p.wait(timeout=120) == 130
    finally:
        if p.poll() is None:
            p.kill()
    text = out.read_text()
    assert "interrupted: stopping the workload and the cluster" in text
    assert "every process stopped" in text
    assert ours_alive(d) == []
    if when == "== 3.":
        # metadata x3, shards a-d of 3 members each, ratelimit, a proxy, a coordinator
        assert len(pids(d)) == 18


def test_ctl_top_once_and_json(tmp_path):
    import pymongo
    d = tmp_path / "dev"
    env = dict(os.environ, STRIPEDB_CONFIG="/dev/null")
    r = subprocess.run([BIN, "dev", "up", "--dir", str(d), "--shards", "2", "--proxies", "1",
                        "--coordinators", "0"], capture_output=True, text=True, timeout=180,
                       env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    try:
        cl = json.loads((d / "cluster.json").read_text())
        meta = ",".join(f"127.0.0.1:{p['wire']}" for p in cl["processes"]
                        if p["role"] == "metadata")
        proxy = [p["wire"] for p in cl["processes"] if p["role"] == "proxy"][0]
        m = pymongo.MongoClient(f"mongodb://{meta}/?replicaSet=stripedb-meta")
        m.admin.command({"createDatabase": "app"})
        m.admin.command({"shardCollection": "app.c", "key": {"k": 1},
                         "splitPoints": [{"k": 100}], "shards": ["shard-a", "shard-b"]})
        c = pymongo.MongoClient(f"mongodb://127.0.0.1:{proxy}/")
        c.app.c.insert_many([{"_id": i, "k": i} for i in range(130)])
        # no coordinators: a registered migration stays in flight
        r = subprocess.run([BIN, "ctl", f"--metadata={meta}", "migrate", "app.c", "--chunk", "1",
                            "--to", "shard-b"], capture_output=True, text=True, timeout=60,
                           env=env)
        assert r.returncode == 0, r.stderr
        mig = r.stdout.strip()
        r = subprocess.run([BIN, "ctl", f"--metadata={meta}", "top", "--json", "--dir", str(d)],
                           capture_output=True, text=True, timeout=60, env=env)
        assert r.returncode == 0, r.stderr
        top = json.loads(r.stdout)
        shards = {s["id"]: s for s in top["shards"]}
        assert sorted(shards) == ["shard-a", "shard-b"]
        assert (shards["shard-a"]["chunks"], shards["shard-a"]["docs"]) == (1, 100)
        assert (shards["shard-b"]["chunks"], shards["shard-b"]["docs"]) == (1, 30)
        assert all(s["qps"] is not None and s["qps"] >= 0 for s in top["shards"])
        # issue #15: each shard is a 3-member replica set; top shows every member's state
        for s in top["shards"]:
            assert len(s["members"]) == 3 and all(m["reachable"] for m in s["members"]), s
            assert sorted(m["state"] for m in s["members"]) == ["PRIMARY", "SECONDARY",
                                                                 "SECONDARY"], s
            assert all(m["lag"] >= 0 and m["term"] >= 1 for m in s["members"]), s
        assert [(g["id"], g["ns"], g["chunk"], g["from"], g["to"], g["state"])
                for g in top["migrations"]] == [(mig, "app.c", 1, "shard-a", "shard-b",
                                                 "registered")]
        r = subprocess.run([BIN, "ctl", f"--metadata={meta}", "top", "--once"],
                           capture_output=True, text=True, timeout=60, env=env)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[2].split() == ["SHARD", "STATE", "CHUNKS", "DOCS", "SIZE", "QPS"]
        assert lines[3].split()[:4] == ["shard-a", "active", "1", "100"]
        assert lines[3].split()[-1] == "-"  # no metrics address without --dir
        assert "migrations in flight: 1" in r.stdout
    finally:
        subprocess.run([BIN, "dev", "down", "--dir", str(d)], capture_output=True, timeout=120,
                       env=env)


def test_grafana_dashboard_names_only_registered_metrics():
    from conftest import SRCDIR
    dash = json.loads(open(os.path.join(SRCDIR, "packaging/grafana/stripedb.json")).read())
    registered = set()
    for root, _, files in os.walk(os.path.join(SRCDIR, "src")):
        for f in files:
            if f.endswith(".c"):
                registered |= set(re.findall(r'"(stripedb_[a-z0-9_]+)"',
                                             open(os.path.join(root, f)).read()))
    used = set()
    for p in dash["panels"]:
        for t in p.get("targets", []):
            for name in re.findall(r"\b(stripedb_[a-z0-9_]+)", t["expr"]):
                used.add(re.sub(r"_(bucket|sum|count)$", "", name))
    assert used - registered == set()
    # every role has a row, and every panel queries the chosen data source
    rows = [p["title"] for p in dash["panels"] if p["type"] == "row"]
    assert rows == ["Overview", "Proxies", "Shards", "Metadata (Raft)", "CDC (coordinators)",
                    "Rate limiter"]
    assert all(p["datasource"]["uid"] == "${datasource}" for p in dash["panels"]
               if p["type"] != "row")


def test_demo_refuses_a_directory_of_other_files(tmp_path):
    (tmp_path / "precious.txt").write_text("keep me")
    env = dict(os.environ, STRIPEDB_CONFIG="/dev/null")
    r = subprocess.run([BIN, "demo", "--dir", str(tmp_path), "--seconds", "10"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 1
    assert "holds files that are not a stripedb cluster's" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precious.txt"]
    r = subprocess.run([BIN, "demo", "--cdc", "pigeon"], capture_output=True, text=True,
                       timeout=60, env=env)
    assert r.returncode == 2
