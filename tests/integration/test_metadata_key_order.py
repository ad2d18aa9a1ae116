"""Chunk bounds in MongoDB's key order (metadata op version 4, raft/migstate.h
MIGSTATE_OP_VERSION_KEY_ORDER): a chunk split through metadata at a Decimal128 and at NaN
(`stripedb ctl chunk split` and splitChunk by id) lands where the proxies route (NaN below
every other number, Decimal128 by value), so the proxy keeps serving the collection and
every document is on the shard that owns its chunk. A split point the earlier order read
as 0 (a Decimal128 50 "inside" [-10, 10), which inverted the chunk order) is refused."""
import math

from bson.decimal128 import Decimal128
from bson.max_key import MaxKey
from bson.min_key import MinKey

from conftest import OP_VERSION_MAX, wait_until
from migration_helpers import MigCluster

NS = "app.d"


def _bounds(cl):
    """[(min k, max k, shard)] of NS's chunks, as metadata lists them."""
    return [(c["min"]["k"], c["max"]["k"], c["shard"]) for c in cl.chunks(NS)]


def test_split_at_decimal128_and_nan_routes_every_document(start_role, tmp_path):
    cl = MigCluster(start_role, tmp_path, meta=1, shards=2, proxies=1, coordinators=0)
    try:
        wait_until(lambda: cl.meta_read({"metadataStatus": 1})["opVersion"] == OP_VERSION_MAX,
                   30, what="the new cluster's newest op version")
        # [MinKey, -10) shard-a, [-10, 10) shard-b, [10, MaxKey) shard-a
        cl.shard_collection(NS, {"k": 1}, split_points=[{"k": -10}, {"k": 10}],
                            shards=["shard-a", "shard-b"])
        by_min = {(("min",) if isinstance(c["min"]["k"], MinKey) else c["min"]["k"]): c
                  for c in cl.chunks(NS)}
        low, mid, high = by_min[("min",)], by_min[-10], by_min[10]
        assert (low["shard"], mid["shard"], high["shard"]) == ("shard-a", "shard-b", "shard-a")

        # the earlier order read Decimal128 50 as 0, "inside" [-10, 10): now refused
        r = cl.meta_write({"splitChunk": mid["id"], "at": {"k": Decimal128("50")}},
                          ok_codes=(2,))
        assert r["code"] == 2 and "not inside" in r["errmsg"], r
        # and a split point holding an array (never a document's shard-key value)
        r = cl.meta_write({"splitChunk": high["id"], "at": {"k": [20]}}, ok_codes=(2,))
        assert r["code"] == 2 and "array" in r["errmsg"], r

        # Decimal128 5.5 through the CLI (it picks [-10, 10) by the routing order)
        out = cl.ctl("chunk", "split", NS, "--at", '{"k": {"$numberDecimal": "5.5"}}')
        assert out.stdout.decode().startswith(f"split chunk {mid['id']}:"), out.stdout
        # NaN by id: below every other number, so inside [MinKey, -10)
        r = cl.meta_write({"splitChunk": low["id"], "at": {"k": float("nan")}})
        assert r["left"] == low["id"]
        # Decimal128 100.5 by id, inside [10, MaxKey)
        r = cl.meta_write({"splitChunk": high["id"], "at": {"k": Decimal128("100.5")}})
        assert r["left"] == high["id"]

        chunks = _bounds(cl)
        assert len(chunks) == 6
        mins = [lo for lo, _, _ in chunks]
        assert any(isinstance(v, float) and math.isnan(v) for v in mins)
        assert Decimal128("5.5") in mins and Decimal128("100.5") in mins
        assert isinstance(mins[0], MinKey) and any(isinstance(hi, MaxKey) for _, hi, _ in chunks)

        # documents on both sides of every split point: _id -> (k, shard that owns it)
        docs = {
            "null": (None, "shard-a"),                        # [MinKey, NaN)
            "nan": (float("nan"), "shard-a"),                 # [NaN, -10)
            "decnan": (Decimal128("NaN"), "shard-a"),         # == NaN
            "-inf": (float("-inf"), "shard-a"),
            "-11": (-11, "shard-a"),
            "dec-10": (Decimal128("-10"), "shard-b"),         # [-10, 5.5)
            "5": (5, "shard-b"),
            "dec5.4999": (Decimal128("5.4999"), "shard-b"),
            "dec5.5": (Decimal128("5.5"), "shard-b"),         # [5.5, 10)
            "5.5": (5.5, "shard-b"),
            "9": (9, "shard-b"),
            "10": (10, "shard-a"),                            # [10, 100.5)
            "100": (100, "shard-a"),
            "dec100.4": (Decimal128("100.4"), "shard-a"),
            "dec100.5": (Decimal128("100.5"), "shard-a"),     # [100.5, MaxKey)
            "101": (101, "shard-a"),
            "dec1e400": (Decimal128("1E+400"), "shard-a"),
            "inf": (float("inf"), "shard-a"),
            "str": ("x", "shard-a"),
        }
        coll = cl.proxy_client()["app"]["d"]
        for _id, (k, _) in docs.items():
            coll.insert_one({"_id": _id, "k": k})

        # read back through the proxy: every document, once
        got = sorted(d["_id"] for d in coll.find({}))
        assert got == sorted(docs)
        assert coll.count_documents({}) == len(docs) == 19
        # range queries across the split points, routed by the new bounds
        assert sorted(d["_id"] for d in coll.find(
            {"k": {"$gte": Decimal128("5.5"), "$lt": 10}})) == ["5.5", "9", "dec5.5"]
        assert sorted(d["_id"] for d in coll.find({"k": {"$gte": Decimal128("100.5")}})) == \
            ["101", "dec100.5", "dec1e400", "inf"]
        assert [d["_id"] for d in coll.find({"k": {"$gte": -1000, "$lt": -10}})] == ["-11"]
        # equality on NaN, targeted at [NaN, -10): both NaNs (MongoDB: NaN == NaN)
        assert sorted(d["_id"] for d in coll.find({"k": float("nan")})) == ["decnan", "nan"]
        # each document lives on the shard that owns its chunk
        for sid in ("shard-a", "shard-b"):
            held = sorted(d["_id"] for d in cl.shard_client(sid)["app"]["d"].find({}))
            assert held == sorted(i for i, (_, s) in docs.items() if s == sid), sid
    finally:
        cl.close()


def test_a_chunk_under_migration_is_not_split_or_merged(start_role, tmp_path):
    """Op version 4: splitting (ctl chunk split, splitChunk) or merging a chunk that a
    non-terminal migration holds is ConflictingOperationInProgress (117), nothing changed:
    the migration copies and cleans up the range it read at its start but routes only its
    chunk id, so a split during it lost the other half's documents (found by a review).
    Once the migration has ended the split goes through."""
    cl = MigCluster(start_role, tmp_path, meta=1, shards=2, proxies=1, coordinators=0)
    try:
        wait_until(lambda: cl.meta_read({"metadataStatus": 1})["opVersion"] == OP_VERSION_MAX,
                   30, what="the new cluster's newest op version")
        cl.shard_collection(NS, {"k": 1}, split_points=[{"k": 100}], shards=["shard-a"])
        low, high = sorted(cl.chunks(NS), key=lambda c: c["max"]["k"]
                           if not isinstance(c["max"]["k"], MaxKey) else math.inf)
        mid = cl.migrate(NS, low["id"], "shard-b")  # no coordinator: stays registered
        assert cl.migration(mid)["state"] == "registered"
        before = cl.chunks(NS)
        r = cl.meta_write({"splitChunk": low["id"], "at": {"k": 50}}, ok_codes=(117,))
        assert r["code"] == 117 and r["activeMigration"] == mid, r
        r = cl.ctl("chunk", "split", NS, "--at", '{"k": 50}', check=False)
        assert r.returncode == 1 and b"being migrated" in r.stderr, r.stderr
        r = cl.meta_write({"mergeChunks": NS, "ids": [low["id"], high["id"]]}, ok_codes=(117,))
        assert r["code"] == 117, r
        assert cl.chunks(NS) == before
        cl.ctl("migration", "rollback", mid)
        wait_until(lambda: cl.migration(mid)["state"] in ("aborted", "rolled_back"), 30,
                   what="the rolled back migration")
        r = cl.meta_write({"splitChunk": low["id"], "at": {"k": 50}})
        assert len(cl.chunks(NS)) == 3
    finally:
        cl.close()
