"""Internal trust between roles (issue #10): with --cluster-key-file, shard and metadata
listeners accept commands only from connections authenticated as the internal user
__system with the cluster key (SCRAM-SHA-256, as MongoDB's keyFile); the proxy does so by
itself, so applications see no difference.
"""
import os

import pymongo
import pytest
from bson.int64 import Int64
from pymongo.errors import OperationFailure

from conftest import free_port, wait_until
from test_ratelimit_grpc import pb  # noqa: F401 - the stubs fixture

KEY = "c3RyaXBlZGItdGVzdC1jbHVzdGVyLWtleQ"


def client(port, **kw):
    opts = dict(directConnection=True, serverSelectionTimeoutMS=10000, connectTimeoutMS=5000,
                socketTimeoutMS=20000, retryWrites=False)
    opts.update(kw)
    return pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/", **opts)


def member(port, key=KEY):
    return client(port, username="__system", password=key, authSource="admin",
                  authMechanism="SCRAM-SHA-256")


@pytest.fixture
def keyfile(tmp_path):
    p = tmp_path / "cluster.key"
    p.write_text(KEY + "\n")
    os.chmod(p, 0o600)
    return str(p)


def start_keyed_meta_and_shard(start_role, tmp_path, keyfile):
    """One metadata member and one shard (not registered) with the cluster key in
    keyfile (KEY). Returns (metadata port, shard port, a keyed client of metadata once it
    has a leader)."""
    key = f"--cluster-key-file={keyfile}"
    mport, rport, sport = free_port(), free_port(), free_port()
    (tmp_path / "meta").mkdir()
    (tmp_path / "shard").mkdir()
    start_role(["--role=metadata", "--node-id=1", f"--data-dir={tmp_path / 'meta'}",
                f"--listen=127.0.0.1:{mport}", f"--raft-listen=127.0.0.1:{rport}",
                f"--bootstrap-members=1@127.0.0.1:{rport}", "--raft-election-timeout-ms=300",
                key])
    start_role(["--role=shard", f"--listen=127.0.0.1:{sport}",
                f"--data-dir={tmp_path / 'shard'}", key])
    meta = member(mport)
    wait_until(lambda: meta.admin.command("metadataStatus")["ready"], 20, what="leader")
    return mport, sport, meta


@pytest.fixture
def keyed(start_role, tmp_path, keyfile):
    """metadata (1 member) + shard + proxy, all with the cluster key."""
    key = f"--cluster-key-file={keyfile}"
    mport, sport, meta = start_keyed_meta_and_shard(start_role, tmp_path, keyfile)
    pport = free_port()
    meta.admin.command({"addShard": "shard-a", "uri": f"mongodb://127.0.0.1:{sport}/"})
    # --auth=disabled: these tests are about trust between roles, not client users (a
    # keyed proxy authenticates clients by default: test_keyed_proxy_requires_auth...)
    start_role(["--role=proxy", f"--listen=127.0.0.1:{pport}",
                f"--metadata=127.0.0.1:{mport}", key, "--auth=disabled"])
    yield {"meta": mport, "shard": sport, "proxy": pport}
    meta.close()


# Internal commands of each role, as cluster members send them.
META_INTERNAL = [
    {"addShard": "evil", "uri": "mongodb://127.0.0.1:1/"},
    {"shardCollection": "db.c", "key": {"k": 1}},
    {"setChunkShard": Int64(1), "shard": "evil"},
    {"registerMember": Int64(9), "raft": "127.0.0.1:1", "wire": "127.0.0.1:2"},
    {"createUser": "mallory", "tenant": "t", "password": "x"},
    {"getRoutingTable": "db.c"},
    {"getUser": "alice"},
    {"listTenants": 1},
]
SHARD_INTERNAL = [
    {"stripedbSetVersion": "db.c", "version": Int64(5)},
    {"insert": "c", "documents": [{"_id": 1}]},
    {"find": "c"},
    {"applyOps": []},
    {"listDatabases": 1},
]


def test_internal_commands_without_cluster_credentials_are_refused(keyed):
    for role, cmds in (("meta", META_INTERNAL), ("shard", SHARD_INTERNAL)):
        anon = client(keyed[role])
        assert anon.admin.command("ping")["ok"] == 1.0
        assert anon.admin.command("hello")["isWritablePrimary"] is True
        codes = []
        for cmd in cmds:
            with pytest.raises(OperationFailure) as ei:
                anon.admin.command(cmd)
            codes.append(ei.value.code)
        assert (role, codes) == (role, [13] * len(cmds))
        # a wrong key fails authentication
        with pytest.raises(OperationFailure) as ei:
            member(keyed[role], key="bm90LXRoZS1rZXk").admin.command("ping")
        assert ei.value.code == 18
        # tenant users do not exist on internal listeners
        with pytest.raises(OperationFailure) as ei:
            client(keyed[role], username="alice", password="x", authSource="admin",
                   authMechanism="SCRAM-SHA-256").admin.command("ping")
        assert ei.value.code == 18


def test_cluster_members_and_the_proxy_get_through(keyed):
    m = member(keyed["meta"])
    assert [s["id"] for s in m.admin.command("listShards")["shards"]] == ["shard-a"]
    # the proxy authenticates to metadata and shard with the key: an application does not
    app = client(keyed["proxy"])
    wait_until(lambda: app.db.c.insert_one({"_id": 1, "v": "x"}), 20, what="proxy write")
    assert list(app.db.c.find({})) == [{"_id": 1, "v": "x"}]
    # and the shard, asked by a member, holds it
    assert list(member(keyed["shard"]).db.c.find({})) == [{"_id": 1, "v": "x"}]


def test_keyed_proxy_requires_authentication_by_default(keyed, start_role, keyfile):
    """As a MongoDB keyFile implies authorization, a proxy given the cluster key and no
    --auth authenticates its clients."""
    port = free_port()
    start_role(["--role=proxy", f"--listen=127.0.0.1:{port}",
                f"--metadata=127.0.0.1:{keyed['meta']}", f"--cluster-key-file={keyfile}"])
    anon = client(port)
    assert anon.admin.command("ping")["ok"] == 1.0
    with pytest.raises(OperationFailure) as ei:
        anon.db.c.find_one({})
    assert ei.value.code == 13


def test_key_file_readable_by_others_is_refused(start_role, tmp_path, keyfile):
    os.chmod(keyfile, 0o644)
    (tmp_path / "s").mkdir()
    p = start_role(["--role=shard", f"--listen=127.0.0.1:{free_port()}",
                    f"--data-dir={tmp_path / 's'}", f"--cluster-key-file={keyfile}"],
                   wait=False)
    rc = p.p.wait(timeout=20)
    assert rc != 0
    assert "permissions are too open" in p.tail()


def test_keyed_cluster_migrates_a_chunk_with_ctl_and_coordinator(keyed, start_role, tmp_path,
                                                                 keyfile):
    """The coordinator, its CDC publishers and `stripedb ctl` all authenticate with the
    key: a chunk moves between two keyed shards while the data stays readable."""
    import json
    import subprocess

    from conftest import BIN
    m = member(keyed["meta"])
    s2 = free_port()
    (tmp_path / "shard-b").mkdir()
    start_role(["--role=shard", f"--listen=127.0.0.1:{s2}",
                f"--data-dir={tmp_path / 'shard-b'}", f"--cluster-key-file={keyfile}"])
    m.admin.command({"addShard": "shard-b", "uri": f"mongodb://127.0.0.1:{s2}/"})
    m.admin.command({"createDatabase": "app"})
    m.admin.command({"shardCollection": "app.c", "key": {"k": 1},
                     "shards": ["shard-a", "shard-b"], "splitPoints": [{"k": 50}]})
    app = client(keyed["proxy"])
    docs = [{"_id": i, "k": i} for i in range(100)]
    wait_until(lambda: app.app.c.insert_many(docs), 20, what="proxy writes")
    start_role(["--role=coordinator", f"--metadata=127.0.0.1:{keyed['meta']}",
                f"--cdc=embedded:{tmp_path / 'cdc'}", "--cdc-lease-ms=1500",
                f"--cluster-key-file={keyfile}"])
    meta = f"--metadata=127.0.0.1:{keyed['meta']}"

    def ctl(*args, key=True):
        env = dict(os.environ)
        env.pop("STRIPEDB_CLUSTER_KEY_FILE", None)
        flags = [f"--cluster-key-file={keyfile}"] if key else []
        return subprocess.run([BIN, "ctl", meta, "--json", *flags, *args], env=env,
                              capture_output=True, timeout=120)

    # without the key, metadata refuses ctl: exit 1 and one line naming the refusal
    r = ctl("chunk", "list", "app.c", key=False)
    assert r.returncode == 1, r
    assert len(r.stderr.decode().strip().splitlines()) == 1, r.stderr
    chunks = m.admin.command({"getRoutingTable": "app.c", "sinceVersion": 0})["chunks"]
    low = [c for c in chunks if c["shard"] == "shard-a"][0]
    r = ctl("migrate", "app.c", "--chunk", str(low["id"]), "--to", "shard-b", "--grace-ms=300",
            "--wait")
    assert r.returncode == 0, r.stderr.decode()
    mid = json.loads(r.stdout.decode().splitlines()[0])["id"]
    assert m.admin.command({"getMigration": mid})["migration"]["state"] == "complete"
    owners = {c["shard"] for c in
              m.admin.command({"getRoutingTable": "app.c", "sinceVersion": 0})["chunks"]}
    assert owners == {"shard-b"}
    assert sorted(d["_id"] for d in app.app.c.find({})) == list(range(100))
    assert member(s2).app.c.count_documents({}) == 100
    # the source shard was cleaned up after the switch
    wait_until(lambda: member(keyed["shard"]).app.c.count_documents({}) == 0, 30,
               what="source cleanup")


# ---------------------------------------------------------------- rate limiter PeersV1

def test_ratelimit_peers_v1_needs_the_cluster_token(start_role, pb, keyfile):
    import hashlib
    import hmac

    import grpc
    from test_ratelimit_grpc import req, start_nodes

    pb2 = pb[0]
    a, b = start_nodes(start_role, pb, 2, env={"STRIPEDB_CLUSTER_KEY_FILE": keyfile})
    try:
        # the ring works with the token: both nodes count one bucket (owner forwarding)
        keys = [f"k{i}" for i in range(8)]
        first = [r.remaining for r in a.get(*[req(pb, k) for k in keys])]
        second = [r.remaining for r in b.get(*[req(pb, k) for k in keys])]
        assert (first, second) == ([9] * 8, [8] * 8)
        # PeersV1 without the token is refused by every node; with it, it answers
        token = hmac.new(KEY.encode(), b"stripedb PeersV1", hashlib.sha256).hexdigest()
        body = pb2.GetPeerRateLimitsReq(requests=[req(pb, "direct")]).SerializeToString()
        for nd in (a, b):
            for method in ("GetPeerRateLimits", "UpdatePeerGlobals"):
                raw = nd.channel.unary_unary(f"/pb.gubernator.PeersV1/{method}")
                payload = body if method == "GetPeerRateLimits" else b""
                with pytest.raises(grpc.RpcError) as e:
                    raw(payload, timeout=5)
                assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
                with pytest.raises(grpc.RpcError) as e:
                    raw(payload, timeout=5, metadata=[("x-stripedb-cluster-token", "0" * 64)])
                assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
            raw = nd.channel.unary_unary("/pb.gubernator.PeersV1/GetPeerRateLimits")
            out = pb2.GetPeerRateLimitsResp.FromString(
                raw(body, timeout=5, metadata=[("x-stripedb-cluster-token", token)]))
            assert len(out.rate_limits) == 1 and out.rate_limits[0].error == ""
        # the cluster's own buckets (tenant quotas, auth failures) are not on the public
        # V1 API: nobody can drain a tenant's quota through gRPC or the HTTP gateway
        import json
        import urllib.error
        import urllib.request
        quota = req(pb, "bob", hits=45, limit=50, name="stripedb_tenant_requests")
        for nd in (a, b):
            with pytest.raises(grpc.RpcError) as e:
                nd.get(req(pb, "fine"), quota)
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "prefix stripedb_ is reserved" in e.value.details()
            body = json.dumps({"requests": [{"name": "stripedb_tenant_requests",
                                             "unique_key": "bob", "hits": 45, "limit": 50,
                                             "duration": 60000}]}).encode()
            rq = urllib.request.Request(f"http://127.0.0.1:{nd.http_port}/v1/GetRateLimits",
                                        data=body, method="POST")
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(rq, timeout=5)
            assert e.value.code == 403
            assert json.loads(e.value.read())["code"] == 7
        # other names work as before
        assert a.one(req(pb, "fine")).error == ""
    finally:
        a.close()
        b.close()


# ---- cluster key rotation (issue #21) ----

NEW_KEY = "bmV3LWNsdXN0ZXIta2V5LXJvdGF0ZWQtMjAyNg"


def write_keys(path, text):
    tmp = str(path) + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def test_proxy_follows_a_cluster_key_rotation(start_role, tmp_path, keyfile):
    """metadata + shard + proxy rotate the key with a SIGHUP per step ([old, new], [new,
    old], [new]) while an application writes through the proxy: no write fails. Then the
    shard and the metadata member restart (every connection of the proxy's pools is made
    anew, and only the new key is accepted): the proxy, which was never restarted, writes
    and creates collections again, because its pools were renewed with the new key."""
    import signal
    import threading
    import time
    key = f"--cluster-key-file={keyfile}"
    mport, rport, sport, pport = free_port(), free_port(), free_port(), free_port()
    (tmp_path / "meta").mkdir()
    (tmp_path / "shard").mkdir()
    pm = start_role(["--role=metadata", "--node-id=1", f"--data-dir={tmp_path / 'meta'}",
                     f"--listen=127.0.0.1:{mport}", f"--raft-listen=127.0.0.1:{rport}",
                     f"--bootstrap-members=1@127.0.0.1:{rport}",
                     "--raft-election-timeout-ms=300", key])
    ps = start_role(["--role=shard", f"--listen=127.0.0.1:{sport}",
                     f"--data-dir={tmp_path / 'shard'}", key])
    meta = member(mport)
    wait_until(lambda: meta.admin.command("metadataStatus")["ready"], 20, what="leader")
    meta.admin.command({"addShard": "shard-a", "uri": f"mongodb://127.0.0.1:{sport}/"})
    meta.close()
    pp = start_role(["--role=proxy", f"--listen=127.0.0.1:{pport}",
                     f"--metadata=127.0.0.1:{mport}", key, "--auth=disabled"])
    procs = [pm, ps, pp]
    app = client(pport)
    wait_until(lambda: app.db.c.insert_one({"_id": "first"}), 20, what="proxy write")
    acked, errors = [], []
    stop = threading.Event()

    def load():
        i = 0
        while not stop.is_set():
            try:
                app.db.c.insert_one({"_id": i})
                acked.append(i)
            except Exception as e:  # noqa: BLE001 - recorded and asserted below
                errors.append(repr(e))
            i += 1

    def more_writes(k=20):
        n = len(acked)
        wait_until(lambda: len(acked) >= n + k, 30, what="writes through the proxy")

    def step(text, n):
        write_keys(keyfile, text)
        for p in procs:
            p.signal(signal.SIGHUP)
        for p in procs:
            wait_until(lambda p=p: p.tail(1 << 30).count('msg="cluster key file reloaded"') >= n,
                       20, what="cluster key reload")
        more_writes()

    t = threading.Thread(target=load, daemon=True)
    t.start()
    more_writes()
    step(f"- {KEY}\n- {NEW_KEY}\n", 1)
    step(f"- {NEW_KEY}\n- {KEY}\n", 2)
    step(f"{NEW_KEY}\n", 3)
    stop.set()
    t.join(timeout=60)
    assert errors == []
    # the old key is refused by the shard and by metadata now
    for port in (sport, mport):
        with pytest.raises(OperationFailure) as ei:
            member(port).admin.command("ping" if port == sport else "metadataStatus")
        assert ei.value.code == 18
    # every connection of the proxy is made anew, with the new key alone accepted
    for p in (ps, pm):
        p.stop()
        p.restart()
        p.wait_healthy()
    wait_until(lambda: app.db.c.insert_one({"_id": "after-restarts"}), 30,
               what="a proxy write after the restarts")
    wait_until(lambda: app.db.c2.insert_one({"_id": 1}), 30,
               what="a new collection through the proxy (metadata)")
    n = app.db.c.count_documents({})
    assert n == len(acked) + 2  # "first", the load, "after-restarts"
    assert "SCRAM: wrong proof" not in ps.tail(1 << 30).split("shutdown requested")[-1]
    assert "pools renewed with the new cluster key" in pp.tail(1 << 30)
