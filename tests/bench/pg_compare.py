#!/usr/bin/python3
"""stripedb vs PostgreSQL 15 JSONB on the same machine, in one run (issue #19).

Starts a private PostgreSQL 15 (Debian's postgresql-15: initdb into a temporary directory,
TCP on a free loopback port, fsync=on, synchronous_commit=on) and stripedb targets, loads
the same YCSB-shaped data into each (--records documents of 10 fields x 100 bytes, keys
"user%012d"), and runs YCSB C (100% point reads), A (50/50 read/update), B (95/5) and E
(95% short scans of 1-100 documents, 5% inserts) with uniform keys, for each client thread
count, against:

  * pg       PostgreSQL: table ycsb(key text primary key, doc jsonb), driven by pgbench with
             custom scripts (-M prepared, -c N -j N, -T, --random-seed, -l for latencies);
  * direct   one stripedb shard, directly;
  * proxy    one stripedb proxy in front of one shard (metadata member + proxy + shard);
  * relay    (--relay PATH) tests/bench/relay_floor in front of a shard of its own: a
             one-thread libuv byte relay, the floor under any event-driven proxy's cost
             (its server CPU is the relay's and the shard's; x direct is the ratio to the
             shard direct, as for the proxy);
  * rs3      (--replset) a 3-member shard replica set (replicaSet URI);
  * 4x2      (--scale-out) 4 shards behind 2 proxies, ycsb.usertable sharded on _id in 4
             ranged chunks (each shard given its filtering metadata, as a coordinator
             would), the client given both proxies;

stripedb targets are driven by `stripedb bench` (C, libmongoc; it reloads the collection
before each run), of --client-bin when given: a release build links tcmalloc, which the
servers should have and an application's libmongoc client usually does not. One loopback round trip is measured in the same run (redis-benchmark
PING with 1 client against a private redis-server when installed, and always a 1-byte TCP
echo between two Python processes) for the "1-client point read <= 1.5x a loopback round
trip" goal. Prints one table (workload, threads, system, ops/s, p50 ms, p99 ms, ratio to
PostgreSQL, ratio to the shard direct, server and client CPU ms per operation, errors) and
the issue's goals met or not; --json FILE writes the same as JSON.

    /usr/bin/python3 tests/bench/pg_compare.py --bin /tmp/build-pg/stripedb \\
        [--seconds 10] [--records 50000] [--threads 1,16] [--with-64 [WORKLOADS]] \\
        [--workloads c,a,b,e] [--replset] [--scale-out] [--relay build/tests/bench/relay_floor]
        [--json FILE] [--keep]

PostgreSQL refuses to run as root: when run as root, initdb, pg_ctl and the server run as
--pg-user (default `postgres`, Debian's package user) via `runuser -u USER --`; pgbench
and psql run as the caller over TCP (trust authentication on 127.0.0.1 only). Never part
of `make check`; every server is on a free loopback port in a temporary directory and is
stopped at the end.
"""
import argparse
import glob
import json
import os
import pathlib
import re
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))
sys.path.insert(0, str(HERE))

import conftest  # noqa: E402
from conftest import free_port, wait_until  # noqa: E402

PG_BIN = "/usr/lib/postgresql/15/bin"
WORKLOADS = {  # YCSB core mixes as `stripedb bench` runs them (src/bench/bench.h)
    "c": "100% point reads",
    "a": "50% reads / 50% updates",
    "b": "95% reads / 5% updates",
    "e": "95% scans (1-100) / 5% inserts",
}


def die(msg):
    print(f"pg_compare: {msg}", file=sys.stderr)
    sys.exit(2)


# ---------------------------------------------------------------- PostgreSQL

# pgbench scripts, one YCSB operation per transaction; :records is given with -D. Keys are
# 'user' + 12 digits as `stripedb bench` writes them, values 100 characters.
PG_SQL = {
    "read": """\\set k random(0, :records - 1)
SELECT doc FROM ycsb WHERE key = 'user' || lpad(:k::text, 12, '0');
""",
    "update": """\\set k random(0, :records - 1)
\\set f random(0, 9)
UPDATE ycsb SET doc = doc || jsonb_build_object('field' || :f::int,
    substr(repeat(md5(random()::text), 4), 1, 100), 'v', :k::bigint)
  WHERE key = 'user' || lpad(:k::text, 12, '0');
""",
    "scan": """\\set k random(0, :records - 1)
\\set n random(1, 100)
SELECT key, doc FROM ycsb WHERE key >= 'user' || lpad(:k::text, 12, '0') ORDER BY key LIMIT :n;
""",
    "insert": """\\set k random(:records, 999999999999)
INSERT INTO ycsb VALUES ('user' || lpad(:k::text, 12, '0'), (SELECT doc FROM ycsb
    WHERE key = 'user000000000000')) ON CONFLICT DO NOTHING;
""",
}
PG_MIX = {"c": {"read": 100}, "a": {"read": 50, "update": 50},
          "b": {"read": 95, "update": 5}, "e": {"scan": 95, "insert": 5}}

PG_LOAD = """
DROP TABLE IF EXISTS ycsb;
CREATE TABLE ycsb (key text PRIMARY KEY, doc jsonb NOT NULL);
INSERT INTO ycsb SELECT 'user' || lpad(i::text, 12, '0'),
  jsonb_build_object('_id', 'user' || lpad(i::text, 12, '0'), 'v', 0,
    'field0', substr(repeat(md5(random()::text), 4), 1, 100),
    'field1', substr(repeat(md5(random()::text), 4), 1, 100),
    'field2', substr(repeat(md5(random()::text), 4), 1, 100),
    'field3', substr(repeat(md5(random()::text), 4), 1, 100),
    'field4', substr(repeat(md5(random()::text), 4), 1, 100),
    'field5', substr(repeat(md5(random()::text), 4), 1, 100),
    'field6', substr(repeat(md5(random()::text), 4), 1, 100),
    'field7', substr(repeat(md5(random()::text), 4), 1, 100),
    'field8', substr(repeat(md5(random()::text), 4), 1, 100),
    'field9', substr(repeat(md5(random()::text), 4), 1, 100))
  FROM generate_series(0, {n} - 1) AS i;
"""


class Postgres:
    """A private PostgreSQL server: initdb into tmp/pg/data, TCP on 127.0.0.1:port."""

    def __init__(self, tmp, bindir, user, max_conns):
        self.bindir = bindir
        for tool in ("initdb", "pg_ctl", "postgres", "pgbench", "psql"):
            if not os.access(os.path.join(bindir, tool), os.X_OK):
                die(f"{bindir}/{tool} not found: install Debian's postgresql-15 "
                    f"(or give --pg-bindir)")
        self.dir = tmp / "pg"
        self.dir.mkdir()
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self.prefix = []
        if os.geteuid() == 0:
            # initdb and postgres refuse root: run them as an unprivileged user
            if not shutil.which("runuser"):
                die("running as root and runuser is missing: run as an unprivileged user")
            self.prefix = ["runuser", "-u", user, "--"]
            try:
                shutil.chown(self.dir, user=user)
            except (LookupError, PermissionError) as e:
                die(f"cannot give {self.dir} to user {user!r} ({e}): pass --pg-user")
            os.chmod(tmp, 0o755)
        self.port = free_port()
        self._run([f"{bindir}/initdb", "-D", str(self.data), "-U", "postgres",
                   "--auth=trust", "-E", "UTF8", "--no-locale"], "initdb")
        opts = (f"-c listen_addresses=127.0.0.1 -c port={self.port} "
                f"-c unix_socket_directories={self.data} -c fsync=on "
                f"-c synchronous_commit=on -c max_connections={max_conns + 10}")
        self._run([f"{bindir}/pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w",
                   "-t", "60", "-o", opts, "start"], "pg_ctl start")
        self.running = True
        self.settings = {k: self.sql(f"SHOW {k}").strip()
                         for k in ("server_version", "fsync", "synchronous_commit",
                                   "wal_sync_method", "shared_buffers")}
        if self.settings["fsync"] != "on" or self.settings["synchronous_commit"] != "on":
            die(f"PostgreSQL did not take fsync/synchronous_commit on: {self.settings}")

    def _run(self, cmd, what):
        r = subprocess.run(self.prefix + cmd, capture_output=True, text=True, cwd="/")
        if r.returncode != 0:
            tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["?"]
            extra = ""
            if self.log.exists():
                extra = " | server log: " + " ".join(self.log.read_text(
                    errors="replace").strip().splitlines()[-2:])
            die(f"{what} failed (exit {r.returncode}): {tail[0]}{extra}")
        return r.stdout

    def sql(self, text):
        r = subprocess.run([f"{self.bindir}/psql", "-X", "-q", "-t", "-A", "-v",
                            "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", str(self.port),
                            "-U", "postgres", "-d", "postgres", "-c", text],
                           capture_output=True, text=True)
        if r.returncode != 0:
            die(f"psql failed: {r.stderr.strip()[:300]}")
        return r.stdout

    def load(self, n):
        t0 = time.monotonic()
        self.sql(PG_LOAD.replace("{n}", str(int(n))))
        self.sql("VACUUM ANALYZE ycsb")  # not in a transaction block
        self.sql("CHECKPOINT")
        return time.monotonic() - t0

    def bench(self, wl, threads, seconds, records, seed, work):
        """One pgbench run of workload wl; returns ops/s, p50/p99 ms, errors."""
        d = work / f"pg-{wl}-{threads}"
        d.mkdir()
        scripts = []
        for op, weight in PG_MIX[wl].items():
            f = d / f"{op}.sql"
            f.write_text(PG_SQL[op])
            scripts += ["-f", f"{f}@{weight}"]
        cmd = [f"{self.bindir}/pgbench", "-n", "-M", "prepared", "-h", "127.0.0.1",
               "-p", str(self.port), "-U", "postgres", "-c", str(threads), "-j", str(threads),
               "-T", str(int(max(1, round(seconds)))), f"--random-seed={seed}",
               "-D", f"records={records}", "-l", f"--log-prefix={d / 'log'}", *scripts,
               "postgres"]
        pm = self.server_pids()
        srv0, cli0 = cpu_s(pm, children=True), resource.getrusage(resource.RUSAGE_CHILDREN)
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=d)
        try:  # the backends have exited and the postmaster reaped them (their CPU counts)
            wait_until(lambda: len(self.server_pids()) <= len(pm), 5, interval=0.05)
        except Exception:
            pass  # e.g. an autovacuum worker: its CPU so far is left out
        srv1, cli1 = cpu_s(pm, children=True), resource.getrusage(resource.RUSAGE_CHILDREN)
        if r.returncode != 0:
            errs = [ln for ln in r.stderr.splitlines() if "error" in ln.lower()] or ["?"]
            die(f"pgbench {wl} x{threads} failed (exit {r.returncode}): {errs[0][:300]}")
        m = re.search(r"tps = ([\d.]+) \(without initial connection time\)", r.stdout)
        failed = re.search(r"number of failed transactions: (\d+)", r.stdout)
        lat = []
        for path in glob.glob(str(d / "log.*")):
            with open(path) as f:
                for line in f:
                    parts = line.split()
                    if len(parts) >= 3 and parts[2].isdigit():
                        lat.append(int(parts[2]))
        if not m or not lat:
            die(f"pgbench {wl} x{threads}: no tps or latency log in its output")
        lat.sort()
        cli = (cli1.ru_utime + cli1.ru_stime) - (cli0.ru_utime + cli0.ru_stime)
        return {"ops_s": float(m.group(1)), "p50": pct(lat, 50) / 1000.0,
                "p99": pct(lat, 99) / 1000.0, "errors": int(failed.group(1)) if failed else 0,
                "server_cpu_ms_op": 1000 * (srv1 - srv0) / len(lat),
                "client_cpu_ms_op": 1000 * cli / len(lat)}

    def server_pids(self):
        """The postmaster and its live children (checkpointer, WAL writer ...); exited
        backends count through the postmaster's cutime/cstime (cpu_s children=True)."""
        pm = int((self.data / "postmaster.pid").read_text().split()[0])
        pids = [pm]
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open(f"/proc/{d}/stat") as f:
                        if int(f.read().rsplit(")", 1)[1].split()[1]) == pm:
                            pids.append(int(d))
                except (OSError, ValueError, IndexError):
                    pass
        return pids

    def stop(self):
        if getattr(self, "running", False):
            subprocess.run(self.prefix + [f"{self.bindir}/pg_ctl", "-D", str(self.data), "-m",
                                          "fast", "-w", "stop"], capture_output=True, cwd="/")
            self.running = False


def pct(sorted_vals, p):
    return sorted_vals[min(len(sorted_vals) - 1, (len(sorted_vals) * p) // 100)]


# ---------------------------------------------------------------- loopback round trip

ECHO_SERVER = r"""
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(1)
print("ready", flush=True)
c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while True:
    b = c.recv(64)
    if not b:
        break
    c.sendall(b)
"""


def loopback_echo(seconds):
    """1-byte TCP echo between this process and a Python server process, one at a time."""
    port = free_port()
    srv = subprocess.Popen([sys.executable, "-c", ECHO_SERVER, str(port)],
                           stdout=subprocess.PIPE, text=True)
    try:
        srv.stdout.readline()
        c = socket.create_connection(("127.0.0.1", port))
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        lat = []
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            t0 = time.perf_counter_ns()
            c.sendall(b"x")
            c.recv(64)
            lat.append(time.perf_counter_ns() - t0)
        c.close()
    finally:
        srv.kill()
        srv.wait()
    lat.sort()
    return {"ops_s": len(lat) / seconds, "p50": pct(lat, 50) / 1e6, "p99": pct(lat, 99) / 1e6}


def loopback_redis(tmp, seconds):
    """redis-benchmark PING (inline), 1 client, against a private redis-server; None when
    redis is not installed."""
    if not (shutil.which("redis-server") and shutil.which("redis-benchmark")):
        return None
    port = free_port()
    srv = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                            "--save", "", "--appendonly", "no", "--dir", str(tmp)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def up():
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                return True
            except OSError:
                return False
        wait_until(up, 20, what="redis-server up")
        n = max(2000, int(8000 * seconds))
        r = subprocess.run(["redis-benchmark", "-p", str(port), "-c", "1", "-n", str(n),
                            "-t", "ping_inline", "--csv"], capture_output=True, text=True,
                           timeout=600)
    finally:
        srv.terminate()
        srv.wait()
    # "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95..","p99..","max.."
    for line in r.stdout.splitlines():
        f = [x.strip('"') for x in line.split(",")]
        if f and f[0].startswith("PING") and len(f) >= 7:
            return {"ops_s": float(f[1]), "p50": float(f[4]), "p99": float(f[6])}
    return None


# ---------------------------------------------------------------- stripedb targets

def start_targets(args, tmp, st):
    """[(label, uri, pids)] in table order, starting each cluster; pids: its server
    processes (for CPU per operation)."""
    from proxy_helpers import ProxyCluster, install_filtering
    from replset_bench import start_set

    def new_pids(n0):
        return [p.p.pid for p in st.starter.procs[n0:]]

    targets = []
    d = tmp / "direct"
    d.mkdir()
    port = free_port()
    n0 = len(st.starter.procs)
    st(["--role=shard", f"--listen=127.0.0.1:{port}", f"--data-dir={d}"])
    targets.append(("direct", f"mongodb://127.0.0.1:{port}/?directConnection=true",
                    new_pids(n0)))
    d = tmp / "proxy1"
    d.mkdir()
    n0 = len(st.starter.procs)
    one = ProxyCluster(st, d, shards=1, proxies=1)
    targets.append(("proxy", f"mongodb://127.0.0.1:{one.proxy_ports[0]}/?directConnection=true",
                    new_pids(n0)))
    if args.relay:
        d = tmp / "relay"
        d.mkdir()
        sport, rport = free_port(), free_port()
        n0 = len(st.starter.procs)
        st(["--role=shard", f"--listen=127.0.0.1:{sport}", f"--data-dir={d}"])
        relay = Relay(args.relay, rport, sport, d / "relay.log")
        st.members.append(relay)
        targets.append(("relay", f"mongodb://127.0.0.1:{rport}/?directConnection=true",
                        new_pids(n0) + [relay.p.pid]))
    if args.replset:
        procs, _, uri = start_set(args.bin, tmp, 3, "pgcmp-rs3")
        st.members += procs
        targets.append(("rs3", uri, [m.p.pid for m in procs]))
    if args.scale_out:
        d = tmp / "scale"
        d.mkdir()
        n0 = len(st.starter.procs)
        four = ProxyCluster(st, d, shards=4, proxies=2)
        n = args.records
        four.shard_collection("ycsb.usertable", {"_id": 1},
                              split_points=[{"_id": f"user{n * i // 4:012d}"} for i in (1, 2, 3)])
        install_filtering(four, "ycsb.usertable", {"_id": 1})
        hosts = ",".join(f"127.0.0.1:{p}" for p in four.proxy_ports)
        targets.append(("4x2", f"mongodb://{hosts}/", new_pids(n0)))
    return targets


class Relay:
    """tests/bench/relay_floor on 127.0.0.1:port in front of 127.0.0.1:upstream; stop()."""

    def __init__(self, path, port, upstream, log):
        self.p = subprocess.Popen([path, str(port), "127.0.0.1", str(upstream)],
                                  stdout=subprocess.DEVNULL, stderr=open(log, "w"))

        def up():
            if self.p.poll() is not None:
                raise RuntimeError(f"relay_floor exited with {self.p.returncode}: "
                                   f"{pathlib.Path(log).read_text()[-300:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return True
            except OSError:
                return False
        wait_until(up, 10, what="relay_floor listening")

    def stop(self):
        self.p.kill()
        self.p.wait()


TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pids, children=False):
    """User + system CPU seconds of these processes so far (exited ones count 0); with
    children, plus that of their exited, waited-for children (PostgreSQL's backends)."""
    t = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            t += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
            if children:
                t += int(fields[13]) + int(fields[14])  # cutime, cstime
        except (OSError, IndexError, ValueError):
            pass
    return t / TICK


def stripedb_bench(args, targets, wl, threads, seed, work):
    """One `stripedb bench` invocation over every target; {label: result}. The CPU of each
    target's servers and of the client is sampled from its first status line (the load is
    over, the run has begun) to the start of the next target (or the end): CPU ms/op."""
    out = {}
    jbase = work / f"sdb-{wl}-{threads}.json"
    cmd = [args.client_bin, "bench", "--workload", wl, "--distribution", "uniform",
           "--threads", str(threads), "--records", str(args.records),
           "--seconds", str(args.seconds), "--seed", str(seed), "--no-check",
           "--json", str(jbase)]
    for label, uri, _ in targets:
        cmd += ["--uri", uri, "--label", label]
    outf = work / f"sdb-{wl}-{threads}.out"
    cpu = {}
    with open(outf, "w") as fo:
        pr = subprocess.Popen(cmd, stdout=fo, stderr=subprocess.PIPE, text=True, bufsize=1)
        cur, mark = None, None

        def close(now):
            if cur is not None and mark is not None:
                srv = cpu_s(cur[2]) - mark[1]
                cli = cpu_s([pr.pid]) - mark[2]
                cpu[cur[0]] = (now - mark[0], srv, cli)
        errtail = []
        for line in pr.stderr:
            errtail = (errtail + [line])[-20:]
            now = time.monotonic()
            starting = [t for t in targets if line.startswith(f"{t[0]}: workload ")]
            if starting:
                close(now)
                cur, mark = starting[0], None
            elif line.startswith("[") and cur is not None and mark is None:
                mark = (now, cpu_s(cur[2]), cpu_s([pr.pid]))
        close(time.monotonic())
        pr.wait()
    stdout = outf.read_text()
    with open(outf, "a") as fo:
        fo.write("".join(errtail))
    # the comparison table: label ops ops/s p50 p99 errors (several --uri)
    table = {}
    for line in stdout.split("\ncomparison", 1)[-1].splitlines()[1:]:
        f = line.split()
        if len(f) >= 6:
            table[f[0]] = f
    for i, (label, _, _) in enumerate(targets):
        jp = pathlib.Path(f"{jbase}.{i + 1}" if len(targets) > 1 else jbase)
        if not jp.exists():
            out[label] = None
            continue
        ph = json.loads(jp.read_text())["phases"][0]
        res = {"ops_s": ph["opsPerSec"], "errors": None}
        # the point reads' own percentiles (the JSON's, to the microsecond: the table
        # prints hundredths of a millisecond, coarse against a ~0.05 ms round trip)
        rd = ph.get("latencyMS", {}).get("read")
        if rd:
            res["p50_read"] = rd["p50"]
        if label in table:
            f = table[label]
            res.update(p50=float(f[3]), p99=float(f[4]), errors=int(f[5]))
        else:  # one target: no comparison table; the busiest kind's percentiles
            kinds = sorted(ph.get("latencyMS", {}).values(), key=lambda k: -k.get("n", 0))
            res.update(p50=kinds[0]["p50"] if kinds else 0, p99=kinds[0]["p99"] if kinds else 0)
        if label in cpu and res["ops_s"] > 0:
            secs, srv, cli = cpu[label]
            ops = res["ops_s"] * secs
            res["server_cpu_ms_op"] = 1000 * srv / ops
            res["client_cpu_ms_op"] = 1000 * cli / ops
        out[label] = res
    if pr.returncode != 0 and not all(out.values()):
        print(f"pg_compare: stripedb bench {wl} x{threads} failed for some target "
              f"({outf}, kept with --keep): {''.join(errtail).strip()[-300:]}", file=sys.stderr)
    return out


class Stack:
    """Everything started, stopped in reverse order."""

    def __init__(self, tmp):
        from proxy_bench import Starter
        self.starter = Starter(str(tmp))
        self.members = []

    def __call__(self, *a, **kw):
        return self.starter(*a, **kw)

    def stop(self):
        for m in self.members:
            m.stop()
        self.starter.stop()


# ---------------------------------------------------------------- report

def fmt_row(r):
    def x(v):
        return "" if v is None else f"{v:.2f}x"

    def c(v):
        return "" if v is None else f"{v:.3f}"
    if r.get("failed"):
        return (f"| {r['workload'].upper()} | {r['threads']} | {r['system']} | FAILED "
                f"(`stripedb bench` error above) | | | | | | | |")
    return (f"| {r['workload'].upper()} | {r['threads']} | {r['system']} | "
            f"{r['ops_s']:,.0f} | {r['p50']:.3f} | {r['p99']:.3f} | {x(r.get('x_pg'))} | "
            f"{x(r.get('x_direct'))} | {c(r.get('server_cpu_ms_op'))} | "
            f"{c(r.get('client_cpu_ms_op'))} | {'' if r.get('errors') is None else r['errors']} |")


def goals(rows, loop):
    def get(wl, th, sysname):
        for r in rows:
            if r["workload"] == wl and r["threads"] == th and r["system"] == sysname:
                return r
        return None
    g = []

    def add(name, value, target, ok_if_ge=True):
        if value is None:
            g.append({"goal": name, "value": None, "target": target, "met": None})
        else:
            g.append({"goal": name, "value": round(value, 3), "target": target,
                      "met": value >= target if ok_if_ge else value <= target})
    for wl in ("c", "a"):
        r = get(wl, 16, "direct")
        add(f"shard direct >= 1.0x PostgreSQL on YCSB {wl.upper()}, 16 threads",
            r and r.get("x_pg"), 1.0)
    r = get("a", 16, "rs3")
    add("3-member set >= 0.8x PostgreSQL on YCSB A, 16 threads", r and r.get("x_pg"), 0.8)
    for wl in ("c", "a"):
        r = get(wl, 16, "proxy")
        add(f"proxy >= 0.85x shard direct on YCSB {wl.upper()}, 16 threads",
            r and r.get("x_direct"), 0.85)
    r = get("c", 1, "direct")
    rtt = (loop.get("redis") or loop.get("echo") or {}).get("p50")
    add("1-client point read p50 <= 1.5x loopback round trip p50",
        r.get("p50_read", r["p50"]) / rtt if r and not r.get("failed") and rtt else None, 1.5,
        ok_if_ge=False)
    r = get("a", 64, "4x2")
    add("4 shards / 2 proxies >= 3x shard direct on YCSB A, 64 threads",
        r and r.get("x_direct"), 3.0)
    return g


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.environ.get("STRIPEDB_BIN"),
                    help="the stripedb binary (a release build)")
    ap.add_argument("--client-bin", metavar="PATH",
                    help="the stripedb binary whose `stripedb bench` is the client (default "
                         "--bin; e.g. a --without-tcmalloc build, so that the client keeps "
                         "glibc's malloc, as an application linking libmongoc would)")
    ap.add_argument("--seconds", type=float, default=10, help="per run (default 10)")
    ap.add_argument("--records", type=int, default=50000, help="documents (default 50000)")
    ap.add_argument("--threads", default="1,16", help="client threads, comma-separated")
    ap.add_argument("--with-64", nargs="?", const="c,a,b,e", default="", metavar="WORKLOADS",
                    help="also 64 client threads (on these workloads; default all)")
    ap.add_argument("--workloads", default="c,a,b,e", help="of c,a,b,e (default all)")
    ap.add_argument("--replset", action="store_true", help="also a 3-member shard set")
    ap.add_argument("--scale-out", action="store_true", help="also 4 shards behind 2 proxies")
    ap.add_argument("--relay", metavar="PATH",
                    help="also tests/bench/relay_floor (this binary) in front of a shard")
    ap.add_argument("--loopback-seconds", type=float, default=3)
    ap.add_argument("--seed", type=int, default=19)
    ap.add_argument("--pg-bindir", default=PG_BIN)
    ap.add_argument("--pg-user", default="postgres",
                    help="the user initdb and postgres run as when this runs as root")
    ap.add_argument("--json", help="also write the results as JSON to this file")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (logs, data)")
    args = ap.parse_args()
    if not args.bin or not os.access(args.bin, os.X_OK):
        die("--bin (or STRIPEDB_BIN) must name the stripedb binary")
    args.bin = os.path.abspath(args.bin)
    args.client_bin = os.path.abspath(args.client_bin or args.bin)
    if not os.access(args.client_bin, os.X_OK):
        die("--client-bin must name a stripedb binary")
    if args.relay and not os.access(args.relay, os.X_OK):
        die("--relay must name the relay_floor binary (make tests/bench/relay_floor)")
    os.environ["STRIPEDB_BIN"] = args.bin
    threads = [int(t) for t in args.threads.split(",") if t]
    wls = [w for w in args.workloads.split(",") if w]
    with64 = [w for w in args.with_64.split(",") if w in wls]
    for w in wls + [w for w in args.with_64.split(",") if w]:
        if w not in WORKLOADS:
            die(f"unknown workload {w!r} (c, a, b or e)")

    conftest.BIN = args.bin  # what proxy_bench.Starter and ProxyCluster start

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="pg_compare."))
    work = tmp / "work"
    work.mkdir()
    pg = st = None
    t_start = time.monotonic()
    rows, loop = [], {}
    try:
        pg = Postgres(tmp, args.pg_bindir, args.pg_user, max(threads + [64] * bool(with64)))
        print(f"postgres {pg.settings['server_version']} on 127.0.0.1:{pg.port} "
              f"fsync={pg.settings['fsync']} synchronous_commit="
              f"{pg.settings['synchronous_commit']}", flush=True)
        load_s = pg.load(args.records)
        print(f"postgres: loaded {args.records} documents in {load_s:.1f} s", flush=True)
        st = Stack(tmp)
        targets = start_targets(args, tmp, st)
        print("stripedb: " + ", ".join(f"{lbl}={uri}" for lbl, uri, _ in targets), flush=True)

        loop["echo"] = loopback_echo(args.loopback_seconds)
        loop["redis"] = loopback_redis(tmp, args.loopback_seconds)
        for k, v in loop.items():
            if v:
                print(f"loopback {k}: {v['ops_s']:,.0f} round trips/s p50 {v['p50']:.3f} ms "
                      f"p99 {v['p99']:.3f} ms", flush=True)

        for wl in wls:
            for th in threads + ([64] if wl in with64 and 64 not in threads else []):
                seed = args.seed * 1000 + th
                p = pg.bench(wl, th, args.seconds, args.records, seed, work)
                rows.append({"workload": wl, "threads": th, "system": "pg", **p, "x_pg": 1.0})
                print(fmt_row(rows[-1]), flush=True)
                res = stripedb_bench(args, targets, wl, th, seed, work)
                direct = res.get("direct")
                for label, _, _ in targets:
                    r = res.get(label)
                    if r is None:
                        rows.append({"workload": wl, "threads": th, "system": label,
                                     "ops_s": 0.0, "p50": 0.0, "p99": 0.0, "errors": None,
                                     "failed": True})
                        continue
                    row = {"workload": wl, "threads": th, "system": label, **r,
                           "x_pg": r["ops_s"] / p["ops_s"] if p["ops_s"] else None}
                    if label != "direct" and direct:
                        row["x_direct"] = r["ops_s"] / direct["ops_s"]
                    rows.append(row)
                    print(fmt_row(row), flush=True)
    finally:
        if st:
            st.stop()
        if pg:
            pg.stop()
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    print("\nworkloads: " + "; ".join(f"{w.upper()} {WORKLOADS[w]}" for w in wls) +
          f"; {args.records} documents of 10 x 100 bytes, uniform keys, "
          f"{args.seconds:g} s per run; total {time.monotonic() - t_start:.0f} s\n")
    print("| workload | threads | system | ops/s | p50 ms | p99 ms | x PostgreSQL | x direct "
          "| server CPU ms/op | client CPU ms/op | errors |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(fmt_row(r))
    for k, v in loop.items():
        if v:
            name = "redis-benchmark PING" if k == "redis" else "1-byte TCP echo (Python)"
            print(f"| loopback round trip | 1 | {name} | {v['ops_s']:,.0f} | {v['p50']:.3f} "
                  f"| {v['p99']:.3f} | | | | | |")
    gl = goals(rows, loop)
    print()
    for g in gl:
        state = "n/a (not measured)" if g["met"] is None else ("MET" if g["met"] else "NOT MET")
        val = "-" if g["value"] is None else f"{g['value']:.2f}"
        print(f"goal: {g['goal']}: {val} (target {g['target']}) {state}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "nproc": os.cpu_count(), "records": args.records,
                       "seconds": args.seconds, "threads": threads, "workloads": wls,
                       "with_64": with64,
                       "postgres": pg.settings if pg else None, "rows": rows,
                       "loopback": loop, "goals": gl}, f, indent=1)


if __name__ == "__main__":
    main()
