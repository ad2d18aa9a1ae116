"""A command with a duplicate top-level field, sent as a raw OP_MSG (drivers cannot build
one from a dict), to a shard and through a proxy.

MongoDB's IDL parsers refuse it: 40413 IDLDuplicateField, "BSON field 'insert.ordered' is a
duplicate field" (idl_parser.cpp throwDuplicateField; error_codes.yml). A field given both in
the body and as a document sequence is refused by mongod's OP_MSG parser (op_msg.cpp): 40433
"Duplicate field between body and document sequence documents", and two sequences of one
name: 40431 "Duplicate document sequence: documents"; neither has an ErrorCodes name, so
the codeName is "Location<code>". All are error replies on a connection that stays open,
and nothing of the refused command runs."""
import socket
import struct

import bson
import pytest

from conftest import op_msg, raw_doc, raw_msg, recv_exact
from proxy_helpers import ProxyCluster

OP_MSG = 2013


def roundtrip(port, msg):
    """Send msg on a new connection; return (responseTo, reply body) of its reply, after
    checking that the connection still answers a ping."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(msg)
        length, _rid, response_to, opcode = struct.unpack("<iiii", recv_exact(s, 16))
        rest = recv_exact(s, length - 16)
        assert opcode == OP_MSG
        assert rest[4] == 0
        reply = bson.decode(rest[5:])
        s.sendall(op_msg(99, {"ping": 1, "$db": "admin"}))
        length, _rid, to, _op = struct.unpack("<iiii", recv_exact(s, 16))
        assert to == 99 and bson.decode(recv_exact(s, length - 16)[5:])["ok"] == 1.0
    return response_to, reply


def refused(port, msg, code, code_name, errmsg):
    to, r = roundtrip(port, msg)
    assert to == 7
    assert r["ok"] == 0.0, r
    assert (r["code"], r["codeName"], r["errmsg"]) == (code, code_name, errmsg), r


def check_port(port, count):
    """The cases on one server; count() tells how many documents db.c holds."""
    ins = [("insert", "c"), ("documents", [{"_id": 1, "k": 1}])]
    # the same field twice in the body: refused, not run with either value
    refused(port, raw_msg(7, raw_doc(ins + [("ordered", True), ("ordered", False),
                                           ("$db", "db")])),
            40413, "IDLDuplicateField", "BSON field 'insert.ordered' is a duplicate field")
    refused(port, raw_msg(7, raw_doc([("find", "c"), ("filter", {"k": 1}),
                                      ("filter", {"k": 2}), ("$db", "db")])),
            40413, "IDLDuplicateField", "BSON field 'find.filter' is a duplicate field")
    refused(port, raw_msg(7, raw_doc(ins + [("$db", "db"), ("$db", "other")])),
            40413, "IDLDuplicateField", "BSON field 'insert.$db' is a duplicate field")
    # documents in the body and as a document sequence
    refused(port, raw_msg(7, raw_doc(ins + [("$db", "db")]),
                          seqs=[("documents", [{"_id": 2, "k": 2}])]),
            40433, "Location40433",
            "Duplicate field between body and document sequence documents")
    # two sequences of one name
    refused(port, raw_msg(7, raw_doc([("insert", "c"), ("$db", "db")]),
                          seqs=[("documents", [{"_id": 3, "k": 3}]),
                                ("documents", [{"_id": 4, "k": 4}])]),
            40431, "Location40431", "Duplicate document sequence: documents")
    assert count() == 0
    # the same insert, well-formed, through a sequence: runs (the helpers build it right)
    to, r = roundtrip(port, raw_msg(7, raw_doc([("insert", "c"), ("$db", "db")]),
                                    seqs=[("documents", [{"_id": 5, "k": 5}])]))
    assert (to, r["ok"], r["n"]) == (7, 1.0, 1), r
    assert count() == 1


def test_shard_refuses_duplicate_fields(shard):
    import pymongo
    _, port = shard
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true")
    try:
        check_port(port, lambda: c.db.c.count_documents({}))
    finally:
        c.close()


@pytest.fixture
def cluster(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    yield cl
    cl.close()


def test_proxy_refuses_duplicate_fields(cluster):
    cluster.shard_collection("db.c", {"k": 1}, split_points=[{"k": 100}],
                             shards=["shard-a", "shard-b"])
    c = cluster.proxy_client(0)
    check_port(cluster.proxy_ports[0], lambda: c.db.c.count_documents({}))
    # on the shards too: nothing but the one well-formed insert
    assert sum(cluster.shard_client(sid).db.c.count_documents({})
               for sid in cluster.shard_ids) == 1
