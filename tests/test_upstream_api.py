"""Upstream Sandlock's SDK names and behaviours (#17), written against the public names
only: the exports and the exception hierarchy, Process.wait returning a Result,
parse_ports, min_landlock_abi, and Protection waivers (Sandbox(disable=[...]))."""

import errno
import os
import signal
import subprocess
import sys
import time

import pytest

import sandlock
from sandlock import (BranchConflictError, BranchError, ChildError, ConfinementError,
                      ExitReason, ForkError, KernelFeatureError, LandlockUnavailableError,
                      MemoryProtectError, NotifError, PolicyContext, PolicyError, Protection,
                      Result, SandboxError, SandlockError, SeccompError, StdioMode,
                      SyscallEvent, min_landlock_abi, parse_ports)
from conftest import PY, run_py, sandbox

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Ours first, and whatever path the suite itself runs with (the unprivileged rerun's).
PYTHONPATH = os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p])

# Upstream 0.9.0's __all__, less what is out of scope (checkpoints, images) or not built yet.
UPSTREAM_NAMES = [
    "Sandbox", "Stage", "Pipeline", "Result", "ExitReason", "SyscallEvent", "PolicyContext",
    "BranchAction", "parse_ports", "StdioMode", "Process", "Protection",
    "landlock_abi_version", "min_landlock_abi", "confine", "SandlockError", "PolicyError",
    "SandboxError", "ForkError", "ConfinementError", "LandlockUnavailableError",
    "SeccompError", "ChildError", "MemoryProtectError", "NotifError", "BranchError",
    "BranchConflictError"]


def test_upstream_names_are_exported():
    for name in UPSTREAM_NAMES:
        assert name in sandlock.__all__, name
        assert getattr(sandlock, name) is not None
    r = subprocess.run([sys.executable, "-c", "from sandlock import *; print(sorted(dir()))"],
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=PYTHONPATH))
    assert all(f"'{n}'" in r.stdout for n in UPSTREAM_NAMES), r.stderr


def test_the_exception_hierarchy_is_upstreams():
    parents = {PolicyError: SandlockError, SandboxError: SandlockError,
               ForkError: SandboxError, ConfinementError: SandboxError,
               LandlockUnavailableError: ConfinementError, SeccompError: ConfinementError,
               NotifError: SeccompError, ChildError: SandboxError, BranchError: SandboxError,
               BranchConflictError: BranchError, MemoryProtectError: SandlockError}
    for child, parent in parents.items():
        assert issubclass(child, parent), (child, parent)
    assert issubclass(KernelFeatureError, ConfinementError)  # ours, where it fits
    assert issubclass(PolicyError, ValueError)
    with pytest.raises(SandlockError):
        sandbox(max_memory="lots")


def test_syscall_event_and_policy_context_as_a_callback_sees_them():
    seen = []

    def fn(event, ctx):
        assert isinstance(event, SyscallEvent) and isinstance(ctx, PolicyContext)
        seen.append((event.syscall, event.argv_contains("marker")))
    r = sandbox(policy_fn=fn, policy_fn_events=["exec"]).run(["/bin/echo", "marker"])
    assert r.success and ("execve", True) in seen
    event = SyscallEvent(syscall="connect", category="network", pid=1, parent_pid=0,
                         host="example.com", port=443)
    assert not event.argv_contains("x") and event.denied is False


def test_process_wait_returns_a_result():
    p = sandbox().popen(["sh", "-c", "echo out; exit 3"], stdout=StdioMode.PIPED)
    r = p.wait()
    assert isinstance(r, Result)
    assert (r.success, r.exit_code, r.reason) == (False, 3, ExitReason.EXITED)
    assert r.stdout == b"" and p.stdout.read() == b"out\n"  # the stream is the caller's
    assert p.wait() is r or p.wait() == r  # a second call: the same outcome
    p.close()
    p = sandbox().popen(["cat"], stdin=StdioMode.PIPED, stdout=StdioMode.PIPED)
    p.stdin.write(b"to the end")
    r = p.wait(timeout=20)  # its piped stdin is closed first: cat can end
    assert r.success and p.stdout.read() == b"to the end"
    p.close()


def test_process_wait_with_a_timeout_ends_the_sandbox():
    tag = f"waittimeout-{os.getpid()}"
    p = sandbox().popen([PY, "-c", "import os, time\nos.fork()\ntime.sleep(60)", tag])
    t0 = time.monotonic()
    r = p.wait(timeout=0.5)
    assert r.reason == ExitReason.TIMEOUT and not r.success
    assert time.monotonic() - t0 < 5
    left = subprocess.run(["pgrep", "-f", tag], capture_output=True, text=True).stdout
    assert left.strip() == ""  # both processes are gone, not left running
    p.close()
    p = sandbox().popen(["sleep", "0.2"])  # the control: it ends by itself in time
    r = p.wait(timeout=20)
    assert r.success and r.reason == ExitReason.EXITED
    p.close()


def test_wait_code_keeps_the_subprocess_spelling():
    p = sandbox().popen(["sh", "-c", "sleep 0.5; exit 7"])
    with pytest.raises(TimeoutError):
        p.wait_code(timeout=0.05)
    assert p.is_running  # still running after the TimeoutError
    assert p.wait_code(timeout=20) == 7
    p.close()


def test_parse_ports():
    assert parse_ports([80, "8000-8002", "443,9000-9001", " 22 "]) == [
        22, 80, 443, 8000, 8001, 8002, 9000, 9001]
    assert parse_ports([]) == []
    for bad in (["x"], ["90-80"], [70000], ["*"], [True], ["1,,2"]):
        with pytest.raises(ValueError):
            parse_ports(bad)


def test_min_landlock_abi_and_protections():
    assert min_landlock_abi() == 6
    assert [p.name for p in Protection] == ["FS_REFER", "FS_TRUNCATE", "NET_TCP",
                                            "FS_IOCTL_DEV", "SIGNAL_SCOPE",
                                            "ABSTRACT_UNIX_SOCKET_SCOPE"]
    assert [p.min_abi for p in Protection] == [2, 3, 4, 5, 6, 6]
    with pytest.raises(PolicyError, match="disable: 'NOPE' is not a protection"):
        sandbox(disable=["NOPE"])


def test_waiving_truncate(tmp_path):
    target = tmp_path / "data"
    target.write_text("keep me")
    code = (f"import os\ntry:\n    os.truncate({str(target)!r}, 0)\n    print('truncated')\n"
            f"except OSError as e:\n    print(e.errno)")
    r = run_py(sandbox(fs_readable=[str(tmp_path)]), code)
    assert r.stdout == b"%d\n" % errno.EACCES and target.read_text() == "keep me"
    r = run_py(sandbox(fs_readable=[str(tmp_path)], disable=[Protection.FS_TRUNCATE]), code)
    assert r.stdout == b"truncated\n" and target.read_text() == ""


def test_waiving_the_signal_scope():
    victim = subprocess.Popen(["sleep", "60"])
    try:
        code = (f"import os, signal\ntry:\n    os.kill({victim.pid}, signal.SIGTERM)\n"
                f"    print('sent')\nexcept OSError as e:\n    print(e.errno)")
        r = run_py(sandbox(), code)
        assert r.stdout == b"%d\n" % errno.EPERM
        time.sleep(0.2)
        assert victim.poll() is None  # refused, and it did not die
        r = run_py(sandbox(disable=[Protection.SIGNAL_SCOPE]), code)
        assert r.stdout == b"sent\n"
        assert victim.wait(timeout=10) == -signal.SIGTERM
    finally:
        victim.kill()
        victim.wait()


def test_waiving_refer_refuses_moves_across_directories(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    code = (f"import os\nopen({str(tmp_path / 'a' / 'f')!r}, 'w').close()\ntry:\n"
            f"    os.rename({str(tmp_path / 'a' / 'f')!r}, {str(tmp_path / 'b' / 'f')!r})\n"
            f"    print('moved')\nexcept OSError as e:\n    print(e.errno)")
    r = run_py(sandbox(fs_writable=[str(tmp_path)]), code)
    assert r.stdout == b"moved\n" and (tmp_path / "b" / "f").exists()
    os.unlink(tmp_path / "b" / "f")
    r = run_py(sandbox(fs_writable=[str(tmp_path)], disable=[Protection.FS_REFER]), code)
    assert r.stdout == b"%d\n" % errno.EXDEV and not (tmp_path / "b" / "f").exists()


def test_waiving_tcp_never_opens_tcp(tcp_server):
    srv = tcp_server()
    code = ("import socket, sys\ntry:\n    socket.create_connection(('127.0.0.1', "
            "int(sys.argv[1])), timeout=5)\n    print('connected')\n"
            "except OSError as e:\n    print('refused', e.errno)")
    r = run_py(sandbox(net_allow=[f"127.0.0.1:{srv.port}"]), code, str(srv.port))
    assert r.stdout == b"connected\n", r.stderr  # the control
    r = run_py(sandbox(disable=[Protection.NET_TCP]), code, str(srv.port))
    assert r.stdout.startswith(b"refused"), r.stdout
    with pytest.raises(PolicyError, match="NET_TCP"):
        sandbox(disable=[Protection.NET_TCP],
                net_allow=[f"127.0.0.1:{srv.port}"]).run(["true"])


def test_a_kernel_without_a_protection_names_it_and_a_waiver_lifts_it():
    # Landlock ABI 5 emulated (SANDLOCK_TEST_LANDLOCK_ABI can only lower it): no IPC scopes.
    code = ("import sandlock, sys\nsys.path.insert(0, 'tests')\nfrom conftest import sandbox\n"
            "try:\n    sandbox().run(['true'])\n"
            "except sandlock.LandlockUnavailableError as e:\n    print('unavailable')\n"
            "r = sandbox(disable=[sandlock.Protection.SIGNAL_SCOPE,\n"
            "                     sandlock.Protection.ABSTRACT_UNIX_SOCKET_SCOPE]).run(['true'])\n"
            "print(r.success)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=PYTHONPATH, SANDLOCK_TEST_LANDLOCK_ABI="5"),
                       timeout=60)
    assert r.stdout.split() == ["unavailable", "True"], r.stderr[-2000:]


def _workdir(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "keep.txt").write_text("original\n")
    return work


def test_sandbox_commit_and_abort_after_a_deferred_run(tmp_path):
    from sandlock import BranchAction
    work = _workdir(tmp_path)
    sb = sandbox(workdir=str(work), cwd=str(work), on_exit=BranchAction.DEFER)
    with pytest.raises(SandlockError, match="nothing to commit"):
        sb.commit()  # no run yet
    r = sb.run(["sh", "-c", "echo changed > keep.txt; echo new > new.txt"])
    assert r.success and r.pending
    assert (work / "keep.txt").read_text() == "original\n" and not (work / "new.txt").exists()
    sb.commit()
    assert (work / "keep.txt").read_text() == "changed\n" and (work / "new.txt").exists()
    with pytest.raises(SandlockError, match="nothing to commit"):
        sb.commit()  # once only
    r = sb.run(["sh", "-c", "rm new.txt"])
    assert r.pending
    sb.abort()
    assert (work / "new.txt").read_text() == "new\n"  # discarded: the file is still there
    with pytest.raises(SandlockError, match="nothing to abort"):
        sb.abort()


def test_dry_run_lists_the_changes_and_discards_them(tmp_path):
    work = _workdir(tmp_path)
    sb = sandbox(workdir=str(work), cwd=str(work))  # on_exit COMMIT: a plain run commits
    r = sb.dry_run(["sh", "-c", "echo changed > keep.txt; echo new > new.txt"], timeout=30)
    assert r.success
    assert sorted(c.path for c in r.changes) == ["keep.txt", "new.txt"]
    assert (work / "keep.txt").read_text() == "original\n" and not (work / "new.txt").exists()
    r = sb.run(["sh", "-c", "echo new > new.txt"])  # the control: the same sandbox commits
    assert r.success and (work / "new.txt").read_text() == "new\n"
    with pytest.raises(PolicyError, match="dry_run needs a workdir"):
        sandbox().dry_run(["true"])


def test_lifecycle_create_start_wait(tmp_path):
    marker = tmp_path / "ran"
    sb = sandbox(fs_writable=[str(tmp_path)])
    sb.create(["sh", "-c", f"touch {marker}; echo out; echo err >&2; exit 4"])
    assert sb.pid is not None and sb.is_running
    time.sleep(0.3)
    assert not marker.exists()  # confined, its pid known, and none of it has run
    with open(f"/proc/{sb.pid}/status") as f:
        assert "NoNewPrivs:\t1" in f.read()  # already confined
    with pytest.raises(SandlockError, match="already running"):
        sb.create(["true"])
    sb.start()
    r = sb.wait(timeout=30)
    assert (r.exit_code, r.stdout, r.stderr) == (4, b"out\n", b"err\n") and marker.exists()
    assert sb.pid is None and not sb.is_running
    with pytest.raises(SandlockError, match="nothing to wait for"):
        sb.wait()


def test_lifecycle_spawn_pause_resume_kill_and_a_context_manager(tmp_path):
    counter = tmp_path / "n"
    # Written whole (rename), so that a read never sees a truncated file.
    code = (f"import os, time\nn = 0\nwhile True:\n    n += 1\n"
            f"    open({str(counter)!r} + '.t', 'w').write(str(n))\n"
            f"    os.replace({str(counter)!r} + '.t', {str(counter)!r})\n    time.sleep(0.01)")
    with sandbox(fs_writable=[str(tmp_path)]) as sb:
        sb.spawn([PY, "-c", code])
        time.sleep(0.5)
        sb.pause()
        time.sleep(0.1)
        paused = counter.read_text()
        time.sleep(0.3)
        assert counter.read_text() == paused  # stopped
        sb.resume()
        time.sleep(0.3)
        assert int(counter.read_text()) > int(paused)  # running again
        sb.kill()
        r = sb.wait(timeout=10)
        assert r.reason == ExitReason.KILLED
        sb.spawn(["sleep", "60"])
        pid = sb.pid
    time.sleep(0.1)  # leaving the context ended it
    assert not os.path.exists(f"/proc/{pid}") or \
        open(f"/proc/{pid}/stat").read().split()[2] == "Z"


def test_lifecycle_output_never_stalls_the_program():
    sb = sandbox()
    sb.spawn(["sh", "-c", "head -c 1000000 /dev/zero; echo done >&2"])
    time.sleep(1)
    assert not sb.is_running  # it wrote a megabyte without anyone waiting on it yet
    r = sb.wait(timeout=10)
    assert len(r.stdout) == 1000000 and r.stderr == b"done\n"


def test_a_created_process_that_is_never_started_never_runs(tmp_path):
    marker = tmp_path / "ran"
    with sandbox(fs_writable=[str(tmp_path)]) as sb:
        sb.create(["touch", str(marker)])
        pid = sb.pid
    time.sleep(0.2)
    assert not marker.exists()
    assert not os.path.exists(f"/proc/{pid}") or \
        open(f"/proc/{pid}/stat").read().split()[2] == "Z"


def test_change_entry_and_renames_upstream_shape(tmp_path):
    from sandlock import Change, DryRunResult, Entry, renames
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "old.txt").write_text("moved content\n")
    (wd / "keep.txt").write_text("same\n")
    (wd / "edit.txt").write_text("one\n")
    sb = sandbox(workdir=str(wd), fs_writable=[str(wd)], cwd=str(wd))
    r = sb.dry_run(["/bin/sh", "-c", "mv old.txt new.txt; touch keep.txt; echo two > edit.txt;"
                                     " ln -s keep.txt link"], timeout=30)
    assert isinstance(r, DryRunResult) and r.success, r.stderr
    by = {c.path: c for c in r.changes}
    assert all(isinstance(c, Change) for c in r.changes)
    assert {p: c.kind for p, c in by.items()} == {"old.txt": "D", "new.txt": "A",
                                                   "keep.txt": "M", "edit.txt": "M",
                                                   "link": "A"}, r.changes
    assert by["keep.txt"].content_unchanged and not by["edit.txt"].content_unchanged
    assert not by["edit.txt"].type_changed
    e = by["new.txt"].after
    assert isinstance(e, Entry) and e.kind == "file" and e.size == len("moved content\n")
    import hashlib
    assert e.digest == hashlib.sha256(b"moved content\n").digest() and e.target is None
    assert by["link"].after.target == "keep.txt" and by["link"].after.digest is None
    assert renames(r.changes) == [("old.txt", "new.txt")]
    assert str(by["old.txt"]) == "D  old.txt"
    assert sorted(os.listdir(wd)) == ["edit.txt", "keep.txt", "old.txt"]  # discarded
