"""Report-only (--report-only, report_only=True, YAML `mode: report`): what the network, DNS
and HTTP rules would refuse is recorded as "would-deny" and allowed, so a policy can be
trialled on a live program; the filesystem stays enforced."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import PY, sandbox

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FETCH = ("import sys, urllib.request as u\n"
         "for url in sys.argv[1:]:\n"
         "    try:\n        print(u.urlopen(url, timeout=10).read().decode())\n"
         "    except Exception as e:\n        print('failed', type(e).__name__)\n")


@pytest.fixture
def web(web_recorder):
    srv = web_recorder()
    srv.server_address = ("127.0.0.1", srv.port)
    return srv


def test_refusals_are_recorded_and_allowed_files_stay_enforced(tmp_path, web):
    from dnsserver import TestDnsServer
    dns = TestDnsServer({"api.test": ["127.0.0.1"], "other.test": ["127.0.0.1"]})
    port = web.server_address[1]
    log = tmp_path / "audit.jsonl"
    (tmp_path / "private.txt").write_text("private\n")
    os.chmod(tmp_path, 0o755)
    urls = [f"http://127.0.0.1:{port}/tcp",          # no rule names it
            f"http://other.test:{port}/dns",          # a name no rule allows
            f"http://api.test:{port}/admin"]          # an HTTP rule refuses the path
    fields = dict(net_allow=[f"api.test:{port}"], net_allow_private=True,
                  dns_servers=[dns.address], http_allow=[f"GET api.test:{port}/ok/*"],
                  audit_log=str(log))
    # Enforced (the control): nothing reaches the server.
    r = sandbox(**fields).run([PY, "-c", FETCH, *urls], timeout=60)
    assert r.stdout.decode().split().count("failed") == 3 and web.hits == [], r.stdout
    log.unlink()
    # Report-only: all three go through, and each is recorded as would-deny.
    r = sandbox(**fields, report_only=True).run(
        [PY, "-c", FETCH, *urls + [], "file://" + str(tmp_path / "private.txt")], timeout=60)
    out = r.stdout.decode().split()
    assert out[:3] == ["ok", "ok", "ok"], (r.stdout, r.stderr)
    assert out[3] == "failed"  # the file read: still refused
    assert sorted(web.paths()) == ["/admin", "/dns", "/tcp"]
    recs = [json.loads(x) for x in log.read_text().splitlines()]
    would = [(x.get("protocol"), x.get("host") or x.get("address")) for x in recs
             if x["decision"] == "would-deny"]
    # (the port is an HTTP port here: every request to it is judged by the HTTP filter)
    assert {("http", "127.0.0.1"), ("dns", "other.test"), ("http", "api.test")} <= set(
        would), recs
    assert not [x for x in recs if x["decision"] == "deny"]


def test_cli_and_yaml_say_report_only_loudly(tmp_path, web):
    port = web.server_address[1]
    policy = tmp_path / "trial.yaml"
    policy.write_text(f"version: 1\nmode: report\naudit: {{file: {tmp_path}/a.jsonl}}\n")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-m", "sandlock", "run", "--policy", str(policy),
                        "--", PY, "-c", FETCH, f"http://127.0.0.1:{port}/yaml"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "ok" and "/yaml" in web.paths(), r.stderr
    assert "REPORT-ONLY" in r.stderr and "1 request(s) WOULD HAVE BEEN DENIED" in r.stderr
    r = subprocess.run([sys.executable, "-m", "sandlock", "why", f"{tmp_path}/a.jsonl"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert "would deny (report-only): tcp 127.0.0.1" in r.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nmode: trial\n")
    r = subprocess.run([sys.executable, "-m", "sandlock", "policy", "check", str(bad)],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 125 and f"{bad}:2: mode: expected enforce or report" in r.stderr


def test_a_policy_fn_refusal_is_recorded_and_allowed(tmp_path):
    """policy_fn verdicts too: an exec the callback refuses runs, recorded as would-deny;
    a callback that raises still denies (no verdict is no permission)."""
    log = tmp_path / "audit.jsonl"

    def no_true(event, ctx):
        if event.syscall == "execve" and (event.path or "").endswith("/true"):
            return True  # refuse
    r = sandbox(policy_fn=no_true, report_only=True, audit_log=str(log)).run(
        ["/bin/sh", "-c", "/bin/true && echo ran"], timeout=30)
    assert r.stdout == b"ran\n", r.stderr
    recs = [json.loads(x) for x in log.read_text().splitlines()]
    assert [x["decision"] for x in recs if x.get("rule") == "policy_fn"] == ["would-deny"]
    r = sandbox(policy_fn=no_true).run(["/bin/sh", "-c", "/bin/true && echo ran"],
                                       timeout=30)
    assert r.stdout == b""  # enforced: the control

    def broken(event, ctx):
        if event.syscall == "execve" and (event.path or "").endswith("/true"):
            raise RuntimeError("boom")
    r = sandbox(policy_fn=broken, report_only=True).run(
        ["/bin/sh", "-c", "/bin/true && echo ran"], timeout=30)
    assert r.stdout == b""


def test_unix_sockets_stay_refused(tmp_path):
    """Found by review: report-only let a sandbox reach any unix socket (docker.sock, an
    ssh agent) through the supervisor. They stay refused; a granted one works."""
    import socket
    import threading
    path = str(tmp_path / "svc.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(4)
    os.chmod(tmp_path, 0o777)
    os.chmod(path, 0o777)
    accepted = []

    def serve():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            accepted.append(1)
            c.sendall(b"hi")
            c.close()
    threading.Thread(target=serve, daemon=True).start()
    code = (f"import socket\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect({path!r})"
            f"\n    print(s.recv(2).decode())\nexcept OSError as e:\n    print('err', e.errno)")
    try:
        r = sandbox(report_only=True).run([PY, "-c", code], timeout=30)
        assert r.stdout.split()[0] == b"err" and accepted == [], r.stdout
        r = sandbox(report_only=True, net_allow_unix=[path]).run([PY, "-c", code],
                                                                 timeout=30)
        assert r.stdout == b"hi\n" and accepted == [1]
    finally:
        srv.close()
