"""`stripedb ctl cluster bootstrap` (issue #11) across five "VMs": network namespaces on this
machine, each with its own address on a bridge and its own sshd, each running stripedb as it
would on a VM (launcher = direct: the namespaces have no systemd).

    h1  10.213.N.1  metadata                    (the member the partition cuts off)
    h2  10.213.N.2  metadata, proxy, ratelimit
    h3  10.213.N.3  metadata, proxy, coordinator
    h4  10.213.N.4  shard (shard-h4)
    h5  10.213.N.5  shard (shard-h5)

The bootstrap runs from the root namespace (the bridge has 10.213.N.254) over SSH with a key
made for the test. Checked: a first run killed midway (once the metadata group is up) is finished by the next
run, which leaves the running members alone; the cluster key of the spec reaches every host
(mode 0600) and every role uses it; a further run is a no-op (same pids);
a role killed with SIGKILL comes back on the next run and nothing else restarts, as does a
role whose pid file names a live stripedb of another role (a reused pid); with one host
unreachable (its sshd stopped) the run still repairs the others and names it; the YCSB
workload of `stripedb bench` runs through both proxies against a collection sharded over both
shards while h1 is cut off the network (its veth is set down on the host side: it loses every
peer, the metadata group keeps its quorum of two, a metadata write commits without it) and then
restored; h1 catches up (same last applied index and state hash as the leader), the checker
finds every acknowledged write in the final state, and every role is healthy. A shard whose
address in the spec changed fails the run (and status) with one line naming both addresses.
Last, a role that cannot start (its port taken) fails the run with one stderr line naming the
host and role.

Needs root, `ip netns`, sshd and ssh; skipped otherwise. Each host has its own data dir under
the test's tmp dir (the namespaces share the filesystem). Teardown kills every process left in
the namespaces and deletes them and the bridge.
"""
import json
import os
import re
import signal
import subprocess
import urllib.request

import pytest

from conftest import BIN, SRCDIR, free_port, wait_until
from netns import BridgeNet, sh, skip_reason

SSHD = "/usr/sbin/sshd"


_SKIP = skip_reason(tools=("ip", "ssh", "ssh-keygen"), files=((SSHD, "openssh-server"),))
needs_netns = pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")

N_HOSTS = 5
ROLES = {1: ["metadata"], 2: ["metadata", "proxy", "ratelimit"],
         3: ["metadata", "proxy", "coordinator"], 4: ["shard"], 5: ["shard"]}
HTTP = {"metadata": 9101, "shard": 9102, "proxy": 9103, "coordinator": 9104, "ratelimit": 9105}


class Net(BridgeNet):
    """Five namespaces on a bridge (netns.BridgeNet), an sshd in each."""

    def __init__(self, tmp):
        super().__init__(tmp, N_HOSTS, f"10.213.{os.getpid() % 250}", "sv")
        self.sshd = {}

    def up(self):
        super().up()
        # ssh: a host key and a client key made for this test, root by key only
        ssh = self.tmp / "ssh"
        ssh.mkdir()
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ssh / "host_key"))
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ssh / "client_key"))
        (ssh / "authorized_keys").write_text((ssh / "client_key.pub").read_text())
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory
        for i in self.ns:
            self.start_sshd(i)
        for i in self.ns:
            wait_until(lambda i=i: self.ssh(i, "true").returncode == 0, 20,
                       what=f"sshd on h{i}")

    def start_sshd(self, i):
        ssh = self.tmp / "ssh"
        cfg = ssh / f"sshd_h{i}.conf"
        cfg.write_text(
            f"ListenAddress {self.addr(i)}\nPort 22\nHostKey {ssh / 'host_key'}\n"
            f"PidFile {ssh / f'sshd_h{i}.pid'}\nAuthorizedKeysFile {ssh / 'authorized_keys'}\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
            "PubkeyAuthentication yes\nX11Forwarding no\nPrintMotd no\n")
        log = open(self.tmp / f"sshd_h{i}.log", "ab")
        self.sshd[i] = subprocess.Popen(["ip", "netns", "exec", self.ns[i], SSHD, "-D", "-e",
                                         "-f", str(cfg)], stdout=log, stderr=log)
        log.close()

    def stop_sshd(self, i):
        self.sshd[i].terminate()
        self.sshd[i].wait(timeout=10)

    def ssh(self, i, cmd):
        return subprocess.run(["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                               "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
                               "-i", str(self.tmp / "ssh" / "client_key"), f"root@{self.addr(i)}",
                               cmd], capture_output=True, text=True, timeout=20)

    def down(self):
        self.kill_all()  # sshd and the roles
        for p in self.sshd.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.remove()


@pytest.fixture
def net(tmp_path):
    n = Net(tmp_path)
    try:
        n.up()
        yield n
    finally:
        n.down()


KEY = "c3RyaXBlZGItbXVsdGlob3N0LXRlc3Qta2V5"


def write_spec(net, tmp):
    key = tmp / "cluster.key"
    key.write_text(KEY + "\n")
    key.chmod(0o600)
    # the workload below runs without users: proxies of a keyed cluster would ask for them
    lines = ["[cluster]", f"cluster-key-file = {key}", "auth = disabled", "ssh-user = root", f"ssh-identity = {tmp / 'ssh' / 'client_key'}",
             "ssh-option = StrictHostKeyChecking=no", "ssh-option = UserKnownHostsFile=/dev/null",
             "ssh-option = LogLevel=ERROR", f"binary = {os.path.abspath(BIN)}",
             "launcher = direct", "timeout-ms = 60000", ""]
    for i in range(1, N_HOSTS + 1):
        lines += [f"[h{i}]", f"address = {net.addr(i)}", f"roles = {', '.join(ROLES[i])}",
                  f"data-dir = {tmp / f'h{i}'}", ""]
    spec = tmp / "cluster.conf"
    spec.write_text("\n".join(lines))
    return spec


def bootstrap(spec, sub="bootstrap"):
    return subprocess.run([BIN, "ctl", "cluster", sub, "--spec", str(spec)], capture_output=True,
                          text=True, timeout=240)


def healthy(net, i, role):
    try:
        with urllib.request.urlopen(f"http://{net.addr(i)}:{HTTP[role]}/healthz", timeout=2) as r:
            return r.status == 200
    except Exception:  # noqa: BLE001 - down or unreachable
        return False


def pids(tmp):
    out = {}
    for i in range(1, N_HOSTS + 1):
        for role in ROLES[i]:
            out[(i, role)] = int((tmp / f"h{i}" / "run" / f"{role}.pid").read_text())
    return out


def logs(tmp):
    text = []
    for i in range(1, N_HOSTS + 1):
        d = tmp / f"h{i}" / "logs"
        for f in sorted(d.glob("*.log")) if d.exists() else []:
            text.append(f"--- h{i}/{f.name} (tail)\n" + "\n".join(f.read_text(errors="replace")
                                                               .splitlines()[-15:]))
    return "\n".join(text)


@needs_netns
@pytest.mark.timeout(1200)  # five network namespaces with sshd, waits of up to 240 s
def test_bootstrap_five_hosts_workload_partition(net, tmp_path):
    pymongo = pytest.importorskip("pymongo")
    spec = write_spec(net, tmp_path)

    # 1. from bare hosts: a first run interrupted (SIGKILL, with its ssh children) once the
    # metadata group is up; the next run finishes the job and leaves the members alone
    first_run = subprocess.Popen([BIN, "ctl", "cluster", "bootstrap", "--spec", str(spec)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 start_new_session=True)
    try:
        wait_until(lambda: all(healthy(net, i, "metadata") for i in (1, 2, 3)), 90,
                   what="the metadata members up")
    finally:
        try:
            os.killpg(first_run.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        first_run.communicate()
    meta_pids = {i: (tmp_path / f"h{i}" / "run" / "metadata.pid").read_text() for i in (1, 2, 3)}
    r = bootstrap(spec)
    assert r.returncode == 0, r.stdout + r.stderr + logs(tmp_path)
    assert "cluster complete" in r.stdout, r.stdout
    for i in (1, 2, 3):
        assert re.search(rf"^h{i} +metadata +already healthy$", r.stdout, re.M), r.stdout
        assert (tmp_path / f"h{i}" / "run" / "metadata.pid").read_text() == meta_pids[i]
    for i in range(1, N_HOSTS + 1):
        for role in ROLES[i]:
            assert healthy(net, i, role), (i, role)
    assert "shard-h4" in r.stdout and "shard-h5" in r.stdout
    # the cluster key went to every host (mode 0600) and every role uses it: metadata
    # refuses a client that is not a cluster member
    for i in range(1, N_HOSTS + 1):
        assert (tmp_path / f"h{i}" / "cluster.key").read_text() == KEY + "\n"
        assert (tmp_path / f"h{i}" / "cluster.key").stat().st_mode & 0o777 == 0o600
        assert f"cluster-key-file = {tmp_path / f'h{i}' / 'cluster.key'}" in \
            (tmp_path / f"h{i}" / "stripedb.conf").read_text().splitlines()
    meta = ",".join(f"{net.addr(i)}:27019" for i in (1, 2, 3))
    member = dict(username="__system", password=KEY, authSource="admin",
                  authMechanism="SCRAM-SHA-256")
    anon = pymongo.MongoClient(f"mongodb://{net.addr(1)}:27019/?directConnection=true",
                               serverSelectionTimeoutMS=5000)
    with pytest.raises(pymongo.errors.OperationFailure):
        anon.admin.command("listShards")
    anon.close()
    m = pymongo.MongoClient(f"mongodb://{meta}/?replicaSet=stripedb-meta",
                            serverSelectionTimeoutMS=20000, **member)
    assert sorted(s["id"] for s in m.admin.command("listShards")["shards"]) == \
        ["shard-h4", "shard-h5"]
    first = pids(tmp_path)

    # 2. a second run changes nothing
    r = bootstrap(spec)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("already healthy") == 9, r.stdout
    assert r.stdout.count("already registered") == 2, r.stdout
    assert pids(tmp_path) == first

    # 3. a role killed with SIGKILL comes back on the next run, nothing else restarts; so
    # does one whose pid file names a live stripedb of another role (a reused pid)
    os.kill(first[(5, "shard")], signal.SIGKILL)
    os.kill(first[(3, "proxy")], signal.SIGKILL)
    wait_until(lambda: not healthy(net, 5, "shard"), 20, what="h5's shard down")
    wait_until(lambda: not healthy(net, 3, "proxy"), 20, what="h3's proxy down")
    (tmp_path / "h3" / "run" / "proxy.pid").write_text(f"{first[(3, 'metadata')]}\n")
    r = bootstrap(spec)
    assert r.returncode == 0, r.stdout + r.stderr + logs(tmp_path)
    assert r.stdout.count("already healthy") == 7, r.stdout
    assert re.search(r"^h3 +proxy +started \(pid \d+\)$", r.stdout, re.M), r.stdout
    again = pids(tmp_path)
    restarted = [(5, "shard"), (3, "proxy")]
    for k in restarted:
        assert again[k] != first[k]
    assert again[(3, "proxy")] != first[(3, "metadata")]
    assert {k: v for k, v in again.items() if k not in restarted} == \
        {k: v for k, v in first.items() if k not in restarted}
    assert healthy(net, 5, "shard") and healthy(net, 3, "proxy")

    # 3b. one host unreachable (h5's sshd stopped) does not block the repair of the others:
    # h2's killed proxy comes back, h5 is named on the one stderr line, exit 1
    os.kill(again[(2, "proxy")], signal.SIGKILL)
    wait_until(lambda: not healthy(net, 2, "proxy"), 20, what="h2's proxy down")
    net.stop_sshd(5)
    try:
        r = bootstrap(spec)
    finally:
        net.start_sshd(5)
    assert r.returncode == 1, r.stdout + r.stderr + logs(tmp_path)
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(
        f"stripedb ctl cluster bootstrap: host h5 ({net.addr(5)}) writing the config: "), r.stderr
    assert re.search(r"^h5 +shard +skipped \(the host failed\)$", r.stdout, re.M), r.stdout
    assert re.search(r"^h2 +proxy +started \(pid \d+\)$", r.stdout, re.M), r.stdout
    assert "cluster incomplete: 1 host failed" in r.stdout and "cluster complete" not in r.stdout
    assert healthy(net, 2, "proxy")
    repaired = pids(tmp_path)
    assert repaired[(2, "proxy")] != again[(2, "proxy")]
    assert {k: v for k, v in repaired.items() if k != (2, "proxy")} == \
        {k: v for k, v in again.items() if k != (2, "proxy")}
    again = repaired
    wait_until(lambda: net.ssh(5, "true").returncode == 0, 20, what="sshd on h5 again")

    # the workload's collection, sharded over both shards
    m.admin.command("createDatabase", "ycsb")
    m.admin.command("shardCollection", "ycsb.usertable", key={"_id": 1},
                    splitPoints=[{"_id": "user000000000150"}], shards=["shard-h4", "shard-h5"])

    # h1 must hold a follower: hand the leadership away from it if it leads
    def status(i):
        c = pymongo.MongoClient(f"mongodb://{net.addr(i)}:27019/?directConnection=true",
                                serverSelectionTimeoutMS=2000, **member)
        try:
            return c.admin.command("metadataStatus")
        finally:
            c.close()

    if status(1)["state"] == "leader":
        t = subprocess.run([BIN, "ctl", f"--metadata={meta}",
                            f"--cluster-key-file={tmp_path / 'cluster.key'}", "metadata",
                            "transfer", "2"],
                           capture_output=True, text=True, timeout=60)
        assert t.returncode == 0, t.stderr
    wait_until(lambda: status(1)["state"] == "follower" and status(1)["leaderId"] in (2, 3), 30,
               what="h1 a follower")

    # 4. the workload through both proxies; h1 cut off while it runs
    proxies = f"{net.addr(2)}:27017,{net.addr(3)}:27017"
    report = tmp_path / "bench.json"
    bench = subprocess.Popen(
        [BIN, "bench", "--uri", f"mongodb://{proxies}/", "--workload", "a", "--records", "300",
         "--threads", "2", "--seconds", "10", "--json", str(report), "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, STRIPEDB_CONFIG="/dev/null"))
    try:
        px = pymongo.MongoClient(f"mongodb://{proxies}/", serverSelectionTimeoutMS=20000)
        wait_until(lambda: px.ycsb.usertable.count_documents({}) == 300, 60,
                   what="the 300 records loaded")
        net.cut(1)
        wait_until(lambda: not healthy(net, 1, "metadata"), 10, what="h1 unreachable")
        # a metadata write commits on the two members left; h1 misses it
        wait_until(lambda: m.admin.command("createTenant", "partitioned")["ok"] == 1, 30,
                   what="createTenant without h1")
        leader = 2 if status(2)["state"] == "leader" else 3
        assert status(leader)["state"] == "leader"
        assert not healthy(net, 1, "metadata")
        net.restore(1)

        def caught_up():
            a, b = status(1), status(leader)
            return (a["state"] == "follower" and a["lastApplied"] == b["lastApplied"]
                    and a["stateHash"] == b["stateHash"])
        wait_until(caught_up, 30, what="h1 caught up with the leader")
        out, err = bench.communicate(timeout=120)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    assert bench.returncode == 0, out + err
    assert "checker: OK: 300 keys" in out, out + err
    rep = json.loads(report.read_text())
    assert rep["check"]["ok"] is True and rep["check"]["violations"] == 0
    assert rep["check"]["docs"] == 300
    # a metadata follower away changes nothing for the clients
    assert rep["phases"][0]["errors"] == {"quota_462": 0, "duplicate_key": 0, "network": 0,
                                          "routing": 0, "timeout": 0, "other": 0}
    assert rep["phases"][0]["ops"] > 0
    assert "partitioned" in [t["name"] for t in m.admin.command("listTenants")["tenants"]]

    # 5. every role healthy, as `ctl cluster status` sees it
    r = bootstrap(spec, "status")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("healthy") == 9 and "(leader)" in r.stdout, r.stdout
    r = subprocess.run([BIN, "ctl", "cluster", "status", "--spec", str(spec), "--json"],
                       capture_output=True, text=True, timeout=60)
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert sorted((row["host"], row["role"]) for row in rows) == \
        sorted((f"h{i}", role) for i in ROLES for role in ROLES[i])
    assert all(row["healthy"] for row in rows)
    assert len([row for row in rows if row["leader"]]) == 1

    # 6. a shard registered at another address than the spec's (its shard-port changed):
    # bootstrap does not move it; exit 1 with one stderr line naming both addresses, and
    # status flags it too. Nothing restarts (h5's running shard is healthy).
    moved = tmp_path / "moved.conf"
    moved.write_text(spec.read_text().replace(f"data-dir = {tmp_path / 'h5'}\n",
                                              f"data-dir = {tmp_path / 'h5'}\nshard-port = 27028\n"))
    # shard-h5 is a one-member replica set (issue #15): registered by its replica-set URI
    old_uri = f"mongodb://{net.addr(5)}:27018/?replicaSet=shard-h5"
    new_uri = f"mongodb://{net.addr(5)}:27028/?replicaSet=shard-h5"
    what = (f"host h5 ({net.addr(5)}) addShard: shard shard-h5 is registered at {old_uri} but "
            f"the spec says {new_uri} (bootstrap does not move a registered shard: put the old "
            "address back in the spec, or move the shard by hand)\n")
    r = bootstrap(moved)
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stderr == "stripedb ctl cluster bootstrap: " + what, r.stderr
    assert "cluster complete" not in r.stdout
    r = bootstrap(moved, "status")
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stderr == ("stripedb ctl cluster status: "
                        + what.replace(" addShard:", ":")), r.stderr
    assert pids(tmp_path) == again

    # 7. a role that cannot start (a proxy on h4 whose HTTP port sshd holds): exit 1 and
    # one stderr line naming the host and the role; the rest of the cluster is untouched
    bad = tmp_path / "bad.conf"
    bad.write_text(spec.read_text().replace("timeout-ms = 60000", "timeout-ms = 3000")
                   .replace(f"address = {net.addr(4)}\nroles = shard\n",
                            f"address = {net.addr(4)}\nroles = shard, proxy\n"
                            "proxy-http-port = 22\n"))
    r = bootstrap(bad)
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stderr == (f"stripedb ctl cluster bootstrap: host h4 ({net.addr(4)}) role proxy: no "
                        f"healthy /healthz on port 22 after 3 s (see {tmp_path / 'h4'}/logs/"
                        "proxy.log)\n"), r.stderr
    assert (tmp_path / "h4" / "logs" / "proxy.log").exists()
    # metadata x3, shards of h4 and h5, h2's ratelimit, proxies of h2 and h3
    assert r.stdout.count("already healthy") == 8, r.stdout
    assert pids(tmp_path) == again
    m.close()
    px.close()


def _cluster(*args):
    return subprocess.run([BIN, "ctl", "cluster", *args], capture_output=True, text=True,
                          timeout=60)


def test_example_spec_config_per_host():
    """The shipped example parses; `cluster config` prints what bootstrap writes on a host."""
    example = os.path.join(SRCDIR, "packaging", "cluster.conf.example")
    r = _cluster("config", "--spec", example, "db2")
    assert r.returncode == 0, r.stderr
    body = [l for l in r.stdout.splitlines() if l and not l.startswith("#")]
    assert body == [
        "log-level = info", "metadata = 10.0.0.1:27019,10.0.0.2:27019,10.0.0.3:27019",
        "[metadata]", "node-id = 2", "data-dir = /var/lib/stripedb/metadata",
        "listen = 10.0.0.2:27019", "raft-listen = 10.0.0.2:27029", "http-listen = 10.0.0.2:9101",
        "bootstrap-members = 1@10.0.0.1:27029,2@10.0.0.2:27029,3@10.0.0.3:27029",
        "[proxy]", "node-id = proxy-db2", "listen = 10.0.0.2:27017",
        "http-listen = 10.0.0.2:9103", "grpc-listen = 10.0.0.2:1052"]
    r = _cluster("config", "--spec", example, "db4")
    # db1, db4 and db5 share shard-name shard-a: one 3-member replica set (issue #15)
    assert ("[shard]\nreplica-set = shard-a\nnode-id = 2\ndata-dir = /var/lib/stripedb/shard\n"
            "listen = 10.0.0.4:27018\nraft-listen = 10.0.0.4:27039\nhttp-listen = 10.0.0.4:9102\n"
            "bootstrap-members = 1@10.0.0.1:27039,2@10.0.0.4:27039,3@10.0.0.5:27039\n") in r.stdout
    r = _cluster("config", "--spec", example, "nosuch")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no host [nosuch]" in r.stderr


HOST_OK = "[h1]\naddress = 127.0.0.1\nroles = metadata\n"


@pytest.mark.parametrize("spec,message", [
    ("[cluster]\nlauncher = docker\n" + HOST_OK, ":2: launcher: 'docker' is not systemd or direct"),
    ("[h1]\naddress = 127.0.0.1\nroles = metadata, mongos\n", "unknown role 'mongos'"),
    ("[h1]\naddress = -oProxyCommand=touch\nroles = metadata\n", "is not a host name"),
    (HOST_OK + "data-dir = /tmp/x;reboot\n", "data-dir: '/tmp/x;reboot' is not an absolute path"),
    (HOST_OK + "data-dir = /tmp/../etc\n", "is not an absolute path"),
    ("[cluster]\nbinary = /usr/bin/stripedb $(id)\n" + HOST_OK, "binary:"),
    ("[cluster]\nssh-option = -oProxyCommand\n" + HOST_OK, "is not KEY=VALUE"),
    ("[h1]\naddress = 127.0.0.1\nroles = shard\n", "no host has the metadata role"),
    ("[h1]\naddress = 127.0.0.1\n", "host [h1] needs address and roles"),
    (HOST_OK + "metadata-id = 2\n[h2]\naddress = 127.0.0.2\nroles = metadata\nmetadata-id = 2\n",
     "hosts [h1] and [h2] have metadata-id 2"),
    ("[h$1]\naddress = 127.0.0.1\nroles = metadata\n", "host section [h$1]"),
    (HOST_OK + "proxy-port = 70000\n", "proxy-port: '70000' is not a port"),
    ("[cluster\n" + HOST_OK, "syntax error"),
    ("", "no host section"),
    # every listener of a host on its own port, whichever key (or default) set it
    ("[h3]\naddress = 10.0.0.3\nroles = metadata, proxy\nproxy-port = 27019\n",
     ":4: host h3: port 27019 used twice (metadata-port, proxy-port)\n"),
    ("[cluster]\nproxy-http-port = 9101\n[h3]\naddress = 10.0.0.3\nroles = proxy, metadata\n",
     ":2: host h3: port 9101 used twice (metadata-http-port, proxy-http-port)\n"),
    ("[h1]\naddress = 10.0.0.1\nroles = shard, metadata, ratelimit\nraft-port = 1051\n",
     ":4: host h1: port 1051 used twice (raft-port, ratelimit-port)\n"),
    (HOST_OK + "[h2]\naddress = 127.0.0.1\nroles = shard\n",
     ":5: hosts [h1] and [h2] have address 127.0.0.1 (one section per host"),
    # issue #15: hosts sharing a shard-name form one replica set of 1, 3 or 5 members
    (HOST_OK + "[h2]\naddress = 10.0.0.2\nroles = shard\nshard-name = s\n"
     "[h3]\naddress = 10.0.0.3\nroles = shard\nshard-name = s\n",
     "shard s has 2 members (hosts with that shard-name): a replica set has 1, 3 or 5"),
    (HOST_OK + "".join(f"[h{i}]\naddress = 10.0.0.{i}\nroles = shard\nshard-name = s\n"
                       f"shard-member-id = {1 if i < 4 else i}\n" for i in (2, 3, 4)),
     "hosts [h2] and [h3] of shard s have shard-member-id 1"),
    (HOST_OK + "[h2]\naddress = 10.0.0.2\nroles = shard\nshard-member-id = 0\n",
     "shard-member-id: '0' is not a positive integer"),
    ("[h1]\naddress = 10.0.0.1\nroles = shard, metadata\nshard-raft-port = 27029\n",
     ":4: host h1: port 27029 used twice (raft-port, shard-raft-port)\n"),
])
def test_bad_spec_is_one_line_exit_2(tmp_path, spec, message):
    f = tmp_path / "bad.conf"
    f.write_text(spec)
    r = _cluster("bootstrap", "--spec", str(f))
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout == ""
    assert r.stderr.count("\n") == 1 and message in r.stderr, r.stderr


def test_duplicate_port_of_unused_role_is_fine(tmp_path):
    """Only the roles a host runs count: a proxy port equal to the metadata port of a host
    without the proxy role is no conflict."""
    f = tmp_path / "c.conf"
    f.write_text("[cluster]\nproxy-port = 27019\n" + HOST_OK)
    r = _cluster("config", "--spec", str(f), "h1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("27019") == 2  # metadata = ..., listen = ...


@pytest.mark.parametrize("args", [["--help"], ["-h"], ["help"], ["bootstrap", "--help"],
                                  ["status", "--spec", "/nonexistent", "--help"],
                                  ["config", "-h"]])
def test_help_is_usage_on_stdout_exit_0(args):
    r = _cluster(*args)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert r.stdout.startswith("usage: stripedb ctl cluster bootstrap --spec FILE [--verbose]\n")
    assert "stripedb ctl cluster status --spec FILE [--json]\n" in r.stdout


def test_agent_start_replaces_a_reused_pid(tmp_path):
    """A pid file naming a live stripedb that is not this role with this config (a reused pid)
    is stale: agent start starts the role and rewrites the pid file."""
    data = tmp_path / "data"
    (data / "run").mkdir(parents=True)
    # a live stripedb of another command line: an agent put waiting for its stdin
    other = subprocess.Popen([BIN, "ctl", "cluster", "agent", "put", str(tmp_path / "x"), "0644",
                              "-", "10"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        (data / "run" / "shard.pid").write_text(f"{other.pid}\n")
        # the config does not exist: the started shard exits at once, which is fine here
        r = _cluster("agent", "start", "shard", str(tmp_path / "none.conf"), str(data))
        assert r.returncode == 0, r.stderr
        m = re.fullmatch(r"started \(pid (\d+)\)\n", r.stdout)
        assert m, r.stdout
        assert int(m.group(1)) != other.pid
        assert (data / "run" / "shard.pid").read_text() == f"{m.group(1)}\n"
    finally:
        other.kill()
        other.wait()


def test_unreachable_host_names_it(tmp_path):
    """ssh cannot connect: exit 1, one stderr line naming the host and the step."""
    f = tmp_path / "c.conf"
    f.write_text(f"[cluster]\nssh-port = {free_port()}\nlauncher = direct\n"
                 f"[far]\naddress = 127.0.0.1\nroles = metadata\ndata-dir = {tmp_path}/far\n")
    r = _cluster("bootstrap", "--spec", str(f))
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("stripedb ctl cluster bootstrap: host far (127.0.0.1) writing "
                               "the config: "), r.stderr
