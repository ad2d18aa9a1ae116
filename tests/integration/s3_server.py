"""A real S3-compatible server for the tests: Ceph's RADOS Gateway (radosgw, Debian's
`radosgw` package) on a one-node Ceph cluster started in a temporary directory on loopback:
one monitor, one OSD on BlueStore in a sparse 4 GiB file (no block device, no kernel
module, no root-only feature), and radosgw's beast frontend on a free port. It checks every
request's AWS Signature V4 like Amazon S3 does. Startup takes about 20 s, so one server
serves a whole test module (each test uses its own bucket).

    srv = CephRgw(tmp_dir)          # mon + osd + rgw, a user with known keys
    srv.create_bucket("b1")
    srv.kill_rgw(); srv.start_rgw() # the gateway only; the data stays in the OSD
    srv.curl("GET", "b1", "?list-type=2")   # (status, body) with the test user's keys
    srv.close()

Why not something else: Debian 12 has no MinIO, moto or s3proxy package and PyPI is not
reachable from CI; RGW is the S3 implementation the issue names, and it runs unprivileged
with BlueStore on a file.
"""
import hashlib
import os
import shutil
import subprocess
import time
import uuid

from conftest import free_port, wait_until

ACCESS_KEY = "STRIPEDBTESTKEY00001"
SECRET_KEY = "stripedbTestSecretKey0000000000000000001"
BINARIES = ("ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "monmaptool", "ceph-authtool",
            "ceph", "curl")


def missing_binaries():
    return [b for b in BINARIES if shutil.which(b) is None]


class CephRgw:
    def __init__(self, d):
        self.d = str(d)
        self.procs = {}
        os.makedirs(self.d, exist_ok=True)
        self.mon_port = free_port()
        self.rgw_port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.rgw_port}"
        self.conf = os.path.join(self.d, "ceph.conf")
        fsid = str(uuid.uuid4())
        d = self.d
        with open(self.conf, "w") as f:
            f.write(f"""[global]
fsid = {fsid}
mon host = v1:127.0.0.1:{self.mon_port}
mon initial members = a
auth cluster required = none
auth service required = none
auth client required = none
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
mon warn on pool no redundancy = false
mon data avail warn = 1
mon data avail crit = 0
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd objectstore = bluestore
bluestore block create = true
bluestore block size = 4294967296
bluestore block db create = false
bluestore block wal create = false
bluestore fsck on mount = false
bluestore cache size = 134217728
osd memory target = 536870912
osd data = {d}/$name
mon data = {d}/$name
run dir = {d}/run
admin socket = {d}/run/$name.asok
log file = {d}/$name.log
pid file = {d}/run/$name.pid
keyring = {d}/keyring
ms bind ipv6 = false
public addr = 127.0.0.1
osd class update on start = false
osd crush update on start = false
osd max object name len = 256
osd max object namespace len = 64
rgw data = {d}/rgw
[client.rgw]
rgw frontends = beast endpoint=127.0.0.1:{self.rgw_port}
rgw lc debug interval = -1
""")
        for sub in ("mon.a", "osd.0", "run", "rgw"):
            os.makedirs(os.path.join(d, sub), exist_ok=True)
        try:
            self._run("ceph-authtool", "--create-keyring", f"{d}/keyring", "--gen-key", "-n",
                      "mon.", "--cap", "mon", "allow *")
            self._run("monmaptool", "--create", "--add", "a", f"v1:127.0.0.1:{self.mon_port}",
                      "--fsid", fsid, f"{d}/monmap")
            self._run("ceph-mon", "-c", self.conf, "--mkfs", "-i", "a", "--monmap",
                      f"{d}/monmap", "--keyring", f"{d}/keyring")
            self._spawn("mon", ["ceph-mon", "-c", self.conf, "-f", "-i", "a"])
            osd_uuid = str(uuid.uuid4())
            self._run("ceph", "-c", self.conf, "--connect-timeout", "30", "osd", "new", osd_uuid)
            self._run("ceph-osd", "-c", self.conf, "-i", "0", "--mkfs", "--osd-uuid", osd_uuid)
            # placed in the CRUSH map here rather than by the OSD at boot: a freshly started
            # ceph-osd 16.2 may send that command before it knows the cluster's fsid, and dies
            self._run("ceph", "-c", self.conf, "osd", "crush", "add", "osd.0", "1",
                      "root=default", "host=localhost")
            self._spawn("osd", ["ceph-osd", "-c", self.conf, "-f", "-i", "0"])
            self.start_rgw()
            self._run("radosgw-admin", "-c", self.conf, "user", "create", "--uid=stripedb",
                      "--display-name=stripedb", f"--access-key={ACCESS_KEY}",
                      f"--secret-key={SECRET_KEY}")
        except BaseException:
            self.close()
            raise

    # What the ceph CLI prints when the monitor could not answer for a moment (it is
    # electing itself again after a lease timed out on a loaded machine, or is still
    # starting): the command did nothing and may be sent again. Seen in CI once:
    # "Error EPERM: problem getting command descriptions from mon." right after
    # `ceph osd new` had succeeded.
    TRANSIENT = ("problem getting command descriptions", "error connecting to the cluster",
                 "ETIMEDOUT", "Connection timed out")

    def _run(self, *args, deadline_s=120):
        """Run one command; a ceph command whose failure is one of TRANSIENT is sent again
        until deadline_s (every command retried here is idempotent: `osd new` with the same
        uuid, `osd crush add` of the same item)."""
        end = time.monotonic() + deadline_s
        while True:
            r = subprocess.run(list(args), capture_output=True, timeout=120)
            if r.returncode == 0:
                return r
            err = r.stderr.decode(errors="replace")
            if (args[0] == "ceph" and any(t in err for t in self.TRANSIENT)
                    and time.monotonic() < end):
                time.sleep(0.5)
                continue
            raise RuntimeError(f"{' '.join(args)} failed ({r.returncode}): {err[-2000:]}")

    def _spawn(self, name, args):
        log = open(os.path.join(self.d, f"{name}.out"), "ab")
        self.procs[name] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        log.close()

    def start_rgw(self, timeout=120):
        self._spawn("rgw", ["radosgw", "-c", self.conf, "-f", "-n", "client.rgw"])
        p = self.procs["rgw"]

        def up():
            if p.poll() is not None:
                raise RuntimeError(f"radosgw exited with {p.returncode}: see {self.d}")
            st, _ = self.curl("GET", "", "", signed=False)
            return st != 0
        wait_until(up, timeout, interval=0.2, what="radosgw answering")

    def kill_rgw(self):
        p = self.procs.pop("rgw", None)
        if p is not None and p.poll() is None:
            p.kill()
            p.wait(timeout=30)

    def curl(self, method, bucket, path_query, body=None, headers=(), signed=True,
             secret=SECRET_KEY):
        """One request with curl(1) (SigV4 by curl). Returns (status, body bytes); status 0
        when nothing answered."""
        sha = hashlib.sha256(body or b"").hexdigest()
        url = f"{self.endpoint}/{bucket}{path_query}"
        args = ["curl", "-s", "-o", "-", "-w", "\n%{http_code}", "-X", method,
                "--max-time", "60", "-H", f"x-amz-content-sha256: {sha}"]
        if signed:
            args += ["--aws-sigv4", "aws:amz:us-east-1:s3", "--user", f"{ACCESS_KEY}:{secret}"]
        for h in headers:
            args += ["-H", h]
        if body is not None:
            args += ["--data-binary", "@-", "-H", "Content-Type: application/octet-stream"]
        r = subprocess.run(args + [url], input=body or b"", capture_output=True, timeout=90)
        out, _, code = r.stdout.rpartition(b"\n")
        return int(code or 0), out

    def create_bucket(self, name):
        st, body = self.curl("PUT", name, "")
        assert st == 200, (st, body)

    def env(self):
        """Environment of a stripedb process using this server."""
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "STRIPEDB_S3_ENDPOINT": self.endpoint}

    def close(self):
        for name in ("rgw", "osd", "mon"):
            p = self.procs.pop(name, None)
            if p is not None and p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=10)
        shutil.rmtree(self.d, ignore_errors=True)
