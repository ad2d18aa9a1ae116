"""The stripedb binary itself: usage errors, configuration sources, lifecycle, /metrics.

Issue #2: unknown role, unknown flag, bad address, unreadable config -> exit code 2 and one
line on stderr naming the problem; SIGTERM/SIGINT -> graceful stop and exit 0; every role
serves /healthz and Prometheus /metrics; logs are logfmt with role and node on every line.
"""
import os
import signal
import subprocess

import pymongo
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import BIN, free_port, http_get, wait_until


def run(args, env=None, timeout=20):
    e = dict(os.environ)
    e["STRIPEDB_CONFIG"] = "/dev/null"
    if env:
        e.update(env)
    return subprocess.run([BIN] + args, capture_output=True, text=True, env=e, timeout=timeout)


def test_version_and_help():
    r = run(["--version"])
    assert r.returncode == 0
    assert r.stdout.startswith("stripedb ")
    r = run(["--help"])
    assert r.returncode == 0
    for flag in ("--role=ROLE", "--listen=H:P", "--http-listen=H:P", "--data-dir=PATH",
                 "--bootstrap-members=ID@H:P,...", "--metadata=H:P,..."):
        assert flag in r.stdout, flag


@pytest.mark.parametrize("args,needle", [
    (["--role=nosuch"], "unknown role 'nosuch'"),
    (["--role=shard", "--frobnicate=1"], "unknown flag --frobnicate"),
    (["--role=shard", "--listen=localhost"], "--listen: bad address 'localhost'"),
    (["--role=shard", "--http-listen=127.0.0.1:99999"], "port must be 0-65535"),
    (["--role=shard", "--config=/nonexistent/stripedb.conf"], "cannot read config file /nonexistent/stripedb.conf"),
    ([], "no role given"),
    (["ctl", "--bogus"], "unknown flag --bogus"),
    (["ctl", "--metadata=127.0.0.1:1", "frob"], "unknown subcommand 'frob'"),
])
def test_usage_errors_exit_2_with_one_line(args, needle):
    r = run(args)
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert needle in lines[0]
    assert r.stdout == ""


def test_bad_config_file_line_is_named(tmp_path):
    conf = tmp_path / "s.conf"
    conf.write_text("listen = 127.0.0.1:1\nwhat = 3\n")
    r = run(["--role=shard", f"--config={conf}"])
    assert r.returncode == 2
    assert r.stderr.strip() == f"stripedb: {conf}:2: unknown key 'what'"


def test_env_bad_value_exit_2():
    r = run(["--role=shard"], env={"STRIPEDB_HTTP_LISTEN": "nope"})
    assert r.returncode == 2
    assert "STRIPEDB_HTTP_LISTEN" in r.stderr


def test_port_in_use_exits_1_with_message(tmp_path):
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    port = s.getsockname()[1]
    try:
        r = run(["--role=shard", f"--listen=127.0.0.1:{free_port()}", f"--http-listen=127.0.0.1:{port}",
                 f"--data-dir={tmp_path}"])
        assert r.returncode == 1
        assert "cannot listen on 127.0.0.1:%d" % port in r.stderr
    finally:
        s.close()


def _metrics(port):
    st, body = http_get(port, "/metrics")
    assert st == 200
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_graceful_stop_exit_0_and_metrics(start_role, tmp_path, sig):
    port = free_port()
    p = start_role(["--role=shard", f"--listen=127.0.0.1:{port}", f"--data-dir={tmp_path}",
                    "--node-id=n7"])
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true",
                            serverSelectionTimeoutMS=5000)
    assert c.admin.command("ping")["ok"] == 1.0
    fams = _metrics(p.http_port)
    # process metrics and per-command counters/histograms, all parseable
    assert fams["process_resident_memory_bytes"].samples[0].value > 0
    assert fams["process_open_fds"].samples[0].value > 0
    cmds = fams["stripedb_wire_commands"]
    assert any(s.labels.get("cmd") == "ping" and s.value >= 1 for s in cmds.samples)
    assert fams["stripedb_wire_command_duration_seconds"].type == "histogram"
    c.close()
    st, body = http_get(p.http_port, "/healthz")
    assert (st, body) == (200, b"ok\n")
    p.signal(sig)
    assert p.p.wait(timeout=15) == 0
    log = p.tail(100000)
    assert "msg=stopped" in log
    # logfmt with role and node on every line the role thread wrote
    role_lines = [l for l in log.splitlines() if "role=shard" in l]
    assert role_lines and all(" node=n7 " in l and l.startswith("ts=") for l in role_lines)


def test_several_roles_in_one_process_share_http(start_role, tmp_path):
    p1, p2 = free_port(), free_port()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    # flags after a --role apply to that role only; the shared --http-listen comes first
    p = start_role([f"--http-listen=127.0.0.1:{free_port()}",
                    "--role=shard", f"--listen=127.0.0.1:{p1}", f"--data-dir={tmp_path/'a'}",
                    "--role=ratelimit", f"--grpc-listen=127.0.0.1:{p2}"])
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{p1}/?directConnection=true",
                            serverSelectionTimeoutMS=5000)
    assert c.admin.command("ping")["ok"] == 1.0
    c.close()
    assert p.stop() == 0


def test_config_file_and_env(start_role, tmp_path):
    port = free_port()
    conf = tmp_path / "stripedb.conf"
    conf.write_text(f"role = shard\n[shard]\nlisten = 127.0.0.1:{port}\ndata-dir = {tmp_path}\n")
    p = start_role([f"--config={conf}"], env={"STRIPEDB_LOG_LEVEL": "debug"})
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true",
                            serverSelectionTimeoutMS=5000)
    assert c.admin.command("ping")["ok"] == 1.0
    c.close()
    assert p.stop() == 0
    assert "level=debug" in p.tail(100000)


def test_data_dir_is_locked_against_a_second_process(start_role, tmp_path):
    p = start_role(["--role=shard", f"--listen=127.0.0.1:{free_port()}", f"--data-dir={tmp_path}"])
    r = run(["--role=shard", f"--listen=127.0.0.1:{free_port()}", f"--data-dir={tmp_path}"])
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        f"stripedb: shard: data dir {tmp_path} is in use by another stripedb process (pid {p.p.pid})"]
    assert p.stop() == 0


@pytest.mark.parametrize("args,needle", [
    (["--role=shard"], "stripedb: shard: --data-dir is required"),
    (["--role=shard", "--data-dir=DIR", "--listen=host.invalid:1"], "stripedb: shard: listen address 'host.invalid:1'"),
    (["--role=shard", "--config=/"], "stripedb: cannot read config file /: Is a directory"),
    (["--role=shard", "--max-connections=0"], "stripedb: --max-connections: must be at least 1"),
    (["--version", "extra"], "stripedb: unexpected argument 'extra'"),
])
def test_start_refusals_exit_2_with_one_line(tmp_path, args, needle):
    args = [a.replace("DIR", str(tmp_path)) for a in args]
    r = run(args)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(needle), r.stderr
