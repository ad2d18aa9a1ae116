"""$graphLookup (issue #20, MongoDB 6.0's document_source_graph_lookup.cpp): on a shard (the
foreign collection read from the same shard in the same read transaction, one read per
round of the search), through a proxy with every collection unsharded (the whole pipeline
goes to the primary shard), sharded over three shards (the proxy runs the stage and reads
the foreign collection through its own routing, as mongos 5.1+ allows) and mixed. The
MongoDB manual's examples (employees/reportsTo, airports with maxDepth and depthField,
restrictSearchWithMatch), cycles, arrays, null, a view as `from`, $graphLookup inside $facet
and inside a $lookup sub-pipeline, and the argument errors with mongod's codes. mongod's
result order is unspecified, so the results are compared as sets."""
import pymongo
import pytest
from bson.int64 import Int64
from pymongo.errors import OperationFailure

from conftest import wait_until
from proxy_helpers import ProxyCluster

EMP = [{"_id": 1, "name": "Dev"}, {"_id": 2, "name": "Eliot", "reportsTo": "Dev"},
       {"_id": 3, "name": "Ron", "reportsTo": "Eliot"},
       {"_id": 4, "name": "Andrew", "reportsTo": "Eliot"},
       {"_id": 5, "name": "Asya", "reportsTo": "Ron"},
       {"_id": 6, "name": "Dan", "reportsTo": "Andrew"}]
AIR = [{"_id": 0, "airport": "JFK", "connects": ["BOS", "ORD"]},
       {"_id": 1, "airport": "BOS", "connects": ["JFK", "PWM"]},
       {"_id": 2, "airport": "ORD", "connects": ["JFK"]},
       {"_id": 3, "airport": "PWM", "connects": ["BOS", "LHR"]},
       {"_id": 4, "airport": "LHR", "connects": ["PWM"]}]
TRAV = [{"_id": 1, "name": "Dev", "nearestAirport": "JFK"},
        {"_id": 2, "name": "Eliot", "nearestAirport": "JFK"},
        {"_id": 3, "name": "Jeff", "nearestAirport": "BOS"}]
PPL = [{"_id": 1, "name": "Tanya Jordan", "friends": ["Shirley Soto", "Terry Hawkins", "Carole Hale"],
        "hobbies": ["tennis", "unicycling", "golf"]},
       {"_id": 2, "name": "Carole Hale", "friends": ["Joseph Dennis", "Tanya Jordan", "Terry Hawkins"],
        "hobbies": ["archery", "golf", "woodworking"]},
       {"_id": 3, "name": "Terry Hawkins", "friends": ["Tanya Jordan", "Carole Hale", "Angelo Ward"],
        "hobbies": ["knitting", "frisbee"]},
       {"_id": 4, "name": "Joseph Dennis", "friends": ["Angelo Ward", "Carole Hale"],
        "hobbies": ["tennis", "golf", "topiary"]},
       {"_id": 5, "name": "Angelo Ward", "friends": ["Terry Hawkins", "Shirley Soto", "Joseph Dennis"],
        "hobbies": ["travel", "ceramics", "golf"]},
       {"_id": 6, "name": "Shirley Soto", "friends": ["Angelo Ward", "Tanya Jordan", "Carole Hale"],
        "hobbies": ["frisbee", "set theory"]}]
# a cycle a -> b -> c -> a, a branch c -> d (an array), numbers (1 and 1.0 are one value),
# a null and a missing `to`
NODES = [{"_id": "a", "to": "b", "v": 1}, {"_id": "b", "to": "c", "v": 2},
         {"_id": "c", "to": ["a", "d"], "v": 3}, {"_id": "d", "v": 4},
         {"_id": "n", "to": None, "v": None}, {"_id": "m", "v": 5.0}]


def agg(coll, pipeline, **kw):
    return list(coll.aggregate(pipeline, **kw))


def code_of(coll, pipeline):
    with pytest.raises(OperationFailure) as e:
        agg(coll, pipeline)
    return e.value.code


def gl(**spec):
    return {"$graphLookup": spec}


def load(db):
    db.emp.insert_many(EMP)
    db.air.insert_many(AIR)
    db.trav.insert_many(TRAV)
    db.ppl.insert_many(PPL)
    db.nodes.insert_many(NODES)


def check_graph(db):
    # the manual's reportsTo hierarchy: everyone above each employee
    out = agg(db.emp, [gl(**{"from": "emp", "startWith": "$reportsTo",
                             "connectFromField": "reportsTo", "connectToField": "name",
                             "as": "h"})])
    assert {d["name"]: sorted(x["name"] for x in d["h"]) for d in out} == {
        "Dev": [], "Eliot": ["Dev"], "Ron": ["Dev", "Eliot"], "Andrew": ["Dev", "Eliot"],
        "Asya": ["Dev", "Eliot", "Ron"], "Dan": ["Andrew", "Dev", "Eliot"]}
    # the whole documents are in `as`, the input document unchanged around it
    out = agg(db.emp, [{"$match": {"_id": 3}},
                       gl(**{"from": "emp", "startWith": "$reportsTo",
                             "connectFromField": "reportsTo", "connectToField": "name",
                             "as": "h"})])
    assert len(out) == 1
    assert {k: v for k, v in out[0].items() if k != "h"} == EMP[2]
    assert sorted(out[0]["h"], key=lambda d: d["_id"]) == [EMP[0], EMP[1]]

    # airports: maxDepth 2 and depthField (a long, from 0), arrays followed element by
    # element, cycles visited once
    out = agg(db.trav, [gl(**{"from": "air", "startWith": "$nearestAirport",
                              "connectFromField": "connects", "connectToField": "airport",
                              "maxDepth": 2, "depthField": "numConnections",
                              "as": "destinations"})])
    got = {d["name"]: sorted((x["airport"], x["numConnections"]) for x in d["destinations"])
           for d in out}
    assert got == {
        "Dev": [("BOS", 1), ("JFK", 0), ("ORD", 1), ("PWM", 2)],
        "Eliot": [("BOS", 1), ("JFK", 0), ("ORD", 1), ("PWM", 2)],
        "Jeff": [("BOS", 0), ("JFK", 1), ("LHR", 2), ("ORD", 2), ("PWM", 1)]}
    assert all(isinstance(x["numConnections"], Int64)
               for d in out for x in d["destinations"])
    # maxDepth 0: the first round only
    out = agg(db.trav, [{"$match": {"_id": 3}},
                        gl(**{"from": "air", "startWith": "$nearestAirport",
                              "connectFromField": "connects", "connectToField": "airport",
                              "maxDepth": 0, "as": "d"}),
                        {"$project": {"a": "$d.airport"}}])
    assert out == [{"_id": 3, "a": ["BOS"]}]
    # no maxDepth: LHR reaches every airport
    out = agg(db.trav, [{"$match": {"_id": 3}},
                        gl(**{"from": "air", "startWith": "LHR",
                              "connectFromField": "connects", "connectToField": "airport",
                              "as": "d"})])
    assert sorted(x["_id"] for x in out[0]["d"]) == [0, 1, 2, 3, 4]

    # restrictSearchWithMatch: only golfers are reached, and followed
    out = agg(db.ppl, [{"$match": {"name": "Tanya Jordan"}},
                       gl(**{"from": "ppl", "startWith": "$friends",
                             "connectFromField": "friends", "connectToField": "name",
                             "as": "golfers", "restrictSearchWithMatch": {"hobbies": "golf"}}),
                       {"$project": {"name": 1, "friends": 1,
                                     "connections_who_play_golf": "$golfers.name"}}])
    assert len(out) == 1
    assert sorted(out[0]["connections_who_play_golf"]) == [
        "Angelo Ward", "Carole Hale", "Joseph Dennis", "Tanya Jordan"]
    assert out[0]["friends"] == PPL[0]["friends"]

    # a cycle: every node once, with the depth it was first reached at; startWith as an
    # array; a missing startWith reaches nothing; null reaches an explicit null only
    def reach(start, **extra):
        spec = {"from": "nodes", "startWith": start, "connectFromField": "to",
                "connectToField": "_id", "as": "r", "depthField": "d"}
        spec.update(extra)
        o = agg(db.emp, [{"$match": {"_id": 1}}, gl(**spec)])
        return sorted((x["_id"], x["d"]) for x in o[0]["r"])
    assert reach("a") == [("a", 0), ("b", 1), ("c", 2), ("d", 3)]
    assert reach("c") == [("a", 1), ("b", 2), ("c", 0), ("d", 1)]
    assert reach(["b", "d", "zz"]) == [("a", 2), ("b", 0), ("c", 1), ("d", 0)]
    assert reach("$nope") == []
    assert reach("a", maxDepth=1) == [("a", 0), ("b", 1)]
    assert reach("a", restrictSearchWithMatch={"v": {"$lt": 3}}) == [("a", 0), ("b", 1)]
    # connectToField `to`: null matches the explicit null (n), never the missing ones
    o = agg(db.emp, [{"$match": {"_id": 1}},
                     gl(**{"from": "nodes", "startWith": None, "connectFromField": "x",
                           "connectToField": "to", "as": "r"})])
    assert [x["_id"] for x in o[0]["r"]] == ["n"]
    # an array connectToField matches by element; 5 finds 5.0
    o = agg(db.emp, [{"$match": {"_id": 1}},
                     gl(**{"from": "nodes", "startWith": ["d", 5], "connectFromField": "x",
                           "connectToField": "to", "as": "r"}),
                     gl(**{"from": "nodes", "startWith": 5, "connectFromField": "x",
                           "connectToField": "v", "as": "s"})])
    assert [x["_id"] for x in o[0]["r"]] == ["c"]
    assert [x["_id"] for x in o[0]["s"]] == ["m"]

    # `as` a nested path; a startWith expression; the command's let
    out = agg(db.emp, [{"$match": {"_id": 6}},
                       gl(**{"from": "emp", "startWith": {"$concat": ["$$p", "ndrew"]},
                             "connectFromField": "reportsTo", "connectToField": "name",
                             "as": "a.b", "maxDepth": 0}),
                       {"$project": {"n": "$a.b.name"}}], let={"p": "A"})
    assert out == [{"_id": 6, "n": ["Andrew"]}]
    # inside $facet, and inside a $lookup's sub-pipeline
    out = agg(db.emp, [{"$match": {"_id": 5}},
                       {"$facet": {"up": [gl(**{"from": "emp", "startWith": "$reportsTo",
                                                "connectFromField": "reportsTo",
                                                "connectToField": "name", "as": "h"}),
                                          {"$project": {"n": {"$size": "$h"}}}],
                                   "count": [{"$count": "c"}]}}])
    assert out == [{"up": [{"_id": 5, "n": 3}], "count": [{"c": 1}]}]
    out = agg(db.trav, [{"$match": {"_id": 3}},
                        {"$lookup": {"from": "emp", "as": "m", "pipeline": [
                            {"$match": {"_id": 6}},
                            gl(**{"from": "emp", "startWith": "$reportsTo",
                                  "connectFromField": "reportsTo", "connectToField": "name",
                                  "as": "h"}),
                            {"$project": {"_id": 0, "n": {"$size": "$h"}}}]}},
                        {"$project": {"m": 1}}])
    assert out == [{"_id": 3, "m": [{"n": 3}]}]
    # the stages after it see `as`
    out = agg(db.emp, [gl(**{"from": "emp", "startWith": "$reportsTo",
                             "connectFromField": "reportsTo", "connectToField": "name",
                             "as": "h"}),
                       {"$project": {"n": {"$size": "$h"}}}, {"$match": {"n": {"$gte": 2}}},
                       {"$sort": {"_id": 1}}])
    assert out == [{"_id": 3, "n": 2}, {"_id": 4, "n": 2}, {"_id": 5, "n": 3},
                   {"_id": 6, "n": 3}]


def check_view(db):
    # a view as `from`: the view's pipeline runs before each round's $match (as mongod
    # resolves it): the view hides Eliot, so the chains stop below him
    db.command({"create": "emp_noeliot", "viewOn": "emp",
                "pipeline": [{"$match": {"name": {"$ne": "Eliot"}}}]})
    out = agg(db.emp, [{"$match": {"_id": {"$in": [5, 6]}}},
                       gl(**{"from": "emp_noeliot", "startWith": "$reportsTo",
                             "connectFromField": "reportsTo", "connectToField": "name",
                             "as": "h"}),
                       {"$sort": {"_id": 1}}])
    assert [sorted(x["name"] for x in d["h"]) for d in out] == [["Ron"], ["Andrew"]]


def check_errors(db):
    c = db.emp
    base = {"from": "emp", "startWith": "$reportsTo", "connectFromField": "reportsTo",
            "connectToField": "name", "as": "h"}

    def with_(**kw):
        s = dict(base)
        s.update(kw)
        return [{"$graphLookup": s}]

    def without(k):
        return [{"$graphLookup": {x: v for x, v in base.items() if x != k}}]
    assert code_of(c, [{"$graphLookup": 1}]) == 9
    assert code_of(c, without("from")) == 9
    assert code_of(c, with_(**{"from": 1})) == 9
    for k in ("as", "startWith", "connectFromField", "connectToField"):
        assert code_of(c, without(k)) == 40105, k
    assert code_of(c, with_(**{"as": 1})) == 40103
    assert code_of(c, with_(connectToField=5)) == 40103
    assert code_of(c, with_(depthField=True)) == 40103
    assert code_of(c, with_(maxDepth="1")) == 40100
    assert code_of(c, with_(maxDepth=-1)) == 40101
    assert code_of(c, with_(maxDepth=1.5)) == 40102
    assert code_of(c, with_(restrictSearchWithMatch=[])) == 40185
    with pytest.raises(OperationFailure) as e:
        agg(c, with_(restrictSearchWithMatch={"a": {"$bogus": 1}}))
    assert e.value.code == 2
    assert "Failed to parse 'restrictSearchWithMatch' option to $graphLookup" in str(e.value)
    assert code_of(c, with_(bogus=1)) == 40104
    assert code_of(c, with_(**{"as": "$x"})) == 16410
    assert code_of(c, with_(connectFromField="a..b")) == 15998
    assert code_of(c, with_(startWith={"$bogus": 1})) == 168
    # a foreign document without _id: 40271 (a view that drops it)
    db.command({"create": "emp_noid", "viewOn": "emp",
                "pipeline": [{"$project": {"_id": 0}}]})
    assert code_of(c, with_(**{"from": "emp_noid"})) == 40271


def test_graph_lookup_on_a_shard(shard):
    _, port = shard
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true")
    try:
        load(c.gl)
        check_graph(c.gl)
        check_view(c.gl)
        check_errors(c.gl)
    finally:
        c.close()


def test_graph_lookup_through_a_proxy(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=3, proxies=1)
    try:
        client = cl.proxy_client(0)
        # every collection unsharded: the primary shard runs the whole pipeline
        u = client.glu
        load(u)
        check_graph(u)
        check_view(u)
        check_errors(u)
        # every collection sharded over the three shards: the proxy runs the stage and
        # reads each round through its routing
        cl.shard_collection("gls.emp", {"_id": 1}, split_points=[{"_id": 3}, {"_id": 5}])
        cl.shard_collection("gls.air", {"_id": 1}, split_points=[{"_id": 1}, {"_id": 3}])
        cl.shard_collection("gls.trav", {"_id": 1}, split_points=[{"_id": 2}, {"_id": 3}])
        cl.shard_collection("gls.ppl", {"_id": 1}, split_points=[{"_id": 3}, {"_id": 5}])
        cl.shard_collection("gls.nodes", {"_id": 1}, split_points=[{"_id": "c"}, {"_id": "m"}])
        s = client.gls
        load(s)
        for sid in cl.shard_ids:
            assert cl.shard_client(sid).gls.emp.count_documents({}) > 0, sid
            assert cl.shard_client(sid).gls.air.count_documents({}) > 0, sid
        check_graph(s)
        check_errors_sharded = [
            ({"from": "emp", "startWith": "$reportsTo", "connectFromField": "reportsTo",
              "connectToField": "name", "as": "h", "maxDepth": -1}, 40101),
            ({"from": "emp", "startWith": "$reportsTo", "connectFromField": "reportsTo",
              "as": "h"}, 40105)]
        for spec, want in check_errors_sharded:
            assert code_of(s.emp, [{"$graphLookup": spec}]) == want
        # mixed: an unsharded main collection with a sharded foreign one (the proxy runs the
        # stage over the primary's documents), and the reverse
        cl.shard_collection("glm.air", {"_id": 1}, split_points=[{"_id": 1}, {"_id": 3}])
        cl.shard_collection("glm.emp", {"_id": 1}, split_points=[{"_id": 3}, {"_id": 5}])
        m = client.glm
        load(m)
        out = agg(m.trav, [gl(**{"from": "air", "startWith": "$nearestAirport",
                                 "connectFromField": "connects", "connectToField": "airport",
                                 "maxDepth": 2, "depthField": "n", "as": "d"})])
        assert {d["name"]: sorted((x["airport"], x["n"]) for x in d["d"]) for d in out} == {
            "Dev": [("BOS", 1), ("JFK", 0), ("ORD", 1), ("PWM", 2)],
            "Eliot": [("BOS", 1), ("JFK", 0), ("ORD", 1), ("PWM", 2)],
            "Jeff": [("BOS", 0), ("JFK", 1), ("LHR", 2), ("ORD", 2), ("PWM", 1)]}
        out = agg(m.emp, [{"$match": {"_id": 6}},
                          gl(**{"from": "nodes", "startWith": "a", "connectFromField": "to",
                                "connectToField": "_id", "as": "r"})])
        assert sorted(x["_id"] for x in out[0]["r"]) == ["a", "b", "c", "d"]
        # {aggregate: 1}: a sharded `from` is refused (238), an unsharded one is run by the
        # primary shard
        assert agg(u, [{"$documents": [{"s": "Ron"}]},
                       gl(**{"from": "emp", "startWith": "$s", "connectFromField": "reportsTo",
                             "connectToField": "name", "as": "h"}),
                       {"$project": {"_id": 0, "n": {"$size": "$h"}}}]) == [{"n": 3}]
        with pytest.raises(OperationFailure) as e:
            agg(s, [{"$documents": [{"s": "Ron"}]},
                    gl(**{"from": "emp", "startWith": "$s", "connectFromField": "reportsTo",
                          "connectToField": "name", "as": "h"})])
        assert e.value.code == 238
        # inside a transaction: unsharded collections run on the primary in the
        # transaction's snapshot; a sharded `from` is mongod's 3904801
        with client.start_session() as ses:
            with ses.start_transaction():
                out = list(u.emp.aggregate(
                    [{"$match": {"_id": 6}},
                     gl(**{"from": "emp", "startWith": "$reportsTo",
                           "connectFromField": "reportsTo", "connectToField": "name",
                           "as": "h"}),
                     {"$project": {"n": {"$size": "$h"}}}], session=ses))
        assert out == [{"_id": 6, "n": 3}]
        with client.start_session() as ses:
            with pytest.raises(OperationFailure) as e:
                with ses.start_transaction():
                    list(m.trav.aggregate(
                        [gl(**{"from": "air", "startWith": "$nearestAirport",
                               "connectFromField": "connects", "connectToField": "airport",
                               "as": "d"})], session=ses))
            assert e.value.code == 3904801
    finally:
        cl.close()


def test_graph_lookup_foreign_collection_needs_find(start_role, tmp_path):
    """With authentication a $graphLookup of a collection the tenant may not find is
    Unauthorized (13), nested in $facet and in a $lookup sub-pipeline too; of a readable one
    it works."""
    cl = ProxyCluster(start_role, tmp_path, shards=1, proxies=1, proxy_args=["--auth=enabled"])
    try:
        cl.meta_cmd({"createTenant": "A"})
        cl.create_database("gdb", tenant="A")
        cl.meta_cmd({"createUser": "alice", "tenant": "A", "password": "alice-pw"})
        alice = cl.proxy_client(0, username="alice", password="alice-pw", authSource="admin")
        wait_until(lambda: alice.gdb.c.insert_many([{"_id": 1, "x": 1}]), 20,
                   what="alice's first write")
        alice.gdb.secret.insert_one({"_id": 1, "k": 1})
        cl.meta_cmd({"setPolicy": "A", "policy": {"collections": {
            "gdb.secret": {"actions": ["insert"]}}}})
        g = {"$graphLookup": {"from": "secret", "startWith": "$x", "connectFromField": "k",
                              "connectToField": "k", "as": "m"}}

        def code(pipeline):
            try:
                list(alice.gdb.c.aggregate(pipeline))
            except OperationFailure as e:
                return e.code
            return None
        wait_until(lambda: code([g]) == 13, 15, what="the policy to be loaded")
        assert code([{"$facet": {"f": [g]}}]) == 13
        assert code([{"$lookup": {"from": "c", "as": "m", "pipeline": [g]}}]) == 13
        assert list(alice.gdb.c.aggregate([{"$graphLookup": {
            "from": "c", "startWith": "$x", "connectFromField": "x", "connectToField": "x",
            "as": "m"}}])) == [{"_id": 1, "x": 1, "m": [{"_id": 1, "x": 1}]}]
    finally:
        cl.close()
