"""Error paths of the proxy that used to leak (issue #24), checked by LeakSanitizer.

Run against the ASan build (`--enable-sanitizers`): LeakSanitizer reports at process exit,
so each test stops the proxy gracefully and fails on a report (conftest.assert_clean_exit).
Under a build without sanitizers the same tests check only the replies.
"""
import pytest
from pymongo.errors import OperationFailure

from proxy_helpers import ProxyCluster


def test_find_and_modify_shard_error_does_not_leak(start_role, tmp_path):
    """A sharded findAndModify that is not exact on the shard key asks every chunk's shard
    for its first candidate; when a shard answers with an error the proxy replies it and
    used to skip `free(sel)` and `bson_destroy(&best)` (goto done_err in exec.c)."""
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    try:
        cl.shard_collection("db.c", {"k": 1}, split_points=[{"k": 100}],
                            shards=["shard-a", "shard-b"])
        c = cl.proxy_client(0)
        # a document over 128 bytes, so that a kept `best` copy lives on the heap
        c.db.c.insert_many([{"k": k, "x": 1, "pad": "p" * 200} for k in (1, 2, 150)])
        for _ in range(3):
            with pytest.raises(OperationFailure) as ei:
                c.db.command({"findAndModify": "c", "query": {"x": {"$nosuchop": 1}},
                              "update": {"$set": {"y": 1}}})
            assert ei.value.code == 2, ei.value.details  # BadValue: unknown operator
        assert c.db.c.count_documents({"y": 1}) == 0
        # shard-a (chunk [MinKey, 100)) yields a candidate, kept in `best`, before the
        # search reaches shard-b, which is down: HostUnreachable
        cl.shard_procs["shard-b"].stop()
        for _ in range(3):
            with pytest.raises(OperationFailure) as ei:
                c.db.command({"findAndModify": "c", "query": {"x": 1},
                              "update": {"$set": {"y": 1}}})
            assert ei.value.code == 6, ei.value.details
        cl.stop_proxy_clean(0)
    finally:
        cl.close()
