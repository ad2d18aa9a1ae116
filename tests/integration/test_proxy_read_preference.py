"""Read preferences through the proxy (issue #15): a read with readPreference secondary
(or secondaryPreferred, nearest) is forwarded with it and served by a secondary of the
shard's replica set (src/proxy/readpref.c, shardconn.c server selection); a read without
one, and every write, goes to the primary; tag sets are refused with BadValue rather than
ignored; maxStalenessSeconds is validated as mongos does and honoured by reading from the
primary (no secondary's staleness is known), refused with mode secondary.

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
        for rp, what, code in (
                ({"mode": "secondary", "maxStalenessSeconds": 120},
                 "maxStalenessSeconds with mode secondary is not supported", 2),
                ({"mode": "primary", "maxStalenessSeconds": 120},
                 "mode primary cannot be combined with 'maxStalenessSeconds'", 2),
                ({"mode": "nearest", "maxStalenessSeconds": 89},
                 "maxStalenessSeconds value cannot be less than 90", 160),
                ({"mode": "nearest", "maxStalenessSeconds": -5},
                 "maxStalenessSeconds must be a non-negative integer", 2),
                # read as a double, never truncated first (review: -0.5 was taken for
                # "none", NaN for a huge negative)
                ({"mode": "nearest", "maxStalenessSeconds": 89.5},
                 "maxStalenessSeconds value cannot be less than 90", 160),
                ({"mode": "nearest", "maxStalenessSeconds": -0.5},
                 "maxStalenessSeconds must be a non-negative integer", 2),
                ({"mode": "nearest", "maxStalenessSeconds": float("nan")},
                 "maxStalenessSeconds must be a non-negative integer", 2),
                ({"mode": "nearest", "maxStalenessSeconds": "x"},
                 "maxStalenessSeconds field must be a number", 9),
                ({"mode": "secondary", "tags": [{"dc": "east"}]},
                 "tag sets are not supported", 2),
                ({"mode": "sideways"}, "Could not parse $readPreference", 9)):
            with pytest.raises(OperationFailure) as ei:
                c.app.command({"find": "c", "filter": {}, "$readPreference": rp})
            assert what in str(ei.value), ei.value
            assert ei.value.code == code, ei.value
        # an empty tag set and maxStalenessSeconds -1 mean "none": accepted
        r = c.app.command({"find": "c", "filter": {},
                           "$readPreference": {"mode": "nearest", "tags": [{}],
                                               "maxStalenessSeconds": -1}})
        assert r["ok"] == 1


def test_max_staleness_reads_from_the_primary(cluster):
    """maxStalenessSeconds with secondaryPreferred, primaryPreferred or nearest: the shards
    report no last write time, so no secondary is known to be within the bound and the
    primary (never stale) serves the read, as the Max Staleness spec selects when every
    secondary is too stale; an aggregate with $out/$merge too (MongoDB 5.0+ drivers send
    their read preference with it; the CRUD spec's aggregate-write-readPreference.json)."""
    procs, wires, uri = cluster
    pi = primary_index(wires)
    with pymongo.MongoClient(uri) as c:
        for mode in ("secondaryPreferred", "primaryPreferred", "nearest"):
            rp = {"mode": mode, "maxStalenessSeconds": 600}
            for _ in range(5):
                before = finds(procs)
                r = c.app.command({"find": "c", "filter": {}, "$readPreference": rp})
                assert len(r["cursor"]["firstBatch"]) == 10
                grew = [a - b for a, b in zip(finds(procs), before)]
                assert grew[pi] == 1 and sum(grew) == 1, (mode, grew)
        for stage in ({"$out": "o"}, {"$merge": {"into": "m"}}):
            r = c.app.command({"aggregate": "c", "pipeline": [{"$match": {"_id": {"$gt": 4}}},
                                                              stage], "cursor": {},
                               "$readPreference": {"mode": "secondaryPreferred",
                                                   "maxStalenessSeconds": 600}})
            assert r["ok"] == 1
        assert c.app.o.count_documents({}) == 5 and c.app.m.count_documents({}) == 5


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
