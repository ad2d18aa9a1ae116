#!/usr/bin/python3
"""The cost of Decimal128 $sum (issue #20): a $group {$sum} over 100,000 Decimal128 values
against the same $group over 100,000 doubles, same shard, same documents, same run.

One embedded shard holds N documents {_id, d: Decimal128, f: double} (the same amounts:
d = Decimal128("i.cc"), f = float of it). Each round runs
[{$group: {_id: null, s: {$sum: "$d"}}}] and the same over "$f", in alternating order, and
the script prints the median wall time of each and their ratio (decimal / double). The whole
aggregate is timed (scan, document decoding, grouping, reply), which is what a client sees;
the decimal total is checked against Python's decimal module.

    /usr/bin/python3 tests/bench/decimal_sum_bench.py --bin /tmp/build-rel/stripedb \\
        [--docs 100000] [--rounds 9]
"""
import argparse
import decimal
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import pymongo
from bson.decimal128 import Decimal128


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.environ.get("STRIPEDB_BIN", "./stripedb"))
    ap.add_argument("--docs", type=int, default=100000)
    ap.add_argument("--rounds", type=int, default=9)
    a = ap.parse_args()
    if a.docs < 1 or a.rounds < 1:
        sys.exit("decimal_sum_bench: --docs and --rounds must be >= 1")
    tmp = tempfile.mkdtemp(prefix="decbench")
    port = free_port()
    log = open(os.path.join(tmp, "shard.log"), "w")
    proc = subprocess.Popen([os.path.abspath(a.bin), "--role=shard",
                             f"--listen=127.0.0.1:{port}", f"--data-dir={tmp}/data"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true",
                                serverSelectionTimeoutMS=20000)
        coll = c.bench.amounts
        total = decimal.Decimal(0)
        batch = []
        for i in range(a.docs):
            s = f"{i % 10000}.{(i * 7) % 100:02d}"
            total += decimal.Decimal(s)
            batch.append({"_id": i, "d": Decimal128(s), "f": float(s)})
            if len(batch) == 1000:
                coll.insert_many(batch)
                batch = []
        if batch:
            coll.insert_many(batch)
        times = {"d": [], "f": []}
        for r in range(a.rounds):
            for field in (("d", "f") if r % 2 == 0 else ("f", "d")):
                t0 = time.perf_counter()
                (g,) = coll.aggregate([{"$group": {"_id": None, "s": {"$sum": f"${field}"}}}])
                times[field].append(time.perf_counter() - t0)
                if field == "d":
                    assert g["s"] == Decimal128(total), (g["s"], total)
                else:
                    assert isinstance(g["s"], float)
        md, mf = statistics.median(times["d"]), statistics.median(times["f"])
        print(f"$sum over {a.docs} Decimal128: median {md * 1000:.1f} ms")
        print(f"$sum over {a.docs} doubles:    median {mf * 1000:.1f} ms")
        print(f"ratio decimal / double: {md / mf:.3f} ({a.rounds} rounds)")
        c.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
