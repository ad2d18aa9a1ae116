"""The embedded shard through the Node.js `mongodb` driver and mongosh (issue #4 smoke set).

The Node.js run executes a smoke set of the unified CRUD spec files through the driver's own
CRUD API (crud_unified_node.js); mongosh runs a short CRUD script. Both need
tests/integration/node_modules (`scripts/install-deps.sh --test`; CI does it).
"""
import json
import os
import subprocess

import pytest

import crud_unified
from conftest import MONGOSH, needs_node_client, node_env

HERE = os.path.dirname(os.path.abspath(__file__))
DIR = crud_unified.compat_dir()
SMOKE = ["insertOne.json", "insertMany.json", "updateOne.json", "updateMany.json",
         "replaceOne.json", "deleteOne.json", "deleteMany.json", "find.json", "findOne.json",
         "distinct.json", "aggregate.json", "bulkWrite.json", "estimatedDocumentCount.json"]


@needs_node_client("mongodb")
@pytest.mark.skipif(not DIR, reason="CRUD spec files not found")
def test_node_driver_crud_smoke(shard):
    _, port = shard
    uri = f"mongodb://127.0.0.1:{port}/?directConnection=true"
    files = [os.path.join(DIR, f) for f in SMOKE]
    r = subprocess.run(["node", os.path.join(HERE, "crud_unified_node.js"), uri] + files,
                       capture_output=True, text=True, timeout=120, cwd=HERE,
                       env=node_env())
    assert r.returncode == 0, r.stderr
    results = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert [x["file"] for x in results] == SMOKE
    for x in results:
        print(f"{x['file']}: {x['passed']} passed, {x['failed']} failed, {x['skipped']} skipped")
        assert x["failures"] == [], x
        assert x["passed"] > 0, x
        assert all(": " in s for s in x["skips"])  # every skip states its reason
    assert sum(x["passed"] for x in results) == 50


MONGOSH_SCRIPT = r"""
const d = db.getSiblingDB('shsmoke');
d.c.insertMany([{_id: 1, a: 5, t: 'x'}, {_id: 2, a: 7, t: 'y'}, {_id: 3, a: 9, t: 'x'}]);
d.c.createIndex({a: 1});
d.c.updateOne({_id: 2}, {$inc: {a: 1}, $set: {u: true}});
d.c.deleteOne({_id: 3});
const found = d.c.find({a: {$gte: 5}}, {_id: 1, a: 1}).sort({a: -1}).toArray();
const cnt = d.c.countDocuments({t: 'x'});
const agg = d.c.aggregate([{$group: {_id: '$t', n: {$sum: 1}}}, {$sort: {_id: 1}}]).toArray();
const plan = d.c.find({a: 8}).explain('executionStats');
print(JSON.stringify({found, cnt, agg, stage: plan.queryPlanner.winningPlan.stage,
  index: plan.queryPlanner.winningPlan.indexName, docs: plan.executionStats.totalDocsExamined}));
"""


@needs_node_client("mongosh")
def test_mongosh_crud_smoke(shard):
    _, port = shard
    uri = f"mongodb://127.0.0.1:{port}/?directConnection=true"
    r = subprocess.run([MONGOSH, uri, "--quiet", "--norc", "--eval", MONGOSH_SCRIPT],
                       capture_output=True, text=True, timeout=120, cwd=HERE,
                       env=node_env())
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out == {"found": [{"_id": 2, "a": 8}, {"_id": 1, "a": 5}], "cnt": 1,
                   "agg": [{"_id": "x", "n": 1}, {"_id": "y", "n": 1}],
                   "stage": "IXSCAN", "index": "a_1", "docs": 1}
