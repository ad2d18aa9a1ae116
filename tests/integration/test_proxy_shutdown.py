"""A proxy stopped while a request waits on a stopped shard (issue #24). Its graceful stop
times out (--shutdown-timeout-ms) with the request still running; the request is inside a
wait that ends by itself (a call to a shard: shardconn_wait_begin), so the proxy logs it as
"request waiting at shutdown" and not as "unanswered request at shutdown", which the
suite's teardown (conftest.py) fails a test for."""
import os
import signal
import threading

import pymongo

from conftest import wait_until
from proxy_helpers import ProxyCluster


def test_request_waiting_on_a_stopped_shard_is_reported_as_waiting(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1,
                      proxy_args=["--shutdown-timeout-ms=2000", "--shutdown-quiesce-ms=0"])
    stopped = None
    try:
        cl.shard_collection("w.h", {"k": "hashed"}, num_chunks=4)
        cl.proxy_client(0).w.h.insert_many([{"k": i} for i in range(40)])
        stopped = cl.shard_procs["shard-b"].p.pid
        os.kill(stopped, signal.SIGSTOP)
        client = pymongo.MongoClient(f"mongodb://127.0.0.1:{cl.proxy_ports[0]}/",
                                     socketTimeoutMS=120000, retryReads=False)
        errors = []

        def scatter():
            try:
                list(client.w.h.find({}))
            except pymongo.errors.PyMongoError as e:  # the proxy closes the connection
                errors.append(e)

        t = threading.Thread(target=scatter, daemon=True)
        t.start()
        # the find is at the proxy, which waits on shard-b
        wait_until(lambda: cl.metric(0, "stripedb_wire_requests_running") >= 1, 30,
                   what="the find running on the proxy")
        proxy = cl.proxy_procs[0]
        proxy.stop(timeout=30)
        t.join(60)
        client.close()
        log = open(proxy.log_path, errors="replace").read()
        assert "wire: request waiting at shutdown" in log and "cmd=find" in log, log[-3000:]
        assert "wire: unanswered request at shutdown" not in log, log[-3000:]
    finally:
        if stopped:
            os.kill(stopped, signal.SIGCONT)
        cl.close()
