"""`stripedb ctl metadata join|transfer|remove|status` against a real metadata group
(cli/metadata.c). Skipped while ctl does not dispatch the `metadata` subcommand."""
import json
import os
import subprocess

import pytest

from conftest import BIN, wait_until
from metadata_cluster import Cluster


def ctl(seeds, *args, timeout=60):
    env = dict(os.environ, STRIPEDB_CONFIG="/dev/null")
    return subprocess.run([BIN, "ctl", f"--metadata={seeds}", "metadata", *args],
                          capture_output=True, text=True, env=env, timeout=timeout)


@pytest.fixture
def wired():
    r = ctl("127.0.0.1:1", "bogus")
    if r.returncode == 2 and "unknown subcommand 'metadata'" in r.stderr:
        pytest.skip("stripedb ctl does not dispatch `metadata` yet (cli/ctl.c)")


def test_ctl_metadata_join_transfer_remove(wired, start_role, tmp_path):
    c = Cluster(start_role, tmp_path, 3)
    seeds = c.seeds()
    new = c.add_member()
    r = ctl(seeds, "join", str(new.id), f"--raft={new.raft}", f"--wire={new.wire}")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"member {new.id} joined as a voter"
    c.wait_registered()
    wait_until(lambda: any(m["id"] == new.id and m["role"] == "voter"
                           for m in c.leader().status()["members"]), what="member 4 voter")

    r = ctl(seeds, "transfer", str(new.id))
    assert r.returncode == 0, r.stderr
    assert c.leader() is new

    r = ctl(seeds + "," + new.wire, "--json", "status")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert sorted(row["id"] for row in rows) == [1, 2, 3, 4]
    assert [row["id"] for row in rows if row["ready"]] == [new.id]

    r = ctl(seeds + "," + new.wire, "remove", "1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "member 1 removed"
    assert sorted(m["id"] for m in new.status()["members"]) == [2, 3, 4]

    r = ctl(seeds, "remove", "99")
    assert r.returncode == 1
    assert "removeMember" in r.stderr
    r = ctl(seeds, "join", "5")
    assert r.returncode == 2
    assert "join needs ID and --raft=H:P" in r.stderr
