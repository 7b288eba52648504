"""Custom syscall handlers (sandlock.handler, upstream's ABI): real sandboxed programs, the
handlers running in the supervisor. The policy decides first; a handler can only narrow."""

from __future__ import annotations

import errno
import os
import signal

import pytest

from conftest import PY, sandbox
from sandlock import ExitReason
from sandlock.handler import ExceptionPolicy, Handler, NotifAction
from sandlock.presets import AuditPathsHandler, PathDenyHandler


class Deny(Handler):
    """Refuse opens of one path; count what it saw."""
    on_exception = ExceptionPolicy.KILL

    def __init__(self, target: str, err: int = errno.EACCES):
        self.target, self.err, self.seen = target, err, []

    def handle(self, ctx):
        path = ctx.read_path()
        self.seen.append(path)
        return NotifAction.errno(self.err) if path == self.target else NotifAction.continue_()


def _files(tmp_path):
    for name in ("a.txt", "b.txt"):
        (tmp_path / name).write_text(name)
    os.chmod(tmp_path, 0o755)
    return str(tmp_path / "a.txt"), str(tmp_path / "b.txt")


OPEN_BOTH = ("import sys\nfor p in sys.argv[1:]:\n    try:\n        print(open(p).read(), flush=True)\n"
             "    except OSError as e:\n        print('err', e.errno)\n")


def test_a_handler_refuses_one_open_and_lets_the_rest_through(tmp_path):
    a, b = _files(tmp_path)
    h = Deny(a)
    sb = sandbox(fs_readable=[str(tmp_path)])
    r = sb.run_with_handlers([PY, "-c", OPEN_BOTH, a, b], [("openat", h)], timeout=30)
    assert r.stdout.decode().split() == ["err", str(errno.EACCES), "b.txt"], r.stderr
    assert a in h.seen and b in h.seen
    # Positive control: without the handler both open.
    r = sb.run([PY, "-c", OPEN_BOTH, a, b], timeout=30)
    assert r.stdout.decode().split() == ["a.txt", "b.txt"]


def test_the_policy_decides_first(tmp_path):
    """A call the filter refuses never reaches a handler, and continue_() cannot make a
    refused open pass (Landlock still decides)."""
    a, _ = _files(tmp_path)

    class Allow(Handler):
        calls = 0

        def handle(self, ctx):
            Allow.calls += 1
            return NotifAction.continue_()
    sb = sandbox()  # tmp_path not granted
    r = sb.run_with_handlers([PY, "-c", OPEN_BOTH + "import ctypes\nprint('ptrace',"
                              " ctypes.CDLL(None).ptrace(0, 0, 0, 0))\n", a],
                             [("openat", Allow()), ("ptrace", Allow())], timeout=30)
    out = r.stdout.decode().split()
    assert out[:2] == ["err", str(errno.EACCES)] and out[2:] == ["ptrace", "-1"], r.stderr
    assert Allow.calls > 0  # it saw the opens, and continued them


def test_returns_inject_bytes_and_async_handlers(tmp_path):
    class FakePid(Handler):
        def handle(self, ctx):
            return NotifAction.returns(777)

    class Virtual(Handler):
        async def handle(self, ctx):  # run to completion on a worker
            if ctx.read_path() == "/virtual/motd":
                return NotifAction.inject_bytes(b"from the supervisor\n")
            return NotifAction.continue_()
    sb = sandbox()
    code = ("import os\nprint(os.getpid())\nprint(open('/virtual/motd').read(), end='')\n"
            "print(open('/etc/hostname').read() != '')\n")
    r = sb.run_with_handlers([PY, "-c", code], [("getpid", FakePid()),
                                                ("openat", Virtual())], timeout=30)
    assert r.stdout.decode().splitlines() == ["777", "from the supervisor", "True"], r.stderr


@pytest.mark.parametrize("policy, expect", [(ExceptionPolicy.DENY_EIO, "err 5"),
                                            (ExceptionPolicy.CONTINUE, "a.txt"),
                                            (ExceptionPolicy.KILL, None)])
def test_a_failing_handler_gets_its_exception_policy(tmp_path, policy, expect):
    a, _ = _files(tmp_path)

    class Broken(Handler):
        on_exception = policy

        def handle(self, ctx):
            if ctx.read_path() == a:
                raise RuntimeError("boom")
            return NotifAction.continue_()
    r = sandbox(fs_readable=[str(tmp_path)]).run_with_handlers(
        [PY, "-c", OPEN_BOTH, a], [("openat", Broken())], timeout=30)
    if expect is None:
        assert not r.success and r.reason in (ExitReason.SIGNALED, ExitReason.KILLED), r
        assert r.signal == signal.SIGKILL
    else:
        assert " ".join(r.stdout.decode().split()) == expect, r.stderr
    assert any("boom" in d.get("reason", "") for d in r.denials)


def test_builtin_handling_still_applies_after_continue(tmp_path):
    """With a copy-on-write workdir the opens are the supervisor's own: after the
    handler continues, the write lands in the layer (the workdir is untouched)."""
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "f.txt").write_text("old\n")
    seen = []
    audit = AuditPathsHandler(lambda p, ctx: seen.append(p))
    from sandlock import BranchAction
    sb = sandbox(workdir=str(wd), fs_writable=[str(wd)], cwd=str(wd),
                 on_exit=BranchAction.ABORT)
    r = sb.run_with_handlers(["/bin/sh", "-c", "echo new > f.txt; cat f.txt"],
                             [("openat", audit)], timeout=30)
    assert r.stdout == b"new\n" and (wd / "f.txt").read_text() == "old\n", r.stderr
    assert any(p and p.endswith("f.txt") for p in seen)


def test_presets_and_kill(tmp_path):
    a, b = _files(tmp_path)
    deny = PathDenyHandler([str(tmp_path / "a.*")], errno=errno.EPERM)
    r = sandbox(fs_readable=[str(tmp_path)]).run_with_handlers(
        [PY, "-c", OPEN_BOTH, a, b], [("openat", deny)], timeout=30)
    assert r.stdout.decode().split() == ["err", str(errno.EPERM), "b.txt"], r.stderr

    class KillOnB(Handler):
        def handle(self, ctx):
            return (NotifAction.kill(signal.SIGKILL) if ctx.read_path() == b
                    else NotifAction.continue_())
    r = sandbox(fs_readable=[str(tmp_path)]).run_with_handlers(
        [PY, "-c", OPEN_BOTH, a, b], [("openat", KillOnB())], timeout=30)
    assert r.stdout.decode().split() == ["a.txt"] and not r.success


def test_bad_registrations_are_refused_up_front():
    sb = sandbox()
    with pytest.raises(ValueError, match="definitely_not_a_syscall"):
        sb.run_with_handlers(["/bin/true"], [("definitely_not_a_syscall", Deny("x"))])
    with pytest.raises(TypeError):
        sb.run_with_handlers(["/bin/true"], [("openat", object())])
    assert sb.run_with_handlers(["/bin/true"], []).success


def test_an_injected_fd_stays_the_handlers(tmp_path):
    """inject_fd_send sends a duplicate: the handler's fd stays open and can answer again
    (found by review: it was closed after the first answer, and a later answer with that
    number sent whatever the host process had opened since)."""
    src = tmp_path / "served.txt"
    src.write_text("served\n")

    class Serve(Handler):
        def __init__(self):
            self.fd = os.open(src, os.O_RDONLY)

        def handle(self, ctx):
            if ctx.read_path() == "/virtual/file":
                os.lseek(self.fd, 0, os.SEEK_SET)
                return NotifAction.inject_fd_send(self.fd)
            return NotifAction.continue_()
    h = Serve()
    try:
        code = "for _ in range(3):\n    print(open('/virtual/file').read(), end='')\n"
        r = sandbox().run_with_handlers([PY, "-c", code], [("openat", h)], timeout=30)
        assert r.stdout == b"served\n" * 3, r.stderr
        os.fstat(h.fd)  # still open, still the handler's
    finally:
        os.close(h.fd)
