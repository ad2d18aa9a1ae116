"""Legacy OP_QUERY on a collection namespace, OP_GET_MORE, and exhaust cursors, with Debian
12's pymongo (3.11) against a shard and through a proxy.

pymongo 3.x sends an exhaust cursor's find as a legacy OP_QUERY on "<db>.<coll>" with flag
bit 6 (exhaust) whatever the server's maxWireVersion (pymongo/message.py
_Query.use_command: `if not exhaust`), then only reads: the server streams one OP_REPLY
after another until cursorID 0 (mongod 3.x/4.x). A failed legacy query is one document
{$err, code, ok: 0} with QueryFailure (mongod's generateLegacyQueryErrorResponse); without
`$err` pymongo 3.11 raised KeyError('$err') instead of OperationFailure.
pymongo 3.x's find_raw_batches sends a legacy OP_QUERY, then OP_GET_MORE (2005) messages
(message.py _RawBatchQuery/_RawBatchGetMore: use_command is always False).
A mongos refuses exhaust (code 18526, "The 'exhaust' query option is invalid for mongos
queries"), and pymongo refuses it against a mongos before sending anything.
"""
import socket
import struct

import bson
import pymongo
import pytest
from pymongo import monitoring
from pymongo.errors import OperationFailure

from conftest import op_msg, wait_until

from proxy_helpers import ProxyCluster

OP_REPLY = 1
OP_QUERY = 2004
OP_MSG = 2013
QUERY_FAILURE = 2
EXHAUST = 64
N = 1000


# ---- raw protocol helpers ----

def op_query(request_id, ns, query, ntoreturn=0, skip=0, flags=0, fields=None):
    payload = (struct.pack("<i", flags) + ns.encode() + b"\x00"
               + struct.pack("<ii", skip, ntoreturn) + bson.encode(query))
    if fields is not None:
        payload += bson.encode(fields)
    return struct.pack("<iiii", 16 + len(payload), request_id, 0, OP_QUERY) + payload


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        assert chunk, f"connection closed after {len(buf)} of {n} bytes"
        buf += chunk
    return buf


def recv_op_reply(s):
    """One OP_REPLY -> dict(request_id, response_to, flags, cursor_id, starting_from, docs)."""
    length, rid, rto, opcode = struct.unpack("<iiii", recv_exact(s, 16))
    body = recv_exact(s, length - 16)
    assert opcode == OP_REPLY, opcode
    flags, cursor_id, starting_from, n = struct.unpack("<iqii", body[:20])
    docs = bson.decode_all(body[20:])
    assert len(docs) == n, (len(docs), n)
    return dict(request_id=rid, response_to=rto, flags=flags, cursor_id=cursor_id,
                starting_from=starting_from, docs=docs)


def recv_op_msg(s):
    length, _rid, rto, opcode = struct.unpack("<iiii", recv_exact(s, 16))
    body = recv_exact(s, length - 16)
    assert opcode == OP_MSG, opcode
    flags, kind = struct.unpack("<IB", body[:5])
    assert kind == 0
    return rto, flags, bson.decode(body[5:])


def fill(coll, n=N, drop=True):
    if drop:
        coll.drop()
    coll.insert_many([{"_id": i, "k": i, "pad": "x" * 100} for i in range(n)])


class GetMoreCounter(monitoring.CommandListener):
    """Counts the getMore replies pymongo reads off an exhaust socket (it publishes a
    command event for each, with request id 0)."""

    def __init__(self):
        self.get_mores = 0

    def started(self, event):
        pass

    def succeeded(self, event):
        if event.command_name == "getMore":
            self.get_mores += 1

    def failed(self, event):
        pass


def check_exhaust(coll):
    """pymongo exhaust cursors over N documents return each exactly once, in batches."""
    listener = GetMoreCounter()
    client = coll.database.client
    # every document exactly once, default batch size
    docs = list(coll.find({}, cursor_type=pymongo.CursorType.EXHAUST))
    ids = [d["_id"] for d in docs]
    assert len(ids) == N
    assert sorted(ids) == list(range(N))
    # sorted, with a filter, a projection and batches of 50: a stream of 20 replies
    c2 = pymongo.MongoClient(client.address[0], client.address[1], directConnection=True,
                             serverSelectionTimeoutMS=10000, event_listeners=[listener])
    try:
        cur = c2[coll.database.name][coll.name].find(
            {"k": {"$gte": 100}}, {"k": 1}, cursor_type=pymongo.CursorType.EXHAUST
        ).sort("k", -1).batch_size(50)
        got = list(cur)
        assert got == [{"_id": i, "k": i} for i in range(N - 1, 99, -1)]
        # 900 documents in batches of 50: the first from the find, at least 17 streamed
        assert listener.get_mores >= 900 // 50 - 1, listener.get_mores
        # the connection the stream ran on went back to the pool and still works
        assert c2[coll.database.name][coll.name].count_documents({}) == N
        # a stream abandoned half-way (pymongo closes its socket): the next one is whole
        cur = c2[coll.database.name][coll.name].find(
            {}, cursor_type=pymongo.CursorType.EXHAUST).sort("_id", 1).batch_size(10)
        assert [next(cur)["_id"] for _ in range(25)] == list(range(25))
        cur.close()
        assert len(list(c2[coll.database.name][coll.name].find(
            {}, cursor_type=pymongo.CursorType.EXHAUST).batch_size(10))) == N
    finally:
        c2.close()


# ---- tests: shard ----

def test_exhaust_cursor_shard_direct(shard):
    _, port = shard
    with pymongo.MongoClient("127.0.0.1", port, directConnection=True,
                             serverSelectionTimeoutMS=10000) as c:
        fill(c.db.c)
        check_exhaust(c.db.c)


def check_raw_batches(coll):
    """find_raw_batches: legacy OP_QUERY then OP_GET_MORE; every document once."""
    batches = list(coll.find_raw_batches({}, batch_size=300).sort("_id", 1))
    docs = [d for b in batches for d in bson.decode_all(b)]
    assert [d["_id"] for d in docs] == list(range(N))
    assert len(batches) >= 4  # 300 + 300 + 300 + 100: three OP_GET_MOREs at least
    # closed early: the rest is killed with killCursors, the client goes on working
    cur = coll.find_raw_batches({}, batch_size=100)
    assert len(bson.decode_all(next(cur))) == 100
    cur.close()
    assert coll.count_documents({}) == N


def test_raw_batches_shard_direct(shard):
    _, port = shard
    with pymongo.MongoClient("127.0.0.1", port, directConnection=True,
                             serverSelectionTimeoutMS=10000) as c:
        fill(c.db.c)
        check_raw_batches(c.db.c)


def test_op_get_more_unknown_cursor_is_cursor_not_found(shard):
    """mongod's answer to an OP_GET_MORE of an unknown cursor: responseFlags
    CursorNotFound, no document (pymongo raises CursorNotFound from the flag)."""
    _, port = shard
    with pymongo.MongoClient("127.0.0.1", port, directConnection=True,
                             serverSelectionTimeoutMS=10000) as c:
        fill(c.db.c, 10)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        payload = (struct.pack("<i", 0) + b"db.c\x00" + struct.pack("<iq", 0, 123456789))
        s.sendall(struct.pack("<iiii", 16 + len(payload), 91, 0, 2005) + payload)
        r = recv_op_reply(s)
        assert r["response_to"] == 91
        assert r["flags"] & 1 and r["docs"] == [] and r["cursor_id"] == 0


def test_exhaust_stream_on_the_wire(shard):
    """The OP_REPLY stream itself: first reply answers the query, each next one answers the
    previous reply (responseTo = its requestID), startingFrom counts what was sent, the
    last has cursorID 0, and the connection then serves commands again."""
    _, port = shard
    with pymongo.MongoClient("127.0.0.1", port, directConnection=True,
                             serverSelectionTimeoutMS=10000) as c:
        fill(c.db.c)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(op_query(71, "db.c", {"$query": {}, "$orderby": {"_id": 1}}, ntoreturn=100,
                           flags=EXHAUST))
        replies = [recv_op_reply(s)]
        assert replies[0]["response_to"] == 71
        while replies[-1]["cursor_id"] != 0:
            r = recv_op_reply(s)
            assert r["response_to"] == replies[-1]["request_id"]
            replies.append(r)
        assert all(r["flags"] & QUERY_FAILURE == 0 for r in replies)
        assert len(replies) >= N // 100
        assert all(len(r["docs"]) <= 100 for r in replies)
        sent = 0
        for r in replies:
            assert r["starting_from"] == sent
            sent += len(r["docs"])
        assert [d["_id"] for r in replies for d in r["docs"]] == list(range(N))
        s.sendall(op_msg(72, {"ping": 1, "$db": "admin"}))
        rto, _flags, body = recv_op_msg(s)
        assert (rto, body["ok"]) == (72, 1.0)


def test_legacy_query_error_has_err_and_code(shard):
    """Every failed OP_QUERY gets {$err, code, ok: 0}: a legacy query (QueryFailure), an
    unparseable one (QueryFailure), a command on $cmd (a command reply, plus $err)."""
    _, port = shard
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        # the query fails in find: unknown operator
        s.sendall(op_query(81, "db.c", {"_id": {"$bogus": 1}}))
        r = recv_op_reply(s)
        assert r["response_to"] == 81
        assert r["flags"] & QUERY_FAILURE
        assert r["cursor_id"] == 0
        [doc] = r["docs"]
        assert doc["$err"] == "unknown operator: $bogus"
        assert (doc["code"], doc["ok"]) == (2, 0.0)
        # a modifier stripedb does not run
        s.sendall(op_query(82, "db.c", {"$query": {}, "$explain": True}))
        r = recv_op_reply(s)
        [doc] = r["docs"]
        assert r["flags"] & QUERY_FAILURE
        assert "'$explain' is not supported" in doc["$err"]
        assert (doc["code"], doc["ok"]) == (2, 0.0)
        # a namespace with no collection
        s.sendall(op_query(83, "db.", {}))
        r = recv_op_reply(s)
        [doc] = r["docs"]
        assert r["flags"] & QUERY_FAILURE
        assert doc["code"] == 73 and doc["$err"].startswith("OP_QUERY: invalid namespace")
        # invalid BSON in the query: the message's own error
        msg = bytearray(op_query(84, "db.c", {"a": 1}))
        assert msg[-8] == 0x10  # element type of `a` (int32) ...
        msg[-8] = 0x7f  # ... made one that is not a BSON type
        s.sendall(bytes(msg))
        r = recv_op_reply(s)
        [doc] = r["docs"]
        assert r["response_to"] == 84 and r["flags"] & QUERY_FAILURE
        assert doc["code"] == 22 and isinstance(doc["$err"], str) and doc["ok"] == 0.0
        # a failed command over OP_QUERY keeps its command reply and carries $err too
        s.sendall(op_query(85, "admin.$cmd", {"noSuchCommandX": 1}, ntoreturn=-1))
        r = recv_op_reply(s)
        [doc] = r["docs"]
        assert r["flags"] & QUERY_FAILURE == 0
        assert doc["errmsg"] == doc["$err"] == "no such command: 'noSuchCommandX'"
        assert (doc["code"], doc["ok"]) == (59, 0.0)
        # the connection still works
        s.sendall(op_query(86, "admin.$cmd", {"ping": 1}, ntoreturn=-1))
        r = recv_op_reply(s)
        assert r["docs"][0]["ok"] == 1.0 and "$err" not in r["docs"][0]


def test_pymongo_exhaust_error_is_operation_failure(shard):
    _, port = shard
    with pymongo.MongoClient("127.0.0.1", port, directConnection=True,
                             serverSelectionTimeoutMS=10000) as c:
        fill(c.db.c, 10)
        with pytest.raises(OperationFailure) as ei:
            list(c.db.c.find({"_id": {"$bogus": 1}}, cursor_type=pymongo.CursorType.EXHAUST))
        assert ei.value.code == 2
        assert ei.value.details["$err"] == "unknown operator: $bogus"
        # the client goes on working
        assert c.db.c.count_documents({}) == 10


# ---- tests: through a proxy ----

@pytest.fixture
def cluster(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=3, proxies=1)
    yield cl
    cl.close()


def test_legacy_query_through_proxy(cluster):
    """A collection in three chunks on three shards: legacy OP_QUERY and OP_GET_MORE
    (find_raw_batches) through the proxy return every document once; exhaust is refused
    as mongos refuses it, by pymongo before sending and by the proxy with $err."""
    cluster.shard_collection("db.c", {"k": 1}, split_points=[{"k": 300}, {"k": 600}],
                             shards=["shard-a", "shard-b", "shard-c"])
    c = cluster.proxy_client(0)
    fill(c.db.c, drop=False)  # a drop would drop the sharded collection
    for sid in cluster.shard_ids:  # really spread
        assert cluster.shard_client(sid).db.c.count_documents({}) > 0, sid
    check_raw_batches(c.db.c)
    with pytest.raises(pymongo.errors.InvalidOperation,
                       match="Exhaust cursors are not supported by mongos"):
        c.db.c.find({}, cursor_type=pymongo.CursorType.EXHAUST)
    with socket.create_connection(("127.0.0.1", cluster.proxy_ports[0]), timeout=30) as s:
        s.sendall(op_query(61, "db.c", {}, flags=EXHAUST))
        r = recv_op_reply(s)
        [doc] = r["docs"]
        assert r["response_to"] == 61 and r["flags"] & QUERY_FAILURE
        assert (doc["code"], doc["ok"]) == (18526, 0.0)
        assert doc["$err"] == ("The 'exhaust' query option is invalid for mongos queries: "
                               "db.c")
        # a legacy query error through the proxy
        s.sendall(op_query(62, "db.c", {"k": {"$bogus": 1}}))
        r = recv_op_reply(s)
        [doc] = r["docs"]
        assert r["flags"] & QUERY_FAILURE and doc["code"] == 2
        assert "$bogus" in doc["$err"]
        # a sorted legacy query in batches of 250 with OP_GET_MORE, by hand
        s.sendall(op_query(63, "db.c", {"$query": {}, "$orderby": {"k": -1}}, ntoreturn=250))
        r = recv_op_reply(s)
        got = r["docs"]
        while r["cursor_id"] != 0:
            payload = (struct.pack("<i", 0) + b"db.c\x00"
                       + struct.pack("<iq", 250, r["cursor_id"]))
            s.sendall(struct.pack("<iiii", 16 + len(payload), 64, 0, 2005) + payload)
            r = recv_op_reply(s)
            assert r["response_to"] == 64 and r["flags"] & QUERY_FAILURE == 0
            assert len(r["docs"]) <= 250
            got += r["docs"]
        assert [d["_id"] for d in got] == list(range(N - 1, -1, -1))


# ---- authorization: a legacy query passes the checks a find does ----

@pytest.fixture
def sec(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=1, proxies=1, proxy_args=["--auth=enabled"])
    for t, db, user, pw in (("A", "adb", "alice", "alice-pw"), ("B", "bdb", "bob", "bob-pw")):
        cl.meta_cmd({"createTenant": t})
        cl.create_database(db, tenant=t)
        cl.meta_cmd({"createUser": user, "tenant": t, "password": pw})
    yield cl
    cl.close()


def test_legacy_query_is_authorized_like_find(sec):
    alice = sec.proxy_client(0, username="alice", password="alice-pw", authSource="admin")
    bob = sec.proxy_client(0, username="bob", password="bob-pw", authSource="admin")
    # the proxy re-reads tenants once a second: wait until each may write its database
    for who, db in ((alice, "adb"), (bob, "bdb")):
        wait_until(lambda: who[db].c.insert_many([{"_id": i} for i in range(250)]), 20,
                   what=f"the first write to {db}")
    # unauthenticated: Unauthorized, as a legacy query failure
    with socket.create_connection(("127.0.0.1", sec.proxy_ports[0]), timeout=30) as s:
        s.sendall(op_query(51, "bdb.c", {}))
        r = recv_op_reply(s)
        [doc] = r["docs"]
        assert r["flags"] & QUERY_FAILURE and r["cursor_id"] == 0
        assert (doc["code"], doc["$err"]) == (13, "command find requires authentication")
    # another tenant's collection: Unauthorized; its own: every document
    with pytest.raises(OperationFailure) as ei:
        list(alice.bdb.c.find_raw_batches({}))
    assert ei.value.code == 13
    assert ei.value.details["$err"] == "not authorized on bdb to execute command find"
    docs = [d for b in alice.adb.c.find_raw_batches({}, batch_size=100)
            for d in bson.decode_all(b)]
    assert sorted(d["_id"] for d in docs) == list(range(250))
    # bob's legacy cursor, continued by an unauthenticated OP_GET_MORE or by alice:
    # refused; bob goes on reading it (with OP_GET_MORE)
    bob_cur = bob.bdb.c.find_raw_batches({}, batch_size=100)
    assert len(bson.decode_all(next(bob_cur))) == 100
    cid = bob_cur.cursor_id
    assert cid
    with socket.create_connection(("127.0.0.1", sec.proxy_ports[0]), timeout=30) as s:
        payload = struct.pack("<i", 0) + b"bdb.c\x00" + struct.pack("<iq", 100, cid)
        s.sendall(struct.pack("<iiii", 16 + len(payload), 52, 0, 2005) + payload)
        r = recv_op_reply(s)
        [doc] = r["docs"]
        assert r["flags"] & QUERY_FAILURE and r["cursor_id"] == 0
        assert (doc["code"], doc["$err"]) == (13, "command getMore requires authentication")
    with pytest.raises(OperationFailure) as ei:
        alice.bdb.command("getMore", cid, collection="c")
    assert ei.value.code == 13
    assert sum(len(bson.decode_all(b)) for b in bob_cur) == 150
