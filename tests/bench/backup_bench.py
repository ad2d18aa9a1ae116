#!/usr/bin/python3
"""Benchmark of backups and point-in-time restore (issue #22): documents/s of
`stripedb ctl backup create` and `stripedb ctl restore`, beside plain copies of the same
bytes in the same run. Never part of `make check`.

Usage (from the build dir):
    STRIPEDB_BIN=./stripedb /usr/bin/python3 $SRCDIR/tests/bench/backup_bench.py \
        [--docs 100000] [--doc-bytes 200] [--events 20000] [--s3]

A fresh metadata member, one embedded shard, a coordinator with the embedded CDC log and
a file: archive. --docs documents are loaded, a backup is taken, then --events updates
(each an oplog entry the restore replays). Measured, in one run on the same machine:
  backup    `ctl backup create --all` (snapshot read + BSON file + archive copy);
  restore   `ctl restore --to-time=now` into a new collection (backup documents + events,
            read back and verified), documents/s counting both;
  insert    the backup's data object, the same bytes, inserted by pymongo insert_many in
            batches of 1000 into another collection (what a plain reload costs);
  cp        the data object copied with cp (the bytes alone).

With --s3 the archive is s3://bench/arch on Ceph's radosgw started on loopback
(tests/integration/s3_server.py, as test_backup_s3.py; ctl gets --archive=s3://...
--s3-endpoint=URL and the AWS_* credentials), and instead of cp, in the same run:
  curl get  the backup's data object downloaded from the same radosgw by curl(1) in one
            GET (SigV4 by curl --aws-sigv4, as s3_archive_bench.py);
  curl put  the same bytes uploaded by curl in one PUT to another key;
and the ratios stripedb/curl: backup MB/s (data object bytes / `backup create` wall time,
which also holds the snapshot read and the manifest) over curl put MB/s, and restore
MB/s (data object bytes / `restore` wall time, which also holds the events, the writes
through the shard and the verification) over curl get MB/s. The same backup is also taken
into a local file: archive (backupToFileDocsPerSec), to show the share of the upload.
The restore reads the data object from the bucket and the events from the live CDC log.
A fresh radosgw creates its pools on its first uploads: one untimed backup is taken first
(its time printed as coldBackupMs).
"""
import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))

import hashlib  # noqa: E402

import bson  # noqa: E402
import conftest  # noqa: E402
from bson.raw_bson import RawBSONDocument  # noqa: E402
from cdc_helpers import CdcCluster  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=100000)
    ap.add_argument("--doc-bytes", type=int, default=200)
    ap.add_argument("--events", type=int, default=20000)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--s3", action="store_true",
                    help="archive on a radosgw started on loopback; compare with curl")
    args = ap.parse_args()
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="backup-bench-"))
    procs = []

    def start_role(a, http=True, env=None, wait=True):
        a = list(a) + ["--log-level=warn"]
        port = conftest.free_port()
        a.append(f"--http-listen=127.0.0.1:{port}")
        p = conftest.Proc(a, str(tmp / f"proc{len(procs)}.log"), port, env)
        procs.append(p)
        return p.wait_healthy()

    res = {"docs": args.docs, "docBytes": args.doc_bytes, "events": args.events,
           "archive": "s3" if args.s3 else "file"}
    rgw = None
    try:
        cl = CdcCluster(start_role, tmp, shards=1)
        cdc, arch = f"embedded:{tmp}/cdc", f"file:{tmp}/arch"
        env = dict(os.environ, STRIPEDB_CDC=cdc)
        s3flags = []
        if args.s3:
            from s3_server import ACCESS_KEY, SECRET_KEY, CephRgw
            rgw = CephRgw(str(tmp / "ceph"))
            rgw.create_bucket("bench")
            arch = "s3://bench/arch"
            s3flags = [f"--s3-endpoint={rgw.endpoint}"]
            env.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY,
                       TMPDIR=str(tmp))
        env["STRIPEDB_ARCHIVE"] = arch
        co = start_role(["--role=coordinator", f"--metadata={cl.metadata}", f"--cdc={cdc}",
                         f"--archive={arch}"] + s3flags, env=env)
        c = cl.shard_client("shard-a")
        pad = "x" * args.doc_bytes
        for i in range(0, args.docs, 1000):
            c.bench.src.insert_many([{"_id": k, "pad": pad}
                                     for k in range(i, min(args.docs, i + 1000))])
        ctl = [conftest.BIN, "ctl", f"--metadata={cl.metadata}"]
        if args.s3:
            # a fresh radosgw creates its data pools on the first uploads (3 s here):
            # one untimed backup first, so that the timed one (and curl) see a warm gateway
            t0 = time.perf_counter()
            subprocess.run(ctl + ["backup", "create", "--all", f"--archive={arch}"] + s3flags,
                           env=env, check=True, stdout=subprocess.DEVNULL)
            res["coldBackupMs"] = round((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        subprocess.run(ctl + ["backup", "create", "--all", f"--archive={arch}"] + s3flags,
                       env=env, check=True, stdout=subprocess.DEVNULL)
        backup_s = time.perf_counter() - t0
        res["backupDocsPerSec"] = round(args.docs / backup_s)
        if args.s3:
            # the same backup into a local file: archive, to show the S3 upload's share
            t0 = time.perf_counter()
            subprocess.run(ctl + ["backup", "create", "--all", f"--archive=file:{tmp}/farch"],
                           env=env, check=True, stdout=subprocess.DEVNULL)
            res["backupToFileDocsPerSec"] = round(args.docs / (time.perf_counter() - t0))
        for k in range(args.events):
            c.bench.src.update_one({"_id": k % args.docs}, {"$set": {"n": k}})
        cl.wait_published(co, "shard-a", timeout=600)
        uri = f"mongodb://127.0.0.1:{cl.shard_ports['shard-a']}/?directConnection=true"
        t0 = time.perf_counter()
        out = subprocess.run(ctl + ["--json", "restore", "bench.src",
                                    f"--to-time={time.time():.3f}", "--into=bench.restored",
                                    f"--uri={uri}", f"--archive={arch}"] + s3flags,
                             env=env, check=True, stdout=subprocess.PIPE).stdout
        took = time.perf_counter() - t0
        r = json.loads(out)
        res["restoreDocsPerSec"] = round((r["backupDocuments"] + r["events"]) / took)
        res["restoreMs"] = round(took * 1000)
        res["restoreApplyDocsPerSec"] = r["docsPerSec"]
        man = json.loads(subprocess.run(ctl + ["--json", "backup", "list",
                                               f"--archive={arch}"] + s3flags, env=env,
                                        check=True, stdout=subprocess.PIPE).stdout)
        obj = [e for e in man["backups"][-1]["collections"] if e["ns"] == "bench.src"][0]
        if args.s3:
            path = tmp / "data.bson"
            sign = ["--aws-sigv4", "aws:amz:us-east-1:s3", "--user",
                    f"{ACCESS_KEY}:{SECRET_KEY}"]
            empty = hashlib.sha256(b"").hexdigest()
            t0 = time.perf_counter()
            subprocess.run(["curl", "-sf", "-o", str(path), "-H",
                            f"x-amz-content-sha256: {empty}"] + sign +
                           [f"{rgw.endpoint}/bench/arch/{obj['object']}"], check=True)
            get_s = time.perf_counter() - t0
            data = path.read_bytes()
            assert hashlib.sha256(data).hexdigest() == obj["sha256"], "data object hash"
            t0 = time.perf_counter()
            subprocess.run(["curl", "-sf", "-T", str(path), "-H",
                            f"x-amz-content-sha256: {obj['sha256']}"] + sign +
                           [f"{rgw.endpoint}/bench/curl-copy.bson"], check=True)
            put_s = time.perf_counter() - t0
            mb = len(data) / 1e6
            res["bytes"] = len(data)
            res["backupMBPerSec"] = round(mb / backup_s, 1)
            res["restoreMBPerSec"] = round(mb / took, 1)
            res["curlPutMBPerSec"] = round(mb / put_s, 1)
            res["curlGetMBPerSec"] = round(mb / get_s, 1)
            res["backupOverCurlPut"] = round(put_s / backup_s, 3)
            res["restoreOverCurlGet"] = round(get_s / took, 3)
        else:
            path = tmp / "arch" / obj["object"]
            data = path.read_bytes()
            res["bytes"] = len(data)
            res["backupMBPerSec"] = round(len(data) / 1e6 / backup_s, 1)
            t0 = time.perf_counter()
            shutil.copyfile(path, tmp / "copy.bson")
            os.sync()
            res["cpMBPerSec"] = round(len(data) / (time.perf_counter() - t0) / 1e6, 1)
        docs = bson.decode_all(data, codec_options=bson.CodecOptions(
            document_class=RawBSONDocument))
        t0 = time.perf_counter()
        for i in range(0, len(docs), 1000):
            c.bench.plain.insert_many(docs[i:i + 1000], ordered=True)
        res["insertDocsPerSec"] = round(len(docs) / (time.perf_counter() - t0))
        print(json.dumps(res))
    finally:
        for p in procs:
            p.stop()
        if rgw is not None:
            rgw.close()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
