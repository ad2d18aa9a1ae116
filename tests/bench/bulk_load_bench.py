#!/usr/bin/python3
"""Bulk load through a proxy vs straight into the shard (issue #19: "bulk loads through the
proxy must run at >= 0.8x of loading the shard directly"), same run, same data, same client
(pymongo insert_many, which sends 48 MB document sequences; the proxy cuts them to the
shard's limits). Rounds alternate direct and proxy loads into fresh collections and the
ratio of throughputs is printed per round and as the median.

    STRIPEDB_BIN=/path/to/build/stripedb /usr/bin/python3 tests/bench/bulk_load_bench.py \
        [--docs 200000] [--size 500] [--rounds 3]
"""
import argparse
import pathlib
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "integration"))

from proxy_bench import Starter  # noqa: E402
from proxy_helpers import ProxyCluster  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=500, help="approximate BSON bytes a document")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    if a.docs < 1 or a.size < 40 or a.rounds < 1:
        sys.exit("bulk_load_bench: --docs >= 1, --size >= 40, --rounds >= 1")
    tmp = tempfile.mkdtemp(prefix="sdb-bulk-")
    start = Starter(tmp)
    try:
        cl = ProxyCluster(start, pathlib.Path(tmp), shards=1, proxies=1)
        pad = "x" * (a.size - 30)
        docs = [{"_id": i, "k": i, "p": pad} for i in range(a.docs)]
        direct_db = cl.shard_client("shard-a").bench
        proxy_db = cl.proxy_client(0).bench
        ratios = []
        print(f"{a.docs} documents of ~{a.size} bytes, 1 shard, 1 proxy")
        print(f"{'round':>5} {'direct docs/s':>14} {'proxy docs/s':>13} {'proxy/direct':>12}")
        for r in range(a.rounds):
            t = time.perf_counter()
            direct_db[f"d{r}"].insert_many(docs)
            d = time.perf_counter() - t
            t = time.perf_counter()
            proxy_db[f"p{r}"].insert_many(docs)
            p = time.perf_counter() - t
            assert direct_db[f"d{r}"].estimated_document_count() == a.docs
            assert direct_db[f"p{r}"].estimated_document_count() == a.docs
            ratios.append(d / p)
            print(f"{r:>5} {a.docs / d:>14.0f} {a.docs / p:>13.0f} {d / p:>12.2f}")
        print(f"median proxy/direct throughput: {statistics.median(ratios):.2f} (goal >= 0.8)")
        cl.close()
    finally:
        start.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
