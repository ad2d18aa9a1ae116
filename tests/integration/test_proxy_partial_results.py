"""find's allowPartialResults through a proxy (issue #20, a fresh user): it was accepted
and ignored, a find with one shard down answering 6 HostUnreachable. As mongos: the
shards that do not answer (network errors only, never a shard's command error) are left
out, the reachable shards' documents are returned and the cursor replies carry
partialResultsReturned: true (on the first batch, and on a getMore once a shard's part
was dropped). A shard talked to directly accepts the field (and has nothing to leave out)."""
import pytest
from pymongo.errors import OperationFailure

from proxy_helpers import ProxyCluster

N = 100


def test_allow_partial_results_with_a_shard_down(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    try:
        cl.shard_collection("pr.c", {"_id": 1}, split_points=[{"_id": N // 2}])
        db = cl.proxy_client(0).pr
        db.c.insert_many([{"_id": i, "k": i} for i in range(N)])
        on = {sid: sorted(d["_id"] for d in cl.shard_client(sid).pr.c.find())
              for sid in cl.shard_ids}
        assert all(0 < len(ids) < N for ids in on.values()), on  # chunks on both shards
        up, down = cl.shard_ids
        # all shards up: everything, no partialResultsReturned
        r = db.command("find", "c", allowPartialResults=True, batchSize=N + 1)
        assert sorted(d["_id"] for d in r["cursor"]["firstBatch"]) == list(range(N))
        assert "partialResultsReturned" not in r["cursor"]
        # a shard direct accepts the field
        assert sorted(d["_id"] for d in
                      cl.shard_client(up).pr.c.find({}, allow_partial_results=True)) == on[up]
        # a cursor opened while both shards answer, continued after one is gone
        r = db.command("find", "c", allowPartialResults=True, batchSize=2, sort={"_id": 1})
        first = [d["_id"] for d in r["cursor"]["firstBatch"]]
        cid = r["cursor"]["id"]
        assert len(first) == 2 and cid != 0
        assert "partialResultsReturned" not in r["cursor"]
        cl.shard_procs[down].kill()  # kill -9
        # without allowPartialResults: HostUnreachable, as before
        with pytest.raises(OperationFailure) as e:
            list(db.c.find())
        assert e.value.code == 6, e.value.details
        # with it: the reachable shard's documents, and the flag
        r = db.command("find", "c", allowPartialResults=True, batchSize=N + 1)
        assert sorted(d["_id"] for d in r["cursor"]["firstBatch"]) == on[up]
        assert r["cursor"]["partialResultsReturned"] is True
        assert r["cursor"]["id"] == 0
        # through the driver's cursor, with getMores
        got = [d["_id"] for d in db.c.find({}, allow_partial_results=True, batch_size=7)]
        assert sorted(got) == on[up]
        # a filter that targets only the reachable shard leaves nothing out
        lo, hi = on[up][0], on[up][-1]
        r = db.command("find", "c", filter={"_id": {"$gte": lo, "$lte": hi}},
                       allowPartialResults=True)
        assert sorted(d["_id"] for d in r["cursor"]["firstBatch"]) == on[up]
        assert "partialResultsReturned" not in r["cursor"]
        # a shard's command error is never dropped
        with pytest.raises(OperationFailure) as e:
            db.command("find", "c", filter={"$bogus": 1}, allowPartialResults=True)
        assert e.value.code == 2, e.value.details
        # the cursor opened before: its getMore drops the dead shard's part
        r = db.command("getMore", cid, collection="c", batchSize=N + 1)
        rest = [d["_id"] for d in r["cursor"]["nextBatch"]]
        assert r["cursor"]["partialResultsReturned"] is True
        assert r["cursor"]["id"] == 0
        seen = first + rest
        assert len(seen) == len(set(seen)) and set(on[up]) <= set(seen), seen
        assert set(seen) - set(on[up]) <= set(on[down][:2])  # only what was buffered
        # everything built above was freed: a clean exit, no sanitizer report
        cl.stop_proxy_clean(0)
    finally:
        cl.close()
