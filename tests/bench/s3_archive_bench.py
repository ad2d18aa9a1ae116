"""Benchmark of the S3 CDC archive (issue #22) against Ceph's radosgw on loopback: one
segment-sized file (default 64 MiB, the default --cdc-segment-bytes) uploaded and
downloaded ROUNDS times through stripedb's S3 client (tests/bench/s3_archive_bench: SigV4
by libcurl, SHA-256 of the body, 8 MiB multipart parts, checksum verified on read), and the
same bytes moved by curl(1) in one PUT / GET each (SigV4 by curl, no multipart, no
checksum) in the same run, against the same server.

    /usr/bin/python3 tests/bench/s3_archive_bench.py BUILD_DIR [MIB] [ROUNDS]
"""
import hashlib
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
os.environ.setdefault("STRIPEDB_BIN", os.path.join(sys.argv[1], "stripedb"))
from s3_server import ACCESS_KEY, SECRET_KEY, CephRgw  # noqa: E402


def main():
    build = sys.argv[1]
    mib = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    with tempfile.TemporaryDirectory() as d:
        srv = CephRgw(os.path.join(d, "ceph"))
        try:
            srv.create_bucket("bench")
            f = os.path.join(d, "segment")
            with open(f, "wb") as out:
                out.write(os.urandom(mib << 20))
            env = dict(os.environ, AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY)
            r = subprocess.run([os.path.join(build, "tests/bench/s3_archive_bench"), srv.endpoint,
                                "bench", f, str(rounds)], env=env, capture_output=True, check=True)
            print(r.stdout.decode(), end="")
            sha = hashlib.sha256(open(f, "rb").read()).hexdigest()
            sign = ["--aws-sigv4", "aws:amz:us-east-1:s3", "--user", f"{ACCESS_KEY}:{SECRET_KEY}"]
            for what in ("put", "get"):
                t0 = time.monotonic()
                for i in range(rounds):
                    url = f"{srv.endpoint}/bench/curl-{i}"
                    if what == "put":
                        args = ["curl", "-sf", "-T", f, "-H", f"x-amz-content-sha256: {sha}"]
                    else:
                        empty = hashlib.sha256(b"").hexdigest()
                        args = ["curl", "-sf", "-o", f + ".back", "-H",
                                f"x-amz-content-sha256: {empty}"]
                    subprocess.run(args + sign + [url], check=True)
                secs = time.monotonic() - t0
                print(f"curl {what} {mib << 20} bytes {rounds} rounds {secs:.3f} s "
                      f"{(mib << 20) * rounds / secs / (1 << 20):.1f} MiB/s")
        finally:
            srv.close()


if __name__ == "__main__":
    main()
