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

from conftest import wait_until
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


def check_lookup(db):
    a = db.a
    eq = {"from": "b", "localField": "x", "foreignField": "k", "as": "m"}
    # equality: an array local value matches any element (3 -> b's k: [3, 4]); missing and
    # null match a foreign k that is null or missing
    out = agg(a, [{"$sort": {"_id": 1}}, {"$lookup": eq}])
    assert [d["_id"] for d in out] == [1, 2, 3, 4, 5]
    assert ids_of(out) == {1: [10, 12], 2: [11], 3: [10, 12, 15], 4: [13, 14], 5: [13, 14]}
    # the other fields are kept; the matches are whole documents
    one = [d for d in out if d["_id"] == 2][0]
    assert one == {"_id": 2, "x": 2, "m": [{"_id": 11, "k": 2, "n": "two"}]}
    # the reverse direction: a foreign array field matches a local scalar
    out = agg(db.b, [{"$match": {"_id": {"$in": [11, 15]}}},
                     {"$lookup": {"from": "a", "localField": "k", "foreignField": "x",
                                  "as": "m"}}])
    assert ids_of(out) == {11: [2], 15: [3]}
    # a dotted `as`, a stage after it, no match gives []
    out = agg(a, [{"$match": {"_id": 2}},
                  {"$lookup": {"from": "c", "localField": "x", "foreignField": "tag",
                               "as": "j.none"}},
                  {"$project": {"_id": 1, "j": 1}}])
    assert out == [{"_id": 2, "j": {"none": []}}]
    # pipeline form: let variables read with $$ inside $expr
    out = agg(a, [{"$match": {"_id": {"$in": [1, 2, 3]}}},
                  {"$lookup": {"from": "b", "let": {"xv": "$x"}, "as": "m", "pipeline": [
                      {"$match": {"$expr": {"$eq": ["$k", "$$xv"]}}},
                      {"$project": {"_id": 1}}]}}])
    assert ids_of(out) == {1: [10, 12], 2: [11], 3: []}
    # let with an expression and the command's let next to it
    out = agg(a, [{"$match": {"_id": 1}},
                  {"$lookup": {"from": "c", "let": {"want": {"$add": ["$x", 1]}}, "as": "m",
                               "pipeline": [
                                   {"$match": {"$expr": {"$and": [
                                       {"$eq": ["$k", "$$want"]}, {"$eq": ["$tag", "$$tg"]}]}}},
                                   {"$project": {"tag": 1, "_id": 0}}]}}],
              let={"tg": "c2"})
    assert out == [{"_id": 1, "x": 1, "m": [{"tag": "c2"}]}]
    # uncorrelated pipeline: every document gets the same array
    out = agg(a, [{"$match": {"_id": {"$in": [1, 4]}}},
                  {"$lookup": {"from": "c", "as": "m", "pipeline": [
                      {"$sort": {"_id": 1}}, {"$project": {"_id": 1}}]}}])
    assert {d["_id"]: d["m"] for d in out} == {1: [{"_id": 100}, {"_id": 101}],
                                                4: [{"_id": 100}, {"_id": 101}]}
    # 5.0's combined form: the equality first, then the pipeline
    out = agg(a, [{"$match": {"_id": 1}},
                  {"$lookup": {"from": "b", "localField": "x", "foreignField": "k", "as": "m",
                               "pipeline": [{"$project": {"_id": 0, "n": 1}},
                                            {"$sort": {"n": 1}}]}}])
    assert out == [{"_id": 1, "x": 1, "m": [{"n": "one"}, {"n": "uno"}]}]
    # nested: a $lookup inside the $lookup's pipeline, and inside a $unionWith's
    out = agg(a, [{"$match": {"_id": 2}},
                  {"$lookup": {"from": "b", "localField": "x", "foreignField": "k", "as": "m",
                               "pipeline": [
                                   {"$lookup": {"from": "c", "localField": "k",
                                                "foreignField": "k", "as": "cc"}},
                                   {"$project": {"_id": 1, "tags": "$cc.tag"}}]}}])
    assert out == [{"_id": 2, "x": 2, "m": [{"_id": 11, "tags": ["c2"]}]}]
    out = agg(a, [{"$match": {"_id": 1}}, {"$project": {"_id": 1}},
                  {"$unionWith": {"coll": "c", "pipeline": [
                      {"$match": {"_id": 101}},
                      {"$lookup": {"from": "b", "localField": "k", "foreignField": "k",
                                   "as": "bb"}},
                      {"$project": {"_id": 1, "n": "$bb.n"}}]}}])
    out = sorted(out, key=lambda d: d["_id"])
    out[1]["n"].sort()
    assert out == [{"_id": 1}, {"_id": 101, "n": ["one", "uno"]}]
    # a missing foreign collection: every array is empty
    assert agg(a, [{"$match": {"_id": 1}},
                   {"$lookup": {"from": "nosuch", "localField": "x", "foreignField": "k",
                                "as": "m"}}]) == [{"_id": 1, "x": 1, "m": []}]
    # with an index on the foreign field: the same matches
    db.b.create_index("k")
    out = agg(a, [{"$sort": {"_id": 1}}, {"$lookup": eq}])
    assert ids_of(out) == {1: [10, 12], 2: [11], 3: [10, 12, 15], 4: [13, 14], 5: [13, 14]}
    db.b.drop_index("k_1")
    # after $unwind: one output per match
    out = agg(a, [{"$match": {"_id": 3}}, {"$lookup": eq}, {"$unwind": "$m"},
                  {"$project": {"_id": 0, "n": "$m.n"}}])
    assert sorted(d["n"] for d in out) == ["arr", "one", "uno"]


def check_lookup_errors(db):
    a = db.a
    lk = lambda spec: [{"$lookup": spec}]  # noqa: E731
    assert code_of(a, lk(1)) == 9
    assert code_of(a, lk({"from": "b", "localField": "x", "foreignField": "k"})) == 9
    assert code_of(a, lk({"from": 1, "localField": "x", "foreignField": "k", "as": "m"})) == 9
    assert code_of(a, lk({"from": "b", "localField": 1, "foreignField": "k", "as": "m"})) == 9
    assert code_of(a, lk({"from": "b", "localField": "x", "foreignField": "k", "as": "m",
                          "bogus": 1})) == 9
    assert code_of(a, lk({"from": "b", "localField": "x", "as": "m"})) == 9
    assert code_of(a, lk({"from": "b", "as": "m"})) == 9
    assert code_of(a, lk({"from": "b", "localField": "x", "as": "m", "pipeline": []})) == 9
    assert code_of(a, lk({"from": "b", "localField": "x", "foreignField": "k", "as": "m",
                          "let": {"v": 1}})) == 9
    assert code_of(a, lk({"from": "b", "as": "m", "let": 1, "pipeline": []})) == 9
    assert code_of(a, lk({"from": "b", "as": "m", "pipeline": 1})) == 9
    assert code_of(a, lk({"from": "b", "as": "m", "pipeline": [1]})) == 9
    assert code_of(a, lk({"as": "m", "pipeline": [{"$match": {}}]})) == 9
    assert code_of(a, lk({"as": "m", "pipeline": [{"$documents": [{}]}]})) == 238
    assert code_of(a, lk({"from": "b", "as": "m", "let": {"Bad": 1}, "pipeline": []})) == 16867
    assert code_of(a, lk({"from": "b", "as": "m", "pipeline": [{"$out": "z"}]})) == 51047
    assert code_of(a, lk({"from": "b", "as": "m", "pipeline": [
        {"$match": {"$expr": {"$eq": ["$k", "$$nope"]}}}]})) == 17276
    assert code_of(a, lk({"from": "b", "as": "$m", "localField": "x",
                          "foreignField": "k"})) == 16410
    # an error in the sub-pipeline at run time reaches the client
    assert code_of(a, lk({"from": "b", "as": "m", "let": {"xv": "$x"}, "pipeline": [
        {"$project": {"q": {"$divide": [1, 0]}}}]})) == 16608


def nested(depth, stage="$lookup", leaf=None):
    """A pipeline of `depth` nested $lookup (or $unionWith) sub-pipelines over b, each
    level reading one document of b, the innermost holding leaf (default a $match)."""
    one = {"$match": {"_id": 10}}
    inner = leaf or [one]
    for _ in range(depth):
        if stage == "$lookup":
            inner = [{"$lookup": {"from": "b", "pipeline": [one] + inner, "as": "m"}}]
        else:
            inner = [one, {"$unionWith": {"coll": "b", "pipeline": inner}}]
    return inner


def check_depth(db):
    """mongod's bound of 20 nested sub-pipelines (232 MaxSubPipelineDepthExceeded beyond),
    $facet levels not counted."""
    for stage in ("$lookup", "$unionWith"):
        assert len(agg(db.a, [{"$match": {"_id": 1}}] + nested(20, stage))) >= 1
        with pytest.raises(OperationFailure) as e:
            agg(db.a, [{"$match": {"_id": 1}}] + nested(21, stage))
        assert e.value.code == 232, e.value.details
        assert "Limit is 20" in e.value.details["errmsg"]
    # a $graphLookup at depth 21 too
    with pytest.raises(OperationFailure) as e:
        agg(db.a, nested(20, leaf=[{"$graphLookup": {
            "from": "b", "startWith": "$k", "connectFromField": "k", "connectToField": "k",
            "as": "g"}}]))
    assert e.value.code == 232, e.value.details
    # 20 levels, each $lookup inside a $facet (40 levels of pipelines), the innermost
    # reading c: runs (through a proxy the placement walk sees c at the bottom)
    inner = [{"$lookup": {"from": "c", "pipeline": [{"$match": {"_id": 101}}], "as": "m"}}]
    for _ in range(19):
        inner = [{"$match": {"_id": 10}},
                 {"$facet": {"f": [{"$lookup": {"from": "b", "pipeline": inner, "as": "m"}}]}}]
    out = agg(db.b, inner)
    assert len(out) == 1
    d = out[0]
    for _ in range(19):
        d = d["f"][0]["m"][0]
    assert [x["_id"] for x in d["m"]] == [101]


def load(db):
    db.a.insert_many(A)
    db.b.insert_many(B)
    db.c.insert_many(C)


def test_union_with_and_lookup_on_a_shard(shard):
    _, port = shard
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true")
    try:
        load(c.lk)
        check_union(c.lk)
        check_union_errors(c.lk)
        check_lookup(c.lk)
        check_lookup_errors(c.lk)
        check_depth(c.lk)
    finally:
        c.close()


def test_union_with_and_lookup_through_a_proxy(start_role, tmp_path):
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
        check_lookup(db)
        check_lookup_errors(db)
        check_depth(db)
        # every collection unsharded: the primary shard runs the whole pipeline
        u = cl.proxy_client(0).lku
        load(u)
        check_union(u)
        check_union_errors(u)
        check_lookup(u)
        check_lookup_errors(u)
        check_depth(u)
        # mixed: sharded main, unsharded foreign and the reverse
        cl.shard_collection("lkm.a", {"_id": 1}, split_points=[{"_id": 2}, {"_id": 4}])
        cl.shard_collection("lkm.c", {"_id": 1}, split_points=[{"_id": 101}])
        m = cl.proxy_client(0).lkm
        load(m)
        check_union(m)
        check_lookup(m)
        # b unsharded, c (read 40 levels down) sharded: the placement walk sees it
        check_depth(m)
        assert sorted(d["_id"] for d in agg(m.b, [{"$unionWith": "a"}])) == [
            1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15]
        assert agg(m.b, [{"$match": {"_id": {"$gte": 14}}}, {"$sort": {"_id": -1}},
                         {"$project": {"_id": 1}},
                         {"$unionWith": {"coll": "a", "pipeline": [
                             {"$sort": {"_id": 1}}, {"$project": {"_id": 1}}]}}]) == [
            {"_id": 15}, {"_id": 14}, {"_id": 1}, {"_id": 2}, {"_id": 3}, {"_id": 4},
            {"_id": 5}]
        # {aggregate: 1}: a $documents pipeline may union an unsharded collection (the primary
        # shard runs it); a sharded one is refused (238)
        assert agg(u, [{"$documents": [{"_id": 0}]},
                       {"$unionWith": {"coll": "c", "pipeline": [{"$sort": {"_id": 1}}]}},
                       {"$project": {"_id": 1}}]) == [{"_id": 0}, {"_id": 100}, {"_id": 101}]
        with pytest.raises(OperationFailure) as e:
            agg(db, [{"$documents": [{"_id": 0}]}, {"$unionWith": "c"}])
        assert e.value.code == 238
        # a foreign side larger than one batch (the proxy's sub-aggregate drains its cursor
        # with getMores): 250 documents over three shards, unioned and looked up
        cl.shard_collection("lk.big", {"_id": 1}, split_points=[{"_id": 80}, {"_id": 160}])
        db.big.insert_many([{"_id": i, "g": i % 2} for i in range(250)])
        assert agg(db.a, [{"$match": {"_id": 1}}, {"$unionWith": "big"}, {"$count": "n"}]) == [
            {"n": 251}]
        # an unsharded main collection (lkm.b) with the sharded big one
        cl.shard_collection("lkm.big", {"_id": 1}, split_points=[{"_id": 80}, {"_id": 160}])
        m.big.insert_many([{"_id": i, "g": i % 2} for i in range(250)])
        assert agg(m.b, [{"$match": {"_id": 10}}, {"$unionWith": {"coll": "big", "pipeline": [
            {"$match": {"_id": {"$gte": 5}}}]}}, {"$count": "n"}]) == [{"n": 246}]
        out = agg(db.a, [{"$match": {"_id": {"$in": [1, 2]}}}, {"$sort": {"_id": 1}},
                         {"$lookup": {"from": "big", "localField": "x", "foreignField": "g",
                                      "as": "m"}},
                         {"$project": {"n": {"$size": "$m"}}}])
        assert out == [{"_id": 1, "n": 125}, {"_id": 2, "n": 0}]
        # inside a transaction: unsharded collections (one shard, the primary, runs it in
        # the transaction's snapshot); with sharded ones the foreign read reaches other
        # shards, which a transaction may not (stripedb's transactions are single-shard: 263)
        client = cl.proxy_client(0)
        with client.start_session() as s:
            with s.start_transaction():
                out = list(client.lku.a.aggregate(
                    [{"$match": {"_id": 2}}, {"$lookup": {
                        "from": "b", "localField": "x", "foreignField": "k", "as": "m"}},
                     {"$project": {"ids": "$m._id"}}], session=s))
        assert out == [{"_id": 2, "ids": [11]}]
        with client.start_session() as s:
            with pytest.raises(OperationFailure) as e:
                with s.start_transaction():
                    # the main read targets one shard, the foreign one all three
                    list(client.lk.a.aggregate([{"$match": {"_id": 1}}, {"$unionWith": "b"}],
                                               session=s))
            assert e.value.code == 263
    finally:
        cl.close()


def test_foreign_collection_needs_find(start_role, tmp_path):
    """With authentication the proxy's gate requires find on every collection a pipeline
    names: a $lookup/$unionWith of a collection the tenant may not read is Unauthorized (13),
    nested ones included; of a readable one it works."""
    cl = ProxyCluster(start_role, tmp_path, shards=1, proxies=1, proxy_args=["--auth=enabled"])
    try:
        cl.meta_cmd({"createTenant": "A"})
        cl.create_database("adb", tenant="A")
        cl.meta_cmd({"createUser": "alice", "tenant": "A", "password": "alice-pw"})
        alice = cl.proxy_client(0, username="alice", password="alice-pw", authSource="admin")
        wait_until(lambda: alice.adb.c.insert_many([{"_id": 1, "x": 1}]), 20,
                   what="alice's first write")
        alice.adb.secret.insert_one({"_id": 1, "k": 1})
        cl.meta_cmd({"setPolicy": "A", "policy": {"collections": {
            "adb.secret": {"actions": ["insert"]}}}})

        def code(pipeline):
            try:
                list(alice.adb.c.aggregate(pipeline))
            except OperationFailure as e:
                return e.code
            return None
        wait_until(lambda: code([{"$unionWith": "secret"}]) == 13, 15,
                   what="the policy to be loaded")
        assert code([{"$lookup": {"from": "secret", "localField": "x", "foreignField": "k",
                                  "as": "m"}}]) == 13
        assert code([{"$unionWith": {"coll": "c", "pipeline": [
            {"$lookup": {"from": "secret", "pipeline": [], "as": "m"}}]}}]) == 13
        assert list(alice.adb.c.aggregate([{"$lookup": {
            "from": "c", "localField": "x", "foreignField": "x", "as": "m"}}])) == [
            {"_id": 1, "x": 1, "m": [{"_id": 1, "x": 1}]}]
    finally:
        cl.close()
