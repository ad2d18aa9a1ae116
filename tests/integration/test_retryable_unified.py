"""MongoDB's unified-format retryable-writes spec tests (issue #16) against (a) a shard, a
one-member replica set (MongoDB has retryable writes on replica sets and mongos only) and
(b) a proxy in front of two shards, both started with --enable-test-commands so that the
failPoint operations (configureFailPoint failCommand) run. retryable_unified.py plays the
driver (sessions, txnNumber, one retry, command monitoring for expectEvents).

Every file of the data set is run on both; each file's passed/failed/skipped counts are
printed (visible with -s or on failure) and the test fails on any failed spec test or a
skip without a reason. One test per target keeps the cluster start-up to one each.
"""
import os
import re

import pytest
from bson.son import SON
from pymongo.errors import OperationFailure

import crud_unified
import retryable_unified
from conftest import free_port, wait_until
from proxy_helpers import ProxyCluster

DIR = retryable_unified.compat_dir()
FILES = sorted(f for f in os.listdir(DIR) if f.endswith(".json")) if DIR else []
pytestmark = pytest.mark.skipif(
    not DIR, reason="spec files not found: set STRIPEDB_COMPAT_DIR or put them in "
    "../shared/compat/mongodb-retryable-writes-unified")


def run_all(uri):
    """Run every file against uri; return (per-file counts, report text, failures)."""
    report, failures, per_file = [], [], {}
    for name in FILES:
        fname, results = retryable_unified.run_file(uri, os.path.join(DIR, name))
        counts, text = crud_unified.summarize(fname, results)
        per_file[fname] = counts
        report.append(text)
        for d, st, detail in results:
            if st == "failed":
                failures.append(f"{fname}: {d}: {detail}")
            if st == "skipped" and not detail:
                failures.append(f"{fname}: {d}: skipped without a reason")
    total = {k: sum(c[k] for c in per_file.values()) for k in ("passed", "failed", "skipped")}
    report.append(f"TOTAL: {total['passed']} passed, {total['failed']} failed, "
                  f"{total['skipped']} skipped")
    return per_file, "\n".join(report), failures


def test_retryable_unified_against_a_shard(start_role, tmp_path):
    wire, raft = free_port(), free_port()
    data = tmp_path / "shard"
    data.mkdir()
    start_role(["--role=shard", "--replica-set=rs-spec", "--node-id=1",
                f"--listen=127.0.0.1:{wire}", f"--data-dir={data}",
                f"--raft-listen=127.0.0.1:{raft}", f"--bootstrap-members=1@127.0.0.1:{raft}",
                "--raft-tls=disabled", "--raft-election-timeout-ms=300",
                "--enable-test-commands"])
    uri = f"mongodb://127.0.0.1:{wire}/?directConnection=true"

    def primary():
        import pymongo
        with pymongo.MongoClient(uri, serverSelectionTimeoutMS=2000) as c:
            return c.admin.command("hello").get("isWritablePrimary")
    wait_until(primary, 30, interval=0.1, what="the one-member set to elect its primary")
    per_file, text, failures = run_all(uri)
    print(text)
    assert failures == [], text
    assert sum(c["passed"] for c in per_file.values()) > 0, text


def test_retryable_unified_against_a_proxy(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1,
                      proxy_args=["--enable-test-commands"])
    try:
        cl.create_database("retryable-writes-tests")
        uri = f"mongodb://127.0.0.1:{cl.proxy_ports[0]}/?directConnection=true"
        per_file, text, failures = run_all(uri)
        print(text)
        assert failures == [], text
        assert sum(c["passed"] for c in per_file.values()) > 0, text
        # the proxy's fail point is its own (not the shards'); blockConnection waits on a
        # timer, then fails the command with errorCode
        c = cl.proxy_client(0)
        c.admin.command(SON([("configureFailPoint", "failCommand"), ("mode", {"times": 1}),
                             ("data", {"failCommands": ["find"], "blockConnection": True,
                                       "blockTimeMS": 100, "errorCode": 96})]))
        with pytest.raises(OperationFailure) as e:
            c.t.c.find_one({})
        assert e.value.code == 96
        c.t.c.find_one({})  # {times: 1}: spent
        # onPrimaryTransactionalWrite is a mongod fail point: a proxy (mongos) refuses it
        with pytest.raises(OperationFailure) as e:
            c.admin.command(SON([("configureFailPoint", "onPrimaryTransactionalWrite"),
                                 ("mode", "alwaysOn")]))
        assert e.value.code == 2
        # without --enable-test-commands a proxy refuses configureFailPoint
        port = cl.add_proxy()
        with pytest.raises(OperationFailure) as e:
            cl._client(port).admin.command(SON([("configureFailPoint", "failCommand"),
                                                ("mode", "off")]))
        assert e.value.code == 59 and "--enable-test-commands" in str(e.value)
    finally:
        cl.close()


def test_retryable_unified_files_present():
    """Every file of the data set is run: as many as shared/compat/README.md's table says."""
    with open(os.path.join(os.path.dirname(DIR), "README.md")) as f:
        m = re.search(r"^\| mongodb-retryable-writes-unified/ \|.*\| (\d+) files \|$",
                      f.read(), re.M)
    assert m, "shared/compat/README.md names no count for mongodb-retryable-writes-unified"
    assert len(FILES) == int(m.group(1))
