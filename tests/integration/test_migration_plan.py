"""Migrations of several chunks at once and import filters (issue #17): `ctl migrate --plan`
(chunks from several sources to several targets), `ctl migrate --chunks A,B` (several chunks,
one target), `ctl migrate --filter` (one tenant of a compound shard key {t: 1, k: 1} moved by
cutting its key range out of its chunk), each under a write load with the checker's verdict;
bad plans exit 2 with one stderr line and register nothing; a plan whose k-th registration
fails aborts the k-1 registered before it."""
import json
import subprocess

from bson.max_key import MaxKey
from bson.min_key import MinKey

from checker import check
from conftest import BIN, wait_until
from migration_helpers import MigCluster, Workload

GRACE = "--grace-ms=200"


def _by_min(cl, ns, field="k"):
    """{min value of the first key field (MinKey as 'min'): chunk} of ns."""
    out = {}
    for c in cl.chunks(ns):
        v = c["min"][field]
        out["min" if isinstance(v, MinKey) else v] = c
    return out


def _ctl_stdin(cl, stdin, *args):
    return subprocess.run([BIN, "ctl", f"--metadata={cl.metadata}"] + list(args),
                          input=stdin.encode(), capture_output=True, timeout=180)


def _ids(out):
    return [l for l in out.decode().splitlines() if len(l.split()) == 1]


def _verdict(cl, ns, wl):
    final = {k: v for k, v in cl.owned_docs(ns).items() if str(k).startswith("d")}
    verdict = check(wl.history, final)
    assert verdict["ok"], verdict["violations"][:10]
    assert verdict["stats"]["acked"] > 0
    return verdict


def _run_load(cl, ns, **kw):
    wl = Workload(cl, ns, writers=2, readers=1, keys=200, **kw).start()
    wait_until(lambda: wl.acked() >= 50, 30, what="workload running")
    return wl


def _after_load(wl):
    n = wl.acked()
    wait_until(lambda: wl.acked() >= n + 50, 30, what="writes after the moves")
    wl.stop()


def test_plan_moves_chunks_from_two_sources_to_two_targets(start_role, tmp_path):
    """A plan read from stdin swaps chunks between shard-a and shard-b in one group (a -> b
    and b -> a, registered together; the coordinator runs them within its budgets), under
    writes, and moves one tenant of a second namespace by a filter in the same plan."""
    cl = MigCluster(start_role, tmp_path, meta=1, shards=2, proxies=1, coordinators=1)
    try:
        ns = "app.c"
        cl.shard_collection(ns, {"k": 1}, split_points=[{"k": 50}, {"k": 100}, {"k": 150}],
                            shards=["shard-a", "shard-b", "shard-a", "shard-b"])
        coll = cl.proxy_client()["app"]["c"]
        coll.insert_many([{"_id": f"p{i}", "k": i, "v": -i} for i in range(200)])
        # a second namespace in the same plan, moved by a filter: tenant beta a -> b
        cl.shard_collection("app.t", {"t": 1, "k": 1}, split_points=[{"t": "m", "k": MinKey()}],
                            shards=["shard-a", "shard-b"])
        tcoll = cl.proxy_client()["app"]["t"]
        tcoll.insert_many([{"_id": f"{t}{i}", "t": t, "k": i} for t in ("acme", "beta")
                           for i in range(20)])
        ch = _by_min(cl, ns)
        wl = _run_load(cl, ns)
        plan = {"moves": [{"ns": ns, "chunk": ch["min"]["id"], "to": "shard-b"},
                          {"ns": ns, "chunk": ch[50]["id"], "to": "shard-a"},
                          {"ns": "app.t", "filter": {"t": "beta"}, "to": "shard-b"},
                          {"ns": ns, "chunk": ch[100]["id"], "to": "shard-b"}]}
        r = _ctl_stdin(cl, json.dumps(plan), "migrate", "--plan", "-", GRACE, "--wait")
        assert r.returncode == 0, (r.stdout, r.stderr)
        lines = r.stdout.decode().splitlines()
        # the filter's range cut out first, then the group and one id a line
        assert lines[0].startswith("split app.t chunk ") and lines[1].startswith("split app.t")
        assert lines[2].startswith("filter range ") and lines[2].endswith("of app.t: 1 chunk(s)")
        assert lines[3].startswith("group plan-")
        group = lines[3].split()[1]
        ids = _ids(r.stdout)
        assert len(ids) == 4
        _after_load(wl)
        for mid in ids:
            m = cl.migration(mid)
            assert m["state"] == "complete", m
            assert m["spec"]["group"] == group
            assert m["stats"]["verify"]["missing"] == 0 and m["stats"]["verify"]["extra"] == 0
        ch = _by_min(cl, ns)
        assert [ch[k]["shard"] for k in ("min", 50, 100, 150)] == [
            "shard-b", "shard-a", "shard-b", "shard-b"]
        # per shard: exactly the preloaded documents of the chunks it owns now
        pa = cl.shard_client("shard-a")["app"]["c"]
        pb = cl.shard_client("shard-b")["app"]["c"]
        assert sorted(d["k"] for d in pa.find({"_id": {"$regex": "^p"}})) == list(range(50, 100))
        assert sorted(d["k"] for d in pb.find({"_id": {"$regex": "^p"}})) == (
            list(range(0, 50)) + list(range(100, 200)))
        _verdict(cl, ns, wl)
        pre = {k: v for k, v in cl.owned_docs(ns).items() if str(k).startswith("p")}
        assert len(pre) == 200 and all(pre[f"p{i}"]["v"] == -i for i in range(200))
        listed = json.loads(cl.ctl("--json", "migration", "list", "--group", group).stdout)
        assert sorted(m["id"] for m in listed["migrations"]) == sorted(ids)
        table = cl.ctl("migration", "list").stdout.decode().splitlines()
        assert table[0].split()[-1] == "GROUP"
        assert sum(1 for l in table[1:] if l.split()[-1] == group) == 4
        ta = cl.shard_client("shard-a")["app"]["t"]
        tb = cl.shard_client("shard-b")["app"]["t"]
        assert (ta.count_documents({"t": "beta"}), tb.count_documents({"t": "beta"})) == (0, 20)
        assert (ta.count_documents({"t": "acme"}), tb.count_documents({"t": "acme"})) == (20, 0)
        assert tcoll.count_documents({}) == 40
    finally:
        cl.close()


def test_chunks_same_source_and_target(start_role, tmp_path):
    """--chunks A,B: two of shard-a's three chunks move to shard-b together; the third and
    its documents stay on shard-a."""
    cl = MigCluster(start_role, tmp_path, meta=1, shards=2, proxies=1, coordinators=1)
    try:
        ns = "app.c"
        cl.shard_collection(ns, {"k": 1}, split_points=[{"k": 50}, {"k": 100}, {"k": 150}],
                            shards=["shard-a", "shard-a", "shard-a", "shard-b"])
        coll = cl.proxy_client()["app"]["c"]
        coll.insert_many([{"_id": f"p{i}", "k": i, "v": -i} for i in range(200)])
        ch = _by_min(cl, ns)
        wl = _run_load(cl, ns)
        a, b = ch["min"]["id"], ch[100]["id"]
        r = cl.ctl("migrate", ns, "--chunks", f"{a},{b}", "--to", "shard-b", "--dry-run")
        assert r.stdout.decode().splitlines() == [
            f"would migrate {ns} chunk {a} from shard-a to shard-b",
            f"would migrate {ns} chunk {b} from shard-a to shard-b"]
        assert cl.meta_read({"listMigrations": 1})["migrations"] == []
        r = cl.ctl("migrate", ns, "--chunks", f"{a},{b}", "--to", "shard-b", GRACE, "--wait",
                   timeout=180)
        ids = _ids(r.stdout)
        assert len(ids) == 2
        _after_load(wl)
        assert {cl.migration(i)["spec"]["chunk"] for i in ids} == {a, b}
        assert all(cl.migration(i)["state"] == "complete" for i in ids)
        ch = _by_min(cl, ns)
        assert [ch[k]["shard"] for k in ("min", 50, 100, 150)] == [
            "shard-b", "shard-a", "shard-b", "shard-b"]
        pa = cl.shard_client("shard-a")["app"]["c"]
        assert sorted(d["k"] for d in pa.find({"_id": {"$regex": "^p"}})) == list(range(50, 100))
        _verdict(cl, ns, wl)
        assert coll.count_documents({"_id": {"$regex": "^p"}}) == 200
    finally:
        cl.close()


def test_filter_moves_one_tenant_of_a_compound_key(start_role, tmp_path):
    """--filter '{"t": "beta"}' on {t: 1, k: 1}: beta's key range is cut out of the chunk
    it shares with acme (splits at {t: beta, k: MinKey} and {t: beta, k: MaxKey}), moved to
    shard-b under writes to beta; acme's documents stay on shard-a."""
    cl = MigCluster(start_role, tmp_path, meta=1, shards=2, proxies=1, coordinators=1)
    try:
        ns = "app.t"
        cl.shard_collection(ns, {"t": 1, "k": 1}, split_points=[{"t": "m", "k": MinKey()}],
                            shards=["shard-a", "shard-b"])
        coll = cl.proxy_client()["app"]["t"]
        for t in ("acme", "beta", "zeta"):
            coll.insert_many([{"_id": f"p-{t}-{i}", "t": t, "k": i, "v": -i} for i in range(100)])
        (c0,) = [c for c in cl.chunks(ns) if c["shard"] == "shard-a"]
        wl = _run_load(cl, ns, fixed={"t": "beta"})
        r = cl.ctl("migrate", ns, "--filter", '{"t": "beta"}', "--to", "shard-b", "--dry-run")
        out = r.stdout.decode().splitlines()
        assert out[0].startswith(f"would split {ns} chunk {c0['id']} at ")
        assert len(out) == 3
        assert out[2].startswith(f"would migrate {ns} chunk {c0['id']}'s part ")
        assert out[2].endswith(" from shard-a to shard-b")
        assert len(cl.chunks(ns)) == 2  # a dry run splits nothing
        r = cl.ctl("migrate", ns, "--filter", '{"t": "beta"}', "--to", "shard-b", GRACE,
                   "--wait", timeout=180)
        ids = _ids(r.stdout)
        assert len(ids) == 1
        _after_load(wl)
        assert cl.migration(ids[0])["state"] == "complete"
        chunks = sorted(cl.chunks(ns), key=lambda c: (
            0 if isinstance(c["min"]["t"], MinKey) else 1, str(c["min"]["t"]),
            0 if isinstance(c["min"]["k"], MinKey) else 1))
        bounds = [(c["min"], c["max"], c["shard"]) for c in chunks]
        assert len(bounds) == 4, bounds
        assert isinstance(bounds[0][0]["t"], MinKey) and bounds[0][2] == "shard-a"
        assert bounds[1][0] == {"t": "beta", "k": MinKey()}
        assert bounds[1][1] == {"t": "beta", "k": MaxKey()}
        assert bounds[1][2] == "shard-b"
        assert bounds[2][0] == {"t": "beta", "k": MaxKey()} and bounds[2][2] == "shard-a"
        assert bounds[2][1] == {"t": "m", "k": MinKey()}
        sa = cl.shard_client("shard-a")["app"]["t"]
        sb = cl.shard_client("shard-b")["app"]["t"]
        # every beta document on shard-b, none left on shard-a; acme stays, zeta stays
        assert sa.count_documents({"t": "beta"}) == 0
        assert sb.count_documents({"t": "beta", "_id": {"$regex": "^p"}}) == 100
        assert sa.count_documents({"t": "acme"}) == 100
        assert sb.count_documents({"t": "acme"}) == 0
        assert sb.count_documents({"t": "zeta"}) == 100
        _verdict(cl, ns, wl)
        assert coll.count_documents({"_id": {"$regex": "^p"}}) == 300
        # after the splits and the switch both shards take writes of what they own
        for t, home in (("acme", sa), ("beta", sb), ("zeta", sb)):
            coll.insert_one({"_id": f"late-{t}", "t": t, "k": 1000})
            assert coll.find_one({"_id": f"late-{t}", "t": t, "k": 1000})["t"] == t
            assert home.count_documents({"_id": f"late-{t}"}) == 1
            assert coll.update_one({"_id": f"p-{t}-5", "t": t, "k": 5},
                                   {"$set": {"v": 5}}).modified_count == 1
        # again: every chunk of the range is on the target already: nothing registered
        r = cl.ctl("migrate", ns, "--filter", '{"t": "beta"}', "--to", "shard-b")
        assert _ids(r.stdout) == []
        assert len(cl.meta_read({"listMigrations": 1})["migrations"]) == 1
    finally:
        cl.close()


def test_bad_plans_register_nothing(start_role, tmp_path):
    """Exit 2, one line on stderr, no migration registered and no chunk split for: an
    unknown chunk, an unknown shard or namespace, a chunk to its own shard, a chunk twice,
    malformed JSON, a filter on a field outside the key, $or, $regex, a range with one bound
    or bounds of two types, a field twice, a hashed key, a filter overlapping a chunk of the
    same plan, and a plan whose last move is bad. Then two accepted range filters, dry run."""
    cl = MigCluster(start_role, tmp_path, meta=1, shards=2, proxies=0, coordinators=0)
    try:
        ns = "app.t"
        cl.shard_collection(ns, {"t": 1, "k": 1}, split_points=[{"t": "m", "k": MinKey()}],
                            shards=["shard-a", "shard-b"])
        cl.meta_write({"shardCollection": "app.h", "key": {"t": "hashed"}, "numChunks": 2,
                       "shards": ["shard-a", "shard-b"]})
        a, b = sorted(c["id"] for c in cl.chunks(ns))
        before = sorted((c["id"], c["shard"]) for c in cl.chunks(ns))
        beta = {"ns": ns, "filter": {"t": "beta"}, "to": "shard-b"}
        cases = [
            (["migrate", ns, "--chunks", f"{a},999999", "--to", "shard-b"], None, "no chunk 999999"),
            (["migrate", ns, "--chunks", f"{a}", "--to", "shard-z"], None, "unknown shard 'shard-z'"),
            (["migrate", ns, "--chunks", f"{b}", "--to", "shard-b"], None, "already on shard-b"),
            (["migrate", ns, "--chunks", f"{a},{a}", "--to", "shard-b"], None, "moved twice"),
            (["migrate", "--plan", "-"], '{"moves": [{"ns": ', "malformed JSON"),
            (["migrate", "--plan", "-"], json.dumps({"moves": [
                {"ns": ns, "chunk": a, "to": "shard-b"},
                {"ns": ns, "chunk": a, "to": "shard-b"}]}), "moved twice"),
            (["migrate", ns, "--filter", '{"v": 1}', "--to", "shard-b"], None,
             "field 'v' is not in the shard key"),
            (["migrate", ns, "--filter", '{"$or": [{"t": "a"}, {"t": "b"}]}', "--to", "shard-b"],
             None, "operator $or is not supported"),
            (["migrate", ns, "--filter", '{"t": {"$regex": "^b"}}', "--to", "shard-b"], None,
             "a regex value"),
            (["migrate", ns, "--filter", '{"t": {"$gte": "b"}}', "--to", "shard-b"], None,
             "needs both a lower"),
            (["migrate", ns, "--filter", '{"k": 5}', "--to", "shard-b"], None,
             "equality on a prefix"),
            (["migrate", "app.h", "--filter", '{"t": "beta"}', "--to", "shard-b"], None,
             "hashed shard key"),
            (["migrate", ns, "--filter", '{"t": "a", "t": "b"}', "--to", "shard-b"], None,
             "field 't' is given twice"),
            (["migrate", ns, "--filter", '{"t": {"$eq": "a", "$gte": "a"}}', "--to", "shard-b"],
             None, "either $eq or a range"),
            (["migrate", ns, "--filter", '{"t": {"$gte": "a", "$lt": 5}}', "--to", "shard-b"],
             None, "of one type"),
            (["migrate", "app.nope", "--chunks", "1", "--to", "shard-b"], None, "app.nope"),
            (["migrate", "--plan", "-"], json.dumps({"moves": [
                beta, {"ns": ns, "chunk": a, "to": "shard-b"}]}), "overlaps the filter"),
            (["migrate", "--plan", "-"], json.dumps({"moves": [
                {"ns": ns, "chunk": a, "to": "shard-b"},
                {"ns": ns, "chunk": b, "to": "shard-q"}]}), "plan: move 2: unknown shard 'shard-q'"),
            # bounds metadata cannot order (its comparator reads a Decimal128 as 0 and a NaN
            # equal to every number: a split there was misplaced, a fresh review found)
            (["migrate", ns, "--filter",
              '{"t": {"$gte": {"$numberDecimal": "-3"}, "$lt": {"$numberDecimal": "-1"}}}',
              "--to", "shard-b"], None, "$gte is not supported"),
            (["migrate", ns, "--filter", '{"t": {"$gte": 10, "$lt": {"$numberDecimal": "20"}}}',
              "--to", "shard-b"], None, "$lt is not supported"),
            (["migrate", ns, "--filter", '{"t": {"$numberDouble": "NaN"}}', "--to", "shard-b"],
             None, "a NaN value"),
            (["migrate", ns, "--filter", '{"t": {"$numberDecimal": "1"}}', "--to", "shard-b"],
             None, "a Decimal128 value"),
            (["migrate", ns, "--chunks", f"{a},,{b}", "--to", "shard-b"], None,
             "'' is not a chunk id"),
            (["migrate", ns, "--filter", "5", "--to", "shard-b"], None,
             "a filter is a JSON document"),
        ]
        for args, stdin, want in cases:
            r = _ctl_stdin(cl, stdin or "", *args)
            err = r.stderr.decode()
            assert r.returncode == 2, (args, r.stdout, err)
            assert len(err.splitlines()) == 1, (args, err)
            assert want in err, (args, err)
            assert r.stdout == b"", (args, r.stdout)
        # accepted ranges, shown by --dry-run: on the field after an equality prefix, and on
        # the first field (the other fields of a bound MinKey)
        r = cl.ctl("migrate", ns, "--filter", '{"t": "acme", "k": {"$gte": 10, "$lt": 20}}',
                   "--to", "shard-b", "--dry-run")
        out = r.stdout.decode().splitlines()
        assert out[0] == f'would split {ns} chunk {a} at {{ "t" : "acme", "k" : 10 }}', out
        assert out[1] == f'would split {ns} chunk {a} at {{ "t" : "acme", "k" : 20 }}', out
        assert out[2].startswith(f"would migrate {ns} chunk {a}'s part ") and len(out) == 3
        # the same with --json: one JSON document, nothing else on stdout
        r = cl.ctl("--json", "migrate", ns, "--filter",
                   '{"t": "acme", "k": {"$gte": 10, "$lt": 20}}', "--to", "shard-b",
                   "--dry-run")
        j = json.loads(r.stdout.decode())
        assert [(x["chunk"], x["at"]) for x in j["splits"]] == \
            [(a, {"t": "acme", "k": 10}), (a, {"t": "acme", "k": 20})], j
        assert [(x["chunk"], x["from"], x["to"], x["min"], x["max"]) for x in j["plan"]] == \
            [(a, "shard-a", "shard-b", {"t": "acme", "k": 10}, {"t": "acme", "k": 20})], j
        r = cl.ctl("migrate", ns, "--filter", '{"t": {"$gte": "a", "$lte": "c"}}',
                   "--to", "shard-b", "--dry-run")
        out = r.stdout.decode().splitlines()
        assert out[0] == (f'would split {ns} chunk {a} at '
                          '{ "t" : "a", "k" : { "$minKey" : 1 } }'), out
        assert out[1] == (f'would split {ns} chunk {a} at '
                          '{ "t" : "c", "k" : { "$maxKey" : 1 } }'), out
        # a filter whose range is on the target already: nothing cut, nothing registered
        r = cl.ctl("migrate", ns, "--filter", '{"t": "acme"}', "--to", "shard-a")
        assert r.returncode == 0 and "split" not in r.stdout.decode(), r.stdout
        assert cl.meta_read({"listMigrations": 1})["migrations"] == []
        assert sorted((c["id"], c["shard"]) for c in cl.chunks(ns)) == before
    finally:
        cl.close()


def test_a_chunk_in_migration_fails_the_plan_before_anything_changes(start_role, tmp_path):
    """Move 3 of a plan names a chunk another migration holds (metadata allows one active
    migration per chunk), and a filter's range overlaps it: each plan exits 1 naming the
    migration, with nothing registered and no chunk split (a fresh review found the first
    two moves registered then aborted, and a split left behind)."""
    cl = MigCluster(start_role, tmp_path, meta=1, shards=2, proxies=1, coordinators=1)
    try:
        ns = "app.c"
        cl.shard_collection(ns, {"k": 1}, split_points=[{"k": 50}, {"k": 100}],
                            shards=["shard-a", "shard-b", "shard-a"])
        ch = _by_min(cl, ns)
        # the blocker: paused before it is registered, so it stays in replicating
        cl.ctl("migration", "pause", "blocker")
        cl.meta_write({"registerMigration": "blocker", "ns": ns, "chunk": ch[100]["id"],
                       "from": "shard-a", "to": "shard-b"})
        plan = {"moves": [{"ns": ns, "chunk": ch["min"]["id"], "to": "shard-b"},
                          {"ns": ns, "chunk": ch[50]["id"], "to": "shard-a"},
                          {"ns": ns, "chunk": ch[100]["id"], "to": "shard-b"}]}
        before = sorted((c["id"], c["shard"]) for c in cl.chunks(ns))
        r = _ctl_stdin(cl, json.dumps(plan), "migrate", "--plan", "-", GRACE)
        assert r.returncode == 1, (r.stdout, r.stderr)
        assert "is being migrated by blocker" in r.stderr.decode(), r.stderr
        r = cl.ctl("migrate", ns, "--filter", '{"k": {"$gte": 60, "$lt": 120}}',
                   "--to", "shard-a", check=False)
        assert r.returncode == 1, (r.stdout, r.stderr)
        assert "is being migrated by blocker" in r.stderr.decode(), r.stderr
        assert [m["id"] for m in cl.meta_read({"listMigrations": 1})["migrations"]] == \
            ["blocker"]
        assert sorted((c["id"], c["shard"]) for c in cl.chunks(ns)) == before
        cl.ctl("migration", "rollback", "blocker")
        cl.ctl("migration", "resume", "blocker")
        assert cl.wait_migration("blocker")["state"] in ("aborted", "rolled_back")
    finally:
        cl.close()
