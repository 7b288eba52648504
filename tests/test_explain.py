"""explain=True / --explain: each file access the policy refuses is recorded (path,
access, the grant that would allow it), the program's own error unchanged; applying the
suggested grant makes the same command pass."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import sandbox

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tree(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "in.txt").write_text("input\n")
    out = tmp_path / "out"
    out.mkdir()
    for p in (tmp_path, data, out):
        os.chmod(p, 0o777)
    os.chmod(data / "in.txt", 0o644)
    return data, out


def test_refused_reads_and_writes_are_explained_and_the_suggestion_works(tmp_path):
    data, out = _tree(tmp_path)
    script = f"cat {data}/in.txt; echo result > {out}/r.txt; cat /etc/hostname >/dev/null"
    r = sandbox(explain=True).run(["/bin/sh", "-c", script], timeout=30)
    assert b"Permission denied" in r.stderr and not (out / "r.txt").exists()
    files = {(d["access"], d["path"]): d for d in r.denials if d.get("protocol") == "file"}
    assert set(files) in ({("read", f"{data}/in.txt"), ("create", f"{out}/r.txt")},
                          {("read", f"{data}/in.txt"), ("create", str(out))}), r.denials
    read = files[("read", f"{data}/in.txt")]
    create = files.get(("create", f"{out}/r.txt")) or files[("create", str(out))]
    # (the supervisor's judgment, or Landlock's own record where the audit stream is read)
    assert read["suggest"]["flag"] == f"-r {data}/in.txt"
    assert read["rule"] in ("default:fs", "landlock")
    assert create["suggest"]["flag"] == f"-w {out}"
    assert create["suggest"]["yaml"] == f"filesystem: {{write: [{out}]}}"
    # Applying both suggestions: the same command passes, with nothing left to explain.
    r = sandbox(explain=True, fs_readable=[f"{data}/in.txt"], fs_writable=[str(out)]).run(
        ["/bin/sh", "-c", script], timeout=30)
    assert r.success and r.stdout == b"input\n" and (out / "r.txt").read_text() == "result\n"
    assert [d for d in r.denials if d.get("protocol") == "file"] == []
    # Without explain nothing is recorded (the positive control of the mechanism).
    r = sandbox().run(["/bin/sh", "-c", f"cat {data}/in.txt"], timeout=30)
    assert b"Permission denied" in r.stderr and r.denials == []


def test_a_grant_that_would_expose_a_secret_says_so(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("x")
    os.chmod(tmp_path, 0o755)
    monkeypatch.setenv("HOME", str(home))
    r = sandbox(explain=True).run(["/bin/sh", "-c", f"ls {home}/.ssh"], timeout=30)
    (d,) = [d for d in r.denials if d.get("protocol") == "file"]
    assert "expose" in d["suggest"]["warning"] and ".ssh" in d["suggest"]["warning"]


def test_cli_explain_writes_the_audit_log(tmp_path):
    data, _ = _tree(tmp_path)
    log = tmp_path / "audit.jsonl"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-m", "sandlock", "run", "--explain", "--audit",
                        str(log), "--", "cat", f"{data}/in.txt"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "Permission denied" in r.stderr
    recs = [json.loads(x) for x in log.read_text().splitlines()]
    assert [(x["access"], x["path"]) for x in recs] == [("read", f"{data}/in.txt")]


def _audit_enabled(on: bool) -> None:
    """Turn the kernel's audit subsystem on or off (AUDIT_SET; root): tests only — Sandlock
    itself never changes it."""
    import socket
    import struct
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 9)
    try:
        s.bind((0, 0))
        status = struct.pack("=8I", 1, int(on), 0, 0, 0, 0, 0, 0)  # mask: ENABLED
        s.send(struct.pack("=IHHII", 16 + len(status), 1001, 1 | 4, 1, 0) + status)
        s.recv(65536)
    finally:
        s.close()


@pytest.fixture
def kernel_audit():
    if os.geteuid() != 0:
        pytest.skip("the kernel's audit stream is read with CAP_AUDIT_READ (root)")
    from sandlock._kernel import audit
    was = audit.enabled()
    _audit_enabled(True)
    try:
        yield
    finally:
        _audit_enabled(was)


def test_landlock_reports_its_own_refusals_where_the_audit_stream_is_readable(
        tmp_path, kernel_audit):
    """As root with the audit subsystem on, the refusals come from Landlock's own records
    (rule "landlock"): no path call goes to the supervisor for them."""
    data, out = _tree(tmp_path)
    sb = sandbox(explain=True)
    r = sb.run(["/bin/sh", "-c", f"cat {data}/in.txt; echo x > {out}/r.txt"], timeout=30)
    assert b"Permission denied" in r.stderr and not (out / "r.txt").exists()
    files = {(d["access"], d["path"]): d for d in r.denials if d.get("protocol") == "file"}
    assert set(files) == {("read", f"{data}/in.txt"), ("create", str(out))}, r.denials
    assert {d["rule"] for d in files.values()} == {"landlock"}
    assert files[("create", str(out))]["suggest"]["flag"] == f"-w {out}"
    assert sb._conf.landlock_log  # the trampoline asked Landlock to log; nothing routed
    # A refusal of another, unrelated Landlock domain (a sandbox without explain) is
    # never attributed to this one.
    r = sandbox().run(["cat", f"{data}/in.txt"], timeout=30)
    assert r.denials == []
    # Each run's domains are forgotten after it (found by review: they were kept, and the
    # sessions with them).
    import time
    from sandlock.supervisor import landlock_audit
    time.sleep(0.8)
    assert landlock_audit._watched == {} and landlock_audit._domains == {}
