"""$sample and $redact (issue #20), as MongoDB 6.0, on a shard and through a proxy to an
unsharded and to a sharded collection.

$sample: N distinct documents, uniformly. The uniformity tests are statistical and can
fail: many samples, the documents in 10 equal buckets, Pearson's chi-square against the
uniform counts with 9 degrees of freedom and a threshold of 45 (a uniform sampler exceeds it
with probability about 1e-6; a sampler that favours one bucket by a fifth fails it almost
surely). Through a proxy to a collection whose documents are 90% on one shard and 10% on
the other, the sample must follow the documents, not the shards (a per-shard 50/50 merge
would put half of the draws in the last bucket).

$redact: the MongoDB manual's two examples (reference/operator/aggregation/redact), with
the manual's expected documents; the $setIntersection of the first example is written with
$in (same meaning for these documents: stripedb has no set operators yet). Plus $$CURRENT
and $$ROOT in subdocuments, arrays of arrays, $$KEEP, a pruned top level, and 17053.
"""
import pymongo
import pytest
from pymongo.errors import OperationFailure

from proxy_helpers import ProxyCluster, shard_cmd_count
from proxy_helpers import install_filtering

CHI2_LIMIT = 45.0  # chi-square, 9 degrees of freedom: P(X > 45) ~ 9e-7


def chi_square(counts):
    n = sum(counts)
    exp = n / len(counts)
    return sum((c - exp) ** 2 / exp for c in counts)


def sample_counts(coll, n_docs, size, rounds, pipeline_prefix=()):
    """Run $sample rounds times; count the drawn _ids (0..n_docs-1) in 10 buckets."""
    counts = [0] * 10
    for _ in range(rounds):
        got = list(coll.aggregate(list(pipeline_prefix) + [{"$sample": {"size": size}}]))
        ids = [d["_id"] for d in got]
        assert len(ids) == size, got
        assert len(set(ids)) == size, ids  # without replacement
        for d in got:
            assert "$stripedbSampleKey" not in d, d  # the proxy's merge key never leaks
            counts[d["_id"] * 10 // n_docs] += 1
    return counts


def check_sample_basics(db):
    c = db.s
    c.insert_many([{"_id": i, "v": i % 7} for i in range(50)])
    assert list(c.aggregate([{"$sample": {"size": 0}}])) == []
    # more than there are: every document once
    got = list(c.aggregate([{"$sample": {"size": 500}}]))
    assert sorted(d["_id"] for d in got) == list(range(50))
    assert all(d == {"_id": d["_id"], "v": d["_id"] % 7} for d in got)
    got = list(c.aggregate([{"$sample": {"size": 10.9}}]))  # safeNumberLong truncates
    assert len(got) == 10 and len({d["_id"] for d in got}) == 10
    # after a $match, before other stages
    got = list(c.aggregate([{"$match": {"v": 3}}, {"$sample": {"size": 4}},
                            {"$project": {"_id": 0, "v": 1}}]))
    assert got == [{"v": 3}] * 4
    got = list(c.aggregate([{"$sort": {"_id": -1}}, {"$limit": 5}, {"$sample": {"size": 3}}]))
    assert len(got) == 3 and {d["_id"] for d in got} <= {45, 46, 47, 48, 49}
    (cnt,) = c.aggregate([{"$sample": {"size": 7}}, {"$count": "n"}])
    assert cnt == {"n": 7}
    (f,) = c.aggregate([{"$facet": {"a": [{"$sample": {"size": 2}}, {"$count": "n"}]}}])
    assert f == {"a": [{"n": 2}]}
    # mongod 6.0's errors (DocumentSourceSample::createFromBson)
    for spec, code in ((5, 28745), ("x", 28745), ({"size": "3"}, 28746),
                       ({"size": None}, 28746), ({"size": -1}, 28747),
                       ({"size": 1, "foo": 1}, 28748), ({}, 28749)):
        with pytest.raises(OperationFailure) as e:
            list(c.aggregate([{"$sample": spec}]))
        assert e.value.code == code, (spec, e.value.details)
    with pytest.raises(OperationFailure) as e:
        list(c.aggregate([{"$sample": {"size": -1}}]))
    assert "size argument to $sample must not be negative" in str(e.value)
    with pytest.raises(OperationFailure) as e:
        list(c.aggregate([{"$sample": {"size": 1, "foo": 1}}]))
    assert "unrecognized option to $sample: foo" in str(e.value)


def check_uniform(db, name="u", n_docs=100, size=5, rounds=400):
    c = db[name]
    c.insert_many([{"_id": i} for i in range(n_docs)])
    counts = sample_counts(c, n_docs, size, rounds)
    assert chi_square(counts) < CHI2_LIMIT, counts
    # each position of the output is uniform too (the output order is the random keys')
    firsts = [0] * 10
    for _ in range(300):
        (d,) = c.aggregate([{"$sample": {"size": 1}}])
        firsts[d["_id"] * 10 // n_docs] += 1
    assert chi_square(firsts) < CHI2_LIMIT, firsts


# ---- $redact: the manual's examples ----

FORECAST = {
    "_id": 1, "title": "123 Department Report", "tags": ["G", "STLW"], "year": 2014,
    "subsections": [
        {"subtitle": "Section 1: Overview", "tags": ["SI", "G"],
         "content": "Section 1: This is the content of section 1."},
        {"subtitle": "Section 2: Analysis", "tags": ["STLW"],
         "content": "Section 2: This is the content of section 2."},
        {"subtitle": "Section 3: Budgeting", "tags": ["TK"],
         "content": {"text": "Section 3: This is the content of section 3.",
                     "tags": ["HCS"]}},
    ],
}
# userAccess = ["STLW", "G"]: {$gt: [{$size: {$setIntersection: ["$tags", userAccess]}}, 0]}
FORECAST_REDACT = {"$cond": {
    "if": {"$or": [{"$in": ["STLW", "$tags"]}, {"$in": ["G", "$tags"]}]},
    "then": "$$DESCEND", "else": "$$PRUNE"}}
FORECAST_WANT = {
    "_id": 1, "title": "123 Department Report", "tags": ["G", "STLW"], "year": 2014,
    "subsections": [
        {"subtitle": "Section 1: Overview", "tags": ["SI", "G"],
         "content": "Section 1: This is the content of section 1."},
        {"subtitle": "Section 2: Analysis", "tags": ["STLW"],
         "content": "Section 2: This is the content of section 2."},
    ],
}

ACCOUNT = {
    "_id": 1, "level": 1, "acct_id": "xyz123",
    "cc": {"level": 5, "type": "yy", "num": 0, "exp_date": "2015-11-01",
           "billing_addr": {"level": 5, "addr1": "123 ABC Street", "city": "Some City"},
           "shipping_addr": [{"level": 3, "addr1": "987 XYZ Ave", "city": "Some City"},
                             {"level": 3, "addr1": "PO Box 0123", "city": "Some City"}]},
    "status": "A",
}
ACCOUNT_REDACT = {"$cond": {"if": {"$eq": ["$level", 5]},
                            "then": "$$PRUNE", "else": "$$DESCEND"}}
ACCOUNT_WANT = {"_id": 1, "level": 1, "acct_id": "xyz123", "status": "A"}


def check_redact(db):
    db.forecasts.insert_one(FORECAST)
    got = list(db.forecasts.aggregate([{"$match": {"year": 2014}},
                                       {"$redact": FORECAST_REDACT}]))
    assert got == [FORECAST_WANT]
    db.accounts.insert_many([ACCOUNT, {"_id": 2, "level": 5, "status": "A"}])
    got = list(db.accounts.aggregate([{"$match": {"status": "A"}},
                                      {"$redact": ACCOUNT_REDACT}, {"$sort": {"_id": 1}}]))
    assert got == [ACCOUNT_WANT]  # _id 2 is pruned at its top level: not output
    # $$KEEP keeps the whole (sub)document, even the parts a later level would prune
    got = list(db.accounts.aggregate([{"$match": {"_id": 1}}, {"$redact": {"$cond": [
        {"$eq": ["$level", 5]}, "$$KEEP", "$$DESCEND"]}}]))
    assert got == [ACCOUNT]
    got = list(db.accounts.aggregate([{"$sort": {"_id": 1}}, {"$redact": "$$KEEP"}]))
    assert [d["_id"] for d in got] == [1, 2] and got[0] == ACCOUNT
    assert list(db.accounts.aggregate([{"$redact": "$$PRUNE"}])) == []
    # a value equal to one of the variables acts as it (mongod compares values)
    got = list(db.accounts.aggregate([{"$match": {"_id": 2}}, {"$redact": "keep"}]))
    assert got == [{"_id": 2, "level": 5, "status": "A"}]

    # $$CURRENT is the subdocument, $$ROOT the input document at every depth
    db.nest.insert_one({"_id": 1, "owner": "ann", "a": {"owner": "bob", "x": 1},
                        "b": {"owner": "ann", "y": 2, "c": {"z": 3}},
                        "arr": [{"owner": "ann", "k": 1}, {"owner": "bob", "k": 2}, 7,
                                [{"owner": "bob"}, {"owner": "ann", "deep": True}, "s"],
                                []]})
    got = list(db.nest.aggregate([{"$redact": {"$cond": [
        {"$eq": ["$$CURRENT.owner", "$$ROOT.owner"]}, "$$DESCEND", "$$PRUNE"]}}]))
    # c has no owner: missing != "ann", pruned; non-documents stay; arrays recurse
    assert got == [{"_id": 1, "owner": "ann", "b": {"owner": "ann", "y": 2},
                    "arr": [{"owner": "ann", "k": 1}, 7, [{"owner": "ann", "deep": True}, "s"],
                            []]}]
    got = list(db.nest.aggregate([{"$redact": {"$cond": [
        {"$eq": ["$owner", "bob"]}, "$$PRUNE", "$$DESCEND"]}}, {"$project": {"arr": 1}}]))
    assert got == [{"_id": 1, "arr": [{"owner": "ann", "k": 1}, 7,
                                       [{"owner": "ann", "deep": True}, "s"], []]}]

    # 17053: anything else than the three values
    for expr, shown in (("$level", "returned 1"), ("foo", 'returned "foo"'),
                        ({"$cond": [{"$eq": ["$level", 1]}, "$$DESCEND", "$nope"]},
                         "returned MISSING")):
        with pytest.raises(OperationFailure) as e:
            list(db.accounts.aggregate([{"$match": {"_id": 1}}, {"$redact": expr}]))
        assert e.value.code == 17053, e.value.details
        assert "$redact's expression should not return anything aside from the variables " \
               "$$KEEP, $$DESCEND, and $$PRUNE, but returned" in str(e.value)
        assert shown in str(e.value), (shown, e.value.details)
    # the three variables exist only inside $redact
    with pytest.raises(OperationFailure) as e:
        list(db.accounts.aggregate([{"$project": {"k": "$$KEEP"}}]))
    assert e.value.code == 17276, e.value.details


# ---- a shard ----

def check_deep_output_refused(db):
    """A pipeline that nests $$ROOT in itself stage after stage builds documents deeper
    than any BSON document may be: 15 Overflow as mongod's Document::toBson, never a crash
    (a reviewer's 40 x 150 levels followed by $redact overflowed the stack of a shard and
    of a proxy), through $replaceWith, $addFields and $group; the server keeps serving."""
    db.deep.insert_one({"_id": 1})

    def nest(n, leaf):
        for _ in range(n):
            leaf = {"a": leaf}
        return leaf
    for last in ([{"$redact": "$$DESCEND"}], [{"$group": {"_id": 1, "p": {"$push": "$$ROOT"}}}],
                 []):
        for stage in ("$replaceWith", "$addFields"):
            spec = nest(150, "$$ROOT") if stage == "$replaceWith" else {"x": nest(50, "$$ROOT")}
            with pytest.raises(OperationFailure) as e:
                list(db.deep.aggregate([{stage: spec}] * 40 + last))
            assert e.value.code == 15, e.value.details
    assert len(list(db.deep.aggregate([{"$replaceWith": nest(150, "$$ROOT")},
                                       {"$redact": "$$DESCEND"}]))) == 1
    assert db.command("ping")["ok"] == 1


def check_sample_in_lookup(db):
    """$sample in a $lookup sub-pipeline runs again for every outer document, as mongod
    (lookup_random.js); the lookup cache (keyed by the stages and let values) held one draw
    for all 200 documents."""
    db.outer.insert_many([{"_id": i} for i in range(200)])
    db.inner.insert_many([{"_id": i} for i in range(50)])
    got = list(db.outer.aggregate([
        {"$lookup": {"from": "inner", "pipeline": [{"$sample": {"size": 1}}], "as": "s"}},
        {"$unwind": "$s"}, {"$group": {"_id": None, "ids": {"$addToSet": "$s._id"}}}]))
    assert len(got[0]["ids"]) > 10, got


def test_sample_on_a_shard(shard):
    _, port = shard
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true")
    try:
        check_sample_basics(c.sr)
        check_uniform(c.sr)
    finally:
        c.close()


def test_redact_on_a_shard(shard):
    _, port = shard
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true")
    try:
        check_redact(c.sr)
        check_deep_output_refused(c.sr)
        check_sample_in_lookup(c.sr)
    finally:
        c.close()


# ---- through a proxy ----

def test_through_a_proxy_unsharded(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    try:
        db = cl.proxy_client(0).sr
        check_sample_basics(db)
        check_uniform(db, rounds=200)
        check_redact(db)
    finally:
        cl.close()


def test_through_a_proxy_sharded(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    try:
        for coll in ("s", "forecasts", "accounts", "nest"):
            cl.shard_collection(f"sr.{coll}", {"_id": 1}, split_points=[{"_id": 2}])
        db = cl.proxy_client(0).sr
        check_sample_basics(db)
        check_redact(db)
        cl.shard_collection("sr.deep", {"_id": 1})
        check_deep_output_refused(db)
        cl.shard_collection("sr.inner", {"_id": 1}, split_points=[{"_id": 25}])
        check_sample_in_lookup(db)
        # documents on both shards in every case above
        a, b = (cl.shard_client(s).sr.s.count_documents({}) for s in cl.shard_ids)
        assert a > 0 and b > 0 and a + b == 50
        # a client cannot ask a shard's sampling through the proxy
        with pytest.raises(OperationFailure) as e:
            db.command({"aggregate": "s", "pipeline": [{"$sample": {"size": 1}}],
                        "cursor": {}, "$stripedbSampleKey": True})
        assert e.value.code == 2, e.value.details
    finally:
        cl.close()


def test_sample_follows_the_documents_not_the_shards(start_role, tmp_path):
    """1000 documents, 900 on one shard and 100 on the other: the draws are uniform over
    the documents, whether the proxy samples what per-chunk finds return (shards without
    filtering metadata) or each shard samples N with their random keys and the proxy keeps
    the N smallest keys of the union (shards with filtering metadata; their orphans are
    never sampled)."""
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1)
    try:
        cl.shard_collection("sr.big", {"_id": 1}, split_points=[{"_id": 900}])
        db = cl.proxy_client(0).sr
        db.big.insert_many([{"_id": i, "pad": "x" * 20} for i in range(1000)])
        shares = sorted(cl.shard_client(s).sr.big.count_documents({}) for s in cl.shard_ids)
        assert shares == [100, 900]
        # per-chunk finds (no filtering metadata yet): the proxy samples
        counts = sample_counts(db.big, 1000, 10, 150)
        assert chi_square(counts) < CHI2_LIMIT, counts

        # the same on a collection whose shards hold their filtering metadata (the proxy
        # remembers a shard without it for a while: a second collection, installed before
        # any request)
        cl.shard_collection("sr.big2", {"_id": 1}, split_points=[{"_id": 900}])
        chunks = install_filtering(cl, "sr.big2", {"_id": 1})
        db.big2.insert_many([{"_id": i, "pad": "x" * 20} for i in range(1000)])
        big = next(ch["shard"] for ch in chunks if ch["max"] == {"_id": 900})
        # orphans on the big shard (their key is the small shard's chunk)
        cl.shard_client(big).sr.big2.insert_many([{"_id": 5000 + i} for i in range(500)])
        before = {s: shard_cmd_count(cl, s, "aggregate") for s in cl.shard_ids}
        counts = sample_counts(db.big2, 1000, 10, 300)
        # the last bucket is the small shard's: a shard-balanced merge would give it ~1/2
        assert chi_square(counts) < CHI2_LIMIT, counts
        # the shards sampled (one aggregate each per $sample), not the proxy over finds
        for s in cl.shard_ids:
            assert shard_cmd_count(cl, s, "aggregate") - before[s] >= 300, s
        # after a $match on both shards' documents
        counts = [0] * 10
        for _ in range(200):
            for d in db.big2.aggregate([{"$match": {"_id": {"$gte": 800}}},
                                       {"$sample": {"size": 5}}]):
                assert 800 <= d["_id"] < 1000
                counts[(d["_id"] - 800) // 20] += 1
        assert chi_square(counts) < CHI2_LIMIT, counts
        got = list(db.big2.aggregate([{"$sample": {"size": 2000}}]))
        assert sorted(d["_id"] for d in got) == list(range(1000))
        # a shard's sample over more than one batch (getMore on its aggregate cursor)
        db.big2.insert_many([{"_id": 1000 + i} for i in range(1100)])
        got = list(db.big2.aggregate([{"$sample": {"size": 5000}}], batchSize=50))
        assert sorted(d["_id"] for d in got) == list(range(2100))
        got = list(db.big2.aggregate([{"$sample": {"size": 1500}}]))
        assert len({d["_id"] for d in got}) == 1500
        assert all(d["_id"] < 2100 and "$stripedbSampleKey" not in d for d in got)
    finally:
        cl.close()
