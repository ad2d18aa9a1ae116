"""The proxy's own shard connections (issue #19, src/proxy/shardwire.c): once libmongoc
has selected a shard's primary, the proxy sends that shard's primary commands on
connections of its own (OP_MSG over blocking sockets, authenticated with the cluster key
when there is one). What must hold: the commands really go that way, a restarted shard
costs no error and no write applied twice, and a cluster key authenticates them."""
import os
import threading

import pymongo
import pytest

from conftest import free_port, http_get, wait_until
from proxy_helpers import ProxyCluster
from shard_impostor import Impostor

WIRE = "stripedb_proxy_shard_wire_commands_total"
OPENED = "stripedb_proxy_shard_wire_connections_total"
STALE = "stripedb_proxy_shard_wire_stale_total"


@pytest.fixture
def cluster(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=1, proxies=1)
    yield cl
    cl.close()


def test_primary_commands_go_on_the_own_connections(cluster):
    c = cluster.proxy_client(0)
    coll = c.ydb.t
    coll.insert_one({"_id": 0, "v": 0})  # libmongoc selects the primary; the proxy learns it
    before = cluster.metric(0, WIRE)
    for i in range(1, 101):
        coll.insert_one({"_id": i, "v": i})
        assert coll.find_one({"_id": i}) == {"_id": i, "v": i}
        coll.update_one({"_id": i}, {"$inc": {"v": 1}})
    sent = cluster.metric(0, WIRE) - before
    # 300 client commands, each at least one shard command on the own connections
    assert sent >= 300, sent
    assert cluster.metric(0, OPENED) >= 1
    assert sorted(d["v"] for d in coll.find({"_id": {"$gt": 0}})) == list(range(2, 102))
    # a cursor's getMores follow it on the same member
    docs = list(coll.find({}, batch_size=7).sort("_id", 1))
    assert [d["_id"] for d in docs] == list(range(0, 101))
    # an error answer is the shard's own, as through libmongoc
    with pytest.raises(pymongo.errors.DuplicateKeyError) as e:
        coll.insert_one({"_id": 5})
    assert e.value.code == 11000


def test_a_restarted_shard_costs_no_error_and_no_duplicate(cluster):
    """The proxy's idle connections to a shard that was SIGKILLed and restarted were closed
    by the kernel; the next command finds that before sending (nothing is sent on a dead
    connection, so a write cannot end as an unknown outcome) and opens a new one."""
    c = cluster.proxy_client(0)
    coll = c.ydb.r
    for i in range(20):
        coll.insert_one({"_id": i})
    assert cluster.metric(0, WIRE) > 0
    stale = cluster.metric(0, STALE)
    opened = cluster.metric(0, OPENED)
    sid = cluster.shard_ids[0]
    cluster.shard_procs[sid].kill()
    cluster.shard_procs[sid].restart()
    wait_until(lambda: _shard_up(cluster, sid), 20, what="shard restarted")
    for i in range(20, 40):
        coll.insert_one({"_id": i})  # retryWrites=False: any unknown outcome would raise
    assert sorted(d["_id"] for d in coll.find()) == list(range(40))
    assert cluster.metric(0, STALE) > stale
    assert cluster.metric(0, OPENED) > opened


def _shard_up(cl, sid):
    try:
        cl.shard_client(sid).admin.command("ping")
        return True
    except pymongo.errors.PyMongoError:
        return False


def test_concurrent_clients_share_the_connections(cluster):
    """16 threads through one proxy: every acknowledged insert is there exactly once."""
    c = cluster.proxy_client(0, maxPoolSize=32)
    coll = c.ydb.conc
    errors = []

    def worker(t):
        try:
            for i in range(100):
                coll.insert_one({"_id": t * 1000 + i, "t": t})
                assert coll.find_one({"_id": t * 1000 + i})["t"] == t
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    ts = [threading.Thread(target=worker, args=(t,)) for t in range(16)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert errors == []
    ids = sorted(d["_id"] for d in coll.find())
    assert ids == sorted(t * 1000 + i for t in range(16) for i in range(100))
    # bounded by the in-flight limit per shard (64), not one connection per request
    assert cluster.metric(0, OPENED) <= 64


def _metric(proc, name):
    st, body = http_get(proc.http_port, "/metrics")
    assert st == 200
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.decode().splitlines()
               if line.startswith(name + " ") or line.startswith(name + "{"))


def _keyed_meta_and_shard(start_role, tmp_path):
    """A metadata member and a shard sharing a cluster key (test_security_cluster's
    setup). Returns (--cluster-key-file flag, shard port, a free port for the proxy,
    metadata port, keyed client options, a keyed client of metadata once it is ready)."""
    from test_security_cluster import KEY, start_keyed_meta_and_shard
    key = tmp_path / "cluster.key"
    key.write_text(KEY + "\n")
    os.chmod(key, 0o600)
    mport, sport, meta = start_keyed_meta_and_shard(start_role, tmp_path, str(key))
    creds = dict(username="__system", password=KEY, authSource="admin",
                 authMechanism="SCRAM-SHA-256", directConnection=True)
    return f"--cluster-key-file={key}", sport, free_port(), mport, creds, meta


def test_cluster_key_authenticates_the_own_connections(start_role, tmp_path):
    """With a cluster key the own connections authenticate as __system (SCRAM-SHA-256,
    the server's signature checked) before any command, as libmongoc's do."""
    kf, sport, pport, mport, _, meta = _keyed_meta_and_shard(start_role, tmp_path)
    meta.admin.command({"addShard": "shard-a", "uri": f"mongodb://127.0.0.1:{sport}/"})
    proxy = start_role(["--role=proxy", f"--listen=127.0.0.1:{pport}",
                        f"--metadata=127.0.0.1:{mport}", kf, "--auth=disabled"])
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{pport}/", directConnection=True,
                            retryWrites=False)
    c.kdb.t.insert_one({"_id": 1})
    for _ in range(5):
        assert c.kdb.t.find_one({"_id": 1}) == {"_id": 1}
    assert _metric(proxy, WIRE) >= 5
    assert _metric(proxy, OPENED) >= 1
    # the shard answers only cluster members: a client without the key is refused
    direct = pymongo.MongoClient(f"mongodb://127.0.0.1:{sport}/", directConnection=True,
                                 serverSelectionTimeoutMS=5000)
    with pytest.raises(pymongo.errors.OperationFailure):
        direct.kdb.t.find_one()
    for x in (direct, c, meta):
        x.close()


def test_a_new_primary_takes_over_the_own_connections(start_role, tmp_path):
    """A 3-member shard set behind the proxy: its primary commands go on the own
    connections to the primary; after `ctl shard member transfer` (Raft leadership
    transfer) every write through the proxy still succeeds exactly once
    (retryWrites=False: an error would surface), lands on the new primary, and the new
    primary's commands go on the own connections again."""
    from metadata_cluster import Cluster
    from test_shard_members import _metrics, ctl
    from test_shard_replset import primary_index, start_set
    procs, wires, rs_uri = start_set(start_role, tmp_path)
    meta = Cluster(start_role, tmp_path, 1)
    meta.leader()
    meta.write({"addShard": "shard-a", "uri": rs_uri})
    port = free_port()
    proxy = start_role(["--role=proxy", f"--listen=127.0.0.1:{port}",
                        f"--metadata={meta.seeds()}"])
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/", serverSelectionTimeoutMS=20000,
                            retryWrites=False)
    coll = c.app.t
    wait_until(lambda: coll.insert_one({"_id": -1}), 30, what="a first write")
    for i in range(20):
        coll.insert_one({"_id": i})
    before = _metric(proxy, WIRE)
    assert before >= 20
    old = primary_index(wires)
    target = (old + 1) % 3 + 1  # another member's node id (ids are index + 1)
    r = ctl("--json", "shard", "member", "transfer", rs_uri, str(target))
    assert r.returncode == 0, r.stderr
    ins = "stripedb_shard_commands_total[('cmd', 'insert'), ('role', 'shard')]"
    on_new = _metrics(procs[target - 1].http_port).get(ins, 0)
    for i in range(20, 60):
        coll.insert_one({"_id": i})
    assert sorted(d["_id"] for d in coll.find()) == list(range(-1, 60))
    assert primary_index(wires) == target - 1
    # the new primary ran the inserts made after the transfer
    assert _metrics(procs[target - 1].http_port).get(ins, 0) - on_new >= 40
    # and after libmongoc found it, the proxy's own connections carry its commands again
    mid = _metric(proxy, WIRE)
    for i in range(60, 80):
        coll.insert_one({"_id": i})
    assert _metric(proxy, WIRE) - mid >= 15
    c.close()


@pytest.mark.parametrize("code", [11602, 11600])
def test_a_write_of_unknown_outcome_is_not_resent(start_role, tmp_path, code):
    """InterruptedDueToReplStateChange (11602) and InterruptedAtShutdown (11600) are what
    a shard answers when it stepped down or shut down AFTER a write entered its log
    (shard_repl_reply_unknown: "its outcome is unknown"): the write may still commit on
    the new primary. The own connections must not take them for a refusal and send the
    write again through libmongoc (a non-retryable $inc applied twice, and a failed
    resend reported as UNSENT); they must reach retry.c, which resends only retryable
    writes, as they did through libmongoc. The fail point answers the code without
    running the update, so the count shows how many times the proxy sent it."""
    cl = ProxyCluster(start_role, tmp_path, shards=1, proxies=1,
                      shard_args=["--enable-test-commands"])
    try:
        c = cl.proxy_client(0)  # retryWrites=False: the update carries no txnNumber
        coll = c.udb.t
        coll.insert_one({"_id": 1, "v": 0})  # libmongoc selects; the proxy learns
        coll.update_one({"_id": 1}, {"$inc": {"v": 1}})
        before = cl.metric(0, WIRE)
        sh = cl.shard_client(cl.shard_ids[0])
        sh.admin.command({"configureFailPoint": "failCommand", "mode": {"times": 1},
                          "data": {"failCommands": ["update"], "errorCode": code}})
        with pytest.raises(pymongo.errors.PyMongoError) as e:
            coll.update_one({"_id": 1}, {"$inc": {"v": 1}})
        # passed on masked (test_proxy_state_change.py): HostUnreachable, the code in errmsg
        assert (e.value.details or {}).get("code") == 6, repr(e.value)
        assert f"({code}) from a shard" in e.value.details.get("errmsg", ""), repr(e.value)
        assert cl.metric(0, WIRE) > before  # it was sent on the own connections
        off = sh.admin.command({"configureFailPoint": "failCommand", "mode": "off"})
        assert off["count"] == 1
        assert coll.find_one({"_id": 1}) == {"_id": 1, "v": 1}
    finally:
        cl.close()


def _keyed_behind_impostor(start_role, tmp_path, mode):
    """metadata, one shard and a proxy sharing a cluster key; the shard registered at an
    Impostor relay (shard_impostor.py) that hands the proxy's own connections to mode.
    Returns (proxy process, client of the proxy, impostor, keyed client of the shard)."""
    kf, sport, pport, mport, creds, meta = _keyed_meta_and_shard(start_role, tmp_path)
    imp = Impostor(sport, mode)
    meta.admin.command({"addShard": "shard-a", "uri": f"mongodb://127.0.0.1:{imp.port}/"})
    meta.close()
    proxy = start_role(["--role=proxy", f"--listen=127.0.0.1:{pport}",
                        f"--metadata=127.0.0.1:{mport}", kf, "--auth=disabled"])
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{pport}/", directConnection=True,
                            retryWrites=False, socketTimeoutMS=20000)
    shard = pymongo.MongoClient(f"mongodb://127.0.0.1:{sport}/", **creds)
    return proxy, c, imp, shard


def test_a_member_that_does_not_know_the_cluster_key_gets_no_command(start_role, tmp_path):
    """The own connections reach a server that plays SCRAM without the key: it accepts
    any proof and ends with a made-up server signature. The proxy must check the
    signature (RFC 5802 §3) and send it nothing: no command reaches it, and every write
    lands on the real shard (through libmongoc, whose connections the relay passes)."""
    proxy, c, imp, shard = _keyed_behind_impostor(start_role, tmp_path, "signature")
    try:
        for i in range(10):
            c.kdb.t.insert_one({"_id": i})
            assert c.kdb.t.find_one({"_id": i}) == {"_id": i}
        assert imp.own >= 1  # the own connections did try the impostor
        assert imp.commands == []
        assert sorted(d["_id"] for d in shard.kdb.t.find()) == list(range(10))
    finally:
        imp.close()
        c.close()
        shard.close()


@pytest.mark.parametrize("mode", ["garbage", "big-bad-bson", "big-short-doc"])
def test_a_garbage_answer_is_an_unknown_outcome(start_role, tmp_path, mode):
    """The member answers a command on an own connection with bytes that are not an OP_MSG
    reply to it (or, over 16 KiB, an OP_MSG to it whose document is not valid BSON, or is
    followed by bytes that are no section): the outcome is unknown, so a non-retryable
    insert is reported as an error (never as acknowledged, never sent again), and an
    idempotent read is resent (retry.c) and answered; the proxy goes on serving."""
    proxy, c, imp, shard = _keyed_behind_impostor(start_role, tmp_path, mode)
    try:
        c.kdb.t.insert_one({"_id": 0})  # through libmongoc: the proxy learns the primary
        n_err = 0
        for i in range(1, 6):
            try:
                c.kdb.t.insert_one({"_id": i})
            except pymongo.errors.PyMongoError:
                n_err += 1
        assert imp.commands.count("insert") == n_err >= 1
        # what the impostor swallowed never reached the shard, nor was it resent
        ids = sorted(d["_id"] for d in shard.kdb.t.find())
        assert len(ids) == 6 - n_err, ids
        assert c.kdb.t.find_one({"_id": 0}) == {"_id": 0}
    finally:
        imp.close()
        c.close()
        shard.close()


def test_large_replies_on_the_own_connections(cluster):
    """Replies beyond the first 16 KB read, up to a 16 MB batch, come whole."""
    c = cluster.proxy_client(0)
    coll = c.ydb.big
    coll.insert_one({"_id": "learn"})
    before = cluster.metric(0, WIRE)
    blobs = {i: bytes([i]) * (6 * 1024 * 1024 + i) for i in range(4)}
    for i, b in blobs.items():
        coll.insert_one({"_id": i, "b": b})
    for i in (0, 3):
        assert coll.find_one({"_id": i})["b"] == blobs[i]
    got = {d["_id"]: d["b"] for d in coll.find({"_id": {"$in": list(blobs)}})}
    assert got == blobs
    assert cluster.metric(0, WIRE) - before >= 6


def _one_member_set(start_role, tmp_path, name):
    wire, raft = free_port(), free_port()
    (tmp_path / name).mkdir()
    start_role(["--role=shard", f"--replica-set={name}", "--node-id=1",
                f"--data-dir={tmp_path / name}", f"--listen=127.0.0.1:{wire}",
                f"--raft-listen=127.0.0.1:{raft}", f"--bootstrap-members=1@127.0.0.1:{raft}",
                "--raft-tls=disabled", "--raft-election-timeout-ms=300"])
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{wire}/", directConnection=True,
                            serverSelectionTimeoutMS=5000)
    wait_until(lambda: c.admin.command("hello").get("isWritablePrimary"), 30,
               what=f"{name} primary")
    return wire, c


def test_a_member_of_another_set_on_the_address_gets_no_command(start_role, tmp_path):
    """The shard (a one-member set rs-a, registered with directConnection) is reached
    through a relay that hands the proxy's own connections to a member of ANOTHER set
    (rs-b), as when another shard's member took over the address. libmongoc drops a
    member whose hello names another set; the own connections must refuse it too (the
    hello's setName checked when a connection opens), or the writes land on rs-b."""
    a_port, a = _one_member_set(start_role, tmp_path, "rs-a")
    b_port, b = _one_member_set(start_role, tmp_path, "rs-b")
    imp = Impostor(a_port, "other", other_port=b_port)
    cl = None
    try:
        mport, rport, pport = free_port(), free_port(), free_port()
        (tmp_path / "meta").mkdir()
        start_role(["--role=metadata", "--node-id=1", f"--data-dir={tmp_path / 'meta'}",
                    f"--listen=127.0.0.1:{mport}", f"--raft-listen=127.0.0.1:{rport}",
                    f"--bootstrap-members=1@127.0.0.1:{rport}",
                    "--raft-election-timeout-ms=300"])
        meta = pymongo.MongoClient(f"mongodb://127.0.0.1:{mport}/", directConnection=True)
        wait_until(lambda: meta.admin.command("metadataStatus")["ready"], 20, what="leader")
        meta.admin.command({"addShard": "shard-a",
                            "uri": f"mongodb://127.0.0.1:{imp.port}/?directConnection=true"})
        meta.close()
        start_role(["--role=proxy", f"--listen=127.0.0.1:{pport}",
                    f"--metadata=127.0.0.1:{mport}"])
        cl = pymongo.MongoClient(f"mongodb://127.0.0.1:{pport}/", directConnection=True,
                                 retryWrites=False, socketTimeoutMS=20000)
        for i in range(10):
            cl.odb.t.insert_one({"_id": i})
            assert cl.odb.t.find_one({"_id": i}) == {"_id": i}
        assert imp.own >= 1  # the own connections did reach rs-b
        assert sorted(d["_id"] for d in a.odb.t.find()) == list(range(10))
        assert list(b.odb.t.find()) == []
    finally:
        imp.close()
        for x in (cl, a, b):
            if x is not None:
                x.close()
