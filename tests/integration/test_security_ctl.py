"""`stripedb ctl tenant create|list|quota|policy` and `ctl user create|passwd|drop`
(issue #10) against a one-member metadata service."""
import json
import os
import subprocess

from conftest import BIN
from metadata_cluster import Cluster


def ctl(cl, *args, env=None):
    e = dict(os.environ, STRIPEDB_CONFIG="/dev/null")
    e.update(env or {})
    return subprocess.run([BIN, "ctl", f"--metadata={cl.seeds()}"] + list(args),
                          capture_output=True, text=True, timeout=60, env=e)


def test_ctl_tenant_and_user(start_role, tmp_path):
    cl = Cluster(start_role, tmp_path, 1, election_ms=300)
    cl.leader()
    r = ctl(cl, "tenant", "create", "acme")
    assert (r.returncode, r.stdout) == (0, "tenant acme created\n"), r.stderr
    r = ctl(cl, "tenant", "create", "acme")
    assert r.returncode == 1 and "already exists" in r.stderr
    r = ctl(cl, "tenant", "quota", "acme", '{"requestsPerSec": 100}')
    assert (r.returncode, r.stdout) == (0, "tenant acme: quota set\n"), r.stderr
    r = ctl(cl, "tenant", "policy", "acme", '{"actions": ["find"], "databases": ["shared"]}')
    assert (r.returncode, r.stdout) == (0, "tenant acme: policy set\n"), r.stderr
    r = ctl(cl, "--json", "tenant", "list")
    assert r.returncode == 0, r.stderr
    assert [json.loads(line) for line in r.stdout.splitlines()] == [
        {"name": "acme", "quota": {"requestsPerSec": 100},
         "policy": {"actions": ["find"], "databases": ["shared"]}}]
    r = ctl(cl, "user", "create", "alice", "--tenant", "acme", env={"STRIPEDB_PASSWORD": "pw"})
    assert (r.returncode, r.stdout) == (0, "user alice created in tenant acme\n"), r.stderr
    u = cl.members[0].cmd({"getUser": "alice"})["user"]
    assert (u["name"], u["tenant"], u["mechanism"]) == ("alice", "acme", "SCRAM-SHA-256")
    assert "password" not in u
    # unknown tenant
    r = ctl(cl, "user", "create", "bob", "--tenant", "nope", "--password", "x")
    assert r.returncode == 1 and "tenant nope not found" in r.stderr
    # bad usage: exit code 2, one line on stderr
    for args in (["tenant", "create"], ["tenant", "quota", "acme", "{bad"],
                 ["user", "create", "carol", "--tenant", "acme"], ["user", "frob", "x"],
                 ["tenant", "list", "extra"]):
        r = ctl(cl, *args)
        assert r.returncode == 2, (args, r.stderr)
