"""Network namespaces on one bridge: the "hosts" of the multi-host and fault tests.

    net = BridgeNet(tmp_path, n_hosts=3, subnet="10.215.7", prefix="rb")
    net.up()                          # h1..hn, each with its own address on the bridge
    net.addr(1)                       # "10.215.7.1"; the root namespace has .254
    net.cut(1) / net.restore(1)       # the host end of h1's veth down/up: h1 loses everyone
    net.partition([1], [2, 3])        # blackhole routes between the two sides only
    net.heal()
    net.remove()                      # SIGKILL what is left inside, delete links and namespaces

No iptables is needed (there is none on the CI image): routes and link state are enough.
Needs root and `ip netns`: skip_reason() says why not. Used by shard_net.py (shard replica
sets) and test_multihost.py (ctl cluster bootstrap over SSH).
"""
import fcntl
import os
import shutil
import signal
import subprocess
import tempfile


def sh(*args, check=True):
    """Run a command (30 s at most); raise with its stderr when check and it fails."""
    r = subprocess.run(list(args), capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {r.stderr.strip()}")
    return r


def skip_reason(tools=("ip",), files=()):
    """None when namespaces work here and every tool (on PATH) and file exists, else why
    the tests that need them are skipped."""
    if os.geteuid() != 0:
        return "needs root (ip netns, veth, bridge)"
    for tool in tools:
        if shutil.which(tool) is None:
            return f"no {tool} in PATH"
    for path, package in files:
        if not os.path.exists(path):
            return f"no {path} (apt-get install {package})"
    probe = f"sdbprobe{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"ip netns does not work here: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


class BridgeNet:
    """n_hosts namespaces h1..hn on a bridge; the root namespace has SUBNET.254. Names carry
    prefix and the test's pid so that concurrent test processes do not collide."""

    def __init__(self, tmp, n_hosts, subnet, prefix):
        self.tag = f"{os.getpid() % 100000:05d}"
        self.subnet = subnet
        self.prefix = prefix
        self.bridge = f"{prefix}b{self.tag}"
        self.tmp = tmp
        self.ns = {i: f"sdb{prefix}-{self.tag}-h{i}" for i in range(1, n_hosts + 1)}
        self.veth = {i: f"{prefix}{self.tag}h{i}" for i in range(1, n_hosts + 1)}
        self.blackholes = []  # (host, address)
        self.made_bridge = False

    def addr(self, i):
        return f"{self.subnet}.{i}"

    def _claim_subnet(self):
        """Make self.subnet a /24 that no interface of the root namespace has an address in:
        the one given, else the next free one (A.B.C+1, ...). The subnet the callers pass
        derives from the pid, so two test processes side by side (pytest-xdist workers, see
        run.sh) may ask for the same one; a second bridge on the same /24 would take the
        other's routes. A lock file serialises the check and the bridge's address across
        processes."""
        base, third = self.subnet.rsplit(".", 1)
        with open(os.path.join(tempfile.gettempdir(), "stripedb-test-netns.lock"), "w") as lk:
            fcntl.flock(lk, fcntl.LOCK_EX)
            used = sh("ip", "-4", "-o", "addr", "show").stdout
            for i in range(250):
                cand = f"{base}.{(int(third) + i) % 250}"
                if f" {cand}." not in used:
                    self.subnet = cand
                    break
            else:
                raise RuntimeError(f"no free {base}.N/24 subnet for a test bridge")
            sh("ip", "link", "add", self.bridge, "type", "bridge")
            self.made_bridge = True
            sh("ip", "addr", "add", f"{self.subnet}.254/24", "dev", self.bridge)

    def up(self):
        """Create the bridge and the namespaces. self.subnet (and so addr()) is final only
        after this (see _claim_subnet)."""
        self._claim_subnet()
        sh("ip", "link", "set", self.bridge, "up")
        for i, ns in self.ns.items():
            peer = f"{self.prefix}{self.tag}n{i}"
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", self.veth[i], "type", "veth", "peer", "name", peer)
            sh("ip", "link", "set", peer, "netns", ns)
            sh("ip", "link", "set", self.veth[i], "master", self.bridge)
            sh("ip", "link", "set", self.veth[i], "up")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
            sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{self.addr(i)}/24", "dev", peer)
            sh("ip", "netns", "exec", ns, "ip", "link", "set", peer, "up")
        return self

    def cut(self, i):
        """Host i loses every peer and every client."""
        sh("ip", "link", "set", self.veth[i], "down")

    def restore(self, i):
        sh("ip", "link", "set", self.veth[i], "up")

    def partition(self, side_a, side_b):
        """Drop every packet between the hosts of side_a and those of side_b (both ways);
        the root namespace still reaches both sides."""
        for a in side_a:
            for b in side_b:
                for h, dst in ((a, b), (b, a)):
                    sh("ip", "netns", "exec", self.ns[h], "ip", "route", "add", "blackhole",
                       f"{self.addr(dst)}/32")
                    self.blackholes.append((h, self.addr(dst)))

    def heal(self):
        for h, dst in self.blackholes:
            sh("ip", "netns", "exec", self.ns[h], "ip", "route", "del", "blackhole", f"{dst}/32",
               check=False)
        self.blackholes = []

    def kill_all(self):
        """SIGKILL every process left in the namespaces (all were started by the test)."""
        for ns in self.ns.values():
            r = sh("ip", "netns", "pids", ns, check=False)
            for pid in r.stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass

    def remove(self):
        """Delete the host ends of the veth pairs explicitly (a namespace the kernel frees
        late would keep its pair and its address alive), the namespaces and the bridge.
        Call kill_all first."""
        for v in self.veth.values():
            sh("ip", "link", "del", v, check=False)
        for ns in self.ns.values():
            sh("ip", "netns", "del", ns, check=False)
        if self.made_bridge:
            sh("ip", "link", "del", self.bridge, check=False)
