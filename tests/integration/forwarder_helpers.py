"""Helpers of the proxy forwarder's tests (test_proxy_forwarder*.py; src/proxy/forwarder.h):
its metrics, a warmed collection, a command held in flight on the loop."""
import socket
import threading

import pytest

from conftest import wait_until
from proxy_helpers import ProxyCluster, install_filtering

LOOP = "stripedb_proxy_loop_commands_total"
FALLBACK = "stripedb_proxy_loop_command_fallbacks_total"
IN_FLIGHT = "stripedb_proxy_loop_commands_in_flight"
LOOP_CONNS = "stripedb_proxy_loop_connections"


@pytest.fixture
def cluster(start_role, tmp_path):
    """One metadata member, one shard with test commands (failCommand), one proxy."""
    cl = ProxyCluster(start_role, tmp_path, shards=1, proxies=1,
                      shard_args=["--enable-test-commands"])
    yield cl
    cl.close()


def strip(reply):
    """A command's reply without the fields that differ between any two (cluster time)."""
    return {k: v for k, v in reply.items() if k not in ("$clusterTime", "operationTime")}


def warm(coll):
    """One write (libmongoc selects the shard's primary, the proxy learns it and keeps an
    idle own connection the loop can take) and two reads of the collection (its routing
    cached, then a loop read)."""
    coll.insert_one({"_id": "warm"})
    coll.find_one({"_id": "warm"})
    coll.find_one({"_id": "warm"})


def one_doc(cl, **client_opts):
    """fwdb.t holding {_id: 1, v: 0}, warmed (warm), through a client of proxy 0 made
    with client_opts."""
    coll = cl.proxy_client(0, **client_opts).fwdb.t
    coll.insert_one({"_id": 1, "v": 0})
    warm(coll)
    return coll


def in_flight(cluster, fn, out):
    """Run fn() on a thread (its result or exception appended to out) and return the
    thread once proxy 0's loop has one command in flight."""
    def run():
        try:
            out.append(fn())
        except Exception as e:  # noqa: BLE001 - asserted by the caller
            out.append(e)
    t = threading.Thread(target=run)
    t.start()
    wait_until(lambda: cluster.metric(0, IN_FLIGHT) == 1, 20, what="a loop command in flight")
    return t


def listener_closed(port):
    """True once nothing accepts connections on 127.0.0.1:port (a stop began)."""
    try:
        socket.create_connection(("127.0.0.1", port), 0.5).close()
        return False
    except OSError:
        return True


def sharded_cluster(start_role, tmp_path, key, filtering=True, test_cmds=False, colls=("s",)):
    """Two shards and one proxy; fwdb.<name> for each name of colls sharded on key ({_id: 1}
    split at 100, or {_id: "hashed"} in 4 chunks), with the shards' filtering metadata
    when filtering; the shards with test commands (failCommand) when test_cmds."""
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1,
                      shard_args=["--enable-test-commands"] if test_cmds else [])
    for name in colls:
        ns = f"fwdb.{name}"
        hashed = key["_id"] == "hashed"
        cl.shard_collection(ns, key, split_points=None if hashed else [{"_id": 100}],
                            num_chunks=4 if hashed else None)
        if filtering:
            install_filtering(cl, ns, key)
    return cl


def warm_ids(coll, ids):
    """Each shard's primary known to the proxy (a write there) and the routing cached; a
    shard without filtering metadata refuses the loop's first read with StaleConfig
    (vWanted null), which a request thread runs again per chunk, and is remembered
    (src/proxy/shardver.c): each is read twice."""
    for i in ids:
        coll.update_one({"_id": i}, {"$set": {"warm": 1}})
    for i in ids:
        coll.find_one({"_id": i})
        coll.find_one({"_id": i})


def recv_msg(s):
    """One OP_MSG answer read whole from socket s: (responseTo, its body)."""
    import struct

    import bson

    def exact(n):
        parts, got = [], 0
        while got < n:
            chunk = s.recv(min(n - got, 1 << 20))
            assert chunk, "the proxy closed the connection"
            parts.append(chunk)
            got += len(chunk)
        return b"".join(parts)
    length, _, response_to, op = struct.unpack("<iiii", exact(16))
    assert op == 2013
    payload = exact(length - 16)
    assert payload[4] == 0  # one kind-0 section
    return response_to, bson.decode(payload[5:])


def greeted_sockets(cluster, n, proxy=0):
    """n raw connections to the proxy, each greeted (a ping answered): [socket]."""
    from conftest import op_msg

    socks = []
    try:
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", cluster.proxy_ports[proxy]),
                                         timeout=90)
            socks.append(s)
            s.sendall(op_msg(1, {"ping": 1, "$db": "admin"}))
            assert recv_msg(s)[1]["ok"] == 1.0
    except BaseException:
        for s in socks:
            s.close()
        raise
    return socks


def paused_cmds(cluster, cmds, then=None, proxy=0, answers=True):
    """One raw connection to the proxy per command of cmds (each a dict with its $db),
    each greeted (ping); then, while the proxy is stopped (SIGSTOP), each sends its
    command (requestId 100 + its index), so that the proxy's next round of I/O takes them
    all at once; then (SIGCONT) then() if given, and the answers in cmds' order:
    [(responseTo, body)] (answers=False: then(sockets) instead, and the sockets are the
    caller's)."""
    import signal

    from conftest import op_msg

    socks = []
    try:
        socks = greeted_sockets(cluster, len(cmds), proxy)
        p = cluster.proxy_procs[proxy]
        p.pause()
        try:
            for i, (s, cmd) in enumerate(zip(socks, cmds)):
                s.sendall(op_msg(100 + i, cmd))
        finally:
            p.signal(signal.SIGCONT)
        if then:
            then() if answers else then(socks)
        if not answers:
            out, socks = socks, []
            return out
        return [recv_msg(s) for s in socks]
    finally:
        for s in socks:
            s.close()


def socket_timeout_cluster(start_role, tmp_path, ms):
    """One metadata member, one shard (shard-a) registered with socketTimeoutMS=ms in its
    URI, one proxy: (the ProxyCluster, the shard's process). The caller closes it."""
    from conftest import free_port
    cl = ProxyCluster(start_role, tmp_path, shards=0, proxies=0)
    port = free_port()
    d = tmp_path / "shard-a"
    d.mkdir()
    proc = start_role(["--role=shard", f"--listen=127.0.0.1:{port}", f"--data-dir={d}"])
    cl.shard_ids.append("shard-a")
    cl.shard_ports["shard-a"] = port
    cl.shard_procs["shard-a"] = proc
    cl.meta_cmd({"addShard": "shard-a",
                 "uri": f"mongodb://127.0.0.1:{port}/?socketTimeoutMS={ms}"})
    cl.add_proxy()
    return cl, proc
