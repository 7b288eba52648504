"""COW fork: `Sandbox(init_fn=..., work_fn=...).fork(n)` and `reducer.reduce(cmd, clones)`.

The init process is a fork of the calling Python process that confines itself with the
sandbox's policy (process group, capabilities, NO_NEW_PRIVS, Landlock, the seccomp deny
list) before running any user code, closes every fd it inherited except its pipes, runs
`init_fn()` once, and then forks `n` clones. Each clone is a copy-on-write copy of that
confined process (memory shared until written), runs `work_fn(clone_id)` with CLONE_ID in
its environment and its stdout on its own pipe to the parent, and exits.

Invariants:
- No user code runs before the confinement is complete; a step that fails ends the init
  process (exit 70) before init_fn, and fork() raises with the step's name.
- Clones inherit the confinement (Landlock, seccomp, capabilities are per task and kept
  across fork) and nothing but their own pipe, stdin (/dev/null) and stderr.
- Policies that need the supervisor (host or UDP rules, HTTP rules, policy_fn, a
  copy-on-write workdir, unix socket grants) are refused: clones run without one. So are
  unix sockets (Landlock does not cover pathname-socket connects) unless
  net_allow_unix=["*"], and metadata calls (chmod & co.), which Landlock does not cover.
"""

from __future__ import annotations

import ctypes
import gc
import io
import os
import resource
import select
import selectors
import signal
import sys
import threading
import time
import traceback

from ._kernel import caps
from ._kernel.seccomp import load_filter
from .errors import PolicyError, SandlockError

INIT_FAILED = 70
_SECBITS_SANDBOX = 0x2F  # as the exec trampoline: NOROOT, NO_SETUID_FIXUP, KEEP_CAPS locked
_PR_SET_SECUREBITS, _PR_CAPBSET_DROP, _PR_CAP_AMBIENT, _AMBIENT_CLEAR_ALL = 28, 24, 47, 4


class Clone:
    """One clone: its id and pid; after ForkResult.wait(), its stdout and exit code."""

    def __init__(self, clone_id: int, pid: int, fd: int):
        self.id, self.pid, self.fd = clone_id, pid, fd
        self.stdout: bytes | None = None
        self.exit_code: int | None = None

    def __repr__(self):
        return f"Clone(id={self.id}, pid={self.pid}, exit_code={self.exit_code})"


class ForkResult:
    """The clones of one fork(): `pids`, len(), indexing (a Clone), wait(), kill()."""

    def __init__(self, init_pid: int, clones: list[Clone], status, fork_seconds: float,
                 early: bytes = b""):
        self.init_pid = init_pid
        self.clones = clones
        self.pids = [c.pid for c in clones]
        self.fork_seconds = fork_seconds  # the init process's time to fork every clone
        self._status = status             # the init process's report pipe (file)
        self._early = early               # report lines read with the fork report
        self._done = False
        self._killed = False

    def __len__(self):
        return len(self.clones)

    def __getitem__(self, i) -> Clone:
        return self.clones[i]

    def __iter__(self):
        return iter(self.clones)

    def kill(self) -> None:
        """Kill the init process and every clone (one process group)."""
        self._killed = True
        try:
            os.killpg(self.init_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def wait(self, timeout: float | None = None) -> "ForkResult":
        """Read every clone's stdout to the end and collect exit codes; past `timeout`
        every clone is killed (their exit codes then show the signal)."""
        if self._done:
            return self
        deadline = None if timeout is None else time.monotonic() + timeout
        sel = selectors.DefaultSelector()
        bufs = {}
        for c in self.clones:
            if c.fd >= 0:
                os.set_blocking(c.fd, False)
                sel.register(c.fd, selectors.EVENT_READ, c)
                bufs[c.fd] = bytearray()
        try:
            while bufs:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    self.kill()
                    deadline = None
                for key, _ in sel.select(left):
                    chunk = os.read(key.fd, 65536)
                    if chunk:
                        bufs[key.fd] += chunk
                        continue
                    sel.unregister(key.fd)
                    c = key.data
                    c.stdout = bytes(bufs.pop(key.fd))
                    os.close(c.fd)
                    c.fd = -1
        finally:
            sel.close()
        self._collect()
        return self

    def _collect(self) -> None:
        by_pid = {c.pid: c for c in self.clones}
        for line in self._early.splitlines() + list(self._status):
            parts = line.split()
            if parts[:1] == [b"X"] and len(parts) == 3:
                c = by_pid.get(int(parts[1]))
                if c is not None:
                    st = int(parts[2])
                    c.exit_code = os.waitstatus_to_exitcode(st)
        self._status.close()
        os.waitpid(self.init_pid, 0)
        if self._killed:  # the init process died with them: what it did not report, we killed
            for c in self.clones:
                if c.exit_code is None:
                    c.exit_code = -signal.SIGKILL
        self._done = True

    def close(self) -> None:
        """Kill what still runs and release every pipe."""
        if not self._done:
            self.kill()
            for c in self.clones:
                if c.fd >= 0:
                    os.close(c.fd)
                    c.fd = -1
            self._collect()


def check_policy(policy) -> bool:
    """Refuse what needs the supervisor; True when unix sockets must be refused outright
    (their connects are otherwise checked by the supervisor)."""
    landlock_only = policy.tcp_by_landlock and not policy.udp and not policy.icmp
    unix_grants = "*" not in policy.unix_allow and bool(policy.unix_allow)
    needs = [what for what, on in (
        ("network rules naming hosts, addresses, UDP or ICMP", not landlock_only),
        ("net_allow_unix grants", unix_grants),
        ("HTTP rules", policy.http is not None), ("policy_fn", policy.policy_fn is not None),
        ("a copy-on-write workdir", policy.workspace is not None)) if on]
    if needs:
        raise PolicyError(f"fork(): {needs[0]} need(s) the supervisor, which COW clones run "
                          f"without; use port-only TCP rules and filesystem rules")
    return "*" not in policy.unix_allow


def fork(sandbox, n: int, timeout: float | None = None) -> ForkResult:
    """Run init_fn once confined, then n clones of it running work_fn(clone_id). Returns
    once every clone is forked; past `timeout` (init_fn included) everything is killed."""
    from . import syscall_filter
    from .features import detect
    if not callable(sandbox.work_fn):
        raise PolicyError("fork(): work_fn must be set (a callable taking the clone id)")
    if sandbox.init_fn is not None and not callable(sandbox.init_fn):
        raise PolicyError("fork(): init_fn must be callable")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise PolicyError(f"fork(): n must be a positive integer, got {n!r}")
    policy = sandbox.policy
    deny_unix = check_policy(policy)
    conf = sandbox._confinement()
    bpf = syscall_filter.compile_filter(policy.deny_syscalls, supervised=False,
                                        deny_inet=detect().landlock_abi < 4,
                                        deny_unix=deny_unix)
    pipes = []
    status_r, status_w = os.pipe2(os.O_CLOEXEC)
    try:
        for _ in range(n):
            pipes.append(os.pipe2(os.O_CLOEXEC))
    except OSError as e:
        for r, w in pipes:
            os.close(r)
            os.close(w)
        os.close(status_r)
        os.close(status_w)
        raise SandlockError(f"fork({n}): cannot create the clones' pipes: {e.strerror} "
                            f"(raise RLIMIT_NOFILE)") from None
    base = max(max(int(x) for x in os.listdir("/proc/self/fd")), status_w) + 1
    _ensure_nofile(base + n + 1)
    _forkloop()
    import warnings
    with warnings.catch_warnings():  # 3.12+ warns about fork() beside threads; the child
        warnings.simplefilter("ignore", DeprecationWarning)  # touches none of theirs
        pid = os.fork()
    if pid == 0:  # the init process: never returns
        _init_main(conf, bpf, sandbox.init_fn, sandbox.work_fn, n, pipes, status_w, status_r,
                   base)
    os.close(status_w)
    for _, w in pipes:
        os.close(w)
    status = os.fdopen(status_r, "rb")
    pids: dict[int, int] = {}
    fork_ns = 0
    line = b""
    for line in _lines(status_r, timeout):
        parts = line.split()
        if parts[:1] == [b"P"]:
            pids[int(parts[1])] = int(parts[2])
        elif parts[:1] == [b"F"]:
            fork_ns = int(parts[1])
            break
        elif parts[:1] == [b"E"]:
            break
    if len(pids) != n:
        msg = line.decode(errors="replace")[2:].strip() if line.startswith(b"E") else \
            "the init process ended early" if line != b"timeout" else \
            f"init_fn and the forks did not complete within {timeout}s"
        for r, _ in pipes:
            os.close(r)
        status.close()
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
        raise SandlockError(f"fork({n}): {msg}")
    clones = [Clone(i, pids[i], pipes[i][0]) for i in range(n)]
    return ForkResult(pid, clones, status, fork_ns / 1e9, _pushback.pop(status_r, b""))


def _lines(fd: int, timeout: float | None):
    """Lines from the init process's report until F or E (bounded by `timeout`); the rest
    stays in the pipe for ForkResult. Yields b"timeout" when time runs out."""
    deadline = None if timeout is None else time.monotonic() + timeout
    buf = b""
    while True:
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line[:1] in (b"F", b"E") and buf:
                _pushback[fd] = buf  # exit reports already read: kept for wait()
            yield line
            if line[:1] in (b"F", b"E"):
                return
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            yield b"timeout"
            return
        if not select.select([fd], [], [], left)[0]:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return
        buf += chunk


_pushback: dict[int, bytes] = {}


def _ensure_nofile(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            raise SandlockError(f"fork(): needs {need} file descriptors, the hard limit is "
                                f"{hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def _confine_self(conf, bpf: bytes) -> str | None:
    """Apply the sandbox's confinement to this (single-threaded) process, as the exec
    trampoline does for run(). Returns the failing step, or None."""
    try:
        os.setpgid(0, 0)  # the clones' group: ForkResult.kill() ends them all
    except OSError:
        return "setpgid"
    for res, soft, hard in conf.rlimits:
        resource.setrlimit(res, (soft, hard))
    if conf.cap_sets is not None:
        if caps.prctl_errno(_PR_SET_SECUREBITS, _SECBITS_SANDBOX) < 0:
            return "securebits"
        for cap in range(conf.cap_last + 1):
            if not conf.keep_caps & (1 << cap) and caps.prctl_errno(_PR_CAPBSET_DROP, cap) < 0:
                return "bounding set"
        if caps.capset_errno(conf.cap_sets) != 0:
            return "capset"
    if caps.prctl_errno(_PR_CAP_AMBIENT, _AMBIENT_CLEAR_ALL) < 0:
        return "ambient capabilities"
    if caps.prctl_errno(caps.PR_SET_NO_NEW_PRIVS, 1) < 0:
        return "no_new_privs"
    if conf.ruleset is not None and conf.ruleset.restrict_self_errno() < 0:
        return "landlock"
    if load_filter(bpf) < 0:
        return "seccomp"
    return None


def _init_main(conf, bpf, init_fn, work_fn, n, pipes, status_w, status_r, base):
    code = INIT_FAILED
    try:
        os.close(status_r)
        for r, _ in pipes:
            os.close(r)
        for i, (_, w) in enumerate(pipes):  # the clones' pipes, contiguous from `base`
            os.dup2(w, base + i, inheritable=False)
        os.dup2(status_w, base + n, inheritable=False)
        status = base + n
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        failed = _confine_self(conf, bpf)
        if failed is not None:
            os.write(status, f"E confinement failed at {failed}\n".encode())
            os._exit(INIT_FAILED)
        os.closerange(3, base)  # nothing else of the parent's stays open
        if init_fn is not None:
            init_fn()
        sys.stdout.flush() if sys.stdout else None
        # Everything init_fn built becomes permanent for the collector: a clone's GC then
        # never walks (and so never copies) those pages.
        gc.collect()
        gc.freeze()
        t0 = time.perf_counter_ns()
        i, pids = _fork_all(n)
        if i >= 0:
            _clone_main(i, base, n, work_fn)
        os.closerange(base, base + n)  # the clones hold their own ends now
        report = [b"P %d %d\n" % (k, pid) for k, pid in enumerate(pids)]
        spent = time.perf_counter_ns() - t0
        _write_all(status, b"".join(report) + b"F %d\n" % spent)
        for _ in range(n):
            pid, st = os.wait()
            _write_all(status, b"X %d %d\n" % (pid, st))
        code = 0
    except BaseException:
        try:
            msg = traceback.format_exc().strip().splitlines()[-1]
            os.write(base + n, f"E init_fn failed: {msg}\n".encode())
            traceback.print_exc()
        except BaseException:
            pass
    finally:
        os._exit(code)


FORKLOOP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_libexec",
                        "libsandlock-fork.so")


_loaded: list = []


def _forkloop():
    """The C loop, loaded in the caller before the init process confines itself (Landlock
    would refuse to map it afterwards); None when it was not built."""
    if not _loaded:
        _loaded.append(ctypes.CDLL(FORKLOOP, use_errno=True) if os.path.exists(FORKLOOP)
                       else None)
    return _loaded[0]


def _fork_all(n: int) -> tuple[int, list[int]]:
    """Fork n clones: (clone index, []) in a clone, (-1, pids) in the init process. The
    forks bypass Python's at-fork machinery: safe here, as the init process never starts a
    thread and a clone only runs work_fn and exits. With the C loop (make helper) nothing
    runs between two forks; without it, a Python loop does the same, slower."""
    pids = (ctypes.c_int * n)()
    forked = ctypes.c_int(0)
    lib = _forkloop()
    if lib is not None:
        i = lib.sandlock_fork_clones(n, pids, ctypes.byref(forked))
        if i >= 0:
            return i, []
    else:
        libc = ctypes.CDLL(None, use_errno=True)
        for k in range(n):
            pid = libc.fork()
            if pid == 0:
                return k, []
            if pid < 0:
                break
            pids[k] = pid
            forked.value = k + 1
    if forked.value != n:
        raise OSError(ctypes.get_errno(), f"fork failed after {forked.value} clones")
    return -1, list(pids)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _clone_main(i: int, base: int, n: int, work_fn) -> None:
    code = 1
    try:
        os.dup2(base + i, 1)
        os.closerange(base, base + n + 1)
        os.environ["CLONE_ID"] = str(i)
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=False)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True)
        work_fn(i)
        sys.stdout.flush()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        try:
            sys.stdout.flush()
        except BaseException:
            pass
    except BaseException:
        try:
            traceback.print_exc()
        except BaseException:
            pass
    finally:
        os._exit(code)


def reduce(reducer, cmd, clones: ForkResult, timeout: float | None = None):
    """Feed every clone's stdout (in clone order, streamed) to `cmd` under `reducer`."""
    from .sandbox import StdioMode
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        proc = reducer.popen(cmd, stdin=r, stdout=StdioMode.PIPED, stderr=StdioMode.PIPED)
    finally:
        os.close(r)

    def pump():
        broken = False
        for c in clones:
            while c.fd >= 0:
                chunk = os.read(c.fd, 65536)
                if not chunk:
                    os.close(c.fd)
                    c.fd = -1
                    break
                if not broken:
                    try:
                        _write_all(w, chunk)
                    except BrokenPipeError:
                        broken = True  # the reducer stopped reading: drain the clones
        os.close(w)
    t = threading.Thread(target=pump, name="sandlock-reduce", daemon=True)
    t.start()
    with proc:
        result = proc.communicate(timeout=timeout)
    t.join(timeout=5)
    if t.is_alive():
        clones.kill()
        t.join()
    clones._collect()
    return result
