#!/usr/bin/python3
"""Instructions per YCSB-A update on one shard, counted by callgrind (issue #19).

Starts a shard of --bin natively (`--role=shard`), loads it with `stripedb bench`
(--records YCSB documents of 10 x 100 bytes), stops it, restarts it on the same data under
`valgrind --tool=callgrind`, runs --warmup then --updates updates on one pymongo
connection, each an `update` command {q: {_id}, u: {$set: {v: i, field<k>: 100 bytes}}}
(what `stripedb bench --workload a` sends; keys and fields from a fixed seed), and counts
only the measured ones (`callgrind_control -z` before, `-d` after). Prints the shard's
instructions per update, in total and inclusive for a few functions of the apply path.
Unlike wall-clock figures these do not move with the machine's load; the data set is a
new random load each run, so expect differences of about 1% between runs of one binary.

    /usr/bin/python3 tests/bench/update_instr.py --bin build-rel/stripedb
    /usr/bin/python3 tests/bench/update_instr.py --bin build-rel/stripedb --indexes field0,field1

Use a release build (../configure without --enable-sanitizers). Exits 2 with one line on
stderr when the shard does not start or an update does not match one document.
"""
import argparse
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from pymongo import MongoClient

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shard_ab import free_port  # noqa: E402

FUNCS = ["vt_apply", "run_update", "match_docs_in", "sdb_update_apply", "replace_doc",
         "coll_oplog", "sdb_store_apply_begin", "sdb_store_apply_commit", "conn_process"]


def start(cmd, log, port):
    # MONGOC_DISABLE_SHM set: stripedb's start-up re-exec (src/main.c) would exec valgrind's
    # tool binary through /proc/self/exe
    env = dict(os.environ, MONGOC_DISABLE_SHM="1")
    p = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 120
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return p
        except OSError:
            if p.poll() is not None or time.monotonic() > deadline:
                p.kill()
                sys.exit(f"update_instr: the shard did not start (log {log})")
            time.sleep(0.1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True, help="stripedb binary (a release build)")
    ap.add_argument("--records", type=int, default=50000)
    ap.add_argument("--updates", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--indexes", default="", help="fields to index before the updates")
    ap.add_argument("--keep", action="store_true", help="keep the data and callgrind files")
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="update-instr-")
    port = free_port()
    shard = [args.bin, "--role=shard", f"--listen=127.0.0.1:{port}",
             f"--data-dir={tmp}/db"]
    p = start(shard, f"{tmp}/load.log", port)
    subprocess.run([args.bin, "bench", "--uri",
                    f"mongodb://127.0.0.1:{port}/?directConnection=true", "--workload", "a",
                    "--threads", "16", "--records", str(args.records), "--seconds", "1",
                    "--distribution", "uniform", "--quiet", "--no-check"],
                   capture_output=True, check=True)
    p.terminate()
    p.wait()
    out = f"{tmp}/cg.out"
    p = start(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"] + shard,
              f"{tmp}/shard.log", port)
    try:
        coll = MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true").ycsb
        for f in filter(None, args.indexes.split(",")):
            coll.usertable.create_index(f)
        rng = random.Random(7)

        def update(i):
            k = rng.randrange(args.records)
            r = coll.command({"update": "usertable", "updates": [
                {"q": {"_id": "user%012d" % k},
                 "u": {"$set": {"v": i, "field%d" % rng.randrange(10): "x" * 100}}}]})
            if r.get("n") != 1:
                sys.exit(f"update_instr: an update matched {r.get('n')} documents: {r}")

        for i in range(args.warmup):
            update(i)
        subprocess.run(["callgrind_control", "-z", str(p.pid)], check=True,
                       capture_output=True)
        for i in range(args.updates):
            update(args.warmup + i)
        subprocess.run(["callgrind_control", "-d", str(p.pid)], check=True,
                       capture_output=True)
    finally:
        p.terminate()
        p.wait()
    dump = out + ".1"
    ann = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", dump],
                         capture_output=True, text=True).stdout
    total = re.search(r"([\d,]+) \(100.0%\)\s+PROGRAM TOTALS", ann)
    if not total:
        sys.exit(f"update_instr: no callgrind totals in {dump}")
    n = args.updates
    print(f"instructions per update: {int(total.group(1).replace(',', '')) / n:,.0f}")
    for fn in FUNCS:
        m = re.search(r"^\s*([\d,]+) \([\d. ]+%\)\s+\S*:" + fn + r"(\.[\w.]+)? \[", ann, re.M)
        if m:
            print(f"  {fn:24s} {int(m.group(1).replace(',', '')) / n:>10,.0f}")
    if args.keep:
        print(f"kept: {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
