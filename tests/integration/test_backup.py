"""Backups and point-in-time restore (issue #22): `stripedb ctl backup create|list|delete`
and `stripedb ctl restore` against a real shard, coordinator, CDC log and file: archive.

The restore test is Jepsen-style: writers record every operation with the wall time it
was sent and acknowledged; the collection restored as of T must hold, for every _id, the
state after its last operation acknowledged before T, or (only when one was in flight at
T) the state after that one; nothing sent after T.
"""
import os
import subprocess
import threading
import time

import bson
import pytest

from cdc_helpers import CdcCluster
from conftest import BIN, free_port, wait_until


@pytest.fixture
def cl(start_role, tmp_path):
    c = CdcCluster(start_role, tmp_path, shards=1)
    yield c
    c.close()


def ctl(cl, *args, env_extra=None, check=True):
    env = dict(os.environ)
    env["STRIPEDB_CDC"] = cl.cdc
    env["STRIPEDB_ARCHIVE"] = cl.archive
    env.update(env_extra or {})
    r = subprocess.run([BIN, "ctl", f"--metadata={cl.metadata}"] + list(args),
                       capture_output=True, env=env, timeout=120)
    if check:
        assert r.returncode == 0, r.stderr.decode()
    return r


def shard_uri(cl):
    return f"mongodb://127.0.0.1:{cl.shard_ports['shard-a']}/?directConnection=true"


def start(cl, tmp_path):
    return cl.start_coordinator(f"embedded:{tmp_path}/cdc", archive=f"file:{tmp_path}/arch")


def test_backup_create_list_delete(cl, tmp_path):
    start(cl, tmp_path)
    c = cl.shard_client("shard-a")
    c.db1.a.insert_many([{"_id": i, "x": "a" * i} for i in range(300)])
    c.db2.b.insert_many([{"_id": i, "d": {"y": [i, None, 1.5]}} for i in range(50)])
    r = ctl(cl, "backup", "create", "--all")
    out = r.stdout.decode()
    assert "2 collections, 350 documents" in out, out
    r = ctl(cl, "--json", "backup", "list")
    import json
    lst = json.loads(r.stdout)["backups"]
    assert len(lst) == 1
    m = lst[0]
    assert m["shard"] == "shard-a"
    by_ns = {e["ns"]: e for e in m["collections"]}
    assert set(by_ns) == {"db1.a", "db2.b"}
    # the data object is the collection's documents, byte for byte, hash in the manifest
    data = (tmp_path / "arch" / by_ns["db1.a"]["object"]).read_bytes()
    docs = bson.decode_all(data)
    assert docs == list(c.db1.a.find().sort("_id", 1)) or \
        sorted(docs, key=lambda d: d["_id"]) == list(c.db1.a.find().sort("_id", 1))
    import hashlib
    assert hashlib.sha256(data).hexdigest() == by_ns["db1.a"]["sha256"]
    assert int(by_ns["db1.a"]["count"]["$numberLong"]) == 300
    # a second backup, then delete the first one
    ctl(cl, "backup", "create", "--shard=shard-a")
    ids = [b["id"] for b in json.loads(ctl(cl, "--json", "backup", "list").stdout)["backups"]]
    assert len(ids) == 2 and ids[0] != ids[1]
    r = ctl(cl, "backup", "delete", ids[0])
    assert f"deleted backup {ids[0]}" in r.stdout.decode()
    left = [b["id"] for b in json.loads(ctl(cl, "--json", "backup", "list").stdout)["backups"]]
    assert left == [ids[1]]
    assert not (tmp_path / "arch" / "backups" / "shard-a" / ids[0]).exists()
    r = ctl(cl, "backup", "delete", ids[0], check=False)
    assert r.returncode == 1 and b"no backup" in r.stderr
    # bad usage and an unknown shard
    assert ctl(cl, "backup", "create", check=False).returncode == 2
    r = ctl(cl, "backup", "create", "--shard=nope", check=False)
    assert r.returncode == 1 and b"no shard nope" in r.stderr


def test_backup_to_unreachable_s3_names_bucket_and_operation(cl, tmp_path):
    start(cl, tmp_path)
    port = free_port()
    r = ctl(cl, "backup", "list", "--archive=s3://bkt-missing/pfx",
            f"--s3-endpoint=http://127.0.0.1:{port}",
            env_extra={"AWS_ACCESS_KEY_ID": "AKIA", "AWS_SECRET_ACCESS_KEY": "x"}, check=False)
    assert r.returncode == 1
    lines = r.stderr.decode().strip().splitlines()
    assert len(lines) == 1, lines
    assert "bkt-missing" in lines[0] and "ListObjectsV2" in lines[0], lines


def now_ms():
    return int(time.time() * 1000)


def writer(c, base, n_ids, stop, log):
    """Insert, update and delete its own _ids (base..base+n_ids) in a loop; log
    (send_ms, ack_ms or None, _id, state after: dict or None for deleted)."""
    coll = c.db.c
    i = 0
    while not stop.is_set():
        k = base + (i % n_ids)
        phase = (i // n_ids) % 3
        send = now_ms()
        try:
            if phase == 0:
                doc = {"_id": k, "v": i}
                coll.replace_one({"_id": k}, doc, upsert=True)
                after = doc
            elif phase == 1:
                coll.update_one({"_id": k}, {"$set": {"v": i, "u": True}})
                after = {"_id": k, "v": i, "u": True}
            else:
                coll.delete_one({"_id": k})
                after = None
            log.append((send, now_ms(), k, after))
        except Exception:  # unacknowledged: unknown outcome
            log.append((send, None, k, after))
        i += 1


def expected_states(initial, logs, t):
    """_id -> list of allowed states (None = absent) at t."""
    allowed = {}
    for k, v in initial.items():
        allowed[k] = [v]
    for log in logs:
        cur = {}
        inflight = {}
        for send, ack, k, after in log:
            if ack is not None and ack <= t:
                cur[k] = after
                inflight.pop(k, None)
            elif send <= t + 1:
                # in flight at t (or too close to t to tell): either way
                inflight.setdefault(k, []).append(after)
        for k, v in cur.items():
            allowed[k] = [v]
        for k, vs in inflight.items():
            allowed.setdefault(k, [None])
            allowed[k] = allowed[k] + vs
    return allowed


def test_point_in_time_restore_under_write_load(cl, tmp_path):
    co = start(cl, tmp_path)
    c = cl.shard_client("shard-a")
    initial = {k: {"_id": k, "v": -1} for k in range(1000, 1200)}
    c.db.c.insert_many(list(initial.values()))
    ctl(cl, "backup", "create", "--all")
    stop = threading.Event()
    logs = [[] for _ in range(3)]
    ths = [threading.Thread(target=writer, args=(cl.shard_client("shard-a"), 100 * j, 40,
                                                  stop, logs[j]))
           for j in range(3)]
    for th in ths:
        th.start()
    try:
        wait_until(lambda: sum(len(lg) for lg in logs) >= 300, 60, what="writes before T")
        t = now_ms()
        wait_until(lambda: sum(1 for lg in logs for e in lg if e[0] > t + 1) >= 300, 60,
                   what="writes after T")
    finally:
        stop.set()
        for th in ths:
            th.join()
    cl.wait_published(co, "shard-a")
    before = sum(1 for lg in logs for e in lg if e[1] is not None and e[1] <= t)
    after = sum(1 for lg in logs for e in lg if e[0] > t + 1)
    assert before >= 300 and after >= 300
    tt = f"{t // 1000}.{t % 1000:03d}"
    # dry run: which backup and how many events
    r = ctl(cl, "restore", "db.c", f"--to-time={tt}", "--dry-run")
    out = r.stdout.decode()
    assert "shard-a: backup " in out and "200 documents" in out, out
    assert "dry run: would restore db.c" in out, out
    r = ctl(cl, "restore", "db.c", f"--to-time={tt}", "--into=db.r", f"--uri={shard_uri(cl)}")
    out = r.stdout.decode()
    assert "verified" in out, out
    got = {d["_id"]: d for d in c.db.r.find()}
    allowed = expected_states(initial, logs, t)
    unknown = 0
    for k, states in allowed.items():
        have = got.get(k)
        assert have in states, f"_id {k}: restored {have}, allowed {states}"
        unknown += len(states) > 1
    for k in got:
        assert k in allowed, f"_id {k} restored but never written before T"
    print(out, f"acked before T {before}, sent after T {after}, unknown {unknown}")
    # the check can fail: the state a little later than T is not the state at T
    later = expected_states(initial, logs, t + 300)
    assert any(got.get(k) not in v for k, v in later.items())
    # never over live data; the range is enforced
    r = ctl(cl, "restore", "db.c", f"--to-time={tt}", "--into=db.r", f"--uri={shard_uri(cl)}",
            check=False)
    assert r.returncode == 1 and b"never writes over live data" in r.stderr
    r = ctl(cl, "restore", "db.c", "--to-time=2001-01-01T00:00:00Z", f"--uri={shard_uri(cl)}",
            check=False)
    assert r.returncode == 1 and b"outside the available range" in r.stderr, r.stderr
    future = (now_ms() + 3600_000) // 1000
    r = ctl(cl, "restore", "db.c", f"--to-time={future}", f"--uri={shard_uri(cl)}",
            check=False)
    assert r.returncode == 1 and b"outside the available range" in r.stderr, r.stderr
    # the default target name
    r = ctl(cl, "restore", "db.c", f"--to-time={tt}", f"--uri={shard_uri(cl)}")
    name = [n for n in c.db.list_collection_names() if n.startswith("c_restored_")]
    assert len(name) == 1
    assert {d["_id"]: d for d in c.db[name[0]].find()} == got


def test_scheduled_backups(cl, tmp_path):
    # without an archive the option is refused at start
    r = subprocess.run([BIN, "--role=coordinator", f"--metadata={cl.metadata}",
                        f"--cdc=embedded:{tmp_path}/cdc0", "--backup-interval=1s"],
                       capture_output=True, timeout=30)
    assert r.returncode == 2 and b"--backup-interval needs --archive" in r.stderr, r.stderr
    co = cl.start_coordinator(f"embedded:{tmp_path}/cdc", archive=f"file:{tmp_path}/arch",
                              extra=["--backup-interval=1s"])
    c = cl.shard_client("shard-a")
    c.db.s.insert_many([{"_id": i} for i in range(10)])
    import json

    def backups():  # committed ones (not one being written)
        return [b for b in json.loads(ctl(cl, "--json", "backup", "list").stdout)["backups"]
                if b["state"] == "committed"]
    wait_until(lambda: len(backups()) >= 1 and
               any(e["ns"] == "db.s" for b in backups() for e in b["collections"]), 60,
               what="a scheduled backup holding db.s")
    first = backups()[-1]["id"]
    wait_until(lambda: backups()[-1]["id"] > first, 60, what="the next scheduled backup")
    assert all(b["shard"] == "shard-a" for b in backups())
    # a restore from a scheduled backup
    cl.wait_published(co, "shard-a")
    t = now_ms()
    r = ctl(cl, "restore", "db.s", f"--to-time={t // 1000}.{t % 1000:03d}", "--into=db.s2",
            f"--uri={shard_uri(cl)}")
    assert sorted(d["_id"] for d in c.db.s2.find()) == list(range(10))


def test_flags_of_another_command_are_refused(cl, tmp_path):
    start(cl, tmp_path)
    for args in (["backup", "create", "--all", "--dry-run"],
                 ["backup", "list", "--all"],
                 ["backup", "create", "--all", "--to-time=1"],
                 ["restore", "db.c", "--to-time=1", "--shard=shard-a"],
                 ["restore", "db.c", "--to-time=1", "--to-shard=shard-a"],
                 ["restore", "db.c", "--to-time=yesterday"],
                 ["restore", "db.c"]):
        r = ctl(cl, *args, check=False)
        assert r.returncode == 2, (args, r.stderr)
        assert len(r.stderr.decode().strip().splitlines()) == 1, (args, r.stderr)


def backup_id(ms):
    """The id of a backup started at ms (cdc_backup_id)."""
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


def test_incomplete_backups_listed_swept_and_deleted(cl, tmp_path):
    """A backup whose writer died leaves data objects without a manifest. `backup list`
    shows it as incomplete; the coordinator holding the shard's lease deletes it once it
    is older than 24 h and than the newest committed backup, and never touches a younger
    incomplete backup nor a committed one; `backup delete` removes one by hand."""
    import json
    import shutil
    cl.cdc, cl.archive = f"embedded:{tmp_path}/cdc", f"file:{tmp_path}/arch"
    bdir = tmp_path / "arch" / "backups" / "shard-a"
    old, young = "20200101T000000.000Z", backup_id(now_ms() - 3600_000)
    # what a writer killed after its uploads leaves: data objects, no manifest
    for bid, nobj in ((old, 2), (young, 1)):
        (bdir / bid).mkdir(parents=True)
        for i in range(nobj):
            (bdir / bid / f"data-{i:05d}.bson").write_bytes(bson.encode({"_id": i}))

    def listed():
        return {b["id"]: b for b in
                json.loads(ctl(cl, "--json", "backup", "list").stdout)["backups"]}
    got = listed()
    assert set(got) == {old, young}
    assert got[old]["state"] == "incomplete" and got[old]["incomplete"] is True
    assert got[old]["objects"] == 2 and got[young]["objects"] == 1
    text = ctl(cl, "backup", "list").stdout.decode()
    rows = {ln.split()[0]: ln for ln in text.splitlines()[1:]}
    assert rows[old].split()[1] == "shard-a", text
    assert rows[old].endswith(" incomplete (2 objects, no manifest)"), text
    # no committed backup yet: nothing is certainly dead, both are kept
    co = cl.start_coordinator(cl.cdc, archive=cl.archive)
    wait_until(lambda: "incomplete backup sweep" in co.tail(), 60, what="the first sweep")
    assert "shard=shard-a deleted=0 kept=2" in co.tail(), co.tail()
    assert (bdir / old / "data-00000.bson").exists()
    assert co.stop() == 0  # releases the lease
    # a committed backup now, and a copy of it under an id older than the orphan
    c = cl.shard_client("shard-a")
    c.db.x.insert_many([{"_id": i} for i in range(20)])
    ctl(cl, "backup", "create", "--all")
    committed = [i for i, b in listed().items() if b["state"] == "committed"]
    assert len(committed) == 1 and committed[0] > young
    ancient = "20190101T000000.000Z"
    shutil.copytree(bdir / committed[0], bdir / ancient)
    man = bdir / ancient / "manifest.json"
    man.write_text(man.read_text().replace(committed[0], ancient))
    got = listed()
    assert got[ancient]["state"] == "committed" and got[ancient]["incomplete"] is False
    assert [e["ns"] for e in got[ancient]["collections"]] == ["db.x"]
    # the next holder of the lease sweeps at once: the old orphan goes, the young one
    # (1 h old) and both committed backups stay
    co2 = cl.start_coordinator(cl.cdc, archive=cl.archive)
    wait_until(lambda: "incomplete backup sweep" in co2.tail(), 60, what="the second sweep")
    assert "shard=shard-a deleted=1 kept=1" in co2.tail(), co2.tail()
    assert not (bdir / old).exists()
    got = listed()
    assert {i: b["state"] for i, b in got.items()} == {
        ancient: "committed", young: "incomplete", committed[0]: "committed"}
    # by hand
    r = ctl(cl, "backup", "delete", young)
    assert f"deleted incomplete backup {young} of shard-a" in r.stdout.decode()
    assert not (bdir / young).exists()
    assert set(listed()) == {ancient, committed[0]}


def test_backup_refuses_to_commit_when_a_data_object_vanished(cl, tmp_path):
    """A sweep racing a very slow backup: a data object deleted after its upload and
    before the manifest makes the backup fail instead of committing a manifest that
    names a missing object. The writer is stopped (SIGSTOP) after its first data object
    and before its second one (so before its commit check), the object is deleted, the
    writer continued."""
    import json
    import signal
    start(cl, tmp_path)
    c = cl.shard_client("shard-a")
    pad = "p" * 1000
    for db in ("db1", "db2"):
        for i in range(0, 20000, 1000):
            c[db].big.insert_many([{"_id": k, "pad": pad} for k in range(i, i + 1000)])
    env = dict(os.environ, STRIPEDB_CDC=cl.cdc, STRIPEDB_ARCHIVE=cl.archive)
    bdir = tmp_path / "arch" / "backups" / "shard-a"
    for attempt in range(5):
        before = set(bdir.glob("*/data-00000.bson"))
        p = subprocess.Popen([BIN, "ctl", f"--metadata={cl.metadata}", "backup", "create",
                              "--all"], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        first = []

        def uploaded():
            first[:] = list(set(bdir.glob("*/data-00000.bson")) - before)
            return first or p.poll() is not None
        wait_until(uploaded, 60, what="the first data object")
        p.send_signal(signal.SIGSTOP)
        raced = not first or (first[0].parent / "data-00001.bson").exists()
        if not raced:
            first[0].unlink()
        p.send_signal(signal.SIGCONT)
        out, err = p.communicate(timeout=120)
        if raced:  # the writer was already past its second object: try again
            assert p.returncode == 0, err
            continue
        assert p.returncode == 1, (out, err)
        assert b"data-00000.bson is no longer in the archive" in err, err
        assert b"manifest not written" in err, err
        bid = first[0].parent.name
        assert not (bdir / bid).exists() or not any((bdir / bid).iterdir())
        lst = json.loads(ctl(cl, "--json", "backup", "list").stdout)["backups"]
        assert bid not in [b["id"] for b in lst]
        return
    pytest.fail("the writer was never stopped between its two data objects")
