"""MongoDB's CRUD unified spec files (../shared/compat/mongodb-crud-unified) in the three
places issue #20 asks for: against one shard (the only member of a replica set: the runner
sees topology "replicaset"), through a proxy to unsharded collections (2 shards), and
through a proxy to sharded collections (3 shards; the runner sees topology "sharded"). Every
role runs with --enable-test-commands (the failPoint operations). A test that passes against
the shard must pass through the proxy in both modes (no regression) unless the spec runs it
on a standalone or replica set only, and every skip gives its reason (test_crud_unified.py
checks the shard alone file by file: no failure there).

With STRIPEDB_CRUD_REPORT=PATH the per-file passed/failed/skipped of each place and the
skip reasons are written to PATH as Markdown (docs/compat-crud.md is made this way:
`STRIPEDB_CRUD_REPORT=$PWD/docs/compat-crud.md STRIPEDB_BIN=build/stripedb
/usr/bin/python3 -m pytest -q tests/integration/test_crud_report.py`).
"""
import collections
import os
import re

import pymongo
import pytest

import crud_unified
from conftest import start_one_member_set
from proxy_helpers import ProxyCluster

DIR = crud_unified.compat_dir()
FILES = sorted(f for f in os.listdir(DIR) if f.endswith(".json")) if DIR else []


def _namespaces_to_shard(files):
    """The collections the files use, to be sharded on a ranged _id, except two kinds that
    stay unsharded: a collection whose file creates a unique index that does not start with
    _id (such an index cannot be enforced by each shard alone: the proxy refuses it with 67,
    as MongoDB does), and the target of an $out ($out cannot write to a sharded collection:
    28769, as MongoDB; a driver's test runner does not shard it either)."""
    namespaces, unsharded = {}, set()
    for f in files:
        spec = crud_unified.load_file(os.path.join(DIR, f))
        dbs = {e["database"]["id"]: e["database"]["databaseName"]
               for e in spec.get("createEntities", []) if "database" in e}
        colls = {e["collection"]["id"]: f"{dbs[e['collection']['database']]}."
                 f"{e['collection']['collectionName']}"
                 for e in spec.get("createEntities", []) if "collection" in e}
        for ns in colls.values():
            namespaces[ns] = True
        for t in spec.get("tests", []):
            through_mongos = _may_run_sharded(spec.get("runOnRequirements")) and \
                _may_run_sharded(t.get("runOnRequirements"))
            for op in t.get("operations", []):
                args = op.get("arguments", {})
                obj = op.get("object")
                for st in args.get("pipeline", []) if op.get("name") == "aggregate" and \
                        through_mongos else []:
                    out = st.get("$out") if isinstance(st, dict) else None
                    db = dbs.get(obj) or (colls[obj].split(".", 1)[0] if obj in colls
                                          else None)
                    if isinstance(out, str) and db:
                        unsharded.add(f"{db}.{out}")
                    elif isinstance(out, dict) and "db" in out and "coll" in out:
                        unsharded.add(f"{out['db']}.{out['coll']}")
                if (op.get("name") == "createIndex" and args.get("unique") and
                        next(iter(args.get("keys", {"_id": 1}))) != "_id" and
                        op.get("object") in colls):
                    unsharded.add(colls[op["object"]])
    return [ns for ns in namespaces if ns not in unsharded]


def _may_run_sharded(reqs):
    """Whether runOnRequirements reqs let a test run on a sharded cluster (a mongos)."""
    return not reqs or any("sharded" in r.get("topologies", ["sharded"]) for r in reqs)


def _reset(uri):
    """Empty every collection a file may have left (documents, secondary indexes, views),
    keeping the sharding of the sharded place: each file starts as on a fresh server, as
    test_crud_unified.py gives it one."""
    c = pymongo.MongoClient(uri, serverSelectionTimeoutMS=10000)
    try:
        for name in c.list_database_names():
            if name in ("admin", "config", "local"):
                continue
            db = c[name]
            for info in db.list_collections():
                if info.get("type") == "view":
                    db.drop_collection(info["name"])
                    continue
                db[info["name"]].delete_many({})
                db[info["name"]].drop_indexes()
    finally:
        c.close()


TOPOLOGY_RE = re.compile(r"the spec runs it on topologies (\[.*?\]) only \(the server is a "
                         r"(.*?)\)")


def _topology_only(detail):
    """Whether a skip's reason is that the spec runs the test on other topologies only (in
    every one of the requirements' alternatives)."""
    return all(TOPOLOGY_RE.search(part) for part in (detail or "-").split("; "))


def _reason(detail):
    """A skip reason without the test's particulars (for the summary)."""
    m = re.match(r"refused by stripedb: (.*?) \(docs/compat.md\)", detail or "")
    if m:
        return f"refused by stripedb: {m.group(1)}"
    if detail and detail.startswith("needs server"):
        return "needs another server version than the 6.0 we advertise"
    if _topology_only(detail):
        m = TOPOLOGY_RE.search(detail)
        return f"the spec file runs it on {m.group(1)} only, not on a {m.group(2)}"
    return re.sub(r"'[^']*'", "'...'", detail or "")[:120]


@pytest.mark.skipif(not DIR, reason="spec files not found: set STRIPEDB_COMPAT_DIR or put "
                    "them in ../shared/compat/mongodb-crud-unified")
def test_crud_files_on_a_shard_and_through_a_proxy(start_role, tmp_path):
    # test commands on (the failPoint operations): the shard, and the proxies, whose own
    # fail point a useMultipleMongoses: false client sets (as on one mongos)
    test_cmds = ["--enable-test-commands"]
    _, port = start_one_member_set(start_role, tmp_path / "solo", extra=test_cmds)
    (tmp_path / "plain").mkdir()
    (tmp_path / "sharded").mkdir()
    plain = ProxyCluster(start_role, tmp_path / "plain", shards=2, proxies=1,
                         proxy_args=test_cmds)
    sharded = ProxyCluster(start_role, tmp_path / "sharded", shards=3, proxies=1,
                           proxy_args=test_cmds)
    try:
        for ns in _namespaces_to_shard(FILES):
            sharded.shard_collection(ns, {"_id": 1}, split_points=[{"_id": 2}, {"_id": 4}])
        places = [("shard", f"mongodb://127.0.0.1:{port}/?directConnection=true"),
                  ("proxy, unsharded", f"mongodb://127.0.0.1:{plain.proxy_ports[0]}/"),
                  ("proxy, sharded", f"mongodb://127.0.0.1:{sharded.proxy_ports[0]}/")]
        rows, regressions = [], []
        totals = {p: collections.Counter() for p, _ in places}
        reasons = {p: collections.Counter() for p, _ in places}
        for f in FILES:
            per = {}
            for place, uri in places:
                _reset(uri)
                _, results = crud_unified.run_file(uri, os.path.join(DIR, f))
                per[place] = results
                for desc, st, detail in results:
                    totals[place][st] += 1
                    if st == "skipped":
                        assert detail, f"{place}: skip without a reason: {f}: {desc}"
                        reasons[place][_reason(detail)] += 1
            ok_shard = {t for t, st, _ in per["shard"] if st == "passed"}
            for place, _ in places[1:]:
                for t, st, detail in per[place]:
                    # a test the spec runs on a standalone or replica set only is not run
                    # through a mongos: not a regression
                    if t in ok_shard and st != "passed" and not \
                            (st == "skipped" and _topology_only(detail)):
                        regressions.append(f"{place}: {f}: {t}: {detail}")
            rows.append((f, {p: collections.Counter(st for _, st, _ in per[p])
                             for p, _ in places}))
        for place, _ in places:
            print(f"{place}: {dict(totals[place])}")
        out = os.environ.get("STRIPEDB_CRUD_REPORT")
        if out:
            _write_report(out, places, rows, totals, reasons)
        assert regressions == [], "\n".join(regressions)
        assert totals["shard"]["passed"] > 0
    finally:
        plain.close()
        sharded.close()


def _cell(c):
    return f"{c['passed']} / {c['failed']} / {c['skipped']}"


def _write_report(path, places, rows, totals, reasons):
    lines = ["# CRUD unified spec files: passed / failed / skipped", "",
             "Made by tests/integration/test_crud_report.py (see its docstring) from "
             f"{len(rows)} files of ../shared/compat/mongodb-crud-unified. The shard is the "
             "only member of a replica set (topology \"replicaset\" for the runner, which "
             "learns it from hello as a driver does); through a proxy the topology is "
             "\"sharded\"; every role runs with --enable-test-commands, so the failPoint "
             "operations run. A skip is a test the runner does not run, with its reason "
             "below: a feature stripedb refuses (docs/compat.md's refusal table), a server "
             "version other than the MongoDB 6.0 stripedb advertises, or, through a proxy, a "
             "test the spec file runs on a standalone or replica set only (as a driver's "
             "test runner skips it on a mongos). A failure through a proxy of a test that "
             "passes on the shard fails the test file.", "",
             "| file | " + " | ".join(p for p, _ in places) + " |",
             "|---|" + "---:|" * len(places)]
    for f, per in rows:
        lines.append(f"| {f} | " + " | ".join(_cell(per[p]) for p, _ in places) + " |")
    lines.append("| **total** | " + " | ".join(f"**{_cell(totals[p])}**" for p, _ in places)
                 + " |")
    lines += ["", "## Skip reasons", "", "| reason | " + " | ".join(p for p, _ in places) +
              " |", "|---|" + "---:|" * len(places)]
    allr = set()
    for p, _ in places:
        allr |= set(reasons[p])
    for r in sorted(allr, key=lambda r: -reasons["shard"][r]):
        lines.append(f"| {r.replace('|', '/')} | " +
                     " | ".join(str(reasons[p][r]) for p, _ in places) + " |")
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")
