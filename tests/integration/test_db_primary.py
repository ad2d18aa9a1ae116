"""A primary shard per database, as MongoDB has (issue #18): a database records the shard
its unsharded collections live on (enableSharding primaryShard through a proxy, `stripedb
ctl db create --primary`), proxies route them there, config.databases / sh.status() / `ctl
db list` show it, and removeShard refuses a shard only while it is the primary of a
database that still holds unsharded collections on it. Real processes: one metadata
member, three shards, two proxies on loopback."""
import json
import subprocess

import pytest
from pymongo.errors import OperationFailure

from conftest import MONGOSH, needs_node_client, node_env, wait_until
from proxy_helpers import ProxyCluster
from test_proxy_sharding import cluster_error, ctl, fails, ok, usage_error


@pytest.fixture
def cluster(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=3, proxies=2)
    yield cl
    cl.close()


def meta_primaries(cl):
    return {d["name"]: d.get("primary") for d in cl.meta_query({"listDatabases": 1})["databases"]}


def config_primaries(p):
    return {d["_id"]: d["primary"] for d in p.config.databases.find()}


def on_shards(cl, db, coll):
    """How many documents of db.coll each shard holds, read from the shards directly."""
    return {s: cl.shard_client(s)[db][coll].count_documents({}) for s in cl.shard_ids}


def test_databases_have_their_own_primary_shard(cluster):
    cl = cluster
    p0, p1 = cl.proxy_client(0), cl.proxy_client(1)
    admin = p0.admin
    # through a proxy, MongoDB's field; through ctl, --primary
    assert admin.command("enableSharding", "pb", primaryShard="shard-b")["ok"] == 1
    assert admin.command("enableSharding", "pb", primaryShard="shard-b")["ok"] == 1  # same
    fails(lambda: admin.command("enableSharding", "pb", primaryShard="shard-c"), 48,
          ["already exists with primary shard shard-b"])
    fails(lambda: admin.command("enableSharding", "px", primaryShard="nosuch"), 70,
          ["nosuch"])
    fails(lambda: admin.command("enableSharding", "px", primaryShard=3), 2)
    out = ok(ctl(cl, "db", "create", "pc", "--primary", "shard-c"))
    assert out.strip() == "database pc created (primary shard shard-c)"
    ok(ctl(cl, "db", "create", "pd"))  # no --primary: the lowest shard id
    m = meta_primaries(cl)
    assert m["pb"] == "shard-b" and m["pc"] == "shard-c" and m["pd"] == "shard-a"
    assert "px" not in m

    # both proxies see the primaries (a read of config.databases reloads them at once)
    for p in (p0, p1):
        cp = config_primaries(p)
        assert cp["pb"] == "shard-b" and cp["pc"] == "shard-c" and cp["pd"] == "shard-a"

    # unsharded inserts land on each database's primary, through either proxy
    acked = {}
    for i, db in enumerate(["pb", "pc", "pd", "unknowndb"]):
        for k, p in enumerate((p0, p1)):
            ids = list(range(k * 10, k * 10 + 10))
            p[db].u.insert_many([{"_id": x, "db": db} for x in ids])
            acked.setdefault(db, []).extend(ids)
    expect = {"pb": "shard-b", "pc": "shard-c", "pd": "shard-a", "unknowndb": "shard-a"}
    for db, shard in expect.items():
        counts = on_shards(cl, db, "u")
        assert counts == {s: (20 if s == shard else 0) for s in cl.shard_ids}, (db, counts)
        for p in (p0, p1):
            assert sorted(d["_id"] for d in p[db].u.find()) == sorted(acked[db])
            assert p[db].u.count_documents({}) == 20
            assert p[db].u.find_one({"_id": 3})["db"] == db
    # database-level commands go to the database's primary too
    assert "u" in p0.pb.list_collection_names()
    assert p1.pc.command("dbStats")["objects"] == 20
    # a sharded collection of such a database is routed by its chunks, not its primary
    admin.command("shardCollection", "pb.s", key={"_id": "hashed"}, numInitialChunks=3)
    p0.pb.s.insert_many([{"_id": x} for x in range(60)])
    assert sum(on_shards(cl, "pb", "s").values()) == 60
    assert all(n > 0 for n in on_shards(cl, "pb", "s").values())

    # a database already holding documents on the default primary keeps it: moving the
    # primary would hide them
    p0.early.c.insert_one({"_id": 1})
    fails(lambda: admin.command("enableSharding", "early", primaryShard="shard-b"), 20,
          ["already holds 1 documents on shard shard-a", "movePrimary"])
    assert "early" not in meta_primaries(cl)
    assert admin.command("enableSharding", "early", primaryShard="shard-a")["ok"] == 1
    assert p0.early.c.find_one({"_id": 1}) == {"_id": 1}

    # a database created on metadata a moment ago: the first command through a proxy that
    # never saw it already follows its primary (looked up at once)
    ok(ctl(cl, "db", "create", "fresh", "--primary", "shard-c"))
    p1.fresh.c.insert_many([{"_id": x} for x in range(5)])
    assert on_shards(cl, "fresh", "c") == {"shard-a": 0, "shard-b": 0, "shard-c": 5}
    assert sorted(d["_id"] for d in p1.fresh.c.find()) == list(range(5))

    # movePrimary is refused clearly
    fails(lambda: admin.command("movePrimary", "pb", to="shard-a"), 115, ["movePrimary"])


def test_ctl_db_create_primary_bad_input_and_list(cluster):
    cl = cluster
    cluster_error(ctl(cl, "db", "create", "q1", "--primary", "nosuch"), "nosuch")
    usage_error(ctl(cl, "db", "create", "q1", "--primary"), "usage")
    usage_error(ctl(cl, "db", "create", "q1", "--primary="), "usage")
    usage_error(ctl(cl, "db", "create", "q1", "--primary", "--tenant"), "usage")
    assert "q1" not in meta_primaries(cl)
    ok(ctl(cl, "db", "create", "q1", "--primary=shard-b"))
    rows = [json.loads(x) for x in ok(ctl(cl, "--json", "db", "list")).splitlines()]
    assert {"name": "q1", "primary": "shard-b"} in rows, rows
    lines = ok(ctl(cl, "db", "list")).splitlines()
    assert lines[0].split() == ["DATABASE", "TENANT", "PRIMARY"]
    assert ["q1", "-", "shard-b"] in [ln.split() for ln in lines[1:]]


def test_remove_shard_refused_while_primary_of_unsharded_collections(cluster):
    cl = cluster
    p = cl.proxy_client(0)
    admin = p.admin
    admin.command("enableSharding", "rb", primaryShard="shard-b")
    admin.command("enableSharding", "rb2", primaryShard="shard-b")
    p.rb.keep.insert_one({"_id": 1})
    p.rb.other.insert_one({"_id": 1})
    d = fails(lambda: admin.command("removeShard", "shard-b"), 20,
              ["rb.keep", "rb.other", "movePrimary"])
    assert "rb2" not in d["errmsg"]  # empty databases are no obstacle
    # shard-a is the default primary: an unsharded collection of an unknown database
    p.plain.c.insert_one({"_id": 1})
    fails(lambda: admin.command("removeShard", "shard-a"), 20, ["plain.c", "movePrimary"])
    # a sharded collection on shard-b is drained, not an obstacle of this kind
    p.rb.keep.drop()
    p.rb.other.drop()
    assert cl.shard_client("shard-b").rb.list_collection_names() == []
    r = admin.command("removeShard", "shard-b")
    assert r["state"] == "completed", r
    # metadata moved the databases whose primary it was to the lowest remaining id
    m = meta_primaries(cl)
    assert m["rb"] == "shard-a" and m["rb2"] == "shard-a"
    assert config_primaries(p)["rb"] == "shard-a"
    p.rb.after.insert_one({"_id": 1})
    assert cl.shard_client("shard-a").rb.after.count_documents({}) == 1


MONGOSH_PRIMARIES = r"""
const st = sh.status();
print(JSON.stringify(st.value.databases.map(d => [d.database._id, d.database.primary])));
"""


@needs_node_client("mongosh")
def test_mongosh_sh_status_shows_primaries(cluster):
    cl = cluster
    cl.proxy_client(0).admin.command("enableSharding", "mb", primaryShard="shard-b")
    ok(ctl(cl, "db", "create", "mc", "--primary", "shard-c"))
    uri = f"mongodb://127.0.0.1:{cl.proxy_ports[0]}/?directConnection=true"
    r = subprocess.run([MONGOSH, uri, "--quiet", "--norc", "--eval", MONGOSH_PRIMARIES],
                       capture_output=True, text=True, timeout=120, env=node_env())
    assert r.returncode == 0, r.stdout + r.stderr
    got = dict(json.loads(r.stdout.strip().splitlines()[-1]))
    assert got["mb"] == "shard-b" and got["mc"] == "shard-c", got
    for db, primary in meta_primaries(cl).items():
        assert got[db] == primary, (db, got)
