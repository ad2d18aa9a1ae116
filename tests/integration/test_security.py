"""Security of the proxy (issue #10): SCRAM-SHA-256 authentication with pymongo and the
Node.js driver, tenant isolation through every command the proxy registers, the
unauthenticated command set, the fixed failure delay, and the brute-force limit.

Setup: one metadata member, one embedded shard, one proxy with --auth=enabled. Tenants A
(user alice, database adb) and B (user bob, database bdb).
"""
import json
import os
import subprocess
import time

import pymongo
import pytest
from bson.int64 import Int64
from pymongo.errors import OperationFailure

from conftest import free_port, http_get, needs_node_client, node_env, wait_until
from proxy_helpers import ProxyCluster
from test_ratelimit_grpc import pb  # noqa: F401 - the stubs fixture

HERE = os.path.dirname(os.path.abspath(__file__))
FAIL_DELAY_S = 0.2      # AUTH_GATE_FAIL_DELAY_MS
FAILURE_LIMIT = 4       # --auth-failure-limit

# Every command the proxy registers (src/proxy/exec.c proxy_exec_register), each aimed at
# tenant B's database, plus server-side JavaScript that the proxy refuses anyway.
def b_commands(db="bdb"):
    return [
        ("find", {"find": "c"}),
        ("getMore", {"getMore": Int64(1), "collection": "c"}),
        ("killCursors", {"killCursors": "c", "cursors": [Int64(1)]}),
        ("insert", {"insert": "c", "documents": [{"_id": "evil"}]}),
        ("update", {"update": "c", "updates": [{"q": {}, "u": {"$set": {"x": 666}}, "multi": True}]}),
        ("delete", {"delete": "c", "deletes": [{"q": {}, "limit": 0}]}),
        ("findAndModify", {"findAndModify": "c", "query": {}, "update": {"$set": {"x": 666}}}),
        ("findandmodify", {"findandmodify": "c", "query": {}, "remove": True}),
        ("count", {"count": "c"}),
        ("distinct", {"distinct": "c", "key": "x"}),
        ("aggregate", {"aggregate": "c", "pipeline": [], "cursor": {}}),
        ("createIndexes", {"createIndexes": "c", "indexes": [{"key": {"x": 1}, "name": "x_1"}]}),
        ("dropIndexes", {"dropIndexes": "c", "index": "*"}),
        ("drop", {"drop": "c"}),
        ("create", {"create": "c2"}),
        ("collMod", {"collMod": "c"}),
        ("dropDatabase", {"dropDatabase": 1}),
        ("listIndexes", {"listIndexes": "c"}),
        ("listCollections", {"listCollections": 1}),
        ("explain", {"explain": {"find": "c"}}),
        ("dbStats", {"dbStats": 1}),
        ("collStats", {"collStats": "c"}),
        ("mapReduce", {"mapReduce": "c", "map": "function(){}", "reduce": "function(){}",
                       "out": {"inline": 1}}),
    ]


# Routes to tenant B's data from tenant A's own database.
def cross_db_commands():
    return [
        ("aggregate", {"aggregate": "c", "cursor": {}, "pipeline": [
            {"$lookup": {"from": {"db": "bdb", "coll": "c"}, "localField": "x",
                         "foreignField": "x", "as": "j"}}]}),
        ("aggregate", {"aggregate": "c", "cursor": {}, "pipeline": [
            {"$unionWith": {"coll": "c", "pipeline": [
                {"$lookup": {"from": {"db": "bdb", "coll": "c"}, "pipeline": [], "as": "j"}}]}}]}),
        ("aggregate", {"aggregate": "c", "cursor": {}, "pipeline": [
            {"$facet": {"f": [{"$graphLookup": {"from": {"db": "bdb", "coll": "c"},
                                                "startWith": "$x", "connectFromField": "x",
                                                "connectToField": "x", "as": "g"}}]}}]}),
        ("aggregate", {"aggregate": "c", "cursor": {}, "pipeline": [
            {"$out": {"db": "bdb", "coll": "c"}}]}),
        ("aggregate", {"aggregate": "c", "cursor": {}, "pipeline": [
            {"$merge": {"into": {"db": "bdb", "coll": "c"}}}]}),
        ("aggregate", {"aggregate": 1, "cursor": {}, "pipeline": [{"$currentOp": {}}]}),
        ("create", {"create": "v", "viewOn": "c", "pipeline": [
            {"$lookup": {"from": {"db": "bdb", "coll": "c"}, "pipeline": [], "as": "j"}}]}),
        ("explain", {"explain": {"aggregate": "c", "cursor": {}, "pipeline": [
            {"$lookup": {"from": {"db": "bdb", "coll": "c"}, "pipeline": [], "as": "j"}}]}}),
        ("explain", {"explain": {"explain": {"find": "c"}}}),
    ]


@pytest.fixture
def sec(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=1, proxies=1,
                      proxy_args=["--auth=enabled", f"--auth-failure-limit={FAILURE_LIMIT}"])
    for t, db, user, pw in (("A", "adb", "alice", "alice-pw"), ("B", "bdb", "bob", "bob-pw")):
        cl.meta_cmd({"createTenant": t})
        cl.create_database(db, tenant=t)
        cl.meta_cmd({"createUser": user, "tenant": t, "password": pw})
    # the proxy re-reads tenants once a second: wait until bob may write his database
    bob = cl.proxy_client(0, username="bob", password="bob-pw", authSource="admin")
    wait_until(lambda: bob.bdb.c.insert_many([{"_id": i, "x": i} for i in range(5)]),
               20, what="bob's first write")
    yield cl
    cl.close()


def audit_counts(cl):
    st, body = http_get(cl.proxy_procs[0].http_port, "/metrics")
    assert st == 200
    out = {}
    for line in body.decode().splitlines():
        if line.startswith('stripedb_auth_audit_events_total{event="'):
            out[line.split('"')[1]] = int(float(line.split()[-1]))
    return out


def client(cl, user, pw, **kw):
    return cl.proxy_client(0, username=user, password=pw, authSource="admin", **kw)


def test_pymongo_correct_password_works_wrong_fails_with_18_after_fixed_delay(sec):
    alice = client(sec, "alice", "alice-pw")
    alice.adb.c.insert_one({"_id": 1, "who": "alice"})
    assert list(alice.adb.c.find({}, {"_id": 0})) == [{"who": "alice"}]
    assert alice.admin.command("connectionStatus")["authInfo"]["authenticatedUsers"] == \
        [{"user": "alice", "db": "admin"}]
    for user, pw in (("alice", "wrong"), ("nobody", "alice-pw")):
        bad = client(sec, user, pw)
        t0 = time.monotonic()
        with pytest.raises(OperationFailure) as ei:
            bad.adb.c.find_one()
        elapsed = time.monotonic() - t0
        assert ei.value.code == 18
        assert ei.value.details["errmsg"] == "Authentication failed."
        assert elapsed >= FAIL_DELAY_S


def test_pymongo_scram_sha1_correct_and_wrong_password(sec):
    """SCRAM-SHA-1 (older drivers): the leader stored a SHA-1 verifier over MongoDB's
    password digest next to the SHA-256 one at createUser."""
    u = sec.meta_query({"getUser": "alice"})["user"]
    assert u["mechanisms"] == ["SCRAM-SHA-1", "SCRAM-SHA-256"]
    assert (len(u["scramSha1"]["salt"]), u["scramSha1"]["iterations"]) == (16, 10000)
    spec0 = sec.metric(0, "stripedb_auth_speculative_total")
    alice = client(sec, "alice", "alice-pw", authMechanism="SCRAM-SHA-1")
    alice.adb.c.insert_one({"_id": "sha1"})
    assert alice.adb.c.find_one({"_id": "sha1"}) == {"_id": "sha1"}
    # twice more: these conversations start in hello (speculative) from the verifier the
    # first saslStart looked up
    for _ in range(2):
        c = client(sec, "alice", "alice-pw", authMechanism="SCRAM-SHA-1")
        assert c.adb.c.count_documents({"_id": "sha1"}) == 1
    assert sec.metric(0, "stripedb_auth_speculative_total") - spec0 == 2
    with pytest.raises(OperationFailure) as ei:
        client(sec, "alice", "wrong", authMechanism="SCRAM-SHA-1").adb.c.find_one()
    assert (ei.value.code, ei.value.details["errmsg"]) == (18, "Authentication failed.")
    # a SHA-256 client's credentials do not authenticate another mechanism's user name
    with pytest.raises(OperationFailure) as ei:
        client(sec, "nobody", "alice-pw", authMechanism="SCRAM-SHA-1").adb.c.find_one()
    assert ei.value.code == 18


def test_unauthenticated_connection_can_only_hello_ping_saslstart(sec):
    anon = sec.proxy_client(0)
    assert anon.admin.command("ping")["ok"] == 1.0
    assert anon.admin.command("hello")["msg"] == "isdbgrid"
    assert anon.admin.command("isMaster")["ismaster"] is True
    r = anon.admin.command("hello", saslSupportedMechs="admin.alice")
    assert r["saslSupportedMechs"] == ["SCRAM-SHA-1", "SCRAM-SHA-256"]
    # the same list for a user that does not exist (no enumeration)
    r = anon.admin.command("hello", saslSupportedMechs="admin.nobody")
    assert r["saslSupportedMechs"] == ["SCRAM-SHA-1", "SCRAM-SHA-256"]
    names = [n for n, _ in b_commands("adb")] + ["listDatabases", "buildInfo", "endSessions",
                                                 "connectionStatus", "getLog",
                                                 "killAllSessions", "saslContinue"]
    cmds = dict(b_commands("adb"))
    cmds.update({"listDatabases": {"listDatabases": 1}, "buildInfo": {"buildInfo": 1},
                 "endSessions": {"endSessions": []}, "connectionStatus": {"connectionStatus": 1},
                 "getLog": {"getLog": "global"}, "killAllSessions": {"killAllSessions": []},
                 "saslContinue": {"saslContinue": 1, "conversationId": 1, "payload": b"x"}})
    codes = {}
    for n in names:
        with pytest.raises(OperationFailure) as ei:
            anon.adb.command(cmds[n])
        codes[n] = ei.value.code
    # saslContinue outside a conversation is an authentication failure, the rest Unauthorized
    assert codes == {n: (18 if n == "saslContinue" else 13) for n in names}
    # saslStart itself answers (a conversation starts) for a well-formed client-first
    r = anon.admin.command({"saslStart": 1, "mechanism": "SCRAM-SHA-256",
                            "payload": b"n,,n=alice,r=abcdefghijklmnop"})
    assert r["done"] is False and r["conversationId"] == 1
    assert r["payload"].startswith(b"r=abcdefghijklmnop")


def test_tenant_a_cannot_touch_tenant_b_through_any_command(sec):
    alice = client(sec, "alice", "alice-pw")
    bob = client(sec, "bob", "bob-pw")
    alice.adb.c.insert_one({"_id": 1, "x": 1})
    denied0 = audit_counts(sec).get("denied", 0)
    before = sorted(bob.bdb.c.find({}), key=lambda d: d["_id"])
    assert [d["_id"] for d in before] == [0, 1, 2, 3, 4]
    # listDatabases lists only the tenant's own databases
    assert [d["name"] for d in alice.admin.command("listDatabases")["databases"]] == ["adb"]
    assert [d["name"] for d in bob.admin.command("listDatabases")["databases"]] == ["bdb"]
    results = {}
    # the same answer for B's existing database and for a database that does not exist
    for db in ("bdb", "nosuchdb"):
        for name, cmd in b_commands(db):
            with pytest.raises(OperationFailure) as ei:
                alice[db].command(cmd)
            results[(db, name)] = (ei.value.code, ei.value.details["errmsg"])
    assert results == {(db, n): (13, f"not authorized on {db} to execute command {n}")
                       for db in ("bdb", "nosuchdb") for n, _ in b_commands(db)}
    for name, cmd in cross_db_commands():
        with pytest.raises(OperationFailure) as ei:
            alice.adb.command(cmd)
        assert (name, ei.value.code) == (name, 13)
    # B's data and namespaces are untouched
    assert sorted(bob.bdb.c.find({}), key=lambda d: d["_id"]) == before
    assert bob.bdb.list_collection_names() == ["c"]
    # and A still works on its own database through the same commands
    assert alice.adb.command({"count": "c"})["n"] == 1
    assert list(alice.adb.c.aggregate([{"$project": {"_id": 1}}])) == [{"_id": 1}]
    assert alice.adb.command("collStats", "c")["count"] == 1
    assert alice.adb.command("dbStats")["objects"] == 1
    ex = alice.adb.command("explain", {"delete": "c", "deletes": [{"q": {}, "limit": 1}]},
                           verbosity="queryPlanner")
    assert [s["shardName"] for s in ex["queryPlanner"]["winningPlan"]["shards"]] == ["shard-a"]
    # denials are audited
    assert audit_counts(sec)["denied"] - denied0 == \
        2 * len(b_commands()) + len(cross_db_commands())


def test_cursors_belong_to_their_user_and_namespace(sec):
    """A cursor id is usable only by the user that created it, on its namespace (MongoDB):
    another tenant's getMore/killCursors on it fails with 13 and reveals nothing; the owner
    keeps reading."""
    sec.meta_cmd({"createUser": "alice2", "tenant": "A", "password": "alice2-pw"})
    alice = client(sec, "alice", "alice-pw")
    alice2 = client(sec, "alice2", "alice2-pw")
    bob = client(sec, "bob", "bob-pw")
    alice.adb.c.insert_many([{"_id": i} for i in range(10, 15)])
    cid = bob.bdb.command("find", "c", batchSize=2)["cursor"]["id"]
    assert cid > 0
    for who, db, coll in ((alice, "adb", "c"), (alice, "bdb", "c")):
        with pytest.raises(OperationFailure) as ei:
            who[db].command("getMore", cid, collection=coll)
        assert ei.value.code == 13
        if db == "adb":  # the cursor's namespace is not revealed
            assert "bdb" not in ei.value.details["errmsg"], ei.value.details
        with pytest.raises(OperationFailure) as ei:
            who[db].command("killCursors", coll, cursors=[cid])
        assert ei.value.code == 13
    # the owner, on another namespace of its own: 13 too
    with pytest.raises(OperationFailure) as ei:
        bob.bdb.command("getMore", cid, collection="other")
    assert ei.value.code == 13
    # still alive for its owner
    more = bob.bdb.command("getMore", cid, collection="c", batchSize=2)["cursor"]
    assert [d["_id"] for d in more["nextBatch"]] == [2, 3]
    # the same tenant's other user cannot use it either
    aid = alice.adb.command("find", "c", batchSize=1)["cursor"]["id"]
    with pytest.raises(OperationFailure) as ei:
        alice2.adb.command("getMore", aid, collection="c")
    assert ei.value.code == 13
    assert bob.bdb.command("killCursors", "c", cursors=[cid])["cursorsKilled"] == [cid]


def test_brute_force_is_rate_limited_through_the_peer_ring(start_role, tmp_path, pb):
    """Failed authentications are counted on the cluster's rate limiter (the proxies' peer
    ring), per user and per client host: failures on one proxy refuse the user on the
    other one; the host budget (10x the user's) does not lock other users out."""
    g1, g2 = free_port(), free_port()
    ring = [f"--peers=127.0.0.1:{g1},127.0.0.1:{g2}", "--auth=enabled",
            f"--auth-failure-limit={FAILURE_LIMIT}"]
    cl = ProxyCluster(start_role, tmp_path, shards=1, proxies=0)
    for g in (g1, g2):
        cl.add_proxy(ring + [f"--grpc-listen=127.0.0.1:{g}"])
    for t, db, user, pw in (("A", "adb", "alice", "alice-pw"), ("B", "bdb", "bob", "bob-pw")):
        cl.meta_cmd({"createTenant": t})
        cl.create_database(db, tenant=t)
        cl.meta_cmd({"createUser": user, "tenant": t, "password": pw})
    for i in (0, 1):  # both proxies know the users and reach each other's ring
        wait_until(lambda i=i: cl.proxy_client(i, username="bob", password="bob-pw",
                                               authSource="admin").bdb.c.find_one() is None,
                   20, what=f"bob on proxy {i}")
    # every proxy sees every peer alive (HealthCheck healthy, peer_count 2): a proxy that
    # found its peer not yet started takes over its keys for a while, as Gubernator does
    import grpc
    for g in (g1, g2):
        with grpc.insecure_channel(f"127.0.0.1:{g}") as ch:
            v1 = pb[1].V1Stub(ch)
            wait_until(lambda v1=v1: (lambda h: h.status == "healthy" and h.peer_count == 2)(
                v1.HealthCheck(pb[0].HealthCheckReq(), timeout=2)), 60,
                what=f"the peer ring healthy from 127.0.0.1:{g}")
    for _ in range(FAILURE_LIMIT):
        with pytest.raises(OperationFailure) as ei:
            cl.proxy_client(0, username="alice", password="guess",
                            authSource="admin").adb.c.find_one()
        assert ei.value.code == 18
    # the other proxy refuses even the right password: the count is the ring's (polled: a
    # ring still settling after start may answer a query from the key's previous owner)
    def refused():
        try:
            cl.proxy_client(1, username="alice", password="alice-pw",
                            authSource="admin").adb.c.find_one()
        except OperationFailure as e:
            return e.code == 18
        return False
    wait_until(refused, 15, interval=0.2, what="alice refused on the other proxy")
    st, body = http_get(cl.proxy_procs[1].http_port, "/metrics")
    assert b'stripedb_auth_audit_events_total{event="rateLimited"}' in body
    # another user from the same host still gets in (host budget: 10x the user's)
    assert cl.proxy_client(1, username="bob", password="bob-pw",
                           authSource="admin").bdb.c.find_one() is None
    cl.close()


@needs_node_client("mongodb")
@pytest.mark.parametrize("mech", ["SCRAM-SHA-256", "SCRAM-SHA-1", "SCRAM-SHA-256:strict"])
def test_node_driver_auth_and_isolation(sec, mech):
    r = subprocess.run(["node", os.path.join(HERE, "security_node.js"),
                        str(sec.proxy_ports[0]), "alice", "alice-pw", "wrong", "adb", "bdb",
                        mech],
                       capture_output=True, text=True, timeout=120, cwd=HERE,
                       env=node_env())
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["good"] == {"ok": True, "value": [{"_id": 1, "via": "node"}]}
    assert (out["bad"]["ok"], out["bad"]["code"]) == (False, 18)
    assert out["bad"]["ms"] >= FAIL_DELAY_S * 1000
    assert (out["other"]["ok"], out["other"]["code"], out["other"]["codeName"]) == \
        (False, 13, "Unauthorized")


def test_libmongoc_client_authenticates(sec, tmp_path):
    """The C driver (the one every stripedb role uses) speaks SCRAM-SHA-256 to the proxy;
    it requires MongoDB's 28-byte salt in server-first."""
    import shutil
    if not shutil.which("gcc") or not shutil.which("pkg-config"):
        pytest.skip("gcc/pkg-config needed to build the libmongoc client")
    exe = str(tmp_path / "mongoc_client")
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "libmongoc-1.0"],
                           capture_output=True, text=True, check=True).stdout.split()
    subprocess.run(["gcc", os.path.join(HERE, "security_mongoc_client.c"), "-o", exe] + flags,
                   check=True)
    port = sec.proxy_ports[0]
    base = f"127.0.0.1:{port}/?directConnection=true&authSource=admin" \
           "&authMechanism=SCRAM-SHA-256&serverSelectionTimeoutMS=10000"
    r = subprocess.run([exe, f"mongodb://bob:bob-pw@{base}", "bdb"], capture_output=True,
                       text=True, timeout=60)
    last = lambda r: r.stdout.strip().splitlines()[-1]  # noqa: E731 - libmongoc logs first
    assert (r.returncode, last(r)) == (0, "ok 5"), r.stderr
    r = subprocess.run([exe, f"mongodb://bob:nope@{base}", "bdb"], capture_output=True,
                       text=True, timeout=60)
    # libmongoc reports a failed handshake as MONGOC_ERROR_CLIENT_AUTHENTICATE (11) with the
    # server's message
    assert (r.returncode, last(r)) == (1, "error 11 Authentication failed."), r.stdout
    r = subprocess.run([exe, f"mongodb://bob:bob-pw@{base}", "adb"], capture_output=True,
                       text=True, timeout=60)
    assert (r.returncode, last(r)) == \
        (1, "error 13 not authorized on adb to execute command count"), r.stdout


def test_speculative_authentication_in_hello(sec):
    # the first authentication of alice looks her verifier up (saslStart)...
    client(sec, "alice", "alice-pw").adb.c.insert_one({"_id": "warm"})
    before = audit_counts(sec)
    st, body = http_get(sec.proxy_procs[0].http_port, "/metrics")
    n0 = [float(line.split()[-1]) for line in body.decode().splitlines()
          if line.startswith("stripedb_auth_speculative_total")]
    # ...the next connection starts its conversation inside hello (one round trip less)
    c = client(sec, "alice", "alice-pw")
    assert c.adb.c.find_one({"_id": "warm"}) == {"_id": "warm"}
    st, body = http_get(sec.proxy_procs[0].http_port, "/metrics")
    n1 = [float(line.split()[-1]) for line in body.decode().splitlines()
          if line.startswith("stripedb_auth_speculative_total")]
    assert n1[0] - (n0[0] if n0 else 0.0) == 1.0
    # and a wrong password through the speculative path still fails with 18
    with pytest.raises(OperationFailure) as ei:
        client(sec, "alice", "wrong").adb.c.find_one()
    assert ei.value.code == 18
    assert audit_counts(sec)["authFailed"] - before.get("authFailed", 0) == 1


def test_bypass_document_validation_needs_the_admin_action(sec):
    """MongoDB requires the bypassDocumentValidation action (dbAdmin/restore, not readWrite)
    for bypassDocumentValidation: true on insert, update, findAndModify and aggregate's
    $out/$merge target, else 13 Unauthorized. A tenant holds it as the admin action."""
    alice = client(sec, "alice", "alice-pw")
    alice.adb.create_collection("v", validator={"x": {"$type": "int"}})
    alice.adb.create_collection("w", validator={"x": {"$type": "int"}})
    alice.adb.src.insert_one({"_id": 1, "x": "str"})
    sec.meta_cmd({"setPolicy": "A", "policy": {"collections": {
        "adb.v": {"actions": ["find", "insert", "update", "remove"]},
        "adb.w": {"actions": ["find", "insert", "update", "remove", "admin"]}}}})

    def code(coll, cmd):
        try:
            r = alice.adb.command(cmd)
        except OperationFailure as e:
            return e.code
        return r["writeErrors"][0]["code"] if r.get("writeErrors") else None

    bad = {"_id": 1, "x": "str"}
    wait_until(lambda: code("v", {"insert": "v", "documents": [bad],
                                  "bypassDocumentValidation": True}) == 13,
               15, what="the policy to be loaded")
    # without the flag the write is allowed (and validated: 121)
    assert code("v", {"insert": "v", "documents": [bad]}) == 121
    for cmd in ({"update": "v", "updates": [{"q": {}, "u": {"$set": {"x": "s"}}}],
                 "bypassDocumentValidation": 1},
                {"findAndModify": "v", "query": {}, "update": {"$set": {"x": "s"}},
                 "bypassDocumentValidation": True},
                {"aggregate": "src", "cursor": {}, "pipeline": [{"$merge": {"into": "v"}}],
                 "bypassDocumentValidation": True},
                {"aggregate": "src", "cursor": {}, "pipeline": [{"$out": "v"}],
                 "bypassDocumentValidation": True}):
        assert code("v", cmd) == 13, cmd
    # false is no bypass: no admin needed
    assert code("v", {"insert": "v", "documents": [{"_id": 2, "x": 2}],
                      "bypassDocumentValidation": False}) is None
    # with the admin action the bypass works
    assert code("w", {"insert": "w", "documents": [bad],
                      "bypassDocumentValidation": True}) is None
    assert alice.adb.w.find_one({"_id": 1}) == bad
    assert code("w", {"update": "w", "updates": [{"q": {"_id": 1},
                                                  "u": {"$set": {"y": "s"}}}],
                      "bypassDocumentValidation": True}) is None
