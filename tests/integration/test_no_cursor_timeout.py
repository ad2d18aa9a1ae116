"""find's noCursorTimeout (issue #20: accepted means honoured; MongoDB keeps such a cursor
until it is exhausted or killed). With --cursor-timeout-ms short, an idle ordinary cursor is
reaped (43 CursorNotFound) while an older, equally idle noCursorTimeout cursor still answers
getMore: on a shard, and through a proxy whose shards also reap quickly (the proxy forwards
the flag, so the shards' cursors under its cursor stay too). Before this both roles reaped
every idle cursor whatever the flag."""
import pymongo
import pytest
from pymongo.errors import OperationFailure

from conftest import free_port, wait_until
from proxy_helpers import ProxyCluster

N = 400


def _open(db, coll, no_timeout):
    cmd = {"find": coll, "filter": {}, "sort": {"k": 1}, "batchSize": 2}
    if no_timeout:
        cmd["noCursorTimeout"] = True
    r = db.command(cmd)
    assert r["cursor"]["id"] != 0
    return r["cursor"]["id"], [d["k"] for d in r["cursor"]["firstBatch"]]


def _reaped(db, coll, probes):
    """Kill the probe opened at the previous poll (idle since then, longer than the timeout
    given the poll interval) and open a new one: true once a probe was already gone."""
    gone = False
    if probes:
        r = db.command({"killCursors": coll, "cursors": [probes.pop()]})
        gone = r["cursorsNotFound"] != []
    probes.append(_open(db, coll, False)[0])
    return gone


def _drain(db, coll, cid, seen):
    while cid != 0:
        r = db.command({"getMore": cid, "collection": coll, "batchSize": 50})
        seen += [d["k"] for d in r["cursor"]["nextBatch"]]
        cid = r["cursor"]["id"]
    return seen


def test_shard_keeps_a_no_timeout_cursor(start_role, tmp_path):
    port = free_port()
    d = tmp_path / "shard"
    d.mkdir()
    start_role(["--role=shard", f"--listen=127.0.0.1:{port}", f"--data-dir={d}",
                "--cursor-timeout-ms=300"])
    client = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true")
    db = client.nct
    db.c.insert_many([{"_id": i, "k": i} for i in range(N)])
    keep, first = _open(db, "c", True)
    plain, _ = _open(db, "c", False)
    probes = []
    # the idle ordinary cursors are reaped (the first probe, opened after `keep`, is gone)
    wait_until(lambda: _reaped(db, "c", probes), 20, interval=1.0,
               what="an idle cursor to be reaped")
    with pytest.raises(OperationFailure) as e:
        db.command({"getMore": plain, "collection": "c"})
    assert e.value.code == 43
    # the older noCursorTimeout cursor is still there and reads to the end
    assert _drain(db, "c", keep, first) == list(range(N))
    client.close()


def test_proxy_keeps_a_no_timeout_cursor(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1,
                      proxy_args=["--cursor-timeout-ms=300"],
                      shard_args=["--cursor-timeout-ms=300"])
    try:
        cl.shard_collection("nct.c", {"k": 1}, split_points=[{"k": N // 2}],
                            shards=["shard-a", "shard-b"])
        db = cl.proxy_client(0).nct
        db.c.insert_many([{"_id": i, "k": i} for i in range(N)])
        keep, first = _open(db, "c", True)
        plain, _ = _open(db, "c", False)
        assert cl.metric(0, "stripedb_proxy_cursors_open") == 2
        # the ordinary cursor is reaped (watching /metrics does not touch it)
        wait_until(lambda: cl.metric(0, "stripedb_proxy_cursors_open") == 1, 20,
                   what="the idle cursor to be killed")
        with pytest.raises(OperationFailure) as e:
            db.command({"getMore": plain, "collection": "c"})
        assert e.value.code == 43
        # and the shards' cursors of an ordinary proxy cursor are reaped by the shards
        # too: a probe opened straight on a shard disappears
        sdb = pymongo.MongoClient(
            f"mongodb://127.0.0.1:{cl.shard_ports['shard-b']}/?directConnection=true").nct
        probes = []
        wait_until(lambda: _reaped(sdb, "c", probes), 20, interval=1.0,
                   what="an idle shard cursor to be reaped")
        # the noCursorTimeout cursor, older, reads every document from both shards
        assert _drain(db, "c", keep, first) == list(range(N))
    finally:
        cl.close()
