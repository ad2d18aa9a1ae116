"""Read preferences through the proxy (issue #15): a read with readPreference secondary
(or secondaryPreferred, nearest) is forwarded with it and served by a secondary of the
shard's replica set (src/proxy/readpref.c, shardconn.c server selection); a read without
one, and every write, goes to the primary; maxStalenessSeconds and tag sets are refused
with BadValue rather than ignored.

Which member answered is read from each member's own command counters
(stripedb_shard_commands_total{cmd="find"} on its /metrics).
"""
import bson
import pymongo
import pytest
from pymongo.errors import OperationFailure
from pymongo.read_preferences import Secondary

from conftest import free_port, wait_until
from metadata_cluster import Cluster
from test_shard_members import _metrics
from test_shard_replset import primary_index, start_set

FIND = "stripedb_shard_commands_total[('cmd', 'find'), ('role', 'shard')]"


def finds(procs):
    return [_metrics(p.http_port).get(FIND, 0) for p in procs]


@pytest.fixture
def cluster(start_role, tmp_path):
    procs, wires, rs_uri = start_set(start_role, tmp_path)
    meta = Cluster(start_role, tmp_path, 1)
    meta.leader()
    meta.write({"addShard": "shard-a", "uri": rs_uri})
    port = free_port()
    start_role(["--role=proxy", f"--listen=127.0.0.1:{port}", f"--metadata={meta.seeds()}"])
    uri = f"mongodb://127.0.0.1:{port}/"
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=20000) as c:
        wait_until(lambda: c.app.c.insert_many([{"_id": i} for i in range(10)]), 30,
                   what="a first write through the proxy")
    return procs, wires, uri


def test_secondary_read_through_the_proxy_is_served_by_a_secondary(cluster):
    procs, wires, uri = cluster
    pi = primary_index(wires)
    with pymongo.MongoClient(uri, readPreference="secondary") as c:
        def served_by_secondary():
            before = finds(procs)
            docs = list(c.app.c.find({}, sort=[("_id", 1)]))
            after = finds(procs)
            grew = [a - b for a, b in zip(after, before)]
            return len(docs) == 10 and grew[pi] == 0 and sum(grew) >= 1
        # a secondary may still be applying the first writes: poll until it has them all
        wait_until(served_by_secondary, 20, interval=0.2,
                   what="a secondary answering the find with every document")
        # count and aggregate follow it too; the answers are complete
        assert c.app.c.count_documents({}) == 10
        assert len(list(c.app.c.aggregate([{"$match": {}}]))) == 10
    # without a read preference the primary answers
    with pymongo.MongoClient(uri) as c:
        before = finds(procs)
        assert len(list(c.app.c.find({}))) == 10
        grew = [a - b for a, b in zip(finds(procs), before)]
        assert grew[pi] >= 1 and sum(grew) == grew[pi], grew
        # a write with a secondary read preference on the collection still goes to the
        # primary and is acknowledged
        c.app.get_collection("c", read_preference=Secondary()).insert_one({"_id": 99})
        assert c.app.c.count_documents({"_id": 99}) == 1


def test_max_staleness_and_tag_sets_are_refused(cluster):
    procs, wires, uri = cluster
    with pymongo.MongoClient(uri) as c:
        for rp, what in (({"mode": "secondary", "maxStalenessSeconds": 120},
                          "maxStalenessSeconds is not supported"),
                         ({"mode": "secondary", "tags": [{"dc": "east"}]},
                          "tag sets are not supported"),
                         ({"mode": "sideways"}, "Could not parse $readPreference")):
            with pytest.raises(OperationFailure) as ei:
                c.app.command({"find": "c", "filter": {}, "$readPreference": rp})
            assert what in str(ei.value), ei.value
            assert ei.value.code == (9 if rp["mode"] == "sideways" else 2)
        # an empty tag set and maxStalenessSeconds -1 mean "none": accepted
        r = c.app.command({"find": "c", "filter": {},
                           "$readPreference": {"mode": "nearest", "tags": [{}],
                                               "maxStalenessSeconds": -1}})
        assert r["ok"] == 1


def test_read_concern_is_forwarded_to_the_shard_not_dropped(cluster):
    """issue #20: the proxy used to drop every readConcern, so a linearizable or snapshot
    read through it was silently a plain read. It now reaches the shard, which applies or
    refuses it with the codes it answers directly."""
    _, _, uri = cluster
    with pymongo.MongoClient(uri) as c:
        db = c.app
        for rc, code in (({"level": "linearizable"}, 72), ({"level": "snapshot"}, 72),
                         ({"level": "majority", "atClusterTime": bson.Timestamp(1, 1)}, 72),
                         ({"level": "sideways"}, 9)):
            for cmd in ({"find": "c", "filter": {}}, {"count": "c"},
                        {"aggregate": "c", "pipeline": [], "cursor": {}},
                        {"distinct": "c", "key": "_id"}):
                with pytest.raises(OperationFailure) as e:
                    db.command(dict(cmd, readConcern=rc))
                assert e.value.code == code, (rc, cmd, e.value.details)
        # the levels a shard serves answer as before
        for level in ("local", "majority", "available"):
            assert len(db.command({"find": "c", "filter": {},
                                   "readConcern": {"level": level}})["cursor"]["firstBatch"]) == 10
        # a causally consistent session's reads (afterClusterTime) through the proxy
        with c.start_session(causal_consistency=True) as s:
            db.c.insert_one({"_id": 100}, session=s)
            assert db.c.find_one({"_id": 100}, session=s) == {"_id": 100}
            assert db.c.count_documents({}, session=s) == 11
