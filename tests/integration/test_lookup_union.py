"""$unionWith and $lookup (issue #20, MongoDB 6.0's document_source_union_with.cpp and
document_source_lookup.cpp): on a shard (the foreign collection read from the same shard in
the same read transaction), through a proxy with the main and foreign collections unsharded
(the whole pipeline goes to the primary shard), sharded over three shards (the proxy runs the
stage and reads the foreign collection through its own routing) and mixed; the equality,
pipeline (let/$$var) and combined forms of $lookup, $unionWith with a sub-pipeline, nested
stages, and the argument errors with mongod's codes."""
import pymongo
import pytest
from pymongo.errors import OperationFailure

from proxy_helpers import ProxyCluster

A = [{"_id": 1, "x": 1}, {"_id": 2, "x": 2}, {"_id": 3, "x": [1, 3]}, {"_id": 4},
     {"_id": 5, "x": None}]
B = [{"_id": 10, "k": 1, "n": "one"}, {"_id": 11, "k": 2, "n": "two"},
     {"_id": 12, "k": 1, "n": "uno"}, {"_id": 13, "n": "nok"}, {"_id": 14, "k": None, "n": "null"},
     {"_id": 15, "k": [3, 4], "n": "arr"}]
C = [{"_id": 100, "k": 2, "tag": "c2"}, {"_id": 101, "k": 1, "tag": "c1"}]


def agg(coll, pipeline, **kw):
    return list(coll.aggregate(pipeline, **kw))


def code_of(coll, pipeline):
    with pytest.raises(OperationFailure) as e:
        agg(coll, pipeline)
    return e.value.code


def ids_of(out, field="m"):
    """{_id: sorted ids of the array field} of each output document."""
    return {d["_id"]: sorted(x["_id"] for x in d[field]) for d in out}


def check_union(db):
    a = db.a
    # the input's documents first, then the foreign collection's
    assert agg(a, [{"$sort": {"_id": 1}}, {"$project": {"_id": 1}},
                   {"$unionWith": {"coll": "b", "pipeline": [{"$sort": {"_id": 1}},
                                                              {"$project": {"n": 1}}]}}]) == [
        {"_id": 1}, {"_id": 2}, {"_id": 3}, {"_id": 4}, {"_id": 5},
        {"_id": 10, "n": "one"}, {"_id": 11, "n": "two"}, {"_id": 12, "n": "uno"},
        {"_id": 13, "n": "nok"}, {"_id": 14, "n": "null"}, {"_id": 15, "n": "arr"}]
    # the string form; a stage after it sees both collections
    assert sorted(d["_id"] for d in agg(a, [{"$unionWith": "b"}])) == [
        1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15]
    assert agg(a, [{"$unionWith": "b"}, {"$group": {"_id": None, "n": {"$sum": 1}}}]) == [
        {"_id": None, "n": 11}]
    # a sub-pipeline with a $match and $project
    assert sorted(agg(a, [{"$match": {"_id": 1}}, {"$project": {"_id": 1}},
                          {"$unionWith": {"coll": "b", "pipeline": [
                              {"$match": {"k": 1}}, {"$project": {"_id": 1}}]}}]),
                  key=lambda d: d["_id"]) == [{"_id": 1}, {"_id": 10}, {"_id": 12}]
    # nested: a's 1, b's 10, c's 101 (sub-pipeline of the sub-pipeline)
    assert sorted(agg(a, [{"$match": {"_id": 1}}, {"$project": {"_id": 1}},
                          {"$unionWith": {"coll": "b", "pipeline": [
                              {"$match": {"_id": 10}}, {"$project": {"_id": 1}},
                              {"$unionWith": {"coll": "c", "pipeline": [
                                  {"$match": {"k": 1}}, {"$project": {"_id": 1}}]}}]}}]),
                  key=lambda d: d["_id"]) == [{"_id": 1}, {"_id": 10}, {"_id": 101}]
    # a missing collection adds nothing; the union with itself doubles
    assert len(agg(a, [{"$unionWith": "nosuch"}])) == 5
    assert len(agg(a, [{"$unionWith": "a"}])) == 10
    # inside $facet
    assert agg(a, [{"$facet": {"n": [{"$unionWith": "c"}, {"$count": "n"}]}}]) == [
        {"n": [{"n": 7}]}]
    # the command's let is seen by the sub-pipeline
    assert agg(a, [{"$match": {"_id": 1}}, {"$project": {"_id": 1}},
                   {"$unionWith": {"coll": "c", "pipeline": [
                       {"$match": {"$expr": {"$eq": ["$k", "$$want"]}}},
                       {"$project": {"_id": 1}}]}}], let={"want": 2}) == [
        {"_id": 1}, {"_id": 100}]


def check_union_errors(db):
    a = db.a
    u = lambda spec: [{"$unionWith": spec}]  # noqa: E731
    assert code_of(a, u(1)) == 9
    assert code_of(a, u({"coll": 1})) == 14
    assert code_of(a, u({"coll": "b", "pipeline": 1})) == 14
    assert code_of(a, u({"coll": "b", "pipeline": [1]})) == 14
    assert code_of(a, u({"coll": "b", "bogus": 1})) == 40415
    assert code_of(a, u({})) == 9
    assert code_of(a, u({"pipeline": [{"$match": {}}]})) == 9
    assert code_of(a, u({"pipeline": [{"$documents": [{"a": 1}]}]})) == 238
    assert code_of(a, u({"coll": "b", "pipeline": [{"$out": "z"}]})) == 31441
    assert code_of(a, u({"coll": "b", "pipeline": [{"$bogus": 1}]})) == 40324
    assert code_of(a, u({"coll": "b", "pipeline": [
        {"$unionWith": {"coll": "c", "pipeline": [{"$limit": -1}]}}]})) == 15958


def load(db):
    db.a.insert_many(A)
    db.b.insert_many(B)
    db.c.insert_many(C)


def test_union_with_on_a_shard(shard):
    _, port = shard
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true")
    try:
        load(c.lk)
        check_union(c.lk)
        check_union_errors(c.lk)
    finally:
        c.close()


def test_union_with_through_a_proxy(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=3, proxies=1)
    try:
        # sharded a/b/c over the three shards; ua/ub/uc unsharded (on the primary)
        cl.shard_collection("lk.a", {"_id": 1}, split_points=[{"_id": 2}, {"_id": 4}])
        cl.shard_collection("lk.b", {"_id": 1}, split_points=[{"_id": 12}, {"_id": 14}])
        cl.shard_collection("lk.c", {"_id": 1}, split_points=[{"_id": 101}])
        db = cl.proxy_client(0).lk
        load(db)
        for sid in cl.shard_ids:
            assert cl.shard_client(sid).lk.a.count_documents({}) > 0, sid
            assert cl.shard_client(sid).lk.b.count_documents({}) > 0, sid
        # every collection sharded: the proxy runs the stages
        check_union(db)
        check_union_errors(db)
        # every collection unsharded: the primary shard runs the whole pipeline
        u = cl.proxy_client(0).lku
        load(u)
        check_union(u)
        check_union_errors(u)
        # mixed: sharded main, unsharded foreign and the reverse
        cl.shard_collection("lkm.a", {"_id": 1}, split_points=[{"_id": 2}, {"_id": 4}])
        cl.shard_collection("lkm.c", {"_id": 1}, split_points=[{"_id": 101}])
        m = cl.proxy_client(0).lkm
        load(m)
        check_union(m)
        assert sorted(d["_id"] for d in agg(m.b, [{"$unionWith": "a"}])) == [
            1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15]
        assert agg(m.b, [{"$match": {"_id": {"$gte": 14}}}, {"$sort": {"_id": -1}},
                         {"$project": {"_id": 1}},
                         {"$unionWith": {"coll": "a", "pipeline": [
                             {"$sort": {"_id": 1}}, {"$project": {"_id": 1}}]}}]) == [
            {"_id": 15}, {"_id": 14}, {"_id": 1}, {"_id": 2}, {"_id": 3}, {"_id": 4},
            {"_id": 5}]
    finally:
        cl.close()
