"""The user-facing API: `Sandbox` (a dataclass of policy fields), `Process`, `confine()`.

A Sandbox validates its fields when constructed or changed (errors name the field) and
builds its kernel objects once, on first use; every run after that reuses them.
"""

from __future__ import annotations

import dataclasses
import enum
import io
import os
import selectors
import signal
import socket
import threading
import time
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Mapping, Sequence

from . import confinement as _confinement
from . import launch, process_tree, syscall_filter
from ._kernel.pidfd import pidfd_send_signal
from .errors import PolicyError, SandlockError
from .fs_rules import is_beneath
from .policy import Policy, build_policy
from .result import ExitReason, Result
from .supervisor.loop import Session, supervisor

_CLEAN_ENV_KEEP = (b"PATH", b"HOME", b"TERM", b"LANG", b"LC_ALL", b"TZ", b"USER", b"LOGNAME",
                   b"SHELL")
_DEFAULT_PATH = b"/usr/local/bin:/usr/bin:/bin"
_DRAIN_AFTER_KILL = 2.0
# How long the root may take to end the tree once asked (sandlock-init.c: its kill rounds
# are bounded well below this); past it, this process kills the tree and the root itself.
_ROOT_GRACE = 10.0


class BranchAction(enum.Enum):
    COMMIT = "commit"
    ABORT = "abort"
    KEEP = "keep"
    DEFER = "defer"


class StdioMode(enum.Enum):
    INHERIT = "inherit"
    PIPED = "piped"
    NULL = "null"


@dataclass
class Sandbox:
    fs_readable: Sequence[str] | None = None
    fs_writable: Sequence[str] | None = None
    fs_denied: Sequence[str] | None = None
    workdir: str | None = None
    cwd: str | None = None
    fs_storage: str | None = None
    max_disk: Any = None
    on_exit: BranchAction = BranchAction.COMMIT
    on_error: BranchAction = BranchAction.ABORT
    workspace_backend: str | None = None
    private_tmp: bool | None = None
    protect_user_files: bool = False
    extra_deny_syscalls: Sequence[str] | None = None
    extra_allow_syscalls: Sequence[str] | None = None
    net_allow: Sequence[str] | None = None
    net_deny: Sequence[str] | None = None
    net_allow_bind: Sequence[Any] | None = None
    net_deny_bind: Sequence[Any] | None = None
    port_remap: Any = None
    net_allow_unix: Sequence[str] | None = None
    net_allow_private: bool = False
    dns_servers: Sequence[str] | None = None
    audit_log: str | None = None
    audit_allowed: bool = False
    http_allow: Sequence[str] | None = None
    http_deny: Sequence[str] | None = None
    http_ports: Sequence[int] | None = None
    http_upgrades: Sequence[str] | None = None
    http_raw: Sequence[str] | None = None
    http_ca: str | None = None
    http_key: str | None = None
    http_inject_ca: Any = None
    http_ca_out: str | None = None
    http_upstream_ca: str | None = None
    max_memory: Any = None
    max_processes: int | None = None
    max_open_files: int | None = None
    max_cpu: int | None = None
    cpu_cores: Any = None
    num_cpus: int | None = None
    random_seed: int | None = None
    time_start: Any = None
    no_randomize_memory: bool = False
    no_huge_pages: bool = False
    deterministic_dirs: bool = False
    clean_env: bool = False
    env: Mapping[str, str] | None = None
    uid: int | None = None
    gid: int | None = None
    no_coredump: bool = False
    allow_degraded: bool = False
    disable: Sequence[Any] | None = None
    keep_capabilities: Sequence[str] | None = None
    name: str | None = None
    policy_fn: Callable | None = None
    policy_fn_timeout: float = 2.0
    policy_fn_events: Sequence[str] | None = None
    init_fn: Callable | None = None
    work_fn: Callable | None = None
    _policy: Policy | None = field(default=None, init=False, repr=False, compare=False)
    _conf: Any = field(default=None, init=False, repr=False, compare=False)
    _net: Any = field(default=None, init=False, repr=False, compare=False)
    _audit: Any = field(default=None, init=False, repr=False, compare=False)
    _default_timeout: float | None = field(default=None, init=False, repr=False,
                                           compare=False)
    _tmp: Any = field(default=None, init=False, repr=False, compare=False)
    _run_policy: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        self._policy = self._validate()

    def __setattr__(self, name, value):
        if name.startswith("_") or "_policy" not in self.__dict__:
            object.__setattr__(self, name, value)
            return
        # A changed field: validate now (errors at the boundary), rebuild lazily. A rejected
        # value leaves the sandbox exactly as it was.
        old = getattr(self, name)
        object.__setattr__(self, name, value)
        try:
            policy = self._validate()
        except BaseException:
            object.__setattr__(self, name, old)
            raise
        if self._net is not None:
            self._net.stop()
        if self._tmp is not None:
            self._tmp.close()
        object.__setattr__(self, "_tmp", None)
        object.__setattr__(self, "_run_policy", None)
        object.__setattr__(self, "_conf", None)
        object.__setattr__(self, "_net", None)
        object.__setattr__(self, "_audit", None)
        object.__setattr__(self, "_policy", policy)

    @classmethod
    def from_policy(cls, path: str, **overrides) -> "Sandbox":
        """A Sandbox from a YAML policy file (see sandlock.policy_file); keyword arguments
        add to it (lists are extended). `filesystem.system` (default true) grants the
        read-only system view of `sandlock run`."""
        from .policy_file import load_policy, merge_fields, system_fields
        loaded = load_policy(path)
        fields_ = merge_fields(system_fields() if loaded.system else {}, loaded.fields)
        sb = cls(**merge_fields(fields_, overrides))
        object.__setattr__(sb, "_default_timeout", loaded.timeout)
        return sb

    def _validate(self) -> Policy:
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        deny = syscall_filter.resolve_deny_list(self.extra_deny_syscalls,
                                                self.extra_allow_syscalls)
        _action(self.on_exit, "on_exit")
        _action(self.on_error, "on_error")
        return build_policy(values, deny)

    @property
    def policy(self) -> Policy:
        return self._policy

    def _confinement(self) -> _confinement.Confinement:
        conf = self._conf
        if conf is None:
            with _build_lock:
                if self._conf is None:
                    policy = self._policy
                    if policy.private_tmp:  # its root exists before Landlock grants it
                        from dataclasses import replace
                        from .private_tmp import PrivateTmp
                        tmp = PrivateTmp()
                        object.__setattr__(self, "_tmp", tmp)
                        policy = replace(policy, fs_writable=policy.fs_writable + (tmp.root,))
                    object.__setattr__(self, "_run_policy", policy)
                    object.__setattr__(self, "_conf", _confinement.build(policy))
                conf = self._conf
        return conf

    def _audit_log(self):
        """The AuditLog of this sandbox's policy (None without audit_log), opened once."""
        policy = self._policy
        if not policy.audit_log:
            return None
        with _build_lock:
            if self._audit is None:
                from netpolicy.audit import AuditLog
                try:
                    audit = AuditLog(policy.audit_log, policy.audit_allowed)
                except OSError as e:
                    raise PolicyError(f"audit_log: {policy.audit_log}: {e.strerror}") from None
                object.__setattr__(self, "_audit", audit)
            return self._audit

    def _net_state(self):
        """The supervisor's network state for this sandbox (resolved names, pins, audit),
        built once and shared by its runs; None when Landlock alone decides."""
        policy = self._policy
        conf = self._confinement()
        if not policy.net_supervised or not conf.supervised or not conf.net_supervised:
            return None
        audit = self._audit_log()
        with _build_lock:
            if self._net is None:
                from .supervisor.netstate import NetState
                net = NetState(policy, audit)
                try:
                    net.start()
                except Exception as e:
                    raise SandlockError(f"net_allow: {e}") from None
                object.__setattr__(self, "_net", net)
            return self._net

    @property
    def audit(self):
        """The AuditLog of this sandbox (None without audit_log)."""
        net = self._net_state()
        return net.audit if net is not None else self._audit_log()

    @property
    def notices(self) -> tuple[str, ...]:
        """What this system does differently for this policy without losing protection
        (e.g. UDP refused where the supervisor cannot act on sockets, a workspace backend
        that fell back, and why)."""
        ws = self._policy.workspace
        extra = (ws.notice,) if ws is not None and getattr(ws, "notice", None) else ()
        return self._confinement().notices + extra

    @property
    def degradations(self) -> tuple[str, ...]:
        """Protections missing on this kernel that allow_degraded accepted (empty normally)."""
        return self._confinement().degradations

    # --- running -------------------------------------------------------------------------

    def popen(self, cmd: Sequence[str], stdin=StdioMode.INHERIT, stdout=StdioMode.INHERIT,
              stderr=StdioMode.INHERIT) -> "Process":
        """Start `cmd` confined and return at once."""
        argv = _argv(cmd)
        conf = self._confinement()
        policy = self._run_policy  # with its private TMPDIR's root, if any
        net = self._net_state()
        extra = {}
        tmpdir = None
        if self._tmp is not None and "TMPDIR" not in dict(policy.env):
            tmpdir = self._tmp.new_run()
            extra[b"TMPDIR"] = os.fsencode(tmpdir)
        if net is not None and net.dns_enabled:
            # glibc's resolver then speaks DNS over TCP, which the supervisor hands to its
            # own responder; UDP queries are filtered one by one.
            opts = os.environb.get(b"RES_OPTIONS", b"") if not policy.clean_env else b""
            extra[b"RES_OPTIONS"] = (opts + b" use-vc").strip()
        if net is not None and net.ca_bundle is not None:
            # Programs inside trust our CA without manual steps (http_inject_ca).
            bundle, cert = (os.fsencode(p) for p in net.ca_bundle)
            for var in (b"SSL_CERT_FILE", b"REQUESTS_CA_BUNDLE", b"CURL_CA_BUNDLE",
                        b"GIT_SSL_CAINFO", b"PIP_CERT"):
                extra[var] = bundle
            extra[b"NODE_EXTRA_CA_CERTS"] = cert
        env = _environment(policy, extra)
        path = env.get("PATH") if env is os.environ else os.fsdecode(env.get(b"PATH", b""))
        exe = _find_executable(argv[0], path or os.fsdecode(_DEFAULT_PATH), policy.cwd)
        runtime = None
        if policy.policy_fn is not None:
            from .supervisor.runtime import Runtime
            runtime = Runtime(policy.policy_fn, policy.policy_fn_timeout,
                              policy.runtime_events, self._audit_log(), policy.name)
        session = Session(policy, policy.name, net, runtime)
        if policy.limits is not None and policy.limits.processes:
            from .supervisor.forks import ForkBudget
            session.forks = ForkBudget(policy.limits.processes)
        workspace = _Workspace.start(policy, self.on_exit, self.on_error, session)
        session.overlay = workspace is not None and workspace.overlay is not None
        session.own_mounts = session.overlay or conf.protect_fd >= 0
        ruleset_ready = None
        if conf.guard:
            from .supervisor.confined import Confined
            from .supervisor.guard import Protection

            def ruleset_ready(fd):
                threads = Confined(fd, policy.keep_caps)
                session.protection = Protection(policy.protection, conf.guard, threads,
                                                conf.write_roots)
            if conf.ruleset is None and not (workspace is not None and
                                             (workspace.overlay or workspace.run_rules)):
                ruleset_ready(None)
        parent_ends, child_fds, to_close = _stdio(stdin, stdout, stderr)
        try:
            if exe is None:
                raise CommandNotFound(f"{argv[0]}: command not found")
            spawned = launch.spawn(
                conf, os.fsencode(exe), [os.fsencode(a) for a in argv],
                env, policy.cwd, child_fds,
                attach=lambda listener, pid: supervisor().attach(listener, session, pid),
                overlay=workspace.overlay if workspace is not None else None,
                run_rules=workspace.run_rules if workspace is not None else None,
                ruleset_ready=ruleset_ready)
        except BaseException:
            for fd in parent_ends:
                if fd >= 0:
                    os.close(fd)
            if workspace is not None:
                workspace.layer.discard()
            if tmpdir is not None:
                self._tmp.end_run(tmpdir)
            raise
        finally:
            for fd in to_close:
                os.close(fd)
        proc = Process(spawned, session, parent_ends, workspace)
        if runtime is not None:
            runtime.on_limits = proc._lower_limits
        if tmpdir is not None:
            proc._cleanup.append(lambda tmp=self._tmp: tmp.end_run(tmpdir))
        return proc

    def run(self, cmd: Sequence[str], timeout: float | None = None, *,
            input: bytes | None = None) -> Result:
        """Run `cmd` to completion, capturing stdout and stderr.

        `timeout` (seconds) kills the whole process group. stdin is `input`, or empty.
        """
        if timeout is None:
            timeout = self._default_timeout
        try:
            proc = self.popen(cmd, stdin=StdioMode.PIPED if input else StdioMode.NULL,
                              stdout=StdioMode.PIPED, stderr=StdioMode.PIPED)
        except CommandNotFound as e:
            return Result(success=False, exit_code=127, error=str(e))
        with proc:
            return proc.communicate(input=input, timeout=timeout)

    def run_interactive(self, cmd: Sequence[str], timeout: float | None = None) -> Result:
        """Run `cmd` on this process's terminal, in its foreground (sandlock.terminal): it
        reads the terminal, Ctrl-C/Ctrl-Z and window-size changes reach it, a shell inside
        has job control; the terminal is given back when it ends. Output is not captured."""
        if timeout is None:
            timeout = self._default_timeout
        try:
            proc = self.popen(cmd)
        except CommandNotFound as e:
            return Result(success=False, exit_code=127, error=str(e))
        from .terminal import Foreground
        fg = Foreground(proc.root)
        try:
            try:
                proc.wait_code(timeout)
            except TimeoutError:
                proc.time_out()
                proc.wait_code()
        finally:
            fg.restore()
        with proc:
            return proc.communicate()

    def fork(self, n: int, timeout: float | None = None):
        """COW fork: run init_fn once confined, then `n` copy-on-write clones of that
        process, each running work_fn(clone_id) with CLONE_ID set and its stdout on its own
        pipe. Returns a ForkResult (pids, len(), clones by index, wait(), kill())."""
        from .clones import fork
        return fork(self, n, timeout)

    def reduce(self, cmd: Sequence[str], clones, timeout: float | None = None) -> Result:
        """Run `cmd` under this sandbox with every clone's stdout (in clone order, streamed)
        on its stdin; returns its Result once it and the clones have ended."""
        from .clones import reduce
        return reduce(self, _argv(cmd), clones, timeout)

    def cmd(self, argv: Sequence[str]):
        """A pipeline stage: `sb.cmd([...]) | other.cmd([...])`, then `.run(timeout=...)`."""
        from .pipeline import Stage
        return Stage(self, _argv(argv))


_build_lock = threading.Lock()


class CommandNotFound(SandlockError):
    """The command is not on the sandbox's PATH (run() reports it as exit status 127)."""


def _argv(cmd) -> list[str]:
    if isinstance(cmd, (str, bytes)):
        raise TypeError("cmd must be a list of arguments, e.g. ['sh', '-c', 'echo hi']")
    argv = [os.fsdecode(a) for a in cmd]
    if not argv or not argv[0]:
        raise PolicyError("cmd: empty command")
    for i, a in enumerate(argv):
        if "\0" in a:
            raise PolicyError(f"cmd: argument {i} contains a NUL byte")
    return argv


def _environment(policy: Policy, extra: dict[bytes, bytes]):
    """The program's environment. Unchanged, it is os.environ itself (posix_spawn converts
    it in C; copying it in Python costs more than the rest of a run's set-up)."""
    if not (policy.clean_env or policy.env or extra):
        return os.environ
    environ = os.environb
    if policy.clean_env:
        env = {k: environ[k] for k in _CLEAN_ENV_KEEP if k in environ}
        env.setdefault(b"PATH", _DEFAULT_PATH)
    else:
        env = dict(environ)
    for k, v in policy.env:
        env[os.fsencode(k)] = os.fsencode(v)
    env.update(extra)
    return env


def _find_executable(name: str, path: str, cwd: str | None) -> str | None:
    if "/" in name:
        return name if os.path.isabs(name) or cwd is None else os.path.join(cwd, name)
    for directory in path.split(os.pathsep):
        candidate = os.path.join(directory or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _stdio(stdin, stdout, stderr):
    """(parent ends [in, out, err], child fds [0, 1, 2], fds to close after spawn)."""
    parent = [-1, -1, -1]
    child = [-1, -1, -1]
    to_close: list[int] = []
    devnull = -1
    for i, mode in enumerate((stdin, stdout, stderr)):
        if isinstance(mode, int) and not isinstance(mode, bool):
            child[i] = mode  # a caller's fd
        elif mode == StdioMode.PIPED:
            r, w = os.pipe2(os.O_CLOEXEC)
            parent[i], child[i] = (w, r) if i == 0 else (r, w)
            to_close.append(child[i])
        elif mode == StdioMode.NULL:
            if devnull < 0:
                devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
                to_close.append(devnull)
            child[i] = devnull
        elif mode != StdioMode.INHERIT:
            raise TypeError(f"stdio mode must be a StdioMode or an fd, got {mode!r}")
    return parent, tuple(child), to_close


class _Pipe(io.FileIO):
    """The parent end of a PIPED stream as an unbuffered binary file (Process.stdin,
    .stdout, .stderr). It owns the fd: closing it closes the fd once and tells the
    Process, which never closes that number itself afterwards (it may be reused)."""

    def __init__(self, proc: "Process", attr: str, mode: str):
        super().__init__(getattr(proc, attr), mode, closefd=True)
        self._owner = (proc, attr)

    def close(self) -> None:
        if not self.closed:
            proc, attr = self._owner
            setattr(proc, attr, -1)
        super().close()


class _RootWatch:
    """Once the root was asked to end the tree: if it has not ended within _ROOT_GRACE
    (it should always have: sandlock-init.c bounds its kill rounds), every member is
    killed from here, a few rounds (a fork in flight shows up in the next), then the root
    itself, so that nothing waiting for the sandbox can hang. Holds its own duplicate of
    the root's pidfd: the root it signals is always that process, never a reused pid."""

    def __init__(self, pidfd: int, root: int):
        self._fd = os.dup(pidfd)
        self._root = root
        self._lock = threading.Lock()
        self._timer = threading.Timer(_ROOT_GRACE, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        with self._lock:
            if self._fd < 0:
                return
            try:
                if not select_poll(self._fd).poll(0):  # alive: its pid is still its own
                    for _ in range(5):
                        process_tree.signal_members(self._root, signal.SIGKILL)
                        time.sleep(0.01)
                    pidfd_send_signal(self._fd, signal.SIGKILL)
            except OSError:
                pass
            finally:
                os.close(self._fd)
                self._fd = -1

    def cancel(self) -> None:
        self._timer.cancel()
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


class Process:
    """A running sandboxed process. The sandbox is its whole process group: when the main
    process ends, or on kill()/timeout, every process left in the group is killed too."""

    def __init__(self, spawned: launch.Spawned, session: Session, parent_ends,
                 workspace: "_Workspace | None" = None):
        self._workspace = workspace
        self.pid = spawned.pid
        self.root = spawned.root  # sandlock-init.c: keeps and ends the process tree
        self._pidfd = spawned.pidfd  # the root's: it ends as the program ended
        self._control = spawned.control
        self._memory: int | None = None  # max_memory lowered by a policy_fn
        self._exec_error = spawned.exec_error
        self._session = session
        self._stdin_fd, self._stdout_fd, self._stderr_fd = parent_ends
        self._pipes: dict[str, _Pipe] = {}
        self._status: tuple[ExitReason, int, int] | None = None
        self._killed_by_us: ExitReason | None = None
        self._lock = threading.Lock()
        self._cleanup: list = []  # run once every task is gone (its private TMPDIR)
        self._watch: _RootWatch | None = None  # once the root was asked to end the tree
        self._result: Result | None = None  # once ended and reported (wait, communicate)

    # -- lifecycle --

    @property
    def is_running(self) -> bool:
        return self._status is None and not self._exited(0)

    def _exited(self, timeout: float | None) -> bool:
        if self._pidfd < 0:
            return True
        p = select_poll(self._pidfd)
        return bool(p.poll(None if timeout is None else max(0, int(timeout * 1000))))

    def _end(self) -> None:
        """Ask the root to end the whole tree (it stops every member, kills them, reaps
        them, then ends as killed)."""
        if self._status is None and self._pidfd >= 0:
            try:
                pidfd_send_signal(self._pidfd, signal.SIGTERM)
            except OSError:
                pass
            if self._watch is None:
                self._watch = _RootWatch(self._pidfd, self.root)

    def kill(self) -> None:
        self._killed_by_us = self._killed_by_us or ExitReason.KILLED
        self._end()

    def time_out(self) -> None:
        """Kill the whole sandbox because its time is up (reason TIMEOUT), unless it has
        already ended."""
        with self._lock:
            if self._status is None and self._killed_by_us is None and not self._exited(0):
                self._killed_by_us = ExitReason.TIMEOUT
                self._end()

    def pause(self) -> None:
        if self._status is None:
            process_tree.signal_members(self.root, signal.SIGSTOP)

    def resume(self) -> None:
        if self._status is None:
            process_tree.signal_members(self.root, signal.SIGCONT)

    def _reap(self) -> tuple[ExitReason, int, int]:
        """Collect the exit status: the root's, which ends only once every process of the
        sandbox is gone, as the program ended."""
        with self._lock:
            if self._status is None:
                info = os.waitid(os.P_PIDFD, self._pidfd, os.WEXITED)
                if self._watch is not None:
                    self._watch.cancel()
                os.close(self._pidfd)
                self._pidfd = -1
                if info.si_code == os.CLD_EXITED:
                    status = (ExitReason.EXITED, info.si_status, -1)
                else:
                    status = (ExitReason.SIGNALED, -1, info.si_status)
                decided = self._root_reason()
                if decided is not None and self._killed_by_us is None:
                    self._killed_by_us = decided
                if self._killed_by_us is not None:
                    status = (self._killed_by_us,) + status[1:]
                self._status = status
                if self._session.runtime is not None:
                    self._session.runtime.close()
                if self._session.protection is not None:
                    self._session.protection.threads.close()
                for cleanup in self._cleanup:
                    try:
                        cleanup()
                    except OSError:
                        pass
                if self._workspace is not None:
                    self._workspace.finish(self._session, status[0] == ExitReason.EXITED
                                           and status[1] == 0)
            return self._status

    def _lower_limits(self, memory: int | None = None, processes: int | None = None) -> None:
        """A policy_fn's restrict_max_memory / restrict_max_processes (lower only)."""
        if processes is not None:
            if self._session.forks is None:
                raise SandlockError("restrict_max_processes: forks are counted only in a "
                                    "sandbox started with max_processes")
            self._session.forks.lower(processes)
        if memory is not None:
            current = self._session.policy.limits.memory if self._session.policy.limits \
                else None
            memory = min(memory, current or memory, self._memory or memory)
            self._memory = memory
            try:
                self._control.send(b"memory %d" % memory)
            except OSError:
                pass
            import resource
            for pid in process_tree.members(self.root):
                try:  # from the next allocation of each live process
                    soft, hard = resource.prlimit(pid, resource.RLIMIT_DATA)
                    if hard == resource.RLIM_INFINITY or hard > memory:
                        resource.prlimit(pid, resource.RLIMIT_DATA, (memory, memory))
                except OSError:
                    pass

    def _root_reason(self) -> "ExitReason | None":
        """Why the root ended the sandbox itself, if it did: 'M' past max_memory."""
        try:
            data = self._control.recv(16, socket.MSG_DONTWAIT)
        except OSError:
            data = b""
        self._control.close()
        return ExitReason.MEMORY if b"M" in data else None

    def wait(self, timeout: float | None = None) -> Result:
        """Wait for the sandbox to end and return its Result, as upstream Sandlock's
        Process.wait: at `timeout` every process of it is killed and the Result says
        TIMEOUT, so the wait never outlasts it. A piped stdin still open is closed first
        (a program reading to its end can then exit); piped stdout and stderr stay the
        caller's to read, and the Result carries neither. A second call returns the same
        Result. wait_code() is the subprocess-like spelling."""
        if self._result is not None:
            return self._result
        self._close_stdin()
        if self._status is None and not self._exited(timeout):
            self.time_out()
        return self._finish(b"", b"")

    def wait_code(self, timeout: float | None = None) -> int:
        """Wait for exit; returns the exit code (negative signal number if signalled).
        Raises TimeoutError if `timeout` passes first (the process keeps running)."""
        if self._status is None and not self._exited(timeout):
            raise TimeoutError(f"sandboxed process {self.pid} still running after {timeout}s")
        reason, code, sig = self._reap()
        return code if sig < 0 else -sig

    @property
    def returncode(self) -> int | None:
        if self._status is None and not self._exited(0):
            return None
        _, code, sig = self._reap()
        return code if sig < 0 else -sig

    def communicate(self, input: bytes | None = None, timeout: float | None = None) -> Result:
        """Feed `input`, read stdout/stderr to the end, wait; kill the group at `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        out, err = bytearray(), bytearray()
        sel = selectors.DefaultSelector()
        sinks = {}
        if self._stdout_fd >= 0:
            sel.register(self._stdout_fd, selectors.EVENT_READ)
            sinks[self._stdout_fd] = out
        if self._stderr_fd >= 0:
            sel.register(self._stderr_fd, selectors.EVENT_READ)
            sinks[self._stderr_fd] = err
        pending = memoryview(input or b"")
        if self._stdin_fd >= 0:
            if pending:
                os.set_blocking(self._stdin_fd, False)
                sel.register(self._stdin_fd, selectors.EVENT_WRITE)
            else:
                self._close_stdin()
        if self._pidfd >= 0:
            sel.register(self._pidfd, selectors.EVENT_READ)
        drain_deadline = None
        try:
            while sinks or (self._pidfd >= 0 and self._status is None):
                now = time.monotonic()
                if deadline is not None and now >= deadline and drain_deadline is None:
                    self.time_out()
                    drain_deadline = now + _DRAIN_AFTER_KILL
                if drain_deadline is not None and now >= drain_deadline:
                    break  # a pipe held open by something outside the group: stop reading
                limits = [d for d in (deadline if drain_deadline is None else None,
                                      drain_deadline) if d is not None]
                wait = max(0.0, min(limits) - now) if limits else None
                for key, _ in sel.select(wait):
                    fd = key.fd
                    if fd == self._pidfd:
                        sel.unregister(fd)
                        self._reap()
                        if drain_deadline is None:
                            drain_deadline = time.monotonic() + _DRAIN_AFTER_KILL
                    elif fd == self._stdin_fd:
                        try:
                            n = os.write(fd, pending[:65536])
                            pending = pending[n:]
                        except (BrokenPipeError, BlockingIOError) as e:
                            if isinstance(e, BrokenPipeError):
                                pending = pending[:0]
                        if not pending:
                            sel.unregister(fd)
                            self._close_stdin()
                    else:
                        chunk = os.read(fd, 65536)
                        if chunk:
                            sinks[fd] += chunk
                        else:
                            sel.unregister(fd)
                            del sinks[fd]
        finally:
            sel.close()
        if self._status is None:
            self._end()
        return self._finish(bytes(out), bytes(err))

    def _finish(self, out: bytes, err: bytes) -> Result:
        """The Result of the ended sandbox (its workspace reported once)."""
        reason, code, sig = self._reap()
        if self._result is not None:
            return dataclasses.replace(self._result, stdout=out, stderr=err)
        result = Result(success=(reason == ExitReason.EXITED and code == 0),
                        exit_code=code, stdout=out, stderr=err,
                        error=self._error_text(reason), reason=reason, signal=sig,
                        denials=list(self._session.denials), flagged=self.flagged)
        if self._workspace is not None:
            self._workspace.report(result)
        self._result = dataclasses.replace(result, stdout=b"", stderr=b"")
        return result

    @property
    def changes(self) -> list:
        """What the run changed in its copy-on-write workdir (after it ended)."""
        return list(self._workspace.changes) if self._workspace is not None else []

    @property
    def workspace(self) -> "_Workspace | None":
        """The copy-on-write workspace of this run (outcome, commit(), abort())."""
        return self._workspace

    @property
    def exec_error(self) -> str | None:
        """Why execve failed (the process then exits 126/127), or None."""
        return self._exec_error

    def _error_text(self, reason: ExitReason) -> str | None:
        if self._exec_error:
            return self._exec_error
        if reason == ExitReason.TIMEOUT:
            return "timed out; every process of the sandbox was killed"
        if reason == ExitReason.MEMORY:
            limit = self._memory or self._session.policy.limits.memory
            return (f"its processes together went past max_memory ({limit} bytes); every "
                    f"process of the sandbox was killed")
        return None

    # -- the PIPED streams --

    @property
    def stdin(self) -> _Pipe | None:
        """With stdin=PIPED: a binary file writing to the program's stdin (close it to
        send EOF); else None."""
        return self._pipe("_stdin_fd", "w")

    @property
    def stdout(self) -> _Pipe | None:
        """With stdout=PIPED: a binary file reading the program's output as it comes."""
        return self._pipe("_stdout_fd", "r")

    @property
    def stderr(self) -> _Pipe | None:
        return self._pipe("_stderr_fd", "r")

    def _pipe(self, attr: str, mode: str) -> _Pipe | None:
        f = self._pipes.get(attr)
        if f is None or f.closed:
            if getattr(self, attr) < 0:
                return None
            f = self._pipes[attr] = _Pipe(self, attr, mode)
        return f

    def _close_fd(self, attr: str) -> None:
        f = self._pipes.get(attr)
        if f is not None and not f.closed:
            f.close()  # sets the attribute to -1
        elif getattr(self, attr) >= 0:
            os.close(getattr(self, attr))
            setattr(self, attr, -1)

    def _close_stdin(self):
        self._close_fd("_stdin_fd")

    def close(self) -> None:
        """Kill whatever is still running and release every fd."""
        if self._status is None:
            if not self._exited(0):
                self.kill()
            self._reap()
        for name in ("_stdin_fd", "_stdout_fd", "_stderr_fd"):
            self._close_fd(name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def denials(self) -> list[dict]:
        return list(self._session.denials)

    @property
    def flagged(self) -> list[dict]:
        """Events a policy_fn flagged with "audit" (allowed, recorded)."""
        rt = self._session.runtime
        return list(rt.flagged) if rt is not None else []


class _Workspace:
    """A run's copy-on-write layer and what its outcome did with it."""

    RELEASE_WAIT = 2.0  # seconds for the supervisor to see the last sandboxed task go

    def __init__(self, layer, on_exit, on_error, max_disk):
        self.layer = layer
        self.on_exit, self.on_error = on_exit, on_error
        self.max_disk = max_disk
        self.changes: list = []
        self.refused: list = []  # (change, reason) never applied (protected files)
        self.action: BranchAction | None = None
        self.pending = False
        self.error: str | None = None

    @classmethod
    def start(cls, policy: Policy, on_exit, on_error, session) -> "_Workspace | None":
        ws = policy.workspace
        if ws is None:
            return None
        from . import cow
        try:
            layer = cow.create(ws.workdir, ws.storage, policy.name, ws.backend)
        except OSError as e:
            raise SandlockError(f"fs_storage: cannot create the copy-on-write layer in "
                                f"{ws.storage}: {e.strerror}") from None
        if ws.backend == "seccomp":  # the supervisor serves the workdir's path calls
            session.cow = layer
            session.cow_max_disk = ws.max_disk
        return cls(layer, _action(on_exit, "on_exit"), _action(on_error, "on_error"),
                   ws.max_disk)

    @property
    def run_rules(self) -> dict | None:
        """Landlock rules of this run's own (the seccomp backend's layer: its upper tree is
        read and executed by the kernel for exec and chdir re-issued there; never written
        but by the supervisor)."""
        if getattr(self.layer, "backend", None) == "overlay":
            return None
        from .fs_rules import READ_RIGHTS
        return {self.layer.upper: READ_RIGHTS}

    @property
    def overlay(self) -> tuple[str, str, str] | None:
        """(lower, upper, work) for the trampoline's overlay mount (overlay backend)."""
        layer = self.layer
        if getattr(layer, "backend", None) != "overlay":
            return None
        return layer.lower, layer.upper, layer.work

    def finish(self, session, success: bool) -> None:
        """Apply on_exit or on_error once every sandboxed task is gone."""
        from . import cow
        action = self.on_exit if success else self.on_error
        if not session.released.wait(self.RELEASE_WAIT):
            # A task of the sandbox still runs (nothing may change the layer during a diff
            # or a commit): leave the layer as it is.
            self.action = BranchAction.KEEP
            self.error = (f"sandboxed processes were still running after the program ended; "
                          f"{action.value} not done, layer kept in {self.layer.root}")
            return
        try:
            self.changes = cow.diff(self.layer)
            self._refuse_protected(session)
            if self.max_disk is not None and action == BranchAction.COMMIT:
                used = self.layer.usage()
                if used > self.max_disk:
                    action = BranchAction.ABORT
                    self.error = (f"the workspace used {used} bytes, over max_disk "
                                  f"({self.max_disk}): changes discarded")
            self._apply(action)
        except Exception as e:  # never lose the layer on a failure: keep it for a retry
            self.action = BranchAction.KEEP
            self.error = f"copy-on-write {action.value} failed: {e}; layer kept in " \
                         f"{self.layer.root}"

    def _refuse_protected(self, session) -> None:
        """Changes to the user's protected files (protect_user_files) are never applied:
        inside the workdir the sandbox wrote to its layer, so they are refused here, at
        the commit, and listed in `refused`."""
        prot = session.protection
        if prot is None:
            return
        kept, held = [], []  # held: directories kept whole (their replacement refused)
        for change in self.changes:
            real = os.path.join(self.layer.lower, change.path)
            why = prot.refusal(real)
            replaced = change.action == "deleted" or (
                change.before is not None and change.after is not None
                and change.before.kind != change.after.kind)  # .git dir -> a gitfile
            if why is None and replaced:
                why = prot.moves(real)
                if why is not None:
                    held.append(real)
            if why is None:
                kept.append(change)
            else:
                self.refused.append((change, why))
        if held:  # nothing beneath a directory kept whole changes either
            inside = [c for c in kept if any(
                is_beneath(os.path.join(self.layer.lower, c.path), h) for h in held)]
            kept = [c for c in kept if c not in inside]
            self.refused += [(c, f"it lies in {h}, which is kept whole") for c in inside
                             for h in held[:1]]
        if self.refused:
            self.changes = kept
            first = self.refused[0][1]
            self.error = (f"{len(self.refused)} change(s) to protected files not applied "
                          f"(e.g. {first})")

    def _apply(self, action: BranchAction) -> None:
        from . import cow
        self.action = action
        if action == BranchAction.COMMIT:
            cow.commit(self.layer, self.changes)
        elif action == BranchAction.ABORT:
            self.layer.discard()
        elif action == BranchAction.DEFER:
            self.pending = True

    def commit(self) -> None:
        """Apply a deferred run's changes to the workdir."""
        if not self.pending:
            raise SandlockError("nothing to commit: the run's outcome was not DEFER, or it "
                                "was already committed or aborted")
        from . import cow
        cow.commit(self.layer, self.changes)
        self.pending = False
        self.action = BranchAction.COMMIT

    def abort(self) -> None:
        """Discard a deferred run's changes."""
        if not self.pending:
            raise SandlockError("nothing to abort: the run's outcome was not DEFER, or it "
                                "was already committed or aborted")
        self.layer.discard()
        self.pending = False
        self.action = BranchAction.ABORT

    def report(self, result: Result) -> None:
        result.changes = list(self.changes)
        result.pending = self.pending
        result.workspace = self
        if self.action == BranchAction.KEEP:
            result.kept = self.layer.root
        if self.error:
            result.error = f"{result.error}; {self.error}" if result.error else self.error


def _action(value, field_name: str) -> BranchAction:
    if isinstance(value, BranchAction):
        return value
    try:
        return BranchAction(str(value).lower())
    except ValueError:
        raise PolicyError(f"{field_name}: expected one of commit, abort, keep, defer, got "
                          f"{value!r}") from None


def select_poll(fd: int):
    import select
    p = select.poll()
    p.register(fd, select.POLLIN)
    return p


def landlock_abi_version() -> int:
    from .features import detect
    return detect().landlock_abi


def confine(sandbox: Sandbox) -> None:
    """Apply `sandbox`'s filesystem policy (and Landlock's IPC scopes) to the calling
    process, irreversibly. Network rules need the supervisor of run()/popen() and are
    refused here rather than half-applied.

    Landlock confines the calling thread and the threads and processes it creates later,
    so this refuses to run in a process that already has more than one thread.
    """
    from ._kernel import caps
    from .features import check, detect
    policy = sandbox.policy
    if policy.endpoints.allow or policy.endpoints.deny or policy.tcp_bind.ports \
            or policy.unix_allow:
        raise PolicyError("confine() applies the filesystem policy only; network rules need "
                          "the supervisor of Sandbox.run()/popen()")
    if policy.policy_fn is not None or policy.workspace is not None:
        raise PolicyError("confine() applies the filesystem policy only; policy_fn and "
                          "workdir need the supervisor of Sandbox.run()/popen()")
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        raise SandlockError(f"confine() needs a single-threaded process (this one has "
                            f"{threads} threads): call it before starting threads")
    check(sandbox.allow_degraded, sandbox.policy.waived)
    ruleset = _confinement._build_ruleset(policy, detect().landlock_abi, network=False)
    if ruleset is None:
        return
    try:
        ret = caps.prctl_errno(caps.PR_SET_NO_NEW_PRIVS, 1)
        if ret == 0:
            ret = ruleset.restrict_self_errno()
        if ret < 0:
            raise SandlockError(f"confine: landlock_restrict_self failed: {os.strerror(-ret)}")
    finally:
        ruleset.close()
