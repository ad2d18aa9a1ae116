#!/usr/bin/python3
"""Benchmark of backups and point-in-time restore (issue #22): documents/s of
`stripedb ctl backup create` and `stripedb ctl restore`, beside plain copies of the same
bytes in the same run. Never part of `make check`.

Usage (from the build dir):
    STRIPEDB_BIN=./stripedb /usr/bin/python3 $SRCDIR/tests/bench/backup_bench.py \
        [--docs 100000] [--doc-bytes 200] [--events 20000]

A fresh metadata member, one embedded shard, a coordinator with the embedded CDC log and
a file: archive. --docs documents are loaded, a backup is taken, then --events updates
(each an oplog entry the restore replays). Measured, in one run on the same machine:
  backup    `ctl backup create --all` (snapshot read + BSON file + archive copy);
  restore   `ctl restore --to-time=now` into a new collection (backup documents + events,
            read back and verified), documents/s counting both;
  insert    the backup's data object, the same bytes, inserted by pymongo insert_many in
            batches of 1000 into another collection (what a plain reload costs);
  cp        the data object copied with cp (the bytes alone).
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

    res = {"docs": args.docs, "docBytes": args.doc_bytes, "events": args.events}
    try:
        cl = CdcCluster(start_role, tmp, shards=1)
        cdc, arch = f"embedded:{tmp}/cdc", f"file:{tmp}/arch"
        co = cl.start_coordinator(cdc, archive=arch)
        c = cl.shard_client("shard-a")
        pad = "x" * args.doc_bytes
        for i in range(0, args.docs, 1000):
            c.bench.src.insert_many([{"_id": k, "pad": pad}
                                     for k in range(i, min(args.docs, i + 1000))])
        env = dict(os.environ, STRIPEDB_CDC=cdc, STRIPEDB_ARCHIVE=arch)
        ctl = [conftest.BIN, "ctl", f"--metadata={cl.metadata}"]
        t0 = time.perf_counter()
        subprocess.run(ctl + ["backup", "create", "--all"], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        res["backupDocsPerSec"] = round(args.docs / (time.perf_counter() - t0))
        for k in range(args.events):
            c.bench.src.update_one({"_id": k % args.docs}, {"$set": {"n": k}})
        cl.wait_published(co, "shard-a", timeout=600)
        uri = f"mongodb://127.0.0.1:{cl.shard_ports['shard-a']}/?directConnection=true"
        t0 = time.perf_counter()
        out = subprocess.run(ctl + ["--json", "restore", "bench.src",
                                    f"--to-time={time.time():.3f}", "--into=bench.restored",
                                    f"--uri={uri}"],
                             env=env, check=True, stdout=subprocess.PIPE).stdout
        took = time.perf_counter() - t0
        r = json.loads(out)
        res["restoreDocsPerSec"] = round((r["backupDocuments"] + r["events"]) / took)
        res["restoreMs"] = round(took * 1000)
        res["restoreApplyDocsPerSec"] = r["docsPerSec"]
        man = json.loads(subprocess.run(ctl + ["--json", "backup", "list"], env=env,
                                        check=True, stdout=subprocess.PIPE).stdout)
        obj = [e for e in man["backups"][0]["collections"] if e["ns"] == "bench.src"][0]
        path = tmp / "arch" / obj["object"]
        data = path.read_bytes()
        res["bytes"] = len(data)
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
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
