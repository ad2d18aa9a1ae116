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


@pytest.fixture
def keyed(start_role, tmp_path, keyfile):
    """metadata (1 member) + shard + proxy, all with the cluster key."""
    key = f"--cluster-key-file={keyfile}"
    mport, rport, sport, pport = free_port(), free_port(), free_port(), free_port()
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
    meta.admin.command({"addShard": "shard-a", "uri": f"mongodb://127.0.0.1:{sport}/"})
    start_role(["--role=proxy", f"--listen=127.0.0.1:{pport}",
                f"--metadata=127.0.0.1:{mport}", key])
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


def test_key_file_readable_by_others_is_refused(start_role, tmp_path, keyfile):
    os.chmod(keyfile, 0o644)
    (tmp_path / "s").mkdir()
    p = start_role(["--role=shard", f"--listen=127.0.0.1:{free_port()}",
                    f"--data-dir={tmp_path / 's'}", f"--cluster-key-file={keyfile}"],
                   wait=False)
    rc = p.p.wait(timeout=20)
    assert rc != 0
    assert "permissions are too open" in p.tail()


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
    finally:
        a.close()
        b.close()
