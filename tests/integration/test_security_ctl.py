"""`stripedb ctl tenant create|list|quota|policy` and `ctl user create|passwd|drop`
(issue #10) against a one-member metadata service."""
import hashlib
import hmac
import json
import os
import subprocess

import pytest
from pymongo.errors import OperationFailure

from conftest import BIN, wait_until
from metadata_cluster import Cluster
from proxy_helpers import ProxyCluster

MECHS = ("SCRAM-SHA-1", "SCRAM-SHA-256")


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
    # a policy the proxy could not read is refused, naming the field; the old one stays
    for bad, msg in (('{"actions": "find"}', "policy.actions must be an array"),
                     ('{"actions": ["find", "bogus"]}', "unknown action 'bogus'"),
                     ('{"collections": {"secret": ["find"]}}', "'secret' must be")):
        r = ctl(cl, "tenant", "policy", "acme", bad)
        assert r.returncode == 1 and r.stdout == "", (bad, r.stdout, r.stderr)
        assert len(r.stderr.splitlines()) == 1 and msg in r.stderr, (bad, r.stderr)
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


def _verifier_sha256(password, salt, iterations):
    """RFC 5802 §3 SCRAM-SHA-256 verifier, as the leader computes it (no SHA-1 one)."""
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    ck = hmac.new(salted, b"Client Key", "sha256").digest()
    return {"salt": salt, "iterations": iterations,
            "storedKey": hashlib.sha256(ck).digest(),
            "serverKey": hmac.new(salted, b"Server Key", "sha256").digest()}


def test_ctl_user_passwd_and_drop_through_the_proxy(start_role, tmp_path):
    """`ctl user passwd` / `ctl user drop` reach the proxy: the old password and a dropped
    user fail at once with AuthenticationFailed (18) through SCRAM-SHA-1 and -256, even
    when a conversation starts from the proxy's verifier cache (speculative); the new
    password works once the proxy saw the change (usersVersion). A connection that
    authenticated before a passwd keeps working; one that authenticated before a drop is
    logged out (Unauthorized 13 on its next command once the proxy saw the drop), as
    MongoDB logs a dropped user out of its sessions."""
    cl = ProxyCluster(start_role, tmp_path, shards=1, proxies=1,
                      proxy_args=["--auth=enabled", "--auth-failure-limit=50"])
    meta = Cluster.__new__(Cluster)  # ctl() only needs seeds()
    meta.seeds = lambda: cl.metadata_addr
    cl.meta_cmd({"createTenant": "A"})
    cl.create_database("adb", tenant="A")
    r = ctl(meta, "user", "create", "alice", "--tenant", "A", "--password", "old-pw")
    assert (r.returncode, r.stdout) == (0, "user alice created in tenant A\n"), r.stderr
    # a user stored before SCRAM-SHA-1 verifiers existed: a SHA-256 verifier only
    cl.meta_cmd({"createUser": "legacy", "tenant": "A",
                 **_verifier_sha256("legacy-pw", bytes(range(28)), 15000)})
    assert cl.meta_query({"getUser": "legacy"})["user"]["mechanisms"] == ["SCRAM-SHA-256"]

    def login(user, pw, mech):
        return cl.proxy_client(0, username=user, password=pw, authSource="admin",
                               authMechanism=mech)

    def fails18(user, pw, mech):
        with pytest.raises(OperationFailure) as ei:
            login(user, pw, mech).adb.c.find_one()
        return ei.value.code == 18

    def proxy_saw_users_version():
        want = cl.meta_query({"listTenants": 1})["usersVersion"]
        return cl.metric(0, "stripedb_auth_users_version") >= want

    # the proxy re-reads tenants once a second: wait until alice may write her database
    wait_until(lambda: login("alice", "old-pw", "SCRAM-SHA-256").adb.c.insert_one({"w": 1}),
               20, what="alice's first write")
    assert login("legacy", "legacy-pw", "SCRAM-SHA-256").adb.c.count_documents({}) == 1
    assert fails18("legacy", "legacy-pw", "SCRAM-SHA-1")
    wait_until(proxy_saw_users_version, 10, what="proxy usersVersion")
    # warm the verifier cache of both mechanisms: later conversations start in hello
    spec0 = cl.metric(0, "stripedb_auth_speculative_total")
    for mech in MECHS:
        for _ in range(2):
            assert login("alice", "old-pw", mech).adb.c.count_documents({}) == 1
    # SCRAM-SHA-256 was cached by the writes above (2 in hello); SCRAM-SHA-1's first
    # conversation looks it up (saslStart), its second starts in hello
    assert cl.metric(0, "stripedb_auth_speculative_total") - spec0 == 3
    kept = login("alice", "old-pw", "SCRAM-SHA-256")
    assert kept.adb.c.count_documents({}) == 1

    r = ctl(meta, "user", "passwd", "alice", env={"STRIPEDB_PASSWORD": "new-pw"})
    assert (r.returncode, r.stdout, r.stderr) == (0, "user alice: password changed\n", "")
    # the old password fails at once, whichever path the conversation takes
    for mech in MECHS:
        assert fails18("alice", "old-pw", mech), mech
    wait_until(proxy_saw_users_version, 10, what="proxy usersVersion after passwd")
    for mech in MECHS:
        for _ in range(2):
            assert login("alice", "new-pw", mech).adb.c.count_documents({}) == 1, mech
    assert kept.adb.c.count_documents({}) == 1  # a new password logs nobody out
    # a user created after the proxy's last user list is not taken for a dropped one
    r = ctl(meta, "user", "create", "carol", "--tenant", "A", "--password", "carol-pw")
    assert r.returncode == 0, r.stderr
    carol = login("carol", "carol-pw", "SCRAM-SHA-256")
    for _ in range(3):
        assert carol.adb.c.count_documents({}) == 1
    wait_until(proxy_saw_users_version, 10, what="proxy usersVersion after create")
    assert carol.adb.c.count_documents({}) == 1

    r = ctl(meta, "user", "drop", "alice")
    assert (r.returncode, r.stdout, r.stderr) == (0, "user alice dropped\n", "")
    for mech in MECHS:
        assert fails18("alice", "new-pw", mech), mech
    with pytest.raises(OperationFailure) as ei:
        cl.meta_query({"getUser": "alice"})
    assert ei.value.code == 4
    # the connection authenticated before the drop is logged out once the proxy has
    # read the user list of the drop's usersVersion (polled: about a second)
    def kept_logged_out():
        try:
            kept.adb.c.count_documents({})
            return False
        except OperationFailure as e:
            assert (e.code, e.details["errmsg"]) == \
                (13, "command aggregate requires authentication")
            return True
    wait_until(kept_logged_out, 10, what="the dropped user's connection logged out")
    with pytest.raises(OperationFailure) as ei:
        kept.adb.command("find", "c")
    assert (ei.value.code, ei.value.details["errmsg"]) == \
        (13, "command find requires authentication")

    # unknown users: non-zero exit, exactly one line on stderr; UserNotFound (11) on the wire
    for args in (["user", "passwd", "alice", "--password", "x"], ["user", "drop", "nobody"]):
        r = ctl(meta, *args)
        assert (r.returncode, r.stdout, r.stderr) == \
            (1, "", f'stripedb ctl: Could not find user "{args[2]}"\n'), args
    for cmd in ({"dropUser": "nobody"}, {"updateUser": "nobody", "password": "x"}):
        with pytest.raises(OperationFailure) as ei:
            cl.meta_cmd(cmd)
        assert (ei.value.code, ei.value.details["codeName"]) == (11, "UserNotFound")
    cl.close()
