"""Start an embedded shard on free loopback ports and drive it with pymongo.

Usage: quickstart.py PATH/TO/stripedb. Prints what it does; exits non-zero on any failure.
"""
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import pymongo


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def main():
    binary = sys.argv[1]
    data = tempfile.mkdtemp(prefix="stripedb-quickstart-")
    ok = False
    port, http = free_port(), free_port()
    log = open(os.path.join(data, "shard.log"), "wb")
    env = dict(os.environ, STRIPEDB_CONFIG="/dev/null")
    proc = subprocess.Popen([binary, "--role=shard", f"--listen=127.0.0.1:{port}",
                             f"--http-listen=127.0.0.1:{http}", f"--data-dir={data}/db"],
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    print(f"==> stripedb --role=shard listening on mongodb://127.0.0.1:{port} "
          f"(metrics: http://127.0.0.1:{http}/metrics, log: {data}/shard.log)")
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http}/healthz", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("shard did not start; log:\n" + open(f"{data}/shard.log").read())
                time.sleep(0.05)
        client = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true")
        hello = client.admin.command("hello")
        print(f"==> pymongo connected: maxWireVersion={hello['maxWireVersion']} "
              f"ping={client.admin.command('ping')['ok']}")
        charges = client.payments.charges
        rnd = random.Random(42)
        docs = [{"_id": f"ch_{i:06d}", "merchant": f"acct_{rnd.randrange(20):02d}",
                 "amount": rnd.randrange(100, 100000), "currency": rnd.choice(["usd", "eur", "gbp"]),
                 "created": 1700000000 + i} for i in range(5000)]
        t0 = time.monotonic()
        charges.insert_many(docs, ordered=False)
        t1 = time.monotonic()
        charges.create_index([("merchant", 1), ("created", -1)])
        n = charges.count_documents({"merchant": "acct_07"})
        top = list(charges.find({"merchant": "acct_07", "amount": {"$gte": 50000}})
                   .sort("created", -1).limit(3))
        charges.update_many({"currency": "gbp"}, {"$inc": {"amount": 1}})
        total = list(charges.aggregate([{"$group": {"_id": "$currency", "n": {"$sum": 1},
                                                     "volume": {"$sum": "$amount"}}},
                                        {"$sort": {"_id": 1}}]))
        print(f"==> inserted {len(docs)} charges in {t1 - t0:.2f}s; merchant acct_07 has {n} charges")
        for d in top:
            print(f"    {d['_id']} {d['amount']:>6} {d['currency']} created={d['created']}")
        for row in total:
            print(f"    {row['_id']}: {row['n']} charges, volume {row['volume']}")
        expected = sum(1 for d in docs if d["merchant"] == "acct_07")
        assert n == expected, (n, expected)
        client.close()
        ok = True
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
        log.close()
        if rc == 0 and ok:
            shutil.rmtree(data)
            print(f"==> shard stopped gracefully (exit {rc}); removed its temp dir {data}")
        else:
            print(f"==> shard stopped (exit {rc}); its data and log are kept in {data}")
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
