"""One active migration per chunk, decided by the metadata state machine (issue #18;
raft/fsm_migration.c, raft/migstate.h op version 3).

Two registrations of the same chunk racing (here: `stripedb ctl migrate` processes and
direct registerMigration commands, all at once) used to both be recorded: only the proxy's
moveChunk looked for an active migration before registering. At cluster op version 3 the
apply refuses every registration of a chunk that has a non-terminal migration with 117
ConflictingOperationInProgress, identically on every member. At op version 2 (the default
of a cluster whose members may still run an older binary) registrations apply as before.
"""
import subprocess
import threading

from pymongo.errors import OperationFailure

from conftest import BIN, OP_VERSION_MAX, wait_until
from metadata_cluster import Cluster

NS = "app.users"


def seed(c):
    c.write("addShard", "shard-a", uri="mongodb://a.example:27017")
    c.write("addShard", "shard-b", uri="mongodb://b.example:27017")
    c.write("createDatabase", "app")
    r = c.write("shardCollection", NS, key={"uid": 1},
                splitPoints=[{"uid": 100}, {"uid": 200}])
    assert r["chunks"] == 3
    chunks = c.leader().cmd("getRoutingTable", NS)["chunks"]
    return sorted(ch["id"] for ch in chunks), {ch["id"]: ch["shard"] for ch in chunks}


def ctl(seeds, *args):
    return subprocess.run([BIN, "ctl", f"--metadata={seeds}", *args],
                          capture_output=True, text=True, timeout=60)


def non_terminal(c, chunk):
    migs = c.leader().cmd("listMigrations")["migrations"]
    return [m["id"] for m in migs
            if m.get("spec", {}).get("ns") == NS
            and m.get("spec", {}).get("chunk") in (chunk, str(chunk))
            and m["state"] not in ("complete", "aborted", "rolled_back")]


def race(c, chunk, src, dst, nctl=6, ncmd=6, tag="a"):
    """Register chunk's migration from nctl ctl processes and ncmd threads at once.
    Returns (registered ids, refusal messages)."""
    seeds = c.seeds()
    procs = [subprocess.Popen([BIN, "ctl", f"--metadata={seeds}", "--json", "migrate", NS,
                               "--chunk", str(chunk), "--to", dst],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(nctl)]
    start = threading.Barrier(ncmd)
    results = []
    lock = threading.Lock()

    def one(i):
        client = c.rs_client()
        try:
            start.wait()
            # half of them name the chunk as a decimal string, as the coordinator accepts
            r = client.admin.command("registerMigration", f"race-{tag}-{chunk}-{i}", ns=NS,
                                     chunk=chunk if i % 2 else str(chunk), **{"from": src},
                                     to=dst)
            out = ("ok", r["id"])
        except OperationFailure as e:
            out = ("err", e.code, str(e))
        finally:
            client.close()
        with lock:
            results.append(out)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(ncmd)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    ok, refused = [], []
    for p in procs:
        out, err = p.communicate(timeout=60)
        if p.returncode == 0:
            ok.append(out.strip())
        else:
            assert p.returncode == 1, (p.returncode, err)
            refused.append(err)
    for r in results:
        if r[0] == "ok":
            ok.append(r[1])
        else:
            assert r[1] == 117, r
            refused.append(r[2])
    return ok, refused


def test_second_active_migration_of_a_chunk_is_refused_by_metadata(start_role, tmp_path):
    c = Cluster(start_role, tmp_path, 3)
    ids, owner = seed(c)
    c1, c2 = ids[0], ids[1]
    other = {"shard-a": "shard-b", "shard-b": "shard-a"}
    # a new cluster starts at the newest op version (its leader raises it once ready):
    # lower it to 2, as an existing cluster upgraded in place has it until an operator
    # raises it
    wait_until(lambda: c.leader().cmd("metadataStatus", 1)["opVersion"] == OP_VERSION_MAX,
               30, what="the new cluster's newest op version")
    c.write("setOpVersion", 2)

    # op version 2: the old rules, two registrations of one chunk both recorded
    r = c.write("registerMigration", "old-1", ns=NS, chunk=c2, **{"from": owner[c2]},
                to=other[owner[c2]])
    assert r["state"] == "registered"
    c.write("registerMigration", "old-2", ns=NS, chunk=c2, **{"from": owner[c2]},
            to=other[owner[c2]])
    assert sorted(non_terminal(c, c2)) == ["old-1", "old-2"]

    # raise the cluster op version (every member runs this binary)
    r = ctl(c.seeds(), "metadata", "op-version", "3")
    assert r.returncode == 0, r.stderr
    bad = ctl(c.seeds(), "metadata", "op-version", "x")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    tooh = ctl(c.seeds(), "metadata", "op-version", str(OP_VERSION_MAX + 1))
    assert tooh.returncode == 1, tooh.stderr

    # a chunk that already has two active migrations (from op version 2) refuses a third
    try:
        c.leader().cmd("registerMigration", "new-on-c2", ns=NS, chunk=c2,
                       **{"from": owner[c2]}, to=other[owner[c2]])
        raise AssertionError("a third migration of chunk %d was registered" % c2)
    except OperationFailure as e:
        assert e.code == 117 and e.details["codeName"] == "ConflictingOperationInProgress"
        assert e.details["activeMigration"] in ("old-1", "old-2")

    # the race: exactly one registration of chunk c1 wins, every other one gets 117
    ok, refused = race(c, c1, owner[c1], other[owner[c1]])
    assert len(ok) == 1, (ok, refused)
    assert len(refused) == 11
    assert all("already being migrated" in m for m in refused), refused
    winners = non_terminal(c, c1)
    assert len(winners) == 1
    win = winners[0]

    # a different chunk of the same collection is not affected
    r = c.write("registerMigration", "c2-not", ns="app.other", chunk=c1, **{"from": "shard-a"},
                to="shard-b")
    assert r["state"] == "registered"

    # once the winner ends (aborted: terminal), the chunk can be migrated again
    c.write("updateMigration", win, expectState="registered", state="aborted")
    ok, refused = race(c, c1, owner[c1], other[owner[c1]], nctl=3, ncmd=3,
                        tag="b")
    assert len(ok) == 1 and len(refused) == 5, (ok, refused)
    assert len(non_terminal(c, c1)) == 1

    # every member applied the same refusals: identical state and apply chain
    c.converged(c.members)


def test_leader_refuses_an_illegal_migration_update_before_the_log(start_role, tmp_path):
    """The leader checks an updateMigration before proposing it (src/metadata/role.c):
    expectState required, expectState -> state an edge of raft/migstate.h's table. So no
    entry a member of an older binary would apply differently enters the log during a
    rolling upgrade; the record's version shows nothing was applied."""
    c = Cluster(start_role, tmp_path, 1)
    wait_until(lambda: c.leader().cmd("metadataStatus", 1)["opVersion"] == OP_VERSION_MAX,
               30, what="the new cluster's newest op version")  # its one setOpVersion entry is in
    c.write("registerMigration", "m1", ns=NS, chunk=1, **{"from": "shard-a"}, to="shard-b")
    before = c.leader().cmd("getMigration", "m1")["migration"]
    last_index = c.leader().cmd("metadataStatus", 1)["lastIndex"]
    for kw, code in (({"state": "importing"}, 2),                  # no expectState
                     ({"expectState": "registered", "state": "complete"}, 20),
                     ({"expectState": "registered", "state": "nonsense"}, 2),
                     ({"expectState": "bogus", "state": "importing"}, 2)):
        try:
            c.leader().cmd("updateMigration", "m1", **kw)
            raise AssertionError(f"updateMigration {kw} was accepted")
        except OperationFailure as e:
            assert e.code == code, (kw, e.details)
    # refused before proposing: the log did not grow (apply would refuse them too, but
    # only after every member, old binaries included, had the entry)
    assert c.leader().cmd("metadataStatus", 1)["lastIndex"] == last_index
    after = c.leader().cmd("getMigration", "m1")["migration"]
    assert after["state"] == "registered" and after["version"] == before["version"]
    # a legal edge still applies
    r = c.write("updateMigration", "m1", expectState="registered", state="importing")
    assert r["state"] == "importing" and r["version"] == before["version"] + 1
