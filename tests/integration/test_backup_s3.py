"""Backups and point-in-time restore (issue #22) with the archive on S3: Ceph's radosgw
started on loopback by the test (s3_server.py), which checks every request's signature.

One backup with a collection above the multipart threshold (8 MiB), a restore under a live
write load whose events after the backup were read back from the bucket (the live log's
retention had moved them there), checked Jepsen-style as in test_backup.py; a wrong
secret refused in one line naming the bucket and the operation.
"""
import json
import os
import threading

import pytest
from bson import Binary

from conftest import wait_until
from s3_server import SECRET_KEY
from test_backup import expected_states, now_ms, writer
from test_cdc_s3 import SMALL, archive_status, rgw, s3cl  # noqa: F401 (fixtures)

pytestmark = pytest.mark.timeout(900)


def test_backup_and_restore_through_s3(s3cl, tmp_path):
    cl = s3cl
    spec = f"s3://{cl.bucket}/arch"
    co = cl.start_coordinator(f"embedded:{tmp_path}/cdc", archive=spec, extra=SMALL)
    c = cl.shard_client("shard-a")
    # 9 x 1 MiB: its data object goes up in two parts
    c.db.big.insert_many([{"_id": i, "b": Binary(os.urandom(1 << 20))} for i in range(9)])
    initial = {k: {"_id": k, "v": -1} for k in range(1000, 1100)}
    c.db.c.insert_many(list(initial.values()))
    r = cl.ctl("backup", "create", "--all")
    assert "2 collections, 109 documents" in r.stdout.decode(), r.stdout
    man = json.loads(cl.ctl("--json", "backup", "list").stdout)["backups"]
    assert len(man) == 1
    objs = cl.objects(f"arch/backups/shard-a/{man[0]['id']}/")
    big = [e for e in man[0]["collections"] if e["ns"] == "db.big"][0]
    assert objs[f"arch/{big['object']}"].endswith("-2"), objs  # multipart ETag
    assert f"arch/backups/shard-a/{man[0]['id']}/manifest.json" in objs
    head = man[0]["headTs"]["$timestamp"]
    stop = threading.Event()
    logs = [[] for _ in range(2)]
    ths = [threading.Thread(target=writer, args=(cl.shard_client("shard-a"), 100 * j, 30,
                                                  stop, logs[j]))
           for j in range(2)]
    for th in ths:
        th.start()
    try:
        wait_until(lambda: sum(len(lg) for lg in logs) >= 200, 60, what="writes before T")
        t = now_ms()
        wait_until(lambda: sum(1 for lg in logs for e in lg if e[0] > t + 1) >= 200, 60,
                   what="writes after T")
    finally:
        stop.set()
        for th in ths:
            th.join()
    cl.wait_published(co, "shard-a")
    # the events after the backup are (partly) in the bucket only
    wait_until(lambda: archive_status(cl)["archive"]["nextOffset"]
               == archive_status(cl)["log"]["firstOffset"], 60, what="archive meets the log")
    st = archive_status(cl)
    last = st["archive"]["lastTs"]
    assert (last["t"], last["i"]) > (head["t"], head["i"]), (st, head)
    tt = f"{t // 1000}.{t % 1000:03d}"
    uri = f"mongodb://127.0.0.1:{cl.shard_ports['shard-a']}/?directConnection=true"
    r = cl.ctl("restore", "db.c", f"--to-time={tt}", "--into=db.r", f"--uri={uri}")
    assert "verified" in r.stdout.decode(), r.stdout
    got = {d["_id"]: d for d in c.db.r.find()}
    allowed = expected_states(initial, logs, t)
    for k, states in allowed.items():
        assert got.get(k) in states, f"_id {k}: restored {got.get(k)}, allowed {states}"
    assert set(got) <= set(allowed)
    # a wrong secret: one line, the bucket and the operation
    bad = dict(cl.env, AWS_SECRET_ACCESS_KEY=SECRET_KEY[:-1] + "X")
    r = cl.ctl("backup", "list", env=bad, check=False)
    lines = r.stderr.decode().strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, lines
    assert cl.bucket in lines[0] and "ListObjectsV2" in lines[0] and "403" in lines[0], lines


def test_incomplete_backups_on_s3(s3cl, tmp_path):
    """Incomplete backups in a bucket: listed, swept by the next holder of the shard's
    lease once a committed backup exists (the old one only), deleted by hand."""
    from test_backup import backup_id
    cl = s3cl
    spec = f"s3://{cl.bucket}/arch"
    cl.cdc, cl.archive = f"embedded:{tmp_path}/cdc", spec
    old, young = "20200101T000000.000Z", backup_id(now_ms() - 3600_000)
    for bid in (old, young):
        st, body = cl.rgw.curl("PUT", cl.bucket, f"/arch/backups/shard-a/{bid}/data-00000.bson",
                               body=b"\x05\x00\x00\x00\x00")
        assert st == 200, body
    cl.shard_client("shard-a").db.x.insert_many([{"_id": i} for i in range(5)])
    cl.ctl("backup", "create", "--all")
    lst = {b["id"]: b["state"]
           for b in json.loads(cl.ctl("--json", "backup", "list").stdout)["backups"]}
    assert sorted(lst.values()) == ["committed", "incomplete", "incomplete"], lst
    assert lst[old] == "incomplete" and lst[young] == "incomplete"
    co = cl.start_coordinator(cl.cdc, archive=spec)
    wait_until(lambda: "incomplete backup sweep" in co.tail(), 60, what="the sweep")
    assert "shard=shard-a deleted=1 kept=1" in co.tail(), co.tail()
    objs = cl.objects("arch/backups/shard-a/")
    assert not any(k.startswith(f"arch/backups/shard-a/{old}/") for k in objs), objs
    assert f"arch/backups/shard-a/{young}/data-00000.bson" in objs, objs
    r = cl.ctl("backup", "delete", young)
    assert f"deleted incomplete backup {young}" in r.stdout.decode()
    lst = json.loads(cl.ctl("--json", "backup", "list").stdout)["backups"]
    assert [b["state"] for b in lst] == ["committed"], lst
