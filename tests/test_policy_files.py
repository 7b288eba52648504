"""YAML policies, `sandlock policy check`, `net-run` and `sandlock audit`, end to end."""

import json
import os
import subprocess
import sys

import pytest

from sandlock import PolicyError, Sandbox
from conftest import PY, TcpServer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SANDLOCK = [sys.executable, "-m", "sandlock"]


def write(tmp_path, text, name="p.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize("text, fragment", [
    ("version: 1\nnetwork:\n  alow: [':443']\n", "p.yaml:3: network.alow: unknown key"),
    ("version: 1\nnetwerk: {}\n", "p.yaml:2: netwerk: unknown key"),
    ("version: 1\nnetwork:\n  allow: ':443'\n", "p.yaml:3: network.allow: expected a list"),
    ("version: 1\nnetwork:\n  allow:\n    - ':443'\n    - '*.com:443'\n",
     "p.yaml:5: network.allow: '*.com:443': a wildcard must cover"),
    ("version: 2\n", "p.yaml:1: version: unsupported version 2"),
    ("network: {allow: []}\n", "missing 'version: 1'"),
    ("version: 1\nprocess:\n  timeout: -1\n", "p.yaml:3: process.timeout: must be positive"),
    ("version: 1\nfilesystem:\n  read: [/nonexistent/x]\n", ":3: filesystem.read: /nonexistent/x does not exist"),
    ("version: 1\n  bad: [\n", "not valid YAML"),
])
def test_malformed_policy_is_refused_with_file_line_and_key(tmp_path, text, fragment):
    path = write(tmp_path, text)
    with pytest.raises(PolicyError) as e:
        Sandbox.from_policy(path)
    assert fragment in str(e.value) and "\n" not in str(e.value)
    marker = tmp_path / "ran"
    r = subprocess.run(SANDLOCK + ["run", "--policy", path, "--", "touch", str(marker)],
                       capture_output=True, text=True)
    assert r.returncode == 125 and fragment in r.stderr and not marker.exists()


@pytest.mark.parametrize("name", sorted(os.listdir(os.path.join(ROOT, "policies"))))
def test_shipped_policies_are_valid_and_documented(name, tmp_path):
    path = os.path.join(ROOT, "policies", name)
    assert open(path).readline().startswith(f"# {name}")
    # From a project directory (relative paths such as `workdir: .` name it).
    r = subprocess.run(SANDLOCK + ["policy", "check", path], capture_output=True, text=True,
                       cwd=tmp_path)
    assert r.returncode == 0 and "valid (version 1)" in r.stdout, r.stderr


def test_policy_file_with_flags_and_policy_check(tmp_path):
    srv = TcpServer("127.0.0.2")
    try:
        path = write(tmp_path, f"version: 1\nname: t\nnetwork:\n  allow: ['127.0.0.2:{srv.port}']\n")
        code = (f"import socket; s = socket.create_connection(('127.0.0.2', {srv.port}));"
                f"print(s.recv(3).decode().strip())")
        r = subprocess.run(SANDLOCK + ["run", "--policy", path, "--", PY, "-c", code],
                           capture_output=True, text=True)
        assert r.stdout == "ok\n", r.stderr
        r = subprocess.run(SANDLOCK + ["policy", "check", path], capture_output=True, text=True)
        assert f"127.0.0.2:{srv.port}" in r.stdout and "supervisor decides" in r.stdout
    finally:
        srv.close()


def test_net_run_allowed_refused_audit_and_summary(tmp_path):
    ok, bad = TcpServer("127.0.0.2"), TcpServer("127.0.0.3")
    audit = tmp_path / "audit.jsonl"
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text("KEY")
    work = tmp_path / "work"
    work.mkdir()
    code = f"""
import socket
for host, port in (("127.0.0.2", {ok.port}), ("127.0.0.3", {bad.port})):
    try:
        socket.create_connection((host, port)); print("ok", host)
    except OSError as e:
        print("denied", host, e.errno)
try:
    open({str(home / '.ssh' / 'id_rsa')!r}).read(); print("read key")
except OSError as e:
    print("key", e.errno)
open("out.txt", "w").write("written")
"""
    try:
        r = subprocess.run(SANDLOCK + ["net-run", "--allow", f"127.0.0.2:{ok.port}",
                                       "--audit", str(audit), "-r", str(home), "--",
                                       PY, "-c", code],
                           capture_output=True, text=True, cwd=work,
                           env=dict(os.environ, HOME=str(home)))
        assert r.stdout.split("\n")[:3] == ["ok 127.0.0.2", "denied 127.0.0.3 13", "key 13"], \
            r.stderr
        assert (work / "out.txt").read_text() == "written"  # cwd is writable
        assert f"1 network request(s) denied; audit log: {audit}" in r.stderr
        assert bad.accepted == 0 and ok.accepted == 1
        (rec,) = [json.loads(line) for line in audit.read_text().splitlines()]
        assert rec["address"] == "127.0.0.3" and rec["decision"] == "deny"
        s = subprocess.run(SANDLOCK + ["audit", str(audit)], capture_output=True, text=True)
        assert "1 denied event(s)" in s.stdout and f"tcp 127.0.0.3:{bad.port}" in s.stdout
        assert "python3" in s.stdout
    finally:
        ok.close()
        bad.close()
