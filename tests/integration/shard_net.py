"""Shard replica sets whose members each run in their own network namespace (issue #15,
"a member cut off and restored; a minority side refuses writes").

    net = ShardNet(tmp_path, n_hosts=3)        # namespaces on one bridge
    rs = net.replset("rs-a", hosts=[1, 2, 3])  # a 3-member set, one member per namespace
    rs.uri                                     # mongodb://10.215.N.1:27017,.../?replicaSet=rs-a
    net.cut(1) / net.restore(1)                # the host's veth down/up: h1 loses everyone
    net.partition([1], [2, 3]) / net.heal()    # blackhole routes between the two sides only

Each namespace is joined to a bridge that holds 10.215.N.254 in the root namespace, so the
test (and any proxy or metadata process it starts in the root namespace) reaches every member
by its own address. `cut` sets the host end of the member's veth down: the member loses every
peer and every client. `partition` adds `blackhole` routes inside the namespaces of each side
for the addresses of the other side: packets between the sides are dropped silently (as a
switch failure would), while the root namespace still reaches both sides, so a test can send
writes to the minority and see them refused. No iptables is needed (there is none on the CI
image): routes and link state are enough.

Needs root and `ip netns`: `skip_reason()` says why not. Every process is started by this
module in its namespace with `ip netns exec`, which execs the binary in place (the pid is
the stripedb process itself, so SIGKILL/SIGSTOP reach it); teardown kills what is left in
the namespaces and deletes them.
"""
import os
import signal
import subprocess

import pymongo
from pymongo.errors import ConnectionFailure, OperationFailure

from conftest import BIN, SANITIZER_REPORT, Proc, wait_until
from netns import BridgeNet, skip_reason  # noqa: F401 - skip_reason: re-exported for the tests

WIRE, RAFT, HTTP = 27017, 27018, 9102


class NsProc(Proc):
    """A stripedb process inside a namespace; /healthz is reached over the bridge."""

    def __init__(self, args, log_path, ns, addr):
        self.ns, self.addr = ns, addr
        super().__init__(args, log_path, HTTP)

    def start(self):
        self.log = open(self.log_path, "ab")
        env = dict(os.environ)
        env.setdefault("STRIPEDB_CONFIG", "/dev/null")
        # `ip netns exec` execs the binary in place (no fork): the pid is stripedb's own
        self.p = subprocess.Popen(["ip", "netns", "exec", self.ns, BIN] + self.args,
                                  stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                  start_new_session=True)

    def wait_healthy(self, timeout=30.0):
        import urllib.request

        def ok():
            if self.p.poll() is not None:
                raise RuntimeError(f"stripedb exited with {self.p.returncode}: {self.tail()}")
            with urllib.request.urlopen(f"http://{self.addr}:{HTTP}/healthz", timeout=1) as r:
                return r.status == 200
        wait_until(ok, timeout, what=f"/healthz of {self.addr}")
        return self


class ReplSet:
    """One shard replica set, member i on host hosts[i] (wire 27017, raft 27018)."""

    def __init__(self, net, name, hosts, extra=()):
        self.net, self.name, self.hosts = net, name, list(hosts)
        self.addrs = [net.addr(h) for h in self.hosts]
        members = ",".join(f"{i + 1}@{a}:{RAFT}" for i, a in enumerate(self.addrs))
        self.procs = []
        for i, (h, a) in enumerate(zip(self.hosts, self.addrs)):
            args = ["--role=shard", f"--replica-set={name}", f"--node-id={i + 1}",
                    f"--data-dir={net.tmp / f'{name}-m{i + 1}'}", f"--listen={a}:{WIRE}",
                    f"--raft-listen={a}:{RAFT}", f"--bootstrap-members={members}",
                    f"--http-listen={a}:{HTTP}", "--raft-tls=disabled",
                    "--raft-election-timeout-ms=500", "--shutdown-quiesce-ms=0", *extra]
            p = NsProc(args, str(net.tmp / f"{name}-m{i + 1}.log"), net.ns[h], a)
            net.procs.append(p)
            self.procs.append(p)
        self.wires = [f"{a}:{WIRE}" for a in self.addrs]
        self.uri = f"mongodb://{','.join(self.wires)}/?replicaSet={name}"
        wait_until(lambda: self._listed(), 30, interval=0.1, what=f"{name}: every member in hello")

    def direct(self, i, **kw):
        opts = dict(serverSelectionTimeoutMS=2000, connectTimeoutMS=1000, socketTimeoutMS=4000)
        opts.update(kw)
        return pymongo.MongoClient(f"mongodb://{self.wires[i]}/?directConnection=true", **opts)

    def hello(self, i):
        with self.direct(i) as c:
            return c.admin.command("hello")

    def primary(self):
        """Index of a member that says it is the writable primary (None if none does)."""
        for i in range(len(self.wires)):
            try:
                if self.hello(i).get("isWritablePrimary"):
                    return i
            except (ConnectionFailure, OperationFailure):
                continue
        return None

    def _listed(self):
        i = self.primary()
        return i is not None and len(self.hello(i)["hosts"]) == len(self.wires)

    def wait_primary(self, exclude=(), timeout=30):
        def ok():
            for i in range(len(self.wires)):
                if i in exclude:
                    continue
                try:
                    if self.hello(i).get("isWritablePrimary"):
                        return i + 1
                except (ConnectionFailure, OperationFailure):
                    continue
            return None
        return wait_until(ok, timeout, interval=0.05, what=f"{self.name}: a primary") - 1

    def state(self, i, db, coll):
        """(documents sorted by _id, oplog (ts, op, ns, o2, o._id)) of member i; its
        stripedbCheck must find no problem."""
        with self.direct(i, socketTimeoutMS=20000) as c:
            docs = list(c[db][coll].find({}, sort=[("_id", 1)]))
            oplog = [(e["ts"], e["op"], e["ns"], e.get("o2"), e["o"].get("_id"))
                     for e in c.local["oplog.rs"].find({"ns": f"{db}.{coll}"})]
            check = c.admin.command("stripedbCheck")
            assert check["nProblems"] == 0, check
        return docs, oplog

    def converged(self, db, coll, timeout=60):
        """Wait until every member holds the same documents and oplog; return them."""
        last = []

        def same():
            states = [self.state(i, db, coll) for i in range(len(self.wires))]
            last[:] = states
            return all(s == states[0] for s in states[1:]) and states[0]
        try:
            return wait_until(same, timeout, interval=0.2, what=f"{self.name} converged")
        except TimeoutError:
            desc = [f"member {i}: {len(d)} documents, {len(o)} oplog entries"
                    for i, (d, o) in enumerate(last)]
            raise AssertionError(f"{self.name}: members did not converge: {desc}")


class ShardNet(BridgeNet):
    """n_hosts namespaces h1..hn on a bridge (netns.BridgeNet); the root namespace has .254."""

    def __init__(self, tmp, n_hosts):
        super().__init__(tmp, n_hosts, f"10.215.{os.getpid() % 250}", "rv")
        self.procs = []

    def replset(self, name, hosts, extra=()):
        return ReplSet(self, name, hosts, extra)

    def logs(self, n=3000):
        return "\n".join(f"--- {' '.join(p.args[:3])} ---\n{p.tail(n)}" for p in self.procs)

    def down(self):
        """Stop every member gracefully, then remove the namespaces. Returns the problems
        found: a member that did not exit 0 on SIGTERM, or a sanitizer report in a log."""
        problems = []
        for p in self.procs:
            try:
                p.signal(signal.SIGCONT)  # a member left paused would never see SIGTERM
                code = p.stop(timeout=20)
                log = p.tail(1 << 20)
                if SANITIZER_REPORT.search(log):
                    problems.append(f"{p.log_path}: sanitizer report:\n{log[-4000:]}")
                elif code != 0:
                    problems.append(f"{p.log_path}: exit code {code} on SIGTERM:\n{log[-2000:]}")
            except Exception as e:  # noqa: BLE001 - teardown goes on
                problems.append(f"{p.log_path}: {e!r}")
        self.kill_all()
        self.remove()
        return problems
