"""Shard replica sets seen by an operator (issue #15): every member's state, term, lag in
Raft entries and in milliseconds, and who is primary, in `ctl shard member status` /
`ctl shard list`, /metrics and /healthz?format=json (src/shard/repl_view.c,
src/shard/members.c, cli/shardset.c).

A member that is SIGSTOPped answers nothing: it must still show, as unreachable, with the
lag the primary sees growing; after SIGCONT it catches up and its lag returns to 0. A
removed member's per-member series leave /metrics.
"""
import json
import os
import signal
import subprocess
import threading

import pytest

from conftest import BIN, http_get, wait_until
from test_shard_members import _metrics, ctl, status
from test_shard_replset import primary_index, run_writers, start_set

CTL_FAST = ["--timeout-ms=1000"]


def ctl_status(uri):
    """`ctl --json shard member status` parsed, keyed by member id (rows without an id,
    i.e. a member the primary does not know, under their host)."""
    r = subprocess.run([BIN, "ctl", "--json", *CTL_FAST, "shard", "member", "status", uri],
                       capture_output=True, text=True, timeout=60,
                       env={k: v for k, v in os.environ.items() if k != "STRIPEDB_METADATA"})
    assert r.returncode in (0, 1), r.stderr
    doc = json.loads(r.stdout)
    return {m.get("id", m["host"]): m for m in doc["members"]}, r


def healthz(port):
    st, body = http_get(port, "/healthz?format=json")
    doc = json.loads(body)
    assert (st == 200) == (doc["status"] == "ok"), (st, doc)
    shard = next(c for c in doc["checks"] if c["name"] == "shard")
    return st, shard


def health_member(port, mid):
    st, shard = healthz(port)
    rs = shard["replicaSet"]
    return st, rs, next(m for m in rs["memberStatus"] if m["id"] == mid)


def metric(port, name, mid):
    return _metrics(port).get(f"{name}[('member', '{mid}')]")


@pytest.mark.parametrize("compaction", [False, True])
def test_stopped_secondary_shows_unreachable_with_growing_lag_then_recovers(start_role,
                                                                            tmp_path,
                                                                            compaction):
    # with compaction the entries the stopped member lacks leave the primary's in-memory
    # log: lagMillis then comes from the samples of the log's growth (repl_view.c), and
    # the member catches up from a snapshot
    extra = ["--raft-snapshot-threshold=32"] if compaction else []
    procs, wires, uri = start_set(start_role, tmp_path, extra=extra)
    pi = primary_index(wires)
    pid = pi + 1
    vi = (pi + 1) % 3
    vid = vi + 1
    ph = procs[pi].http_port

    # everyone caught up before the fault: lag 0 everywhere, one primary
    stop, acked, failed = threading.Event(), [], []
    writers = run_writers(uri, stop, acked, failed, n_threads=2)
    try:
        wait_until(lambda: len(acked) >= 20, 30, what="first acknowledged writes")
        rows, r = ctl_status(uri)
        assert r.returncode == 0, r.stderr
        assert [m["id"] for m in rows.values() if m["primary"]] == [pid]
        assert all(m["reachable"] and m["primarySees"] for m in rows.values()), rows
        assert all(m["lag"] >= 0 and m["lagMillis"] >= 0 for m in rows.values()), rows

        os.kill(procs[vi].p.pid, signal.SIGSTOP)
        try:
            # ctl: the stopped member does not answer, yet it is listed with the lag the
            # primary sees, and that lag grows while the writes go on
            first = {}

            def ctl_lagging():
                rows, _ = ctl_status(uri)
                m = rows.get(vid)
                if not m or m["reachable"] or m["state"] != "UNREACHABLE":
                    return False
                if m.get("primarySees") is not False or m["lag"] <= 0 or m["lagMillis"] <= 0:
                    return False
                first.setdefault("ctl", m)
                return (m["lag"] > first["ctl"]["lag"]
                        and m["lagMillis"] > first["ctl"]["lagMillis"]) and m
            m = wait_until(ctl_lagging, 60, interval=0.2, what="ctl: growing lag of the "
                           "stopped member")
            assert not m["primary"]
            rows, _ = ctl_status(uri)
            assert rows[pid]["primary"] and rows[pid]["state"] == "PRIMARY"
            assert rows[pid]["lag"] == 0 and rows[pid]["lagMillis"] == 0

            # /metrics of the primary: the same, per member
            def metrics_lagging():
                lag = metric(ph, "stripedb_shard_member_lag_entries", vid)
                ms = metric(ph, "stripedb_shard_member_lag_ms", vid)
                seen = metric(ph, "stripedb_shard_member_reachable", vid)
                if lag is None or ms is None or seen != 0 or lag <= 0 or ms <= 0:
                    return False
                first.setdefault("metrics", (lag, ms))
                return lag > first["metrics"][0] and ms > first["metrics"][1]
            wait_until(metrics_lagging, 30, interval=0.2, what="/metrics: growing lag")
            assert metric(ph, "stripedb_shard_member_reachable", pid) == 1
            assert metric(ph, "stripedb_shard_member_lag_entries", pid) == 0
            assert _metrics(ph)["stripedb_shard_raft_primary_id[]"] == pid

            # /healthz?format=json of the primary: 200 (the member is alive), with its
            # view of the set
            def health_lagging():
                st, rs, m = health_member(ph, vid)
                if st != 200 or rs["state"] != "PRIMARY" or rs["primaryId"] != pid:
                    return False
                if m["reachable"] or m["lagEntries"] <= 0 or m["lagMillis"] <= 0:
                    return False
                first.setdefault("health", m)
                return (m["lagEntries"] > first["health"]["lagEntries"]
                        and m["lagMillis"] > first["health"]["lagMillis"])
            wait_until(health_lagging, 30, interval=0.2, what="/healthz: growing lag")
            _, rs, me = health_member(ph, pid)
            assert me["primary"] and me["reachable"] and me["lagEntries"] == 0
            assert rs["primary"] == f"127.0.0.1:{wires[pi]}"
        finally:
            stop.set()
            for t in writers:
                t.join(30)
            os.kill(procs[vi].p.pid, signal.SIGCONT)
    finally:
        stop.set()

    # resumed: it catches up and every view returns to 0
    def all_zero():
        rows, r = ctl_status(uri)
        if r.returncode != 0 or not all(m["reachable"] for m in rows.values()):
            return False
        if any(m["lag"] != 0 or m["lagMillis"] != 0 or not m["primarySees"]
               for m in rows.values()):
            return False
        if (metric(ph, "stripedb_shard_member_lag_entries", vid) != 0
                or metric(ph, "stripedb_shard_member_lag_ms", vid) != 0
                or metric(ph, "stripedb_shard_member_reachable", vid) != 1):
            return False
        _, _, m = health_member(ph, vid)
        return m["reachable"] and m["lagEntries"] == 0 and m["lagMillis"] == 0
    wait_until(all_zero, 60, interval=0.2, what="lag back to 0 after SIGCONT")
    # the resumed member holds every acknowledged write
    assert len(acked) > 20
    assert status(wires[vi])["applied"] == status(wires[pi])["applied"]

    # a secondary's /healthz names the primary but leaves lag to it; its /metrics has no
    # per-member series
    # (a member resumed after its election timer ran out is a pre-vote candidate for a
    # moment: pre-vote keeps the primary, the member turns follower at its next heartbeat)
    def secondary_view():
        _, rs, m = health_member(procs[vi].http_port, pid)
        return rs["state"] == "SECONDARY" and (rs, m)
    rs, m = wait_until(secondary_view, 20, interval=0.1, what="the resumed member a secondary")
    assert rs["primaryId"] == pid and m["primary"]
    assert "lagEntries" not in m
    assert metric(procs[vi].http_port, "stripedb_shard_member_lag_entries", vid) is None


def test_removed_member_leaves_the_primarys_metrics_and_views(start_role, tmp_path):
    procs, wires, uri = start_set(start_role, tmp_path)
    pi = primary_index(wires)
    ph = procs[pi].http_port
    victim = next(i for i in range(3) if i != pi) + 1
    wait_until(lambda: all(metric(ph, "stripedb_shard_member_lag_entries", i) is not None
                           for i in (1, 2, 3)), 10, interval=0.1,
               what="the primary's per-member series")
    r = ctl("shard", "member", "remove", uri, str(victim))
    assert r.returncode == 0, r.stderr

    def gone():
        m = _metrics(ph)
        names = ("stripedb_shard_member_lag_entries", "stripedb_shard_member_lag_ms",
                 "stripedb_shard_member_reachable")
        return (all(f"{n}[('member', '{victim}')]" not in m for n in names)
                and all(f"{n}[('member', '{i}')]" in m for n in names
                        for i in (1, 2, 3) if i != victim))
    wait_until(gone, 10, interval=0.1, what="the removed member's series gone")
    wait_until(lambda: victim not in [m["id"] for m in
                                      healthz(ph)[1]["replicaSet"]["memberStatus"]],
               10, interval=0.1, what="the removed member gone from /healthz")
    assert victim not in [m["id"] for m in status(wires[pi])["memberStatus"]]
