"""The proxy's event-driven forwarder on sharded collections (issue #19,
src/proxy/forwarder.c sharded_point): a point find, update or delete on `_id` of a
collection sharded on {_id: 1} or {_id: "hashed"} is sent by the loop thread to the one
chunk's shard, built by the same code a request thread uses (read.c px_find_shard_cmd,
write.c px_stmt_shard_cmd) and answered as px_do_find / px_do_write answer. What must
hold: such commands go that way, on shards with and without filtering metadata; each
answer is the request thread's for the same command; a StaleConfig (the routing moved
under the proxy) goes to a request thread, which refreshes and answers, and no write is
applied twice or lost."""
import bson
import pytest

from forwarder_helpers import FALLBACK, LOOP, sharded_cluster, strip, warm_ids

NS = "fwdb.s"
ROUTED = "stripedb_proxy_routed_total"


KEYS = [({"_id": 1}, True), ({"_id": 1}, False), ({"_id": "hashed"}, True)]
IDS = ["id-key", "filtering"]


@pytest.mark.parametrize("key,filtering", KEYS)
def test_sharded_point_reads_are_answered_by_the_loop_as_a_request_thread_answers(
        start_role, tmp_path, key, filtering):
    cl = sharded_cluster(start_role, tmp_path, key, filtering)
    try:
        db = cl.proxy_client(0).fwdb
        docs = [{"_id": i, "v": i, "sub": {"x": [i]}} for i in (1, 50, 99, 100, 150, 1000)]
        docs += [{"_id": "k", "v": "s"}, {"_id": 2.5, "v": 2.5},
                 {"_id": bson.Int64(200), "v": 200}, {"_id": bson.Decimal128("7.5"), "v": 7}]
        db.s.insert_many(docs)
        warm_ids(db.s, [1, 150])
        fallbacks = cl.metric(0, FALLBACK)
        assert fallbacks == (0 if filtering else 2)
        queries = []
        for d in docs + [{"_id": "absent"}, {"_id": 101}]:
            f = {"_id": d["_id"]}
            queries += [{"filter": f}, {"filter": f, "limit": 1, "singleBatch": True},
                        {"filter": f, "batchSize": 1}, {"filter": f, "limit": 0}]
        queries.append({"filter": {"_id": 150.0}})
        for q in queries:
            before, routed = cl.metric(0, LOOP), cl.metric(0, ROUTED)
            loop = strip(db.command(dict({"find": "s"}, **q), check=False))
            assert cl.metric(0, LOOP) == before + 1, q
            assert cl.metric(0, ROUTED) == routed + 1, q
            before = cl.metric(0, LOOP)
            thread = strip(db.command(dict({"find": "s"}, **q, comment="thread"),
                                      check=False))
            assert cl.metric(0, LOOP) == before, q
            assert cl.metric(0, ROUTED) == routed + 2, q
            assert loop == thread, (q, loop, thread)
        assert cl.metric(0, FALLBACK) == fallbacks
        # what the loop leaves to request threads on a sharded collection
        for q in [{"filter": {"_id": 1}, "projection": {"v": 1}}, {"filter": {"_id": None}},
                  {"filter": {"v": 1}}]:
            before = cl.metric(0, LOOP)
            assert db.command(dict({"find": "s"}, **q))["ok"] == 1
            assert cl.metric(0, LOOP) == before, q
    finally:
        cl.close()


def _update(coll, q, u, **stmt):
    return {"update": coll, "updates": [dict({"q": q, "u": u}, **stmt)]}


@pytest.mark.parametrize("key,filtering", KEYS)
@pytest.mark.parametrize("retry", [True, False], ids=["retryable", "plain"])
def test_sharded_point_writes_are_answered_by_the_loop_as_a_request_thread_answers(
        start_role, tmp_path, key, filtering, retry):
    """The same updates and deletes on two sharded collections, one through the loop and
    one (with `comment`) through a request thread: the same answers and documents."""
    cl = sharded_cluster(start_role, tmp_path, key, filtering, colls=("s", "t"))
    try:
        c = cl.proxy_client(0, retryWrites=retry)
        db = c.fwdb
        seed = [{"_id": i, "v": i, "a": [1]} for i in (1, 2, 3, 150, 151)] + [{"_id": "s"}]
        for name in ("s", "t"):
            db[name].insert_many(seed)
            warm_ids(db[name], [1, 150])
        fallbacks = cl.metric(0, FALLBACK)
        cmds = [
            _update(None, {"_id": 1}, {"$inc": {"v": 1}}),
            _update(None, {"_id": 150}, {"$set": {"w": {"x": 1}}}),
            _update(None, {"_id": 2}, {"$push": {"a": 3}}),
            _update(None, {"_id": "s"}, {"v": "replaced"}),
            _update(None, {"_id": 120}, {"$set": {"v": 120}}, upsert=True),
            _update(None, {"_id": 98}, {"$set": {"v": 98}}),
            _update(None, {"_id": 3}, {"$set": {"_id": 4}}),        # ImmutableField
            _update(None, {"_id": 3}, {"$inc": {"a": 1}}),          # TypeMismatch
            _update(None, {"_id": 3}, {"$bad": {"v": 1}}),          # unknown operator
            _update(None, {"_id": 151}, {"$set": {"v": 5}}, multi=False, upsert=False),
            {"delete": None, "deletes": [{"q": {"_id": 151}, "limit": 1}]},
            {"delete": None, "deletes": [{"q": {"_id": 151}, "limit": 1}]},  # gone
            {"delete": None, "deletes": [{"q": {"_id": 2}, "limit": 0}]},
            _update(None, {"_id": 150}, {"$inc": {"v": 1}}, upsert=True),
        ]
        s_loop, s_thread = c.start_session(), c.start_session()
        for i, cmd in enumerate(cmds):
            name = next(iter(cmd))
            if retry and not (name == "delete" and cmd["deletes"][0]["limit"] == 0):
                base = {"txnNumber": bson.Int64(3000 + i)}
                sl, st = s_loop, s_thread
            else:
                base, sl, st = {}, None, None
            before = cl.metric(0, LOOP)
            loop = strip(db.command(dict(cmd, **{name: "s"}, **base), check=False,
                                    session=sl))
            assert cl.metric(0, LOOP) == before + 1, (cmd, loop)
            before = cl.metric(0, LOOP)
            thread = strip(db.command(dict(cmd, **{name: "t"}, comment="t", **base),
                                      check=False, session=st))
            assert cl.metric(0, LOOP) == before, cmd
            for r in (loop, thread):
                for we in r.get("writeErrors", []):
                    we["errmsg"] = we["errmsg"].replace("fwdb.s", "X").replace("fwdb.t", "X")
            assert loop == thread, (cmd, loop, thread)
        s_loop.end_session()
        s_thread.end_session()
        assert sorted(db.s.find(), key=repr) == sorted(db.t.find(), key=repr)
        assert cl.metric(0, FALLBACK) == fallbacks
    finally:
        cl.close()


def test_a_handed_on_read_is_routed_once(start_role, tmp_path):
    """A shard without filtering metadata refuses the loop's first read (StaleConfig,
    vWanted null): handed to a request thread, which answers it; the read counts once in
    stripedb_proxy_routed_total (the loop counts what it answers, the thread the rest),
    and the next read of that shard is the loop's, per chunk."""
    cl = sharded_cluster(start_role, tmp_path, {"_id": 1}, False)
    try:
        coll = cl.proxy_client(0).fwdb.s
        coll.insert_many([{"_id": 1, "v": 1}, {"_id": 150, "v": 2}])
        coll.update_one({"_id": 1}, {"$set": {"w": 1}})  # the primary learned
        routed, fb, loop = (cl.metric(0, m) for m in (ROUTED, FALLBACK, LOOP))
        assert coll.find_one({"_id": 1}) == {"_id": 1, "v": 1, "w": 1}
        assert cl.metric(0, FALLBACK) == fb + 1
        assert cl.metric(0, LOOP) == loop
        assert cl.metric(0, ROUTED) == routed + 1
        assert coll.find_one({"_id": 1}) == {"_id": 1, "v": 1, "w": 1}
        assert cl.metric(0, FALLBACK) == fb + 1
        assert cl.metric(0, LOOP) == loop + 1
        assert cl.metric(0, ROUTED) == routed + 2
    finally:
        cl.close()
