"""Issue #20 as a mongosh user meets it: semantics_mongosh.js runs one section per bullet of
the issue (collation, validators, TTL indexes, views, strict parsing, write concerns,
pipeline updates, $expr/let, $lookup, $graphLookup, $facet/$bucket/$bucketAuto/$sortByCount,
$unionWith, $documents, $out/$merge, change streams, text search, $collStats / validate /
renameCollection / currentOp) against a shard, through a proxy to unsharded collections and
through a proxy to sharded ones, with the expected values; a feature not built must be
refused with its code from docs/compat.md's table, never accepted and ignored."""
import json
import subprocess

import pymongo
import pytest

from conftest import MONGOSH, needs_node_client, node_env
from proxy_helpers import ProxyCluster


def run_script(port, mode):
    here = __file__.rsplit("/", 1)[0]
    r = subprocess.run([MONGOSH, f"mongodb://127.0.0.1:{port}/?directConnection=true",
                        "--quiet", "--norc", "--eval", f"const MODE = {json.dumps(mode)};",
                        f"{here}/semantics_mongosh.js"],
                       capture_output=True, text=True, timeout=300, env=node_env())
    assert r.returncode == 0, r.stdout + r.stderr
    results = json.loads(r.stdout.strip().splitlines()[-1])
    failed = {k: v for k, v in results.items() if v != "ok"}
    assert not failed, failed
    assert len(results) == 17, sorted(results)


@needs_node_client("mongosh")
def test_semantics_on_a_shard(shard):
    _, port = shard
    run_script(port, "shard")


@needs_node_client("mongosh")
def test_semantics_through_a_proxy(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    try:
        run_script(cl.proxy_ports[0], "proxy-unsharded")
        c = pymongo.MongoClient(f"mongodb://127.0.0.1:{cl.proxy_ports[0]}/?directConnection=true")
        try:
            c.drop_database("sem")
        finally:
            c.close()
        cl.shard_collection("sem.c", {"k": 1}, split_points=[{"k": 50}])
        cl.shard_collection("sem.f", {"k": 1}, split_points=[{"k": 50}])
        run_script(cl.proxy_ports[0], "proxy-sharded")
        # the documents really are on both shards
        for sid in cl.shard_ids:
            s = cl.shard_client(sid)
            assert s.sem.c.count_documents({}) == 2, sid
    finally:
        cl.close()
