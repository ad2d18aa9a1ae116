"""validate (issue #20): MongoDB's collection validation on a shard (every document and
every index entry checked in one read snapshot) and through a proxy (mongos' reply: each
shard's under raw, valid over all of them for a sharded collection); a damaged index is
found; MongoDB's option rules and errors."""
import json
import sqlite3
import subprocess

import pymongo
import pytest
from pymongo.errors import OperationFailure

from conftest import MONGOSH, NODE_CLIENTS_REQUIRED, node_clients_present, node_env
from proxy_helpers import ProxyCluster


@pytest.fixture
def cl(start_role, tmp_path):
    c = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    c.tmp_path = tmp_path
    yield c
    c.close()


def load(coll, n=300):
    coll.insert_many([{"_id": i, "a": i % 7, "tags": [i, i + 1]} for i in range(n)])
    coll.create_index("a")
    coll.create_index("tags")


def test_validate_on_a_shard(cl):
    db = cl.shard_client("shard-a").v
    load(db.c)
    r = db.command("validate", "c")
    assert r["ok"] == 1 and r["valid"] is True, r
    assert r["ns"] == "v.c"
    assert r["nrecords"] == 300
    assert r["nInvalidDocuments"] == 0
    assert r["nIndexes"] == 3
    # a multikey index holds one key per array element
    assert r["keysPerIndex"] == {"_id_": 300, "a_1": 300, "tags_1": 600}
    assert set(r["indexDetails"]) == {"_id_", "a_1", "tags_1"}
    assert r["errors"] == [] and r["warnings"] == [] and r["repaired"] is False
    assert db.command("validate", "c", full=True)["valid"] is True
    assert db.command("validate", "c", background=True)["valid"] is True
    m = db.command("validate", "c", metadata=True)
    assert m["valid"] is True and m["nIndexes"] == 3 and "nrecords" not in m


@pytest.mark.parametrize("opts,code", [
    ({"repair": True}, 20),
    ({"background": True, "full": True}, 72),
    ({"metadata": True, "full": True}, 72),
    ({"full": "yes", "background": 1}, 72),  # mongod reads the options by truth
    ({"scandata": True}, 40415),
])
def test_validate_options_refused(cl, opts, code):
    db = cl.shard_client("shard-a").v
    db.c.insert_one({"_id": 1})
    for target in (db, cl.proxy_client(0).v):
        with pytest.raises(OperationFailure) as e:
            target.command({"validate": "c", **opts})
        assert e.value.code == code, (opts, e.value.details)
    assert db.c.count_documents({}) == 1


def test_validate_missing_collection_and_view(cl):
    db = cl.shard_client("shard-a").v
    db.c.insert_one({"_id": 1})
    db.command("create", "w", viewOn="c", pipeline=[])
    for target in (db, cl.proxy_client(0).v):
        with pytest.raises(OperationFailure) as e:
            target.command("validate", "nope")
        assert e.value.code == 26
    with pytest.raises(OperationFailure) as e:
        db.command("validate", "w")
    assert e.value.code == 166


def test_a_damaged_index_is_found(cl):
    """Index entries deleted behind the engine's back (the shard stopped, its database
    file edited) make validate answer valid: false with the index named."""
    db = cl.shard_client("shard-a").v
    load(db.c, 50)
    assert db.command("validate", "c")["valid"] is True
    proc = cl.shard_procs["shard-a"]
    proc.stop()
    path = cl.tmp_path / "shard-a" / "shard.db"
    con = sqlite3.connect(str(path))
    tables = [r[0] for r in con.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'i\\_%' ESCAPE '\\'")]
    assert tables, "no index tables"
    # the table of index a_1 is the one with 50 rows and keys of 7 distinct values
    victim = next(t for t in tables
                  if con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] == 50)
    con.execute(f"DELETE FROM {victim} WHERE (k, id) IN (SELECT k, id FROM {victim} LIMIT 3)")
    con.commit()
    con.close()
    proc.restart()
    proc.wait_healthy()
    db = pymongo.MongoClient(f"mongodb://127.0.0.1:{cl.shard_ports['shard-a']}/",
                             directConnection=True).v
    r = db.command("validate", "c")
    assert r["valid"] is False, r
    assert r["errors"] and any("a_1" in e for e in r["errors"]), r["errors"]
    assert r["keysPerIndex"]["a_1"] == 47


def test_validate_through_a_proxy(cl):
    p = cl.proxy_client(0)
    load(p.u.c, 120)
    r = p.u.command("validate", "c")
    assert r["valid"] is True and r["nrecords"] == 120, r
    assert len(r["raw"]) == 1
    (shard, sub), = r["raw"].items()
    assert shard in cl.shard_ids and sub["nrecords"] == 120
    cl.shard_collection("s.c", {"k": 1}, split_points=[{"k": 100}])
    p.s.c.insert_many([{"_id": i, "k": i} for i in range(200)])
    r = p.s.command("validate", "c")
    assert r["valid"] is True, r
    assert sorted(r["raw"]) == sorted(cl.shard_ids)
    assert sum(s["nrecords"] for s in r["raw"].values()) == 200
    assert "nrecords" not in r  # mongos: a sharded collection answers valid and raw only
    # mongosh's db.coll.validate() (sends {validate, full: false}) through the proxy
    # (skipped, and said so, only when mongosh is absent and not required: conftest)
    if NODE_CLIENTS_REQUIRED or node_clients_present("mongosh"):
        script = ("const a = db.getSiblingDB('s').c.validate(); const b = db.getSiblingDB('u')"
                  ".c.validate({full: true}); print(JSON.stringify({a: a.valid, "
                  "shards: Object.keys(a.raw).sort(), b: b.valid, n: Number(b.nrecords)}))")
        r = subprocess.run([MONGOSH, f"mongodb://127.0.0.1:{cl.proxy_ports[0]}/", "--quiet",
                            "--norc", "--eval", script],
                           capture_output=True, text=True, timeout=120, env=node_env())
        assert r.returncode == 0, r.stdout + r.stderr
        assert json.loads(r.stdout.strip().splitlines()[-1]) == \
            {"a": True, "shards": sorted(cl.shard_ids), "b": True, "n": 120}
