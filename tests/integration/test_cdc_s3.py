"""The CDC archive on S3 (issue #22): `--archive=s3://BUCKET/PREFIX` against a real
S3-compatible server that checks signatures: Ceph's radosgw on a one-node Ceph cluster
started on loopback by the test (s3_server.py says why this one).

Every read-back is compared byte for byte with the shard's own oplog, read raw.
"""
import json
import os
import re
import threading

import hashlib
import subprocess

import bson
import pytest
from bson import Binary

from cdc_helpers import CdcCluster
from conftest import BIN, free_port, wait_until
from s3_server import SECRET_KEY, CephRgw, missing_binaries
from test_cdc import all_types_doc, assert_log_equals_oplog

pytestmark = pytest.mark.timeout(900)

SMALL = ["--cdc-segment-bytes=4096", "--cdc-retention-bytes=8192"]


@pytest.fixture(scope="module")
def rgw(tmp_path_factory):
    miss = missing_binaries()
    if miss:
        pytest.skip(f"no S3 server: {', '.join(miss)} not installed "
                    "(scripts/install-deps.sh --test installs radosgw, ceph-mon, ceph-osd)")
    srv = CephRgw(tmp_path_factory.mktemp("ceph"))
    yield srv
    srv.close()


class S3Cluster(CdcCluster):
    """A CdcCluster whose coordinators and ctl talk to the test's radosgw."""

    def __init__(self, start_role, tmp_path, rgw, bucket):
        super().__init__(start_role, tmp_path, shards=1)
        self.rgw = rgw
        self.bucket = bucket
        rgw.create_bucket(bucket)
        # the S3 archive's download cache goes under $TMPDIR: keep it in the test's directory
        # (a coordinator killed with -9 leaves it behind)
        self.env = dict(rgw.env(), TMPDIR=str(tmp_path))

    def start_coordinator(self, cdc, archive=None, extra=(), env=None, wait=True):
        self.cdc, self.archive = cdc, archive
        args = ["--role=coordinator", f"--metadata={self.metadata}", f"--cdc={cdc}"]
        if archive:
            args.append(f"--archive={archive}")
        return self.start_role(args + list(extra), env=env or self.env, wait=wait)

    def ctl(self, *args, check=True, cdc=None, archive=None, timeout=120, env=None):
        e = dict(os.environ)
        e.update(env or self.env)
        e["STRIPEDB_CDC"] = cdc or self.cdc
        e["STRIPEDB_ARCHIVE"] = archive or self.archive
        r = subprocess.run([BIN, "ctl", f"--metadata={self.metadata}"] + list(args),
                           capture_output=True, env=e, timeout=timeout)
        if check:
            assert r.returncode == 0, r.stderr.decode()
        return r

    def objects(self, prefix):
        """Keys and ETags under prefix, listed by curl (not by stripedb)."""
        st, body = self.rgw.curl("GET", self.bucket,
                                 f"?list-type=2&max-keys=1000&prefix={prefix.replace('/', '%2F')}")
        assert st == 200, body
        text = body.decode()
        return dict(zip(re.findall(r"<Key>([^<]*)</Key>", text),
                        [e.replace("&quot;", "") for e in re.findall(r"<ETag>([^<]*)</ETag>", text)]))


@pytest.fixture
def s3cl(start_role, tmp_path, rgw, request):
    bucket = "t-" + re.sub(r"[^a-z0-9]", "-", request.node.name.lower())[:50]
    c = S3Cluster(start_role, tmp_path, rgw, bucket)
    yield c
    c.close()


def archive_status(cl):
    return json.loads(cl.ctl("--json", "cdc", "status").stdout)["shards"][0]


def test_s3_archive_byte_fidelity_multipart_and_reader_fallback(s3cl, tmp_path):
    cl = s3cl
    spec = f"s3://{cl.bucket}/cdc/prod"
    co = cl.start_coordinator(f"embedded:{tmp_path}/cdc", archive=spec, extra=SMALL)
    c = cl.shard_client("shard-a")
    c.db.c.insert_many([all_types_doc(i) for i in range(60)])
    # one event of 10 MiB: its segment (> CDC_S3_PART_BYTES, 8 MiB) goes up in parts
    c.db.c.insert_one({"_id": "big", "blob": Binary(os.urandom(10 * 1024 * 1024))})
    c.db.c.update_one({"_id": 3}, {"$set": {"string": "changed", "new": [1, 2]}})
    c.db.c.delete_one({"_id": 4})
    for k in range(4):
        c.db.c.insert_many([{"_id": 1000 + k * 100 + i, "pad": "x" * 200} for i in range(100)])
    cl.wait_published(co, "shard-a")
    oplog = cl.oplog("shard-a")
    # the live log dropped its old segments into the bucket, from offset 0
    wait_until(lambda: archive_status(cl)["archive"]["nextOffset"]
               == archive_status(cl)["log"]["firstOffset"], 60, what="archive meets the log")
    st = archive_status(cl)
    assert st["log"]["firstOffset"] > 62, st  # the big event's segment is archived too
    assert st["archive"]["firstOffset"] == 0
    objs = cl.objects("cdc/prod/shard-a/")
    segs = sorted(k for k in objs if k.endswith(".seg"))
    assert segs and segs[0].startswith("cdc/prod/shard-a/00000000000000000000-")
    assert all(k[:-4] + ".idx" in objs for k in segs)
    # S3's multipart ETag is "<md5 of the part md5s>-<parts>": the big segment had 2 parts
    assert any(objs[k].endswith("-2") for k in segs), objs
    wait_until(lambda: cl.shard_status(co, "shard-a")["archive"]["nextOffset"]
               == st["archive"]["nextOffset"], 30, what="archive range on /cdc/status")

    # readers: from the beginning (archive in S3, then the live log) and from a position
    # inside the archive; the same bytes as the oplog, every BSON type, the 10 MiB event
    log = cl.read_log("shard-a")
    assert_log_equals_oplog(cl, "shard-a", log, oplog)
    assert max(len(raw) for _, raw in log) > 10 * 1024 * 1024
    assert_log_equals_oplog(cl, "shard-a", cl.read_log("shard-a", after=oplog[30][0]),
                            oplog[31:])
    # without the archive, that position exists nowhere
    r = cl.ctl("cdc", "read", "shard-a", f"--after={oplog[30][0][0]}:{oplog[30][0][1]}",
               check=False, archive=f"s3://{cl.bucket}/other-prefix")
    assert r.returncode == 1 and b"exists nowhere" in r.stderr, r.stderr
    assert r.stdout == b""


def test_s3_checksum_verified_on_read(s3cl, tmp_path):
    cl = s3cl
    spec = f"s3://{cl.bucket}/p"
    co = cl.start_coordinator(f"embedded:{tmp_path}/cdc", archive=spec, extra=SMALL)
    c = cl.shard_client("shard-a")
    for k in range(3):
        c.db.c.insert_many([{"_id": k * 100 + i, "pad": "y" * 200} for i in range(100)])
    cl.wait_published(co, "shard-a")
    wait_until(lambda: archive_status(cl)["archive"]["nextOffset"] > 0, 60, what="archived")
    first = sorted(k for k in cl.objects("p/shard-a/") if k.endswith(".seg"))[0]
    st, good = cl.rgw.curl("GET", cl.bucket, "/" + first)
    assert st == 200
    assert_log_equals_oplog(cl, "shard-a", cl.read_log("shard-a"), cl.oplog("shard-a"))
    # the same object with one byte flipped, stored with the original checksum metadata
    bad = bytearray(good)
    bad[100] ^= 0xFF
    meta = f"x-amz-meta-sha256: {hashlib.sha256(good).hexdigest()}"
    st, body = cl.rgw.curl("PUT", cl.bucket, "/" + first, body=bytes(bad), headers=[meta])
    assert st == 200, body
    r = cl.ctl("cdc", "read", "shard-a", check=False)
    assert r.returncode == 1
    assert b"checksum mismatch" in r.stderr and first.encode() in r.stderr, r.stderr
    assert r.stdout == b""


def test_s3_wrong_secret_missing_bucket_endpoint_down(s3cl, tmp_path):
    cl = s3cl
    spec = f"s3://{cl.bucket}/p"
    bad = dict(cl.env, AWS_SECRET_ACCESS_KEY=SECRET_KEY[:-1] + "X")
    # a coordinator with a wrong secret refuses to start, naming bucket and operation
    co = cl.start_coordinator(f"embedded:{tmp_path}/cdc", archive=spec, env=bad, wait=False)
    assert co.p.wait(timeout=60) != 0
    out = co.tail()
    assert f"s3 ListObjectsV2 s3://{cl.bucket}/" in out and "SignatureDoesNotMatch" in out, out
    # ctl too, exit 1
    r = cl.ctl("cdc", "status", check=False, env=bad)
    assert r.returncode == 1
    assert b"HTTP 403 SignatureDoesNotMatch (the secret key is wrong)" in r.stderr, r.stderr
    # a missing bucket
    r = cl.ctl("cdc", "status", check=False, archive="s3://no-such-bucket-here/p")
    assert r.returncode == 1
    assert b"s3 ListObjectsV2 s3://no-such-bucket-here/" in r.stderr, r.stderr
    assert b"NoSuchBucket" in r.stderr, r.stderr
    # an endpoint where nothing listens: retried, then a clear error
    down = dict(cl.env, STRIPEDB_S3_ENDPOINT=f"http://127.0.0.1:{free_port()}")
    r = cl.ctl("cdc", "status", check=False, env=down)
    assert r.returncode == 1
    assert f"s3 ListObjectsV2 s3://{cl.bucket}/".encode() in r.stderr, r.stderr
    assert b"after 6 tries" in r.stderr, r.stderr
    # a coordinator starts anyway (it must publish; the log keeps what is not archived)
    co = cl.start_coordinator(f"embedded:{tmp_path}/cdc-down", archive=spec, env=down)
    wait_until(lambda: "s3 archive unreachable" in co.tail(1 << 20), 30, what="the warning")
    c = cl.shard_client("shard-a")
    c.db.c.insert_one({"_id": "while-down"})
    cl.wait_published(co, "shard-a")
    co.stop()
    # no credentials at all
    nocred = {k: v for k, v in cl.env.items() if not k.startswith("AWS_")}
    e = dict(os.environ)
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        e.pop(k, None)
    e.update(nocred)
    e["STRIPEDB_CDC"], e["STRIPEDB_ARCHIVE"] = f"embedded:{tmp_path}/cdc", spec
    r = subprocess.run([BIN, "ctl", f"--metadata={cl.metadata}", "cdc", "status"],
                       capture_output=True, env=e, timeout=60)
    assert r.returncode == 1 and b"no credentials" in r.stderr, r.stderr
    # a credentials file instead of the environment works
    cred = tmp_path / "credentials"
    cred.write_text(f"[default]\naws_access_key_id = {cl.env['AWS_ACCESS_KEY_ID']}\n"
                    f"aws_secret_access_key = {SECRET_KEY}\n")
    r = subprocess.run([BIN, "ctl", f"--metadata={cl.metadata}", "cdc", "status",
                        f"--s3-credentials-file={cred}"], capture_output=True, env=e, timeout=60)
    assert r.returncode == 0, r.stderr


def live_segments(tmp_path):
    return len([f for f in os.listdir(tmp_path / "cdc" / "shard-a") if f.endswith(".seg")])


def test_s3_server_killed_during_uploads_nothing_lost(s3cl, tmp_path):
    cl = s3cl
    spec = f"s3://{cl.bucket}/p"
    # segments of ~190 events: the publisher uploads each closed segment before it deletes
    # it, and keeps up with the writer
    co = cl.start_coordinator(f"embedded:{tmp_path}/cdc", archive=spec,
                              extra=["--cdc-segment-bytes=65536",
                                     "--cdc-retention-bytes=131072"])
    c = cl.shard_client("shard-a")
    acked, stop = [], threading.Event()

    def writer():
        i = 0
        while not stop.is_set():
            c.db.c.insert_many([{"_id": i * 10 + j, "pad": "z" * 300} for j in range(10)])
            acked.extend(i * 10 + j for j in range(10))
            i += 1
    t = threading.Thread(target=writer)
    t.start()
    try:
        wait_until(lambda: archive_status(cl)["archive"]["nextOffset"] > 0, 60,
                   what="first uploads")
        cl.rgw.kill_rgw()
        # uploads fail now: the log keeps its segments (nothing deleted before its upload is
        # confirmed) and publishing goes on
        n0 = len(acked)
        wait_until(lambda: "cdc segment kept: archive failed" in co.tail(1 << 20), 60,
                   what="an upload failing")
        wait_until(lambda: len(acked) > n0 + 2000, 60, what="writes while S3 is down")
        cl.wait_published(co, "shard-a")
        assert live_segments(tmp_path) > 5, "segments waiting for the archive were deleted"
        cl.rgw.start_rgw()
        wait_until(lambda: len(acked) > n0 + 3000, 60, what="writes after the restart")
    finally:
        stop.set()
        t.join()
    cl.wait_published(co, "shard-a")

    def caught_up():
        # a write makes the publisher flush, and a flush after the backoff retries the
        # uploads that failed
        c.db.c.insert_one({"_id": os.urandom(8).hex()})
        s = archive_status(cl)
        return s["archive"]["nextOffset"] == s["log"]["firstOffset"] and \
            live_segments(tmp_path) <= 4
    wait_until(caught_up, 120, interval=0.5, what="the archive caught up after the restart")
    cl.wait_published(co, "shard-a")
    oplog = cl.oplog("shard-a")
    log = cl.read_log("shard-a")
    assert_log_equals_oplog(cl, "shard-a", log, oplog)
    inserted = {bson.decode(raw)["o"]["_id"] for _, raw in log if bson.decode(raw)["op"] == "i"}
    lost = set(acked) - inserted
    assert not lost, f"{len(lost)} acknowledged inserts missing from the CDC log + archive"
    assert archive_status(cl)["archive"]["firstOffset"] == 0


def test_s3_archive_retention_deletes_old_segments_only(s3cl, tmp_path):
    cl = s3cl
    spec = f"s3://{cl.bucket}/p"
    # a bad duration is refused
    bad = cl.start_coordinator(f"embedded:{tmp_path}/cdc0", archive=spec,
                               extra=["--archive-retention=7 days"], wait=False)
    assert bad.p.wait(timeout=60) == 2
    assert "--archive-retention must be" in bad.tail()
    co = cl.start_coordinator(f"embedded:{tmp_path}/cdc", archive=spec,
                              extra=SMALL + ["--archive-retention=4s"])
    c = cl.shard_client("shard-a")
    c.db.c.insert_many([{"_id": i, "pad": "r" * 200} for i in range(200)])
    cl.wait_published(co, "shard-a")
    wait_until(lambda: archive_status(cl)["archive"]["nextOffset"] > 0, 60, what="archived")
    old = archive_status(cl)["archive"]
    assert old["firstOffset"] == 0
    # once those events are older than 4 s, their segments leave the bucket, oldest first;
    # newer ones archived since stay
    wait_until(lambda: not any(k.startswith("p/shard-a/00000000000000000000-")
                               for k in cl.objects("p/shard-a/")), 60,
               what="the oldest segment deleted")
    wait_until(lambda: "cdc archive retention" in co.tail(1 << 20), 10, what="retention log")
    c.db.c.insert_many([{"_id": 1000 + i, "pad": "s" * 200} for i in range(200)])
    cl.wait_published(co, "shard-a")
    wait_until(lambda: archive_status(cl)["archive"]["nextOffset"] > old["nextOffset"], 60,
               what="the new events archived")
    st = archive_status(cl)
    assert st["archive"]["firstOffset"] > 0

    def paired():
        # retention deletes a segment's .seg then its .idx, and may be between the two
        # for a later old segment right now: at rest every segment has its index
        objs = cl.objects("p/shard-a/")
        segs = sorted(k[:-4] for k in objs if k.endswith(".seg"))
        return segs == sorted(k[:-4] for k in objs if k.endswith(".idx"))
    wait_until(paired, 30, what="every archived segment with its index")
    # reading from the beginning: the deleted range exists nowhere, and says so
    r = cl.ctl("cdc", "read", "shard-a", check=False)
    assert r.returncode == 1 and b"exists nowhere" in r.stderr, r.stderr
    # the live log is untouched by the archive's retention
    assert st["log"]["nextOffset"] == len(cl.oplog("shard-a"))


def test_s3_archive_with_kafka_log_reads_through_after_broker_retention(s3cl, tmp_path):
    kafka_mock = __import__("cdc_helpers").kafka_mock_path()
    if not os.path.exists(kafka_mock):
        pytest.skip("tests/integration/kafka_mock not built (make check builds it)")
    from cdc_helpers import KafkaMock
    k = KafkaMock(1, ["stripedb.cdc.shard-a"])
    try:
        cl = s3cl
        # librdkafka's mock broker keeps about 5 MB per partition: 7 MB of events make it
        # drop the oldest; the publisher's archiver staged them in 1 MiB segments and
        # uploaded each closed one to the bucket first
        co = cl.start_coordinator(f"kafka:{k.bootstrap}", archive=f"s3://{cl.bucket}/k",
                                  extra=["--cdc-segment-bytes=1048576"])
        c = cl.shard_client("shard-a")
        for r in range(7):
            c.db.c.insert_many([{"_id": r * 100 + i, "pad": "p" * 10000} for i in range(100)])
            cl.wait_published(co, "shard-a")
        oplog = cl.oplog("shard-a")
        assert len(oplog) == 701
        st = archive_status(cl)
        assert st["log"]["firstOffset"] > 0  # the broker dropped the oldest events
        assert st["archive"]["firstOffset"] == 0
        assert st["archive"]["nextOffset"] >= st["log"]["firstOffset"]  # no hole
        assert any(key.endswith(".seg") for key in cl.objects("k/shard-a/"))
        assert_log_equals_oplog(cl, "shard-a", cl.read_log("shard-a"), oplog)
        assert_log_equals_oplog(cl, "shard-a", cl.read_log("shard-a", after=oplog[100][0]),
                                oplog[101:])
    finally:
        k.close()


def test_s3_uploads_resume_after_coordinator_crash(s3cl, tmp_path):
    cl = s3cl
    spec = f"s3://{cl.bucket}/p"
    extra = ["--cdc-segment-bytes=65536", "--cdc-retention-bytes=131072"]
    co = cl.start_coordinator(f"embedded:{tmp_path}/cdc", archive=spec, extra=extra)
    c = cl.shard_client("shard-a")
    c.db.c.insert_many([{"_id": i, "pad": "a" * 300} for i in range(500)])
    cl.wait_published(co, "shard-a")
    wait_until(lambda: archive_status(cl)["archive"]["nextOffset"] > 0, 60, what="archived")
    # the gateway goes down; segments pile up in the log; the coordinator dies (kill -9)
    cl.rgw.kill_rgw()
    try:
        c.db.c.insert_many([{"_id": 1000 + i, "pad": "b" * 300} for i in range(3000)])
        cl.wait_published(co, "shard-a")
        wait_until(lambda: "cdc segment kept: archive failed" in co.tail(1 << 20), 60,
                   what="an upload failing")
        co.kill()
        assert live_segments(tmp_path) > 5
    finally:
        cl.rgw.start_rgw()
    # another coordinator takes the shard over and uploads what was kept
    co2 = cl.start_coordinator(f"embedded:{tmp_path}/cdc", archive=spec, extra=extra)
    c.db.c.insert_one({"_id": "after"})
    cl.wait_published(co2, "shard-a")

    def caught_up():
        s = archive_status(cl)
        return s["archive"]["nextOffset"] == s["log"]["firstOffset"] and \
            live_segments(tmp_path) <= 4
    wait_until(caught_up, 60, interval=0.5, what="the kept segments uploaded")
    oplog = cl.oplog("shard-a")
    assert_log_equals_oplog(cl, "shard-a", cl.read_log("shard-a"), oplog)
    assert archive_status(cl)["archive"]["firstOffset"] == 0
