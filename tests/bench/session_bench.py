#!/usr/bin/python3
"""The cost of retryable-write session bookkeeping (issue #16: "YCSB A with and without
retryable writes, same run; goal under 10%").

Two 3-member shard replica sets of the same build, each loaded with the same records;
`stripedb bench --workload a` (libmongoc, 50% reads / 50% updates) runs against both in one
invocation, one set through a URI with retryWrites=true (every update carries lsid,
txnNumber and stmtId: the shard records the statement's outcome in the same SQLite
transaction and Raft entry), the other with retryWrites=false. The sets swap roles every
round, so a difference between the two sets cancels out over an even number of rounds. The
script checks that the retryable side really wrote session records (stripedbSessionList)
and the plain side none, and prints ops/s per side and the ratio.

    /usr/bin/python3 tests/bench/session_bench.py --bin /tmp/build-rel/stripedb \\
        [--rounds 4] [--threads 16] [--records 10000] [--seconds 15]
"""
import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import pymongo  # noqa: E402

from replset_bench import start_set  # noqa: E402


def sessions(uri):
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=10000) as c:
        n, after = 0, None
        while True:
            cmd = {"stripedbSessionList": 1, "limit": 100000}
            if after is not None:
                cmd["after"] = after
            r = c.admin.command(cmd)
            n += len(r["sessions"])
            if not r.get("more"):
                return n
            after = r["sessions"][-1]["lsid"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.environ.get("STRIPEDB_BIN", "./stripedb"))
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--records", type=int, default=10000)
    ap.add_argument("--seconds", type=int, default=15)
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    if a.rounds < 1 or a.threads < 1 or a.records < 1 or a.seconds < 1:
        sys.exit("session_bench: --rounds, --threads, --records, --seconds must be >= 1")
    binary = os.path.abspath(a.bin)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="session_bench."))
    sets = []
    try:
        for name in ("sa", "sb"):
            procs, _, uri = start_set(binary, tmp, 3, name)
            sets.append((procs, uri))
        ratios, rows = [], []
        for rnd in range(a.rounds):
            retry_set, plain_set = (0, 1) if rnd % 2 == 0 else (1, 0)
            targets = [("retryable", sets[retry_set][1] + "&retryWrites=true"),
                       ("plain", sets[plain_set][1] + "&retryWrites=false")]
            if rnd % 4 >= 2:
                targets.reverse()  # which side runs first alternates too
            before = {label: sessions(uri) for label, uri in targets}
            out = tmp / f"r{rnd}.json"
            cmd = [binary, "bench", "--workload", "a", "--threads", str(a.threads),
                   "--records", str(a.records), "--seconds", str(a.seconds), "--quiet",
                   "--json", str(out)]
            if rnd >= 1:
                cmd.append("--no-load")  # round 0 loaded both sets
            for label, uri in targets:
                cmd += ["--uri", uri, "--label", label]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
            if r.returncode != 0:
                sys.stdout.write(r.stdout + r.stderr[-3000:])
                sys.exit(f"session_bench: stripedb bench failed in round {rnd}")
            ops = {}
            for i, (label, uri) in enumerate(targets):
                with open(f"{out}.{i + 1}") as f:
                    ops[label] = json.load(f)["phases"][0]["opsPerSec"]
                grew = sessions(uri) - before[label]
                if label == "retryable" and grew <= 0 and before[label] == 0:
                    sys.exit("session_bench: the retryable side wrote no session record")
                if label == "plain" and grew > 0:
                    sys.exit("session_bench: the plain side wrote session records")
            ratios.append(ops["retryable"] / ops["plain"])
            rows.append((rnd, "sa" if retry_set == 0 else "sb", ops["retryable"], ops["plain"]))
        print(f"YCSB A, {a.threads} threads, {a.records} records, {a.seconds} s a side, "
              "3-member shard sets")
        print(f"{'round':>5} {'retryable set':>13} {'retryable ops/s':>16} {'plain ops/s':>12} "
              f"{'ratio':>6}")
        for (rnd, s, ro, po), q in zip(rows, ratios):
            print(f"{rnd:>5} {s:>13} {ro:>16.0f} {po:>12.0f} {q:>6.2f}")
        med = statistics.median(ratios)
        print(f"median retryable/plain throughput: {med:.2f} "
              f"(bookkeeping cost {100 * (1 - med):.1f}%; goal under 10%)")
    finally:
        for procs, _ in sets:
            for m in procs:
                m.stop()
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
