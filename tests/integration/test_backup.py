"""Backups and point-in-time restore (issue #22): `stripedb ctl backup create|list|delete`
and `stripedb ctl restore` against a real shard, coordinator, CDC log and file: archive.

The restore test is Jepsen-style: writers record every operation with the wall time it
was sent and acknowledged; the collection restored as of T must hold, for every _id, the
state after its last operation acknowledged before T, or (only when one was in flight at
T) the state after that one; nothing sent after T.
"""
import os
import re
import subprocess
import threading
import time

import bson
import pymongo
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
    # paced by the import throttle with the default limit, as ctl backup create
    assert all(int(b["importLatencyMS"]["$numberLong"]) == 50 for b in backups())
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
                 ["backup", "create", "--all", "--to-shard=shard-a"],
                 ["backup", "create", "--all", "--shard=shard-a"],
                 ["restore", "db.c", "--to-time=2026-12-02T10:32:00", "--dry-run"],
                 ["restore", "--shard=shard-a", "--to-time=1", "--into=db.x",
                  "--to-shard=shard-a"],
                 ["restore", "db.c", "--to-time=1", "--to-shard=shard-a",
                  "--uri=mongodb://127.0.0.1:1/"],
                 ["restore", "db.c", "--to-time=1", "--all", "--uri=mongodb://127.0.0.1:1/"],
                 ["restore", "--to-time=1", "--uri=mongodb://127.0.0.1:1/"],
                 ["restore", "db.c", "--to-time=yesterday"],
                 ["restore", "db.c"]):
        r = ctl(cl, *args, check=False)
        assert r.returncode == 2, (args, r.stderr)
        assert len(r.stderr.decode().strip().splitlines()) == 1, (args, r.stderr)


def test_rebuild_a_lost_shard_from_its_backup_and_the_cdc_log(cl, tmp_path):
    """The shard's disk is lost: it restarts empty at the same address, and
    `ctl restore --shard=ID --to-shard=ID` puts back every collection as of T from its
    backup plus the CDC events after it, including a collection created after the backup."""
    co = start(cl, tmp_path)
    c = cl.shard_client("shard-a")
    c.db1.a.insert_many([{"_id": i, "x": "a" * (i % 50)} for i in range(300)])
    c.db2.b.insert_many([{"_id": i, "d": {"y": [i, None, 1.5]}} for i in range(50)])
    c.db4.u.insert_many([{"_id": i, "email": f"e{i}@x"} for i in range(10)])
    c.db4.u.create_index("email", unique=True, name="email_u")
    ctl(cl, "backup", "create", "--all")
    c.db1.a.insert_many([{"_id": 1000 + i} for i in range(100)])
    c.db1.a.delete_many({"_id": {"$lt": 10}})
    c.db1.a.update_many({"_id": {"$gte": 10, "$lt": 20}}, {"$set": {"x": "updated"}})
    c.db3.new.insert_many([{"_id": i, "n": i} for i in range(20)])
    # command events of db1 (an index, an implicit create) between writes of db1.a: the
    # replay of db1.a goes on past them
    c.db1.a.create_index("x")
    c.db1.other.insert_one({"_id": 1})
    c.db1.a.update_many({"_id": {"$gte": 20, "$lt": 30}}, {"$set": {"x": "after commands"}})
    t = now_ms()
    want = {ns: sorted(c[ns.split(".")[0]][ns.split(".")[1]].find(), key=lambda d: d["_id"])
            for ns in ("db1.a", "db2.b", "db3.new", "db1.other", "db4.u")}
    cl.wait_published(co, "shard-a")
    tt = f"{t // 1000}.{t % 1000:03d}"
    # a dry run without a target: the plan (with the live shard as the target it would be
    # refused: its collections hold documents)
    r = ctl(cl, "restore", "--shard=shard-a", f"--to-time={tt}", "--dry-run")
    out = r.stdout.decode()
    assert "dry run: would restore shard shard-a" in out and "5 collections" in out, out
    # the disk is lost: the shard comes back empty at the same address
    p = cl.shard_procs["shard-a"]
    p.kill()
    import shutil
    shutil.rmtree(tmp_path / "shard-a")
    (tmp_path / "shard-a").mkdir()
    p.restart()
    p.wait_healthy()
    c = cl.shard_client("shard-a")
    wait_until(lambda: c.admin.command("hello").get("isWritablePrimary"), 30,
               what="the empty shard's primary")
    assert c.db1.a.count_documents({}) == 0
    # its history now ends at its last archived event: --to-time=latest restores to it
    r = ctl(cl, "restore", "--shard=shard-a", f"--to-time={tt}", "--to-shard=shard-a",
            check=False)
    assert r.returncode == 1 and b"outside the available range" in r.stderr, r.stderr
    r = ctl(cl, "restore", "--shard=shard-a", "--to-time=latest", "--to-shard=shard-a")
    out = r.stdout.decode()
    assert "restored shard shard-a" in out and out.count("verified") == 5, out
    for ns, docs in want.items():
        db, coll = ns.split(".")
        assert sorted(c[db][coll].find(), key=lambda d: d["_id"]) == docs, ns
    # the backup's indexes are back (after the documents, as mongorestore), and enforced
    ix = {i["name"]: i for i in c.db4.u.list_indexes()}
    assert ix["email_u"]["key"] == {"email": 1} and ix["email_u"].get("unique") is True, ix
    with pytest.raises(pymongo.errors.DuplicateKeyError):
        c.db4.u.insert_one({"_id": 99, "email": "e3@x"})
    # a second run finds the collections live: never over live data, also in a dry run
    for extra in ([], ["--dry-run"]):
        r = ctl(cl, "restore", "--shard=shard-a", "--to-time=latest", "--to-shard=shard-a",
                *extra, check=False)
        assert r.returncode == 1 and b"never writes over live data" in r.stderr, r.stderr
    # one collection, restored onto the shard directly under another name
    r = ctl(cl, "restore", "db2.b", "--to-time=latest", "--to-shard=shard-a", "--into=db2.b2")
    assert sorted(c.db2.b2.find(), key=lambda d: d["_id"]) == want["db2.b"]


def manifest_of(cl, backup_id):
    import json
    for b in json.loads(ctl(cl, "--json", "backup", "list").stdout)["backups"]:
        if b["id"] == backup_id:
            return b
    raise AssertionError(f"no backup {backup_id}")


def test_backup_import_throttle(cl, tmp_path):
    """The migration's import throttle paces a backup's snapshot reads: with a latency
    limit of 1 ms, a getMore of 1000 documents of 1 KiB takes longer (a shard that
    answered 20 of them in under 1 ms each would make this fail), so the backup backs off
    and reports the time; with 0 the throttle is off and reports 0."""
    import json
    start(cl, tmp_path)
    c = cl.shard_client("shard-a")
    for k in range(4):
        c.db.t.insert_many([{"_id": k * 5000 + i, "p": "x" * 1024} for i in range(5000)])
    r = ctl(cl, "--json", "backup", "create", "--all", "--import-latency-ms=1")
    out = json.loads(r.stdout)
    assert out["documents"] == 20000, out
    assert out["throttledMS"] > 0, out
    m = manifest_of(cl, out["id"])
    assert int(m["throttledMS"]["$numberLong"]) == out["throttledMS"], m
    assert int(m["importLatencyMS"]["$numberLong"]) == 1, m
    assert r.stderr == b"", r.stderr  # --json: no progress unless --progress
    r = ctl(cl, "--json", "backup", "create", "--all", "--import-latency-ms=0")
    out = json.loads(r.stdout)
    assert out["documents"] == 20000 and out["throttledMS"] == 0, out
    m = manifest_of(cl, out["id"])
    assert int(m["throttledMS"]["$numberLong"]) == 0, m
    assert int(m["importLatencyMS"]["$numberLong"]) == 0, m
    # the text output names it too; the default limit is 50 ms
    r = ctl(cl, "backup", "create", "--all")
    assert re.search(rb"20000 documents, \d+ bytes, throttled \d+ ms", r.stdout), r.stdout
    lst = json.loads(ctl(cl, "--json", "backup", "list").stdout)["backups"]
    assert int(lst[-1]["importLatencyMS"]["$numberLong"]) == 50, lst[-1]
    for bad in ("--import-latency-ms=-1", "--import-latency-ms=abc", "--import-latency-ms="):
        r = ctl(cl, "backup", "create", "--all", bad, check=False)
        assert r.returncode == 2 and b"--import-latency-ms" in r.stderr, (bad, r.stderr)


BACKUP_LINE = re.compile(r"^backup (\S+) shard-a: (\d+)/~(\d+) documents (\d+)% (\d+) docs/s "
                         r"ETA (\S+) throttled (\d+) ms$")
RESTORE_LINE = re.compile(r"^restore db\.p: (\d+)/(\d+) backup documents \+ (\d+) events "
                          r"(\d+)% (\d+) docs/s ETA (\S+)$")


def test_backup_and_restore_progress(cl, tmp_path):
    """--progress: one line per update on stderr, percent of the expected documents
    (collections counted before the reads) rising batch by batch to 100%, with a rate and
    an ETA; the restore's total is the backup's document count from its manifest."""
    co = start(cl, tmp_path)
    c = cl.shard_client("shard-a")
    c.db.p.insert_many([{"_id": i, "v": i} for i in range(5000)])
    r = ctl(cl, "backup", "create", "--all", "--progress", "--import-latency-ms=0")
    lines = r.stderr.decode().splitlines()
    got = [BACKUP_LINE.match(ln) for ln in lines]
    assert lines and all(got), lines
    # one line per batch of 1000 of the 5000 expected (99% until the end), then the end
    assert [int(g[4]) for g in got] == [20, 40, 60, 80, 99, 100], lines
    assert [int(g[2]) for g in got] == [1000, 2000, 3000, 4000, 5000, 5000], lines
    assert all(int(g[3]) == 5000 for g in got), lines
    assert got[-1][6] == "0s" and got[-1][7] == "0", lines
    assert got[0][6] != "--", lines  # a rate after the first batch: an ETA
    assert all(re.fullmatch(r"--|\d+s|\d+m\d\ds|\d+h\d\dm", g[6]) for g in got), lines
    # without --progress and without a terminal: nothing on stderr
    r = ctl(cl, "backup", "create", "--all")
    assert r.stderr == b"", r.stderr
    # the restore: the backup's 5000 documents, then the events after it
    c.db.p.insert_many([{"_id": 10000 + i} for i in range(10)])
    cl.wait_published(co, "shard-a")
    t = now_ms()
    r = ctl(cl, "restore", "db.p", f"--to-time={t // 1000}.{t % 1000:03d}", "--into=db.q",
            f"--uri={shard_uri(cl)}", "--progress")
    lines = r.stderr.decode().splitlines()
    got = [RESTORE_LINE.match(ln) for ln in lines]
    assert lines and all(got), lines
    assert [int(g[4]) for g in got] == [0, 20, 40, 60, 80, 99, 100], lines
    assert all(int(g[2]) == 5000 for g in got), lines
    assert int(got[-1][1]) == 5000 and int(got[-1][3]) == 10 and got[-1][6] == "0s", lines
    assert c.db.q.count_documents({}) == 5010
    # --progress is a flag of create and restore only
    r = ctl(cl, "backup", "list", "--progress", check=False)
    assert r.returncode == 2, r.stderr


def test_backup_progress_bar_on_a_terminal(cl, tmp_path):
    """stderr a terminal: the bar is rewritten in place (\\r), ends at 100% and a newline;
    with --json it is not drawn."""
    import pty
    start(cl, tmp_path)
    c = cl.shard_client("shard-a")
    c.db.p.insert_many([{"_id": i} for i in range(3000)])

    def run(*extra):
        mfd, sfd = pty.openpty()
        env = dict(os.environ, STRIPEDB_CDC=cl.cdc, STRIPEDB_ARCHIVE=cl.archive)
        p = subprocess.Popen([BIN, "ctl", f"--metadata={cl.metadata}"] + list(extra) +
                             ["backup", "create", "--all"], stdout=subprocess.PIPE,
                             stderr=sfd, env=env)
        os.close(sfd)
        err = b""
        while True:
            try:
                chunk = os.read(mfd, 65536)
            except OSError:  # EIO: the terminal's last writer is gone
                break
            if not chunk:
                break
            err += chunk
        os.close(mfd)
        out = p.stdout.read()
        assert p.wait(timeout=120) == 0, err
        return out, err
    out, err = run()
    assert b"3000 documents" in out, out
    assert err.startswith(b"\r") and err.count(b"\r") >= 2, err
    assert re.search(rb"\r\[#{20}\] backup \S+ shard-a: 3000/~3000 documents 100% \d+ docs/s "
                     rb"ETA 0s "
                     rb"throttled \d+ ms\x1b\[K\r?\n$", err), err
    assert re.search(rb"\r\[#{6}\.{14}\] backup \S+ shard-a: 1000/~3000 documents 33% ",
                     err), err
    out, err = run("--json")
    assert err == b"", err


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


def test_a_backup_older_than_the_retained_cdc_log_is_not_used(start_role, tmp_path):
    """Retention dropped the CDC events right after a backup: that backup cannot be
    replayed forward, so the restore says so (and what to do) instead of offering a range
    it cannot serve; a backup taken after the drop restores."""
    cl = CdcCluster(start_role, tmp_path, shards=1)
    try:
        co = cl.start_coordinator(f"embedded:{tmp_path}/cdc", extra=[
            "--cdc-segment-bytes=4096", "--cdc-retention-bytes=8192"])
        cl.archive = f"file:{tmp_path}/arch"  # backups only: the log has no archive
        c = cl.shard_client("shard-a")
        c.db.c.insert_many([{"_id": i, "x": "a" * 100} for i in range(50)])
        ctl(cl, "backup", "create", "--all")
        for j in range(20):  # ~200 KB of events: the log's first segments are dropped
            c.db.c.update_many({}, {"$set": {"j": j}})
        cl.wait_published(co, "shard-a")
        r = ctl(cl, "restore", "db.c", "--to-time=latest", f"--uri={shard_uri(cl)}",
                check=False)
        assert r.returncode == 1, r.stdout
        err = r.stderr.decode()
        assert "older than its oldest retained CDC event" in err and "take a backup" in err, err
        assert err.count("\n") == 1, err
        ctl(cl, "backup", "create", "--all")
        c.db.c.update_one({"_id": 0}, {"$set": {"last": True}})
        cl.wait_published(co, "shard-a")
        r = ctl(cl, "restore", "db.c", "--to-time=latest", f"--uri={shard_uri(cl)}",
                "--into=db.r")
        assert "verified" in r.stdout.decode()
        assert sorted(c.db.r.find(), key=lambda d: d["_id"]) == \
            sorted(c.db.c.find(), key=lambda d: d["_id"])
    finally:
        cl.close()
