"""A proxy stopped while a request waits (issue #24): on a stopped shard, or on a migration
no coordinator runs. Its graceful stop times out (--shutdown-timeout-ms) with the request
still running; the request is inside a wait that ends by itself (a call to a shard, a
poll: shardconn_wait_begin), so the proxy logs it as "request waiting at shutdown" and not
as "unanswered request at shutdown", which the suite's teardown (conftest.py) fails a test
for."""
import os
import signal
import socket
import struct

import bson

from conftest import wait_until
from proxy_helpers import ProxyCluster

OP_MSG = 2013


def op_msg(request_id, body):
    payload = struct.pack("<I", 0) + b"\x00" + bson.encode(body)
    return struct.pack("<iiii", 16 + len(payload), request_id, 0, OP_MSG) + payload


def stop_during(cl, cmd):
    """Send cmd (one command, on a plain socket: the only request the proxy runs), wait
    until the proxy runs it, stop the proxy (its drain times out with the request still
    running) and check the log names the request as waiting, never as unanswered."""
    s = socket.create_connection(("127.0.0.1", cl.proxy_ports[0]), timeout=60)
    s.sendall(op_msg(1, cmd))
    name = next(iter(cmd))
    wait_until(lambda: cl.metric(0, "stripedb_wire_requests_running") == 1, 30,
               what=f"the {name} running on the proxy")
    proxy = cl.proxy_procs[0]
    proxy.stop(timeout=30)
    s.close()
    log = open(proxy.log_path, errors="replace").read()
    assert "wire: request waiting at shutdown" in log and f"cmd={name}" in log, log[-3000:]
    assert "wire: unanswered request at shutdown" not in log, log[-3000:]


def test_request_waiting_on_a_stopped_shard_is_reported_as_waiting(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1,
                      proxy_args=["--shutdown-timeout-ms=2000", "--shutdown-quiesce-ms=0"])
    stopped = None
    try:
        cl.shard_collection("w.h", {"k": "hashed"}, num_chunks=4)
        cl.proxy_client(0).w.h.insert_many([{"k": i} for i in range(40)])
        for c in cl._clients:  # no driver connection (nor its monitor's hello) is left
            c.close()
        wait_until(lambda: cl.metric(0, "stripedb_wire_requests_running") == 0, 30,
                   what="no request running on the proxy")
        stopped = cl.shard_procs["shard-b"].p.pid
        os.kill(stopped, signal.SIGSTOP)
        stop_during(cl, {"find": "h", "filter": {}, "$db": "w"})  # waits on shard-b
    finally:
        if stopped:
            os.kill(stopped, signal.SIGCONT)
        cl.close()


def test_move_chunk_polling_its_migration_is_reported_as_waiting(start_role, tmp_path):
    """moveChunk waits for the migration's end by polling metadata (src/proxy/chunks.c);
    without a coordinator the migration never moves, and the stop finds the request in
    that poll."""
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1,
                      proxy_args=["--shutdown-timeout-ms=2000", "--shutdown-quiesce-ms=0"])
    try:
        cl.shard_collection("w.r", {"_id": 1}, split_points=[{"_id": 100}],
                            shards=["shard-a", "shard-a"])
        for c in cl._clients:
            c.close()
        wait_until(lambda: cl.metric(0, "stripedb_wire_requests_running") == 0, 30,
                   what="no request running on the proxy")
        stop_during(cl, {"moveChunk": "w.r", "find": {"_id": 5}, "to": "shard-b",
                         "$db": "admin"})
    finally:
        cl.close()
