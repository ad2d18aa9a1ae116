"""Page sizes of shard.db (storage/store.c conn_pragmas): a new store is made with 8 KiB
pages, a store made before (4 KiB pages) keeps its size. Nothing acknowledged may be lost
and an upgraded store must keep working: reads, writes, indexes, checkpoints, restarts,
and snapshots between members whose stores have different page sizes (a set upgraded in
place keeps its 4 KiB stores; a member added afterwards makes an 8 KiB one).

A store "made before" is made here as the old release made it: the file created with 4 KiB
pages in WAL mode, which the new binary then opens (SQLite fixes the page size when the
file is created; the store's schema is CREATE IF NOT EXISTS). With STRIPEDB_OLD_BIN set to
a binary of before 8 KiB pages, one test also makes a data directory with that binary.
"""
import os
import signal
import sqlite3
import threading

import pymongo
import pytest
from pymongo.errors import AutoReconnect, ConnectionFailure

from conftest import free_port, wait_until
from test_shard_members import ctl, members_of, start_joiner, status, write_acked
from test_shard_replset import primary_index, start_set

OLD_BIN = os.environ.get("STRIPEDB_OLD_BIN")


def page_size(path):
    """The page size of a SQLite file, read-only."""
    c = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return c.execute("PRAGMA page_size").fetchone()[0]
    finally:
        c.close()


def make_4k_store(data_dir):
    """data_dir/shard.db created as a release with 4 KiB pages did (page size, then WAL)."""
    os.makedirs(data_dir, exist_ok=True)
    path = os.path.join(data_dir, "shard.db")
    c = sqlite3.connect(path)
    c.execute("PRAGMA page_size=4096")
    assert c.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
    c.close()
    assert page_size(path) == 4096
    return path


def start_shard(start_role, data_dir):
    port = free_port()
    os.makedirs(data_dir, exist_ok=True)
    args = ["--role=shard", f"--listen=127.0.0.1:{port}", f"--data-dir={data_dir}"]
    p = start_role(args)
    return p, port


def client(port):
    return pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true",
                               serverSelectionTimeoutMS=10000, retryWrites=False)


def exercise(port, n_small=3000, big_mb=15):
    """Writes of every kind a store sees: many small documents, documents of 3 KB (an
    overflow page at 4 KiB, not at 8), one near the 16 MB limit, an index, updates and
    deletes. Returns what the collection must hold afterwards: {_id: (a, len(s))}."""
    want = {}
    with client(port) as c:
        coll = c.app.c
        coll.create_index("a")
        docs = [{"_id": i, "a": i % 97, "s": "y" * 40} for i in range(n_small)]
        coll.insert_many(docs, ordered=True)
        for d in docs:
            want[d["_id"]] = (d["a"], 40)
        for i in range(n_small, n_small + 300):
            coll.insert_one({"_id": i, "a": i % 97, "s": "m" * 3000})
            want[i] = (i % 97, 3000)
        big = "B" * (big_mb * 1024 * 1024)
        coll.insert_one({"_id": "big", "a": -1, "s": big})
        want["big"] = (-1, len(big))
        coll.update_many({"a": 5}, {"$set": {"a": 1000}})
        for k, (a, n) in list(want.items()):
            if a == 5:
                want[k] = (1000, n)
        coll.delete_many({"a": 7})
        want = {k: v for k, v in want.items() if v[0] != 7}
    return want


def check(port, want):
    with client(port) as c:
        coll = c.app.c
        got = {d["_id"]: (d["a"], len(d["s"])) for d in coll.find({}, {"a": 1, "s": 1})}
        assert got == want
        # the index answers as the collection does
        for a in (0, 1000, 96, -1, 7):
            ids = sorted(str(d["_id"]) for d in coll.find({"a": a}, {"_id": 1}).hint("a_1"))
            assert ids == sorted(str(k) for k, v in want.items() if v[0] == a), a
        r = c.app.command("validate", "c", full=True)
        assert r["valid"], r


@pytest.mark.parametrize("made", ["new", "4k"])
def test_store_keeps_its_page_size_and_works_across_restarts(start_role, tmp_path, made):
    data = str(tmp_path / "shard")
    if made == "4k":
        make_4k_store(data)
    db = os.path.join(data, "shard.db")
    p, port = start_shard(start_role, data)
    expect = 4096 if made == "4k" else 8192
    assert page_size(db) == expect
    want = exercise(port)
    check(port, want)
    p.stop()
    p.restart().wait_healthy()
    assert page_size(db) == expect
    check(port, want)
    with client(port) as c:
        c.app.c.insert_one({"_id": "after", "a": 3, "s": "z"})
    want["after"] = (3, 1)
    check(port, want)
    assert page_size(db) == expect


@pytest.mark.parametrize("made", ["new", "4k"])
def test_wal_stays_bounded_under_writes(start_role, tmp_path, made):
    """The checkpoint thresholds count frames of 8 KiB: on either store the WAL must still
    be copied back, not grow with the data (100 MB written here). Commits wait for the
    checkpoint thread once the WAL grew by STORE_CKPT_FRAMES_BEHIND frames (32 MB of 8 KiB
    pages, 16 MB of 4 KiB) during its copy: the release of before 8 KiB pages peaked at
    21-34 MB on this load, as this one does."""
    data = str(tmp_path / "shard")
    if made == "4k":
        make_4k_store(data)
    p, port = start_shard(start_role, data)
    wal = os.path.join(data, "shard.db-wal")
    blob = "w" * 4000
    peak = 0
    with client(port) as c:
        coll = c.app.c
        for b in range(250):
            coll.insert_many([{"_id": b * 100 + i, "s": blob} for i in range(100)])
            peak = max(peak, os.path.getsize(wal) if os.path.exists(wal) else 0)
        assert coll.count_documents({}) == 25000
    written = 250 * 100 * 4000
    # SQLite reuses the WAL from its start after a complete checkpoint, so its file is as
    # big as the most it ever held: the back-pressure bound and a commit, far below the data
    assert 0 < peak < 60 * 1000 * 1000, (peak, written)
    assert page_size(os.path.join(data, "shard.db")) == (4096 if made == "4k" else 8192)


@pytest.mark.parametrize("made", ["new", "4k"])
def test_sigkill_mid_write_loses_nothing_acknowledged(start_role, tmp_path, made):
    data = str(tmp_path / "shard")
    if made == "4k":
        make_4k_store(data)
    p, port = start_shard(start_role, data)
    acked = []
    stop = threading.Event()

    def writer():
        try:
            with client(port) as c:
                i = 0
                while not stop.is_set():
                    # some documents big enough to span pages of either size
                    c.app.c.insert_one({"_id": i, "s": "k" * (9000 if i % 5 == 0 else 50)})
                    acked.append(i)
                    i += 1
        except (AutoReconnect, ConnectionFailure):
            pass

    t = threading.Thread(target=writer)
    t.start()
    wait_until(lambda: len(acked) >= 1500, 60, interval=0.05, what="1,500 acknowledged writes")
    p.p.send_signal(signal.SIGKILL)
    p.p.wait(timeout=10)
    stop.set()
    t.join(30)
    assert not t.is_alive()
    p.log.close()
    p.restart().wait_healthy()
    with client(port) as c:
        got = {d["_id"] for d in c.app.c.find({}, {"_id": 1})}
    missing = sorted(set(acked) - got)
    assert not missing, f"{len(missing)} acknowledged writes lost: {missing[:20]}"
    assert page_size(os.path.join(data, "shard.db")) == (4096 if made == "4k" else 8192)


def _add_and_catch_up(start_role, tmp_path, wires, uri, joiner_4k):
    if joiner_4k:
        make_4k_store(str(tmp_path / "m4"))
    p4, w4, r4 = start_joiner(start_role, tmp_path, wires, 4, members_of(wires))
    r = ctl("--json", "shard", "member", "add", uri, "4", f"--raft=127.0.0.1:{r4}",
            f"--wire=127.0.0.1:{w4}")
    assert r.returncode == 0, r.stderr
    wait_until(lambda: status(w4)["applied"] >= status(wires[primary_index(wires)])["applied"]
               and status(w4)["state"] == "SECONDARY",
               60, interval=0.1, what="the new member caught up")
    return p4, w4


def _write_acked(uri, ids):
    """write_acked as retryable writes: a primary that steps down under the load of four
    members on two cores answers 11602, and the driver's one retry is applied once."""
    return write_acked(uri, ids, retry=True)


def _seed(uri):
    """app.c indexed on a and 200 acknowledged documents of 3 KB (on overflow pages at 4
    KiB, not at 8) through uri, as retryable writes; returns their _ids."""
    acked = []
    with pymongo.MongoClient(uri, retryWrites=True, serverSelectionTimeoutMS=10000) as c:
        c.app.c.create_index("a")
        for i in range(200):
            c.app.c.insert_one({"_id": i, "a": i % 10, "s": "p" * 3000})
            acked.append(i)
    return acked


@pytest.mark.parametrize("set_4k,joiner_4k", [(True, False), (False, True)],
                         ids=["4k-set-new-joiner", "new-set-4k-joiner"])
def test_member_added_installs_a_snapshot_of_another_page_size(start_role, tmp_path, set_4k,
                                                               joiner_4k):
    """With log compaction the added member installs a copy of another member's shard.db
    (src/shard/snapfile.c, storage/copy.c sdb_store_replace_from): from a set upgraded in
    place (4 KiB) into the new member's 8 KiB store, and the reverse."""
    if set_4k:
        for i in (1, 2, 3):
            make_4k_store(str(tmp_path / f"m{i}"))
    procs, wires, uri = start_set(start_role, tmp_path, extra=["--raft-snapshot-threshold=32"])
    acked = _seed(uri)
    # a document near the 16 MB limit: a long overflow chain in either page size
    with pymongo.MongoClient(uri, retryWrites=False, serverSelectionTimeoutMS=10000) as c:
        c.app.c.insert_one({"_id": 10 ** 6, "a": -1, "s": "B" * (16 * 1024 * 1024 - 200)})
    acked.append(10 ** 6)
    p4, w4 = _add_and_catch_up(start_role, tmp_path, wires, uri, joiner_4k)
    assert "installed a snapshot from another member" in open(p4.log_path).read()
    acked += _write_acked(uri, range(200, 260))
    wait_until(lambda: status(w4)["applied"] >= status(wires[primary_index(wires)])["applied"],
               30, interval=0.1, what="the new member applied the writes after the add")
    with pymongo.MongoClient(f"mongodb://127.0.0.1:{w4}/?directConnection=true",
                             readPreference="secondaryPreferred") as c:
        assert sorted(d["_id"] for d in c.app.c.find({}, {"_id": 1})) == sorted(acked)
        assert sorted(d["_id"] for d in c.app.c.find({"a": 3}).hint("a_1")) == \
            [i for i in range(200) if i % 10 == 3]
        big = c.app.c.find_one({"_id": 10 ** 6})
        assert big["s"] == "B" * (16 * 1024 * 1024 - 200)
    # each store kept the size it was made with
    for i in (1, 2, 3):
        assert page_size(str(tmp_path / f"m{i}" / "shard.db")) == (4096 if set_4k else 8192)
    assert page_size(str(tmp_path / "m4" / "shard.db")) == (4096 if joiner_4k else 8192)
    # and no converted copy was left behind
    snaps = tmp_path / "m4" / "snapshots"
    assert not snaps.exists() or not [n for n in os.listdir(snaps) if n.startswith("in.db")]


@pytest.mark.skipif(not OLD_BIN or not os.access(OLD_BIN or "", os.X_OK),
                    reason="STRIPEDB_OLD_BIN (a binary of before 8 KiB pages) not set")
def test_data_dir_of_the_old_binary_upgrades(start_role, tmp_path):
    """A data directory made and filled by the old binary, which is then killed (SIGKILL),
    opened by this one: everything acknowledged is there, indexes answer, it stays 4 KiB."""
    import subprocess
    data = str(tmp_path / "shard")
    os.makedirs(data)
    port = free_port()
    log = open(tmp_path / "old.log", "wb")
    old = subprocess.Popen([OLD_BIN, "--role=shard", f"--listen=127.0.0.1:{port}",
                            f"--data-dir={data}"],
                           stdout=log, stderr=subprocess.STDOUT,
                           env=dict(os.environ, STRIPEDB_CONFIG="/dev/null"),
                           start_new_session=True)
    try:
        def up():
            assert old.poll() is None, open(tmp_path / "old.log").read()
            try:
                with client(port) as c:
                    return c.admin.command("ping")["ok"] == 1
            except ConnectionFailure:
                return False
        wait_until(up, 30, interval=0.1, what="the old binary's shard answers")
        want = exercise(port, n_small=2000, big_mb=8)
    finally:
        # SIGKILL: what the old binary acknowledged may be only in its WAL (4 KiB frames),
        # which this binary must recover
        old.send_signal(signal.SIGKILL)
        old.wait(timeout=30)
        log.close()
    db = os.path.join(data, "shard.db")
    assert page_size(db) == 4096
    p = start_role(["--role=shard", f"--listen=127.0.0.1:{port}", f"--data-dir={data}"])
    check(port, want)
    with client(port) as c:
        c.app.c.insert_many([{"_id": f"n{i}", "a": 1, "s": "q" * 3000} for i in range(500)])
    for i in range(500):
        want[f"n{i}"] = (1, 3000)
    check(port, want)
    p.stop()
    p.restart().wait_healthy()
    check(port, want)
    assert page_size(db) == 4096


@pytest.mark.skipif(not OLD_BIN or not os.access(OLD_BIN or "", os.X_OK),
                    reason="STRIPEDB_OLD_BIN (a binary of before 8 KiB pages) not set")
@pytest.mark.parametrize("old_side", ["set", "joiner"])
def test_mixed_binaries_add_member_by_snapshot(start_role, tmp_path, monkeypatch, old_side):
    """Mixed binaries, snapshots by log compaction. "set": a set of the old binary (4 KiB
    stores) gets a member of this one, whose new 8 KiB store installs the old leader's 4 KiB
    copy (converted on receipt, storage/copy.c sdb_store_replace_from). "joiner": a set of
    this binary (new 8 KiB stores) gets a member of the old binary (a 4 KiB store), which
    cannot install a copy of another page size: it sends no pageSize, so the sender
    rewrites the copy at 4 KiB (src/shard/snapfile.c, sdb_store_copy_to)."""
    import conftest
    if old_side == "set":
        monkeypatch.setattr(conftest, "BIN", OLD_BIN)
    procs, wires, uri = start_set(start_role, tmp_path, extra=["--raft-snapshot-threshold=32"])
    acked = _seed(uri)
    if old_side == "set":
        monkeypatch.undo()
    else:
        monkeypatch.setattr(conftest, "BIN", OLD_BIN)
    p4, w4 = _add_and_catch_up(start_role, tmp_path, wires, uri, joiner_4k=False)
    assert "installed a snapshot from another member" in open(p4.log_path).read()
    acked += _write_acked(uri, range(200, 260))
    wait_until(lambda: status(w4)["applied"] >= status(wires[primary_index(wires)])["applied"],
               30, interval=0.1, what="the new member applied the writes after the add")
    with pymongo.MongoClient(f"mongodb://127.0.0.1:{w4}/?directConnection=true",
                             readPreference="secondaryPreferred") as c:
        assert sorted(d["_id"] for d in c.app.c.find({}, {"_id": 1})) == sorted(acked)
    for i in (1, 2, 3):
        assert page_size(str(tmp_path / f"m{i}" / "shard.db")) == \
            (4096 if old_side == "set" else 8192)
    assert page_size(str(tmp_path / "m4" / "shard.db")) == \
        (8192 if old_side == "set" else 4096)


def _snapshot_copy(port, dest, **open_args):
    """A copy of the shard's store through stripedbSnapshotFile, as a receiver gets it."""
    with client(port) as c:
        r = c.admin.command({"stripedbSnapshotFile": "open", **open_args})
        got = 0
        with open(dest, "wb") as f:
            while got < r["size"]:
                chunk = c.admin.command({"stripedbSnapshotFile": "read", "id": r["id"],
                                         "offset": got, "length": 8 << 20})
                assert len(chunk["data"]) > 0
                f.write(chunk["data"])
                got += len(chunk["data"])
        c.admin.command({"stripedbSnapshotFile": "close", "id": r["id"]})
    return dest


def test_snapshot_copy_at_the_page_size_the_receiver_asks(shard, tmp_path):
    """A receiver of before 8 KiB pages sends no pageSize and installs only its own size
    (4 KiB): the copy of a new store comes at 4 KiB; one asking for a size gets it."""
    p, port = shard
    with client(port) as c:
        c.app.c.insert_many([{"_id": i, "s": "r" * 3000} for i in range(500)])
    for args, want in (({}, 4096), ({"pageSize": 8192}, 8192), ({"pageSize": 4096}, 4096),
                       ({"pageSize": 16384}, 16384)):
        dest = _snapshot_copy(port, str(tmp_path / f"copy-{want}-{len(args)}.db"), **args)
        assert page_size(dest) == want, args
        db = sqlite3.connect(f"file:{dest}?mode=ro", uri=True)
        try:
            assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            assert db.execute("SELECT v FROM meta WHERE k='format'").fetchone()[0] == 2
        finally:
            db.close()
    with client(port) as c:
        with pytest.raises(pymongo.errors.OperationFailure):
            c.admin.command({"stripedbSnapshotFile": "open", "pageSize": 3000})
    # nothing left behind on the sending side
    snaps = tmp_path / "shard" / "snapshots"
    assert not snaps.exists() or os.listdir(snaps) == []
