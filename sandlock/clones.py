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
- Everything the init process reports is untrusted (init_fn runs beside the report
  socket): lines are parsed within bounds, only pipes' read ends are taken as outputs,
  and the report is read while the outputs are, so the init process never blocks on it.
- Policies that need the supervisor (host or UDP rules, HTTP rules, policy_fn, a
  copy-on-write workdir, unix socket grants) are refused: clones run without one. So are
  unix sockets (Landlock does not cover pathname-socket connects) unless
  net_allow_unix=["*"], and metadata calls (chmod & co.), which Landlock does not cover.
"""

from __future__ import annotations

import array
import ctypes
import fcntl
import gc
import io
import os
import resource
import select
import selectors
import signal
import socket
import stat
import sys
import threading
import time
import traceback

from . import libexec
from ._kernel import caps, hugepages, procstat
from ._kernel.seccomp import load_filter
from .errors import PolicyError, SandlockError

INIT_FAILED = 70
_GRACE = 5.0  # after a kill, how long pipes and the report get to reach EOF
_SECBITS_SANDBOX = 0x2F  # as the exec trampoline: NOROOT, NO_SETUID_FIXUP, KEEP_CAPS locked
_PR_SET_SECUREBITS, _PR_CAPBSET_DROP, _PR_CAP_AMBIENT, _AMBIENT_CLEAR_ALL = 28, 24, 47, 4
_PR_SET_DUMPABLE = 4
_MAX_FD = 2**31 - 1


class Clone:
    """One clone: its id and pid; after ForkResult.wait(), its stdout and exit code."""

    def __init__(self, clone_id: int, pid: int, fd: int):
        self.id, self.pid, self.fd = clone_id, pid, fd
        self.stdout: bytes | None = None
        self.exit_code: int | None = None

    def __repr__(self):
        return f"Clone(id={self.id}, pid={self.pid}, exit_code={self.exit_code})"


class _Report:
    """The caller's end of the init process's report socket (SOCK_SEQPACKET: one record
    per send, whole lines): "P id pid" per clone, with the clone's stdout read end attached
    (SCM_RIGHTS, in line order), "F ns" once all are forked, "X pid status" per exit,
    "E message" on failure. Read with a deadline (poll: fd numbers may exceed select's
    limit). Lines that do not parse are ignored; an fd not claimed by a P line of its own
    record is closed at once (init_fn runs in the init process and may send anything)."""

    RECORD = 65536
    ANCILLARY = socket.CMSG_SPACE(253 * 4)  # SCM_MAX_FD

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.eof = False

    def record(self) -> list[tuple[bytes, int | None]]:
        """The next record's (line, fd or None) pairs, waiting for it; [] at EOF. Only a
        P line gets an fd, and only a pipe's read end: any other fd is closed here. The
        caller owns every fd it is given."""
        data, anc, _, _ = self.sock.recvmsg(self.RECORD, self.ANCILLARY,
                                            socket.MSG_CMSG_CLOEXEC)
        fds = []
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds += array.array("i", payload[:len(payload) - len(payload) % 4])
        if not data and not fds:
            self.eof = True
            return []
        out = []
        try:
            for line in data.split(b"\n")[:-1]:  # a record holds whole lines
                fd = fds.pop(0) if line.startswith(b"P ") and fds else None
                if fd is not None and not _pipe_read_end(fd):
                    os.close(fd)  # wait() relies on EOF once the group is killed
                    fd = None
                out.append((line, fd))
        finally:
            for fd in fds:
                os.close(fd)
        return out or [(b"", None)]

    def lines(self, deadline: float | None):
        """(line, fd or None) until EOF; yields (None, None) when the deadline passes.
        The consumer owns every fd it is given."""
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN)
        while not self.eof:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                yield None, None
                return
            if not poller.poll(None if left is None else max(1, int(left * 1000))):
                continue
            pending = self.record()
            try:
                while pending:
                    yield pending.pop(0)
            finally:
                for _, fd in pending:
                    if fd is not None:
                        os.close(fd)

    def close(self):
        self.sock.close()


def _ints(parts, count):
    """`count` integers after the tag, each within int64 (the init process's lines are
    untrusted: init_fn runs beside the report socket); None otherwise."""
    try:
        vals = [int(x) for x in parts[1:1 + count]] if len(parts) == count + 1 else None
    except ValueError:
        return None
    return vals if vals is not None and all(-2**63 <= v < 2**63 for v in vals) else None


def _pipe_read_end(fd: int) -> bool:
    try:
        return (stat.S_ISFIFO(os.fstat(fd).st_mode)
                and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY)
    except OSError:
        return False


class ForkResult:
    """The clones of one fork(): `pids`, len(), indexing (a Clone), wait(), kill(), and
    `stderr` (every clone's and init_fn's standard error, after wait() or reduce())."""

    def __init__(self, init_pid: int, clones: list[Clone], report: _Report, err_fd: int,
                 fork_seconds: float):
        self.init_pid = init_pid
        self.clones = clones
        self.pids = [c.pid for c in clones]
        self.fork_seconds = fork_seconds  # the init process's time to fork every clone
        self.stderr = b""
        self._report = report
        self._err_fd = err_fd
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
        if not self._done:
            try:
                os.killpg(self.init_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def wait(self, timeout: float | None = None) -> "ForkResult":
        """Read every clone's stdout (and the shared stderr) to the end and collect exit
        codes; at `timeout` everything still running is killed. Returns self."""
        if self._done:
            return self
        deadline = None if timeout is None else time.monotonic() + timeout
        fds = {c.fd: c for c in self.clones if c.fd >= 0}
        if self._err_fd >= 0:
            fds[self._err_fd] = None
        bufs = {fd: bytearray() for fd in fds}
        by_pid = {c.pid: c for c in self.clones}
        sel = selectors.DefaultSelector()
        for fd in fds:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        # The report is read meanwhile: its exit lines would otherwise fill the socket,
        # and the init process (so the shared stderr) would never end.
        report = self._report.sock.fileno()
        sel.register(report, selectors.EVENT_READ)
        killed_at = None
        try:
            while bufs:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    if killed_at is not None:  # EOF did not come: stop reading
                        for fd in list(bufs):
                            self._take(fds, fd, bufs.pop(fd))
                        break
                    self.kill()
                    killed_at = time.monotonic()
                    deadline = killed_at + _GRACE  # killed: the pipes reach EOF now
                    continue
                for key, _ in sel.select(left):
                    if key.fd == report:
                        for line, fd in self._report.record():
                            if fd is not None:  # no P line is expected any more
                                os.close(fd)
                            self._exit_line(line, by_pid)
                        if self._report.eof:
                            sel.unregister(report)
                        continue
                    try:
                        chunk = os.read(key.fd, 65536)
                    except BlockingIOError:  # init_fn sent one pipe twice: read by the other
                        continue
                    if chunk:
                        bufs[key.fd] += chunk
                        continue
                    sel.unregister(key.fd)
                    self._take(fds, key.fd, bufs.pop(key.fd))
        finally:
            sel.close()
        self._collect(None if self._killed else deadline)
        return self

    def _take(self, fds, fd, data) -> None:
        """A clone's (or the shared stderr's) output is complete: keep it, close the fd."""
        os.close(fd)
        c = fds[fd]
        if c is None:
            self.stderr, self._err_fd = bytes(data), -1
        else:
            c.stdout, c.fd = bytes(data), -1

    def _collect(self, deadline: float | None) -> None:
        """Exit codes from the report until the init process ends (killing everything at
        the deadline); then whatever is left in the group is killed, as run() does."""
        by_pid = {c.pid: c for c in self.clones}
        if deadline is None and self._killed:
            deadline = time.monotonic() + _GRACE  # dead: the report ends at once
        for line, fd in self._report.lines(deadline):
            if fd is not None:  # no P line is expected any more
                os.close(fd)
            if line is None:  # the deadline: kill, then read what is left until EOF
                self.kill()
                for line2, fd2 in self._report.lines(time.monotonic() + _GRACE):
                    if fd2 is not None:
                        os.close(fd2)
                    self._exit_line(line2, by_pid)
                break
            self._exit_line(line, by_pid)
        self._report.close()
        try:  # the init process is a zombie at worst: its group id cannot be reused yet
            os.killpg(self.init_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(self.init_pid, 0)
        if self._killed:  # the init process died with them: what it did not report, we killed
            for c in self.clones:
                if c.exit_code is None:
                    c.exit_code = -signal.SIGKILL
        self._done = True

    @staticmethod
    def _exit_line(line, by_pid) -> None:
        parts = (line or b"").split()
        if parts[:1] == [b"X"]:
            vals = _ints(parts, 2)
            c = by_pid.get(vals[0]) if vals else None
            if c is not None and c.exit_code is None:
                try:
                    c.exit_code = os.waitstatus_to_exitcode(vals[1])
                except (ValueError, OverflowError):  # not a status the kernel reports
                    c.exit_code = None

    def close(self) -> None:
        """Kill what still runs and release every pipe."""
        if not self._done:
            self.kill()
            for c in self.clones:
                if c.fd >= 0:
                    os.close(c.fd)
                    c.fd = -1
            if self._err_fd >= 0:
                os.close(self._err_fd)
                self._err_fd = -1
            self._collect(None)


def check_policy(policy) -> tuple[bool, bool]:
    """Refuse what needs the supervisor. Returns (deny_unix, deny_listen): unix sockets
    are refused outright unless any path is granted (their connects and sends are otherwise
    checked by the supervisor), and listen() when TCP bind is restricted."""
    landlock_only = policy.tcp_by_landlock and not policy.udp and not policy.icmp
    unix_grants = "*" not in policy.unix_allow and bool(policy.unix_allow)
    needs = [what for what, on in (
        ("network rules naming hosts, addresses, UDP or ICMP", not landlock_only),
        ("net_allow_unix grants", unix_grants),
        ("HTTP rules", policy.http is not None), ("policy_fn", policy.policy_fn is not None),
        ("audit_log", policy.audit_log is not None),
        ("a copy-on-write workdir", policy.workspace is not None)) if on]
    if needs:
        raise PolicyError(f"fork(): {needs[0]} need(s) the supervisor, which COW clones run "
                          f"without; use port-only TCP rules and filesystem rules")
    return "*" not in policy.unix_allow, not policy.tcp_bind.any_port


def fork(sandbox, n: int, timeout: float | None = None) -> ForkResult:
    """Run init_fn once confined, then n clones of it running work_fn(clone_id). Returns
    once every clone is forked; past `timeout` (init_fn included) everything is killed."""
    from . import syscall_filter
    from .features import Protection, detect
    if not callable(sandbox.work_fn):
        raise PolicyError("fork(): work_fn must be set (a callable taking the clone id)")
    if sandbox.init_fn is not None and not callable(sandbox.init_fn):
        raise PolicyError("fork(): init_fn must be callable")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise PolicyError(f"fork(): n must be a positive integer, got {n!r}")
    policy = sandbox.policy
    deny_unix, deny_listen = check_policy(policy)
    conf = sandbox._confinement()
    bpf = syscall_filter.compile_filter(policy.deny_syscalls, supervised=False,
                                        deny_inet=detect().landlock_abi < 4
                                        or Protection.NET_TCP in policy.waived,
                                        deny_unix=deny_unix, deny_listen=deny_listen)
    highest = max(int(x) for x in os.listdir("/proc/self/fd"))
    _ensure_nofile(highest + n + 16)  # the clones' read ends stay here until wait()
    lib = _forkloop()
    report_sock, init_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)  # one stderr for init_fn and every clone
    base = max(max(int(x) for x in os.listdir("/proc/self/fd")), highest) + 1
    for stream in (sys.stdout, sys.stderr):  # nothing buffered is written twice
        try:
            stream.flush()
        except (AttributeError, ValueError, OSError):
            pass
    import warnings
    with warnings.catch_warnings():  # 3.12+ warns about fork() beside threads; the child
        warnings.simplefilter("ignore", DeprecationWarning)  # touches none of theirs
        pid = os.fork()
    if pid == 0:  # the init process: never returns
        _init_main(conf, bpf, policy, sandbox.init_fn, sandbox.work_fn, n, lib,
                   init_sock.fileno(), err_w, base)
    init_sock.close()
    os.close(err_w)
    report = _Report(report_sock)
    outs: dict[int, tuple[int, int]] = {}  # clone id: (pid, stdout read end)
    try:
        fork_ns, failure = _forked(report, n, timeout, outs)
    except BaseException:  # the caller's own failure (KeyboardInterrupt...): end them all
        ForkResult(pid, [Clone(i, *outs.get(i, (-1, -1))) for i in range(n)], report,
                   err_r, 0.0).close()
        raise
    clones = [Clone(i, *outs.get(i, (-1, -1))) for i in range(n)]
    result = ForkResult(pid, clones, report, err_r, (fork_ns or 0) / 1e9)
    if failure is not None:
        result.close()
        raise SandlockError(f"fork({n}): {failure}")
    return result


def _forked(report: _Report, n: int, timeout: float | None, outs: dict):
    """Read the init process's report until every clone is forked: (ns spent, None), or
    (None, why not). Fills `outs` with each clone's pid and stdout read end."""
    deadline = None if timeout is None else time.monotonic() + timeout
    fork_ns, failure = None, None
    for line, fd in report.lines(deadline):
        parts = (line or b"").split()
        if line is None:
            failure = f"init_fn and the forks did not complete within {timeout}s"
        elif parts[:1] == [b"P"]:
            vals = _ints(parts, 2)
            if (vals is None or fd is None or not 0 <= vals[0] < n or vals[1] <= 0
                    or vals[0] in outs):
                failure = f"the init process sent a malformed report: {line[:80]!r}"
            else:
                outs[vals[0]] = (vals[1], fd)
                continue
        elif parts[:1] == [b"F"]:
            vals = _ints(parts, 1)
            fork_ns = vals[0] if vals and vals[0] >= 0 else 0
            if len(outs) < n:  # the fork loop sends F after its n P lines: an F before
                if fd is not None:  # them is init_fn's (a thread it left), not the end
                    os.close(fd)
                continue
        elif parts[:1] == [b"E"]:
            failure = line.decode(errors="replace")[2:].strip()
        if fd is not None:
            os.close(fd)
        if line is None or parts[:1] in ([b"P"], [b"F"], [b"E"]):
            break
    if failure is None and (fork_ns is None or len(outs) != n):
        failure = "the init process ended early"
    return fork_ns, failure


def _ensure_nofile(need: int) -> None:
    """Raise the soft RLIMIT_NOFILE to `need` if the hard limit allows (it stays raised:
    the caller holds the clones' pipes until wait() or reduce())."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            raise SandlockError(f"fork(): needs {need} file descriptors, the hard limit is "
                                f"{hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def _drop_privileges(conf) -> str | None:
    """The first half of the sandbox's confinement of this (single-threaded) process, as
    the exec trampoline does for run(): its own group, limits, capabilities. Returns the
    failing step, or None."""
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
    return None


def _restrict(conf, bpf: bytes) -> str | None:
    """The second half: not dumpable, NO_NEW_PRIVS, Landlock, the seccomp deny list.
    Returns the failing step, or None."""
    # Not dumpable: no clone (same uid, same Landlock domain) may open another's or the init
    # process's /proc/PID/fd entries (their pipes) or /proc/PID/mem.
    if caps.prctl_errno(_PR_SET_DUMPABLE, 0) < 0:
        return "dumpable"
    if caps.prctl_errno(caps.PR_SET_NO_NEW_PRIVS, 1) < 0:
        return "no_new_privs"
    if conf.ruleset is not None and conf.ruleset.restrict_self_errno() < 0:
        return "landlock"
    if load_filter(bpf) < 0:
        return "seccomp"
    return None


def _unmap_shared_writable() -> None:
    """Memory the caller shares with others for writing (MAP_SHARED files, shared memory)
    is not inherited: the confinement could not stop writes through it."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    with open("/proc/self/maps") as f:
        regions = [line.split()[:2] for line in f]
    for span, perms in regions:
        if perms[1] == "w" and perms[3] == "s":
            lo, hi = (int(x, 16) for x in span.split("-"))
            libc.munmap(lo, hi - lo)


_SELF_FILES = ("maps", "pagemap", "stat")  # hugepages; the thread count (_fork_all)


def _open_self_files(at: int) -> tuple[int, ...] | None:
    """/proc/self/{maps,pagemap,stat} at fds `at`, `at + 1`, `at + 2`, opened after the
    capabilities are gone (pagemap then shows no physical frame numbers) and before the
    process is made not dumpable (its /proc files then belong to root) or Landlock may
    forbid them. They describe only this process, which init_fn could learn anyway; all
    are closed before any clone is forked. None without /proc: the fds are closed then."""
    placed = 0
    try:
        for k, name in enumerate(_SELF_FILES):  # one at a time: a later open
            fd = os.open(f"/proc/self/{name}", os.O_RDONLY | os.O_CLOEXEC)  # never lands
            if fd != at + k:                                                # on the first
                try:
                    os.dup2(fd, at + k, inheritable=False)  # EBADF above a low max_open_files
                finally:
                    os.close(fd)
            placed += 1
    except OSError:
        pass
    if placed == len(_SELF_FILES):
        return tuple(range(at, at + placed))
    for k in range(len(_SELF_FILES)):  # whatever else held these numbers is not ours
        try:
            os.close(at + k)
        except OSError:
            pass
    return None


def _apply_process_fields(policy) -> None:
    """cwd, env and clean_env, as run() applies them to the program."""
    from .sandbox import _CLEAN_ENV_KEEP, _DEFAULT_PATH  # the same as run()'s
    if policy.clean_env:
        keep = {k.decode() for k in _CLEAN_ENV_KEEP}
        for k in list(os.environ):
            if k not in keep:
                del os.environ[k]
        os.environ.setdefault("PATH", _DEFAULT_PATH.decode())
    for k, v in policy.env:
        os.environ[k] = v
    if policy.cwd:
        os.chdir(policy.cwd)


def _init_main(conf, bpf, policy, init_fn, work_fn, n, lib, sock, err_w, base):
    code = INIT_FAILED
    forking = False
    me = os.getpid()  # a clone reaching the handlers below must never kill its siblings
    stage = "setting up"
    report = base  # the report socket: with 0, 1 and 2, all the init process keeps open
    try:
        os.dup2(sock, report, inheritable=False)
        null = os.open("/dev/null", os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(err_w, 2)  # one stderr for init_fn and every clone, read by wait()
        try:
            os.fstat(1)  # the caller's stdout, init_fn's too; the clones' is replaced
        except OSError:
            os.dup2(null, 1)
        _unmap_shared_writable()
        _apply_process_fields(policy)
        own = None
        failed = _drop_privileges(conf)
        if failed is None:
            own = _open_self_files(report + 1)
            failed = _restrict(conf, bpf)
        if failed is not None:
            os.write(report, f"E confinement failed at {failed}\n".encode())
            os._exit(INIT_FAILED)
        os.closerange(3, report)  # nothing else of the caller's stays open, even an fd
        # (and whatever another thread of the caller opened during the fork)
        os.closerange(report + 1 + len(_SELF_FILES), _MAX_FD)
        # init_fn prints to fds 1 and 2 (the caller's sys.stdout may wrap an fd closed above)
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True)
        stage = "init_fn"
        if init_fn is not None:
            init_fn()
        stage = "forking the clones"
        for stream in (sys.stdout, sys.stderr):  # init_fn's output: os._exit flushes nothing
            try:
                stream.flush()
            except (AttributeError, ValueError, OSError):
                pass
        try:
            os.fstat(1)
        except OSError:  # init_fn closed it: keep the number taken (no clone's pipe gets 1)
            os.dup2(2, 1)
        # What a clone needs is built here, once: every page a clone writes before
        # work_fn is a copy-on-write fault. fd 1 is each clone's own pipe by then.
        stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=False)
        os.environ["CLONE_ID"] = ""
        # Everything init_fn built becomes permanent for the collector: a clone's GC then
        # never walks (and so never copies) those pages. Freed heap goes back to the
        # kernel: each clone copies, and tears down, page tables for what is mapped.
        gc.collect()
        gc.freeze()
        _trim_heap()
        threads = None
        if own is not None:  # what init_fn built: one page-table entry per huge page
            hugepages.collapse_own(own[0], own[1])
            threads = _thread_count(own[2])
            for fd in own:
                os.close(fd)
        t0 = time.perf_counter_ns()
        forking = True
        i, pids = _fork_all(n, lib, report, threads)
        if i >= 0:
            _clone_main(i, work_fn, stdout)
        _write_all(report, b"F %d\n" % (time.perf_counter_ns() - t0))
        _reap(pids, lib, report)  # the clones only: children init_fn started are not reported
        code = 0
    except BaseException:
        if os.getpid() != me:  # a clone, before its work_fn ran: its report fd is closed
            os._exit(INIT_FAILED)
        try:
            msg = traceback.format_exc().strip().splitlines()[-1]
            os.write(report, f"E {stage} failed: {msg}\n".encode())
            traceback.print_exc()
        except BaseException:
            pass
    finally:
        if code != 0 and forking and os.getpid() == me:  # a fork or the report failed
            try:                   # (the caller may be gone): no clone outlives the init
                os.killpg(0, signal.SIGKILL)
            except BaseException:
                pass
        os._exit(code)


FORKLOOP = libexec.path("libsandlock-fork.so")
FORKLOOP_VERSION = 4  # sandlock_forkloop_version() of the forkloop.c this module speaks to

_loaded: list = []


def _forkloop():
    """The C loop, loaded in the caller before the init process confines itself (Landlock
    would refuse to map it afterwards); None when it was not built or is stale."""
    if not _loaded:
        lib = libexec.load(FORKLOOP, "sandlock_forkloop_version", FORKLOOP_VERSION,
                           "COW fork uses its slower Python loop")
        if lib is not None:
            # The forks run holding the GIL, as os.fork() does: no other thread of the
            # init process runs Python meanwhile, and each clone's GIL is its own.
            lib.fork_clones = ctypes.PyDLL(FORKLOOP, use_errno=True).sandlock_fork_clones
        _loaded.append(lib)
    return _loaded[0]


def _trim_heap() -> None:
    """Return the C heap's free pages to the kernel (glibc; elsewhere a no-op)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _thread_count(stat_fd: int) -> int | None:
    """Threads of this process (/proc/self/stat, field 20), C ones included."""
    try:
        return int(procstat.fields(os.pread(stat_fd, 4096, 0))[procstat.NUM_THREADS])
    except (OSError, ValueError, IndexError):
        return None


def _fork_all(n: int, lib, report: int,
              threads: int | None = None) -> tuple[int, list[int]]:
    """Fork n clones, each with its stdout on a fresh pipe whose read end goes to the
    caller over `report`: (clone index, []) in a clone, (-1, pids) in the init process.
    With the C loop (make helper) nothing runs between two forks; without it, a Python
    loop does the same, slower (one record per clone)."""
    pids = (ctypes.c_int * n)()
    forked = ctypes.c_int(0)
    # Python's own fork protocol (what os.fork() does around one fork: locks taken before
    # and remade in the child, the at-fork hooks, other threads' states dropped) is needed
    # only if init_fn left threads behind (counted by the kernel: a C thread waiting for
    # the GIL has no Python frame yet): one of them could hold a lock a clone needs. It
    # costs 160 copy-on-write faults per clone. A single-threaded init process (the usual
    # case) skips it; its clones only reseed `random`, the one hook with visible state.
    protocol = (threads or 1) > 1 or len(sys._current_frames()) > 1
    if lib is not None:
        after_child = None
        if protocol:
            after_child = ctypes.cast(ctypes.pythonapi.PyOS_AfterFork_Child, ctypes.c_void_p)
            ctypes.pythonapi.PyOS_BeforeFork()
        i = -2
        try:
            i = lib.fork_clones(n, report, pids, ctypes.byref(forked), after_child)
        finally:
            if protocol and i < 0:  # the init process (each clone ran after_child in C)
                ctypes.pythonapi.PyOS_AfterFork_Parent()
    else:
        i = _fork_all_python(n, report, pids, forked, protocol)
    if i >= 0:  # a clone: never back into the init process's error paths
        if not protocol and "random" in sys.modules:
            try:
                sys.modules["random"].seed()
            except BaseException:
                os._exit(71)
        return i, []
    if i != -1:
        raise OSError(ctypes.get_errno(), f"forking or reporting failed after "
                                          f"{forked.value} of {n} clones")
    return -1, list(pids)


def _fork_all_python(n, report, pids, forked, protocol) -> int:
    """The loop without the C library: with Python's fork protocol (threads left by
    init_fn) each fork is os.fork(), which runs it; without, a bare fork holding the GIL."""
    bare = ctypes.PyDLL(None, use_errno=True).fork
    sock = socket.socket(fileno=os.dup(report))
    try:
        for k in range(n):
            r, w = os.pipe2(os.O_CLOEXEC)
            try:
                pid = os.fork() if protocol else bare()
            except OSError:
                pid = -1
            if pid == 0:
                try:
                    if w != 1:  # fd 1 is normally taken, so neither end is 1
                        os.dup2(w, 1)
                    for fd in {r, w, report, sock.detach()} - {1}:
                        os.close(fd)
                except BaseException:
                    os._exit(71)
                return k
            os.close(w)
            try:
                if pid < 0:
                    return -2
                pids[k] = pid
                forked.value = k + 1
                sock.sendmsg([b"P %d %d\n" % (k, pid)],
                             [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [r]))])
            finally:
                os.close(r)
        return -1
    finally:
        if sock.fileno() >= 0:
            sock.close()


def _reap(pids: list[int], lib, report: int) -> None:
    if lib is not None:
        arr = (ctypes.c_int * len(pids))(*pids)
        if lib.sandlock_reap(len(pids), arr, report) < 0:
            raise OSError(ctypes.get_errno(), "waiting for the clones failed")
        return
    waiting = set(pids)
    while waiting:
        pid, st = os.wait()
        if pid in waiting:
            waiting.discard(pid)
            _write_all(report, b"X %d %d\n" % (pid, st))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _clone_main(i: int, work_fn, stdout) -> None:
    code = 1
    try:
        os.environ["CLONE_ID"] = str(i)
        sys.stdout = stdout
        work_fn(i)
        stdout.flush()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        try:
            if not isinstance(e.code, (int, type(None))):
                print(e.code, file=sys.stderr)  # as Python prints sys.exit("message")
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
    """Feed every clone's stdout (in clone order, streamed) to `cmd` under `reducer`; the
    clones' shared stderr is collected into clones.stderr. Bounded by `timeout`."""
    from .sandbox import StdioMode
    if clones._done or any(c.fd < 0 for c in clones):
        raise SandlockError("reduce(): these clones' outputs were already consumed "
                            "(wait() or an earlier reduce())")
    deadline = None if timeout is None else time.monotonic() + timeout
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        proc = reducer.popen(cmd, stdin=r, stdout=StdioMode.PIPED, stderr=StdioMode.PIPED)
    except BaseException:
        os.close(w)
        clones.close()
        raise
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

    def drain_stderr():
        chunks = []
        while chunk := os.read(clones._err_fd, 65536):
            chunks.append(chunk)
        os.close(clones._err_fd)
        clones._err_fd = -1
        clones.stderr = b"".join(chunks)

    def drain_report():  # exit lines would otherwise fill the socket (see wait())
        by_pid = {c.pid: c for c in clones}
        while not clones._report.eof:
            try:
                lines = clones._report.record()
            except OSError:
                return
            for line, fd in lines:
                if fd is not None:
                    os.close(fd)
                clones._exit_line(line, by_pid)
    threads = [threading.Thread(target=f, name="sandlock-reduce", daemon=True)
               for f in (pump, drain_stderr, drain_report)]
    for t in threads:
        t.start()
    with proc:
        result = proc.communicate(timeout=timeout)
    for t in threads:
        t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() for t in threads):
        clones.kill()  # a clone still holds its pipe past the deadline
        for t in threads:
            t.join(_GRACE)
        if any(t.is_alive() for t in threads):
            # The threads still read the clones' fds and the report: they are left to
            # them. The init process is dead (killed) and reaped; nothing else is reused.
            os.waitpid(clones.init_pid, 0)
            clones._done = True
            raise SandlockError("reduce(): the clones' pipes did not close after they were "
                                "killed (a process outside their group holds one)")
    clones._collect(None if deadline is None else max(deadline, time.monotonic()))
    return result
