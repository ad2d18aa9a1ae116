"""Large batches through a proxy (issue #19): a client's insert may be a 48 MB message
(maxMessageSizeBytes) and its reply must stay under maxBsonObjectSize (16 MiB).

Before the fix, insert_many of 200,000 documents of 500 bytes through a proxy failed: the
proxy forwarded the whole 48.6 MB message to the shard (connection reset), and a reply with
100,000 writeErrors was itself over 16 MiB (10334). The proxy now splits what it sends to a
shard to the shard's limits, and truncates errmsgs past mongod's 1 MiB budget."""
import bson
import pytest
from pymongo.errors import BulkWriteError

from proxy_helpers import ProxyCluster

N = 200_000
PAD = "x" * 470  # {_id: int, k: int, p: 470 bytes} is ~500 bytes of BSON


@pytest.fixture
def cluster(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    yield cl
    cl.close()


def docs(n=N):
    return [{"_id": i, "k": i, "p": PAD} for i in range(n)]


def big_message(batch):
    return sum(len(bson.encode(d)) for d in batch) > 48_000_000


@pytest.mark.parametrize("sharded", [False, True], ids=["unsharded", "sharded"])
@pytest.mark.parametrize("ordered", [True, False], ids=["ordered", "unordered"])
def test_insert_many_of_200k_documents_of_500_bytes(cluster, sharded, ordered):
    name = f"big_{'s' if sharded else 'u'}_{'o' if ordered else 'n'}"
    if sharded:
        cluster.shard_collection(f"db.{name}", {"k": 1}, split_points=[{"k": N // 2}],
                                 shards=["shard-a", "shard-b"])
    batch = docs()
    assert big_message(batch)  # the case that failed: more than one shard command's worth
    c = cluster.proxy_client(0).db[name]
    r = c.insert_many(batch, ordered=ordered)
    assert len(r.inserted_ids) == N
    assert c.count_documents({}) == N
    # every document exactly once, where it belongs
    per_shard = [cluster.shard_client(s).db[name].count_documents({}) for s in ("shard-a", "shard-b")]
    assert sum(per_shard) == N
    if sharded:
        assert per_shard == [N // 2, N // 2]
    if ordered:
        # inserting them all again stops at the first duplicate (the unordered case, where
        # every document fails, is the test below, within one command's reply)
        with pytest.raises(BulkWriteError) as e:
            c.insert_many(batch, ordered=True)
        errs = e.value.details["writeErrors"]
        assert e.value.details["nInserted"] == 0
        assert [(x["index"], x["code"]) for x in errs] == [(0, 11000)]
        assert c.count_documents({}) == N


def test_reply_with_100000_write_errors_stays_under_16_mib(cluster):
    """One insert command of 100,000 (maxWriteBatchSize) duplicates: the reply carries every
    writeError, its errmsgs truncated to "" past 1 MiB as mongod does, under 16 MiB."""
    db = cluster.proxy_client(0).db
    n = 100_000
    db.dups.insert_many([{"_id": i} for i in range(n)])
    reply = db.command("insert", "dups", documents=[{"_id": i} for i in range(n)],
                       ordered=False, check=False)
    assert reply["ok"] == 1.0, {k: v for k, v in reply.items() if k != "writeErrors"}
    assert reply["n"] == 0
    errs = reply["writeErrors"]
    assert len(errs) == n
    assert [x["index"] for x in errs] == list(range(n))
    assert all(x["code"] == 11000 for x in errs)
    assert len(bson.encode(reply)) < 16 * 1024 * 1024
    with_msg = [x for x in errs if x["errmsg"]]
    assert 0 < len(with_msg) < n
    assert sum(len(x["errmsg"]) for x in with_msg) >= 1024 * 1024 - 1024
    assert all(x["errmsg"] == "" for x in errs[len(with_msg):])
