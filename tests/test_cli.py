"""`sandlock run` and `sandlock check` as a user runs them."""

import os
import subprocess
import sys
import time

from conftest import CLI, free_port

SANDLOCK = CLI  # in-process, or through the CLI service (conftest)


def cli(*args, **kw):
    return subprocess.run(SANDLOCK + list(args), capture_output=True, text=True, **kw)


def test_run_propagates_exit_status_and_output():
    r = cli("run", "--", "sh", "-c", "echo hi; exit 3")
    assert r.returncode == 3 and r.stdout == "hi\n"


def test_run_signal_exit_status():
    assert cli("run", "--", "sh", "-c", "kill -TERM $$").returncode == 128 + 15


def test_default_policy_is_read_only_system_and_denies_secrets(tmp_path):
    target = tmp_path / "f"
    r = cli("run", "--", "sh", "-c",
            f"cat /etc/shadow; echo x > {target}; ls /etc | grep -c passwd; cat /etc/hostname")
    assert not target.exists()
    assert "/etc/shadow: Permission denied" in r.stderr
    assert int(r.stdout.splitlines()[0]) >= 1  # /etc stays listable
    assert r.stdout.splitlines()[1] == open("/etc/hostname").read().strip()
    r = cli("run", "-w", str(tmp_path), "--", "sh", "-c", f"echo x > {target}")
    assert r.returncode == 0 and target.read_text() == "x\n"


def test_timeout_exit_124_kills_everything(tmp_path):
    t0 = time.monotonic()
    r = cli("run", "-t", "0.5", "--", "sh", "-c", "sleep 30 & sleep 30")
    assert r.returncode == 124 and "timed out" in r.stderr
    assert time.monotonic() - t0 < 10


def test_net_allow_port_and_fs_deny(tmp_path):
    (tmp_path / "secret").write_text("s")
    (tmp_path / "ok").write_text("o")
    port = free_port()
    import socket
    srv = socket.socket()
    srv.bind(("127.0.0.1", port))
    srv.listen(1)
    try:
        code = (f"import socket; s = socket.create_connection(('127.0.0.1', {port})); "
                f"print('connected')")
        r = cli("run", "-r", str(tmp_path), "--fs-deny", str(tmp_path / "secret"),
                "--net-allow", f":{port}", "--", "sh", "-c",
                f"cat {tmp_path}/ok; cat {tmp_path}/secret; python3 -c \"{code}\"")
        assert r.stdout == "oconnected\n", r.stderr
        assert "Permission denied" in r.stderr
    finally:
        srv.close()


def test_command_not_found():
    r = cli("run", "--", "no-such-command-xyz")
    assert r.returncode == 127 and "command not found" in r.stderr


def test_check_reports_features():
    r = cli("check")
    assert r.returncode == 0 and "landlock ABI >= 6" in r.stdout
    r = cli("check", env=dict(os.environ, SANDLOCK_TEST_LANDLOCK_ABI="2"))
    assert r.returncode == 1 and "missing:" in r.stdout
    r = cli("check", "--allow-degraded", env=dict(os.environ, SANDLOCK_TEST_LANDLOCK_ABI="2"))
    assert r.returncode == 0 and "usable with --allow-degraded" in r.stdout


def test_start_path_imports_neither_mitmproxy_nor_dns():
    code = ("import sys, sandlock.cli\nrc = sandlock.cli.main(['run', '--', 'true'])\n"
            "print(rc, sorted(m for m in sys.modules if m.split('.')[0] in "
            "('mitmproxy', 'dns', 'h11', 'yaml')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.stdout.strip() == "0 []", r.stderr


def test_root_started_sandbox_cannot_read_root_only_system_files(tmp_path):
    """Review observation: a sandbox started as root (uid 0, no capabilities) read files
    that only root may read and that were not on the fixed deny list. Files under /etc that
    belong to root and have no read bit for others are now denied; a readable one is not."""
    import pytest
    if os.geteuid() != 0:
        pytest.skip("only a sandbox started as root owns root's files")
    import uuid
    secret = f"/etc/sandlock-test-{uuid.uuid4().hex}"
    public = secret + "-public"
    try:
        with open(secret, "w") as f:
            f.write("root-only\n")
        os.chmod(secret, 0o600)
        with open(public, "w") as f:
            f.write("everyone\n")
        os.chmod(public, 0o644)
        r = cli("run", "--", "sh", "-c", f"cat {public}; cat {secret}; ls /etc >/dev/null && "
                                         f"echo listable")
        assert r.stdout == "everyone\nlistable\n", r
        assert "Permission denied" in r.stderr
    finally:
        for p in (secret, public):
            if os.path.exists(p):
                os.unlink(p)


def test_a_plain_run_imports_only_what_it_uses():
    """The in-process CLI (what a confined agent always runs: docs/cli.md) imports the
    workspace, credential and policy_fn modules only for policies that have them (each
    1-3 ms of a ~90 ms start); the control: a run with a workdir imports the first."""
    code = ("import sys; from sandlock.cli import main; code = main(sys.argv[1:]); "
            "print(sorted(m for m in ('sandlock.workspace_run', 'sandlock.workspace_policy', "
            "'sandlock.credential_policy', 'sandlock.supervisor.runtime') "
            "if m in sys.modules)); sys.exit(code)")
    env = dict(os.environ, SANDLOCK_SERVICE="0")
    r = subprocess.run([sys.executable, "-c", code, "run", "--", "true"], env=env,
                       capture_output=True, text=True, timeout=60, cwd="/")
    assert r.returncode == 0 and r.stdout == "[]\n", (r.stdout, r.stderr)
    work = f"/tmp/sandlock-imports-{os.getpid()}"
    os.makedirs(work, exist_ok=True)
    try:
        r = subprocess.run([sys.executable, "-c", code, "run", "--workdir", work, "--", "true"],
                           env=env, capture_output=True, text=True, timeout=60, cwd=work)
        assert r.returncode == 0, r.stderr
        assert "'sandlock.workspace_policy'" in r.stdout and "'sandlock.workspace_run'" in r.stdout
    finally:
        os.rmdir(work)
