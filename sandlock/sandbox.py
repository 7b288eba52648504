"""The user-facing API: `Sandbox` (a dataclass of policy fields), `Process`, `confine()`.

A Sandbox validates its fields when constructed or changed (errors name the field) and
builds its kernel objects once, on first use; every run after that reuses them.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from . import confinement as _confinement
from . import launch, syscall_filter
from .errors import BranchError, PolicyError, SandboxError, SandlockError
from .modes import BranchAction, StdioMode, _action  # noqa: F401  (their home, upstream's)
from .policy import Policy, build_policy
from .process import Process
from .result import Result
from .run_setup import _CLEAN_ENV_KEEP, _DEFAULT_PATH  # noqa: F401  (clones, mcp use them)
from .run_setup import (_early_limits, _environment, _find_executable, _settled, _stdio,
                        _unwatch_later, _watch)
from .supervisor.loop import Session, supervisor

if TYPE_CHECKING:
    from .workspace_run import _Workspace  # imported by a run that has a workdir


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
    credentials: Mapping[str, str] | None = None
    credential_env: Mapping[str, str] | None = None
    http_auth: Sequence[Any] | None = None
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
    gpu_devices: Sequence[int] | None = None
    chroot: str | None = None
    image: str | None = None
    fs_mount: Any = None
    fs_mount_ro: Any = None
    no_coredump: bool = False
    explain: bool = False      # record the file accesses the policy refuses (supervisor)
    report_only: bool = False  # network/DNS/HTTP/policy_fn refusals: recorded, allowed
    allow_degraded: Any = ()   # True: any protection may be missing; or [Protection, ...]
    disable: Sequence[Any] = ()
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
    # Built ahead (service/prepared.py): the private TMPDIR's root is made at the first run.
    _tmp_later: bool = field(default=False, init=False, repr=False, compare=False)
    _user_handlers: Any = field(default=None, init=False, repr=False, compare=False)
    _handler_bpf: Any = field(default=None, init=False, repr=False, compare=False)
    _learn_sink: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        for name in ("on_exit", "on_error"):  # "abort" -> BranchAction.ABORT, as upstream
            object.__setattr__(self, name, _action(getattr(self, name), name))
        self._policy = self._validate()

    def __setattr__(self, name, value):
        if name.startswith("_") or "_policy" not in self.__dict__:
            object.__setattr__(self, name, value)
            return
        # A changed field: validate now (errors at the boundary), rebuild lazily. A rejected
        # value leaves the sandbox exactly as it was.
        if name in ("on_exit", "on_error"):
            value = _action(value, name)
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
        object.__setattr__(self, "_tmp_later", False)
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

    def _confinement(self, private_tmp_later: bool = False) -> _confinement.Confinement:
        """The kernel objects of this sandbox's runs, built once. `private_tmp_later`: a
        build ahead (service/prepared.py), which makes nothing: a private TMPDIR's root is
        then made, and granted, when the first run starts (_private_tmp_now)."""
        conf = self._conf
        if conf is None:
            with _build_lock:
                if self._conf is None:
                    policy = self._policy
                    if policy.private_tmp and private_tmp_later:
                        object.__setattr__(self, "_tmp_later", True)
                    elif policy.private_tmp:  # its root exists before Landlock grants it
                        policy = self._take_private_tmp(policy)
                    object.__setattr__(self, "_run_policy", policy)
                    conf = _confinement.build(policy)
                    if (policy.explain or policy.audit_log) and self._learn_sink is None \
                            and conf.ruleset is not None:
                        # Landlock reports its own refusals where the audit subsystem is
                        # on and we may read it: free (supervisor.landlock_audit).
                        from .supervisor import landlock_audit
                        conf.landlock_log = landlock_audit.available()
                    if self._user_handlers or (policy.explain and not conf.landlock_log):
                        self._route_to_handlers(conf)
                    object.__setattr__(self, "_conf", conf)
                conf = self._conf
        return conf

    def _private_tmp_now(self, conf) -> None:
        """A sandbox built ahead: its private TMPDIR's root, made now (in this process's
        TMPDIR, the caller's) and granted as a build with it would have: the same path
        rules for it alone, added to the ruleset no run has used yet (confinement.grant)."""
        if not self._tmp_later:
            return
        with _build_lock:
            if not self._tmp_later:
                return
            policy = self._take_private_tmp(self._run_policy)
            try:
                for path in (self._tmp.root, self._tmp.shm):
                    if path is not None:
                        _confinement.grant(conf, policy, path)
            except BaseException:
                self._tmp.close()
                object.__setattr__(self, "_tmp", None)
                raise
            object.__setattr__(self, "_run_policy", policy)
            object.__setattr__(self, "_tmp_later", False)

    def _take_private_tmp(self, policy: Policy) -> Policy:
        """A private TMPDIR's root made now, this sandbox's; `policy` with it writable."""
        from dataclasses import replace
        from .private_tmp import PrivateTmp
        tmp = PrivateTmp()
        object.__setattr__(self, "_tmp", tmp)
        # .shm: a rule of its own (bound over /dev/shm, it is reached from its own root)
        shm = (tmp.make_shm(),) if policy.private_shm else ()
        return replace(policy, fs_writable=policy.fs_writable + (tmp.root,) + shm)

    def _route_to_handlers(self, conf) -> None:
        """The program's filter, with the calls of the handled syscalls that the policy
        lets through sent to the supervisor (sandlock.bpf_program)."""
        from .bpf_program import route_to_supervisor
        if not conf.supervised:
            conf.close()
            raise PolicyError("custom handlers and explain need the supervisor (seccomp "
                              "user notification), which this kernel cannot run")
        size = os.fstat(conf.bpf_fd).st_size
        base = os.pread(conf.bpf_fd, size, 0)
        numbers = set(self._user_handlers or ())
        if self._policy.explain:
            from .supervisor.explain import CALLS
            from .syscall_filter import syscall_number
            numbers |= {syscall_number(n) for n in CALLS}
        routed = _confinement._sealed_memfd("sandlock-bpf", route_to_supervisor(
            base, numbers))
        os.close(conf.bpf_fd)
        conf.bpf_fd = routed
        object.__setattr__(self, "_handler_bpf", base)

    def run_with_handlers(self, cmd: Sequence[str], handlers, timeout: float | None = None
                          ) -> Result:
        """Run `cmd` with custom syscall handlers (sandlock.handler): `handlers` is a
        sequence of (syscall name or number, Handler). The policy decides first; see
        sandlock.handler for what a handler may do."""
        from . import _handler_ffi
        from .handler import Handler
        table: dict[int, list] = {}
        for item in handlers:
            try:
                syscall, handler = item
            except (TypeError, ValueError):
                raise TypeError(f"handlers: expected (syscall, Handler) pairs, got "
                                f"{item!r}") from None
            nr = _resolve_syscall(syscall)
            if not isinstance(handler, Handler) or not callable(getattr(handler, "handle",
                                                                       None)):
                raise _NotAHandler(f"handlers: {handler!r} is not a sandlock.handler."
                                   f"Handler (it has no handle(ctx) method)")
            table.setdefault(nr, []).append(handler)
        keys = [_handler_ffi.register(h) for hs in table.values() for h in hs]
        try:
            if not table:
                return self.run(cmd, timeout)
            sb = dataclasses.replace(self)
            object.__setattr__(sb, "_user_handlers", table)
            object.__setattr__(sb, "_default_timeout", self._default_timeout)
            try:
                return sb.run(cmd, timeout)
            finally:
                sb._close()
        finally:
            _handler_ffi.release(keys)

    def _close(self) -> None:
        """Release what this Sandbox built for its runs (confinement, network state)."""
        conf, net = self._conf, self._net
        object.__setattr__(self, "_conf", None)
        object.__setattr__(self, "_net", None)
        if conf is not None:
            conf.close()
        if net is not None:
            net.stop()
        if self._tmp is not None:
            self._tmp.close()
            object.__setattr__(self, "_tmp", None)

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
              stderr=StdioMode.INHERIT, *, hold: bool = False, pass_fds: Sequence[int] = (),
              extra_env: Mapping[str, str] | None = None, register: bool = True,
              only_run: bool = False) -> "Process":
        """Start `cmd` confined and return at once. With `hold`, the program is confined
        and its pid known, but it execs only at Process.start(). `pass_fds` reach the
        program as fds 3, 4, ... (a fan-in pipeline's inputs); `extra_env` adds to its
        environment. `register=False`: not in the registry of running sandboxes until
        _register(proc, cmd) (the CLI registers a program still running after a few ms).
        `only_run`: this Sandbox runs nothing else (the CLI's), so a private TMPDIR is its
        root itself, not a directory of the run's beneath it (one directory fewer to make
        and remove: ~0.4 ms of a call on an ext4 /tmp)."""
        argv = _argv(cmd)
        if self.pending:
            raise SandlockError("this sandbox holds a run's workdir changes (DEFER): "
                                "commit() or abort() them before another run")
        conf = self._confinement()
        self._private_tmp_now(conf)
        policy = self._run_policy  # with its private TMPDIR's root, if any
        net = self._net_state()
        extra = {}
        tmpdir = None
        if self._tmp is not None and "TMPDIR" not in dict(policy.env):
            tmpdir = self._tmp.lend_root() if only_run else self._tmp.new_run()
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
        if policy.credentials is not None:
            if net is None:  # never: credentials make the network supervised
                raise SandboxError("credentials need the network supervisor")
            # Placeholders in, and every variable holding a secret out.
            base = dict(os.environb) if not policy.clean_env else {}
            base.update((os.fsencode(k), os.fsencode(v)) for k, v in policy.env)
            extra.update(net.secrets.environment(base))
        for k, v in (extra_env or {}).items():
            extra[os.fsencode(k)] = os.fsencode(v)
        if conf.private_shm:  # for the trampoline, which removes it; never the caller's
            from .private_tmp import SHM_ENV
            shm = self._tmp.shm if self._tmp is not None else None
            extra[SHM_ENV.encode()] = os.fsencode(shm) if shm is not None else None
        env = _environment(policy, extra)
        path = env.get("PATH") if env is os.environ else os.fsdecode(env.get(b"PATH", b""))
        exe = _find_executable(argv[0], path or os.fsdecode(_DEFAULT_PATH), policy.cwd)
        runtime = None
        if policy.policy_fn is not None:
            from .supervisor.runtime import Runtime
            runtime = Runtime(policy.policy_fn, policy.policy_fn_timeout,
                              policy.runtime_events, self._audit_log(), policy.name)
            runtime.report_only = policy.report_only
        session = Session(policy, policy.name, net, runtime)
        on_program = None
        if conf.landlock_log:
            from .supervisor.explain import Explainer
            on_program = functools.partial(_watch, Explainer(session, self._audit_log()))
        elif self._user_handlers or policy.explain:
            from .supervisor.user_handlers import UserHandlers
            table = {nr: list(hs) for nr, hs in (self._user_handlers or {}).items()}
            if policy.explain:  # first: it records, and always continues
                from .supervisor.explain import CALLS, Explainer, handler_for
                from .syscall_filter import syscall_number
                explainer = Explainer(session, self._audit_log(), self._learn_sink)
                for name in CALLS:
                    table.setdefault(syscall_number(name), []).insert(
                        0, handler_for(explainer, name))
            session.user_handlers = UserHandlers(table, self._handler_bpf)
        if conf.landlock_log and self._user_handlers:
            from .supervisor.user_handlers import UserHandlers
            session.user_handlers = UserHandlers(dict(self._user_handlers), self._handler_bpf)
        if (policy.limits is not None and policy.limits.processes) or (
                runtime is not None and "process" in policy.runtime_events):
            from .supervisor.forks import ForkBudget, UNLIMITED
            session.forks = ForkBudget(policy.limits.processes if policy.limits is not None
                                       and policy.limits.processes else UNLIMITED)
        early: dict = {}
        if runtime is not None:
            # The program's own exec is an event too, before this returns: a restriction
            # then applies at once (forks, and RLIMIT_DATA of the processes there are),
            # the rest of it once the Process exists (below).
            runtime.on_limits = lambda memory=None, processes=None: _early_limits(
                session, early, memory, processes)
        pwd = env.get("PWD") if env is os.environ else os.fsdecode(env.get(b"PWD", b""))
        workspace = None
        if policy.workspace is not None:
            from .workspace_run import _Workspace
            workspace = _Workspace.start(policy, self.on_exit, self.on_error, session, pwd)
        session.overlay = workspace is not None and workspace.overlay is not None
        session.own_mounts = session.overlay or conf.protect_fd >= 0 or conf.private_shm
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
                attach=functools.partial(_attach, session),
                overlay=workspace.overlay if workspace is not None else None,
                run_rules=workspace.run_rules if workspace is not None else None,
                ruleset_ready=ruleset_ready, hold=hold, pass_fds=pass_fds,
                on_program=on_program,
                shm=self._tmp.shm if conf.private_shm and self._tmp is not None else None)
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
        if workspace is not None:
            object.__setattr__(self, "_last_workspace", workspace)  # commit()/abort()
        if runtime is not None:
            runtime.on_limits = proc._lower_limits
            if early.get("memory"):
                proc._lower_limits(memory=early["memory"])
        if tmpdir is not None:
            proc._cleanup.append(lambda tmp=self._tmp: tmp.end_run(tmpdir))
        if on_program is not None:
            proc._cleanup.append(lambda pid=proc.pid: _unwatch_later(pid))
        if register:
            self._register(proc, argv)
        return proc

    def _register(self, proc: "Process", cmd: Sequence[str]) -> None:
        """`sandlock ps` / `inspect` / `kill` find `proc` until it is closed."""
        from . import registry
        policy = self._run_policy
        entry = registry.register(proc.root, proc.pid, policy.name, _argv(cmd), policy.cwd,
                                  self._given_fields())
        if entry is not None:
            proc._cleanup.append(lambda: registry.unregister(entry))

    def _given_fields(self) -> dict:
        """The fields set to other than their defaults (what `sandlock inspect` shows)."""
        out = {}
        for f in fields(self):
            if not f.init:
                continue
            value = getattr(self, f.name)
            if value is None or value is False or value == f.default or (
                    isinstance(value, (list, tuple, dict)) and not value):
                continue
            if f.name == "env":  # values may be secrets: another sandbox may read this
                value = {k: "..." for k in value}
            out[f.name] = (f"<{getattr(value, '__qualname__', type(value).__name__)}>"
                           if callable(value) else value)
        return out

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

    # -- one process at a time, as upstream's lifecycle: create/start/spawn/wait ----------

    def create(self, cmd: Sequence[str]) -> None:
        """Confine `cmd`'s process and stop it short of its exec: `pid` is known, no code of
        the program has run; start() lets it run. Its output is captured for wait()."""
        if self._life() is not None:
            raise SandlockError("a process is already running in this sandbox: wait() for "
                                "it or kill() it first")
        proc = self.popen(cmd, stdin=StdioMode.NULL, stdout=StdioMode.PIPED,
                          stderr=StdioMode.PIPED, hold=True)
        object.__setattr__(self, "_lifecycle", [proc, None, None])
        _settled(proc.pid)

    def start(self) -> None:
        """Let a create()d process exec; its output is read from now on (a program that
        writes a lot never stalls waiting for wait())."""
        life = getattr(self, "_lifecycle", None)
        if life is None or life[1] is not None:
            raise SandlockError("the process has not been created: create(cmd) first"
                                if life is None else "already started")
        proc = life[0]
        proc.start()
        outcome: list = []

        def read():
            try:
                outcome.append(proc.communicate())
            except BaseException as e:  # raised by wait(), in the caller's thread
                outcome.append(e)
        reader = threading.Thread(target=read, name="sandlock-lifecycle", daemon=True)
        life[1], life[2] = reader, outcome
        reader.start()

    def spawn(self, cmd: Sequence[str]) -> None:
        """create(cmd) then start(): run it without waiting for it."""
        self.create(cmd)
        self.start()

    def wait(self, timeout: float | None = None) -> Result:
        """The Result of the process start()ed here (stdout and stderr included); at
        `timeout` it is killed (reason TIMEOUT)."""
        life = getattr(self, "_lifecycle", None)
        if life is None or life[1] is None:
            raise SandlockError("nothing to wait for: spawn(cmd), or create(cmd) and "
                                "start(), first")
        proc, reader, outcome = life
        reader.join(timeout)
        if reader.is_alive():
            proc.time_out()
            reader.join()
        object.__setattr__(self, "_lifecycle", None)
        proc.close()
        if isinstance(outcome[0], BaseException):
            raise outcome[0]
        return outcome[0]

    def _life(self):
        life = getattr(self, "_lifecycle", None)
        return life[0] if life is not None else None

    @property
    def pid(self) -> int | None:
        """The pid of the process create()d or spawn()ed here, until wait()."""
        proc = self._life()
        return proc.pid if proc is not None else None

    @property
    def is_running(self) -> bool:
        proc = self._life()
        return proc is not None and proc.is_running

    def pause(self) -> None:
        """Stop every process of the sandbox spawn()ed here (SIGSTOP)."""
        self._running("pause").pause()

    def resume(self) -> None:
        self._running("resume").resume()

    def kill(self) -> None:
        """Kill every process of the sandbox spawn()ed here; wait() then reports it."""
        self._running("kill").kill()

    def _running(self, what: str) -> "Process":
        proc = self._life()
        if proc is None:
            raise SandlockError(f"nothing to {what}: no process was spawn()ed here")
        return proc

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc) -> None:
        if self.pending:  # an undecided branch is never published
            self.abort()
        life = getattr(self, "_lifecycle", None)
        if life is not None:
            proc = life[0]
            if life[1] is None:  # created, never started: it never runs
                proc.close()
                object.__setattr__(self, "_lifecycle", None)
            else:
                proc.kill()
                self.wait()

    def dry_run(self, cmd: Sequence[str], timeout: float | None = None) -> Result:
        """Run `cmd` in the workdir's copy-on-write layer and discard whatever it changed:
        the Result's `changes` list what it would have changed (upstream's dry_run)."""
        if self.workdir is None:
            raise PolicyError("dry_run needs a workdir: the copy-on-write layer that holds "
                              "the changes until they are discarded")
        return dataclasses.replace(self, on_exit=BranchAction.ABORT,
                                   on_error=BranchAction.ABORT).run(cmd, timeout)

    def commit(self) -> None:
        """Apply the changes of this sandbox's last run, held back by on_exit/on_error=
        BranchAction.DEFER (upstream's Sandbox.commit; Result.commit() is the same). If the
        merge fails, BranchError is raised and the changes stay held (commit() or abort()
        again)."""
        workspace = self._held("commit")
        try:
            workspace.commit()
        except OSError as e:
            raise BranchError(f"commit failed: {e.strerror or e}; the changes are still held "
                              f"(commit() or abort())") from e

    def abort(self) -> None:
        """Discard the changes of this sandbox's last run held back by DEFER."""
        self._held("abort").abort()

    @property
    def pending(self) -> bool:
        """A run's workdir changes are held (BranchAction.DEFER) until commit()/abort()."""
        workspace = getattr(self, "_last_workspace", None)
        return workspace is not None and workspace.pending

    @property
    def upper_dir(self) -> str | None:
        """Where the held changes are (the layer's upper tree), while pending."""
        return self._last_workspace.layer.upper if self.pending else None

    def _held(self, what: str) -> "_Workspace":
        workspace = getattr(self, "_last_workspace", None)
        if workspace is None or not workspace.pending:
            raise SandlockError(f"nothing to {what}: only a run that ended with on_exit or "
                                f"on_error=BranchAction.DEFER holds changes")
        return workspace

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
        if self._policy.credentials is not None:
            # A clone starts as a copy of this process: its memory and environment hold
            # what credentials keep out of every other sandbox.
            raise PolicyError("fork(): credentials cannot be used with COW clones; run "
                              "the credential's tools with run() or popen()")
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


def _attach(session, listener: int, pid: int, overlay_mount: int | None = None,
            shm_mount: int | None = None) -> None:
    """launch.spawn's attach: the listener to the supervisor, with the overlay's mount id
    (an overlay-backend workspace) noted before any call of the program is served."""
    session.overlay_mount = overlay_mount
    session.shm_mount = shm_mount
    supervisor().attach(listener, session, pid)


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


class _NotAHandler(TypeError, AttributeError):
    """A handlers entry that is no Handler: a TypeError, and the AttributeError upstream
    raises for it (its handle/on_exception are missing)."""


def _resolve_syscall(value) -> int:
    """A syscall name or number -> its number on this architecture (ValueError/TypeError
    naming what was given)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"a syscall is a name or a number, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"syscall number {value} is negative")
        return value
    from .syscall_filter import syscall_number
    try:
        return syscall_number(value)
    except ValueError:
        raise ValueError(f"unknown syscall {value!r}") from None


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
