"""Review of the loop thread's forwarder (src/proxy/forwarder.c): cases the first tests
(test_proxy_forwarder.py) do not cover."""
import signal
import socket
import threading
import time

import bson
import pymongo
import pytest

from conftest import free_port, wait_until
from proxy_helpers import ProxyCluster

LOOP = "stripedb_proxy_loop_commands_total"
FALLBACK = "stripedb_proxy_loop_command_fallbacks_total"
IN_FLIGHT = "stripedb_proxy_loop_commands_in_flight"


def _warm(coll):
    coll.insert_one({"_id": "warm"})
    coll.find_one({"_id": "warm"})
    coll.find_one({"_id": "warm"})


def _in_flight(cluster, fn, out):
    def run():
        try:
            out.append(fn())
        except Exception as e:  # noqa: BLE001 - asserted by the caller
            out.append(e)
    t = threading.Thread(target=run)
    t.start()
    wait_until(lambda: cluster.metric(0, IN_FLIGHT) == 1, 20, what="a loop command in flight")
    return t


def _listener_closed(port):
    try:
        socket.create_connection(("127.0.0.1", port), 0.5).close()
        return False
    except OSError:
        return True


def test_a_loop_read_at_a_stop_past_its_timeout_is_a_wait_not_a_lost_request(start_role,
                                                                           tmp_path):
    """The proxy's stop outlasts shutdown-timeout-ms while a loop read waits for a
    stopped shard. A request thread's read is then logged as "request waiting at
    shutdown" (info, shardconn_wait_begin); the loop's was logged as "unanswered request
    at shutdown" (warn: a handler that forgot its request, which conftest fails a test
    for). It is a wait bounded by the shard (wire_req_wait_begin): the same log, and the
    proxy exits cleanly once the shard answers."""
    cl = ProxyCluster(start_role, tmp_path, shards=1, proxies=0)
    try:
        cl.add_proxy(["--shutdown-timeout-ms=1000"])
        c = cl.proxy_client(0, socketTimeoutMS=60000, retryReads=False)
        coll = c.fwdb.t
        coll.insert_one({"_id": 1, "v": 1})
        _warm(coll)
        sid = cl.shard_ids[0]
        cl.shard_procs[sid].pause()
        out = []
        t = _in_flight(cl, lambda: coll.find_one({"_id": 1}), out)
        proxy = cl.proxy_procs[0]
        proxy.signal(signal.SIGTERM)
        wait_until(lambda: _listener_closed(cl.proxy_ports[0]), 20, what="the stop began")
        wait_until(lambda: "shutdown timeout, closing connections" in proxy.tail(20000), 20,
                   what="the proxy's shutdown timeout")
        cl.shard_procs[sid].signal(signal.SIGCONT)
        rc = proxy.p.wait(timeout=30)
        t.join(60)
        tail = proxy.tail(20000)
        assert rc == 0, tail
        assert "ERROR: AddressSanitizer" not in tail, tail
        assert "LeakSanitizer" not in tail, tail
        assert "unanswered request at shutdown" not in tail, tail
        assert "request waiting at shutdown" in tail, tail
    finally:
        cl.shard_procs[cl.shard_ids[0]].signal(signal.SIGCONT)
        cl.close()
