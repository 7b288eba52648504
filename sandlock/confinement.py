"""The one place where a Policy becomes kernel objects: a Landlock ruleset, a BPF program,
capability sets and resource limits, all prepared in the parent before fork.

A `Confinement` is immutable once built and shared by every run of the same policy: the
child only applies it (sandlock.launch). (A workspace run's own ruleset, built per run, may
be built ahead by the run before it: run_ruleset, build_next.)
"""

from __future__ import annotations

import resource
import threading
from dataclasses import dataclass, field

from . import features, fs_rules, syscall_filter
from .features import Protection
import fcntl
import os

from ._kernel import caps, landlock
from .errors import PolicyError
from .policy import Policy


@dataclass
class Confinement:
    ruleset: landlock.LandlockRuleset | None
    bpf_fd: int  # sealed memfd holding the BPF program (struct sock_filter[])
    supervised: bool
    cap_sets: caps.CapSets | None  # None: the parent holds no capabilities to drop
    keep_caps: int
    cap_last: int
    rlimits: tuple[tuple[int, int, int], ...]
    degradations: tuple[str, ...]
    subreaper: bool = False  # the program adopts the sandbox's orphans (policy_fn freezes)
    # Overlay-backend workspaces: the rights the trampoline grants beneath its overlay
    # mount, in a ruleset built for each run from the same plan (run_ruleset).
    overlay_rights: int = 0
    # The user's files (protect_user_files): the trampoline's protection list (a sealed
    # memfd, -1 without mounts to make) and the guard's mode ("" without a guard).
    protect_fd: int = -1
    # The trampoline binds the private TMPDIR's .shm (named in the program's environment)
    # over /dev/shm, in a mount namespace of the sandbox's own (policy.private_shm).
    private_shm: bool = False
    guard: str = ""
    write_roots: frozenset = frozenset()  # (dev, ino) of path rules with every write right
    # The trampoline passes its listener over the status socket (SCM_RIGHTS) instead of
    # the parent taking it with pidfd_getfd: whenever the filter leaves sendmsg alone.
    send_listener: bool = False
    # The supervisor decides destinations (policy.net_supervised, where it can act on
    # sockets); False where pidfd_getfd is refused: unix sockets are then refused instead.
    net_supervised: bool = False
    landlock_log: bool = False  # restrict with LOG_NEW_EXEC_ON (supervisor.landlock_audit)
    notices: tuple[str, ...] = ()  # what this system does differently, said to the user
    cores: tuple[int, ...] = ()  # cpu_cores: set on the program before it starts
    control_lines: tuple[bytes, ...] = ()  # limits the sandbox's root applies (limits.py)
    _policy: Policy | None = None
    _abi: int = 0

    _rules: dict | None = None
    # A run's ruleset built ahead, while the run before it went on: (its extra rules, it).
    _next: tuple | None = None
    _next_lock: threading.Lock = field(default_factory=threading.Lock, repr=False,
                                       compare=False)
    _run_rulesets: int = 0  # built so far: a policy run once (the CLI) builds none ahead

    def run_ruleset(self, extra: dict | None = None) -> landlock.LandlockRuleset | None:
        """A ruleset of this policy for one run, with `extra` path rules (path -> rights)
        for that run's own objects (its workspace layer); the caller closes it. The
        policy's path rules are planned once; the one built ahead (build_next) is taken if
        it was built for the same extra rules. Its path rules hold the objects the paths
        named when it was built, as the policy's own ruleset (`ruleset`) holds them from
        the first run on."""
        if self._policy is None:
            return None
        with self._next_lock:
            ahead, self._next = self._next, None
        if ahead is not None:
            if ahead[0] == _extra_key(extra):
                return ahead[1]
            ahead[1].close()
        if self._rules is None:
            self._rules = _plan(self._policy)
        self._run_rulesets += 1
        rules = dict(self._rules)
        for path, rights in (extra or {}).items():
            rules[path] = rules.get(path, 0) | rights
        return _build_ruleset(self._policy, self._abi, rules=rules)

    def build_next(self, extra: dict | None = None) -> None:
        """Build the next run's ruleset now (launch.spawn: once a run has started, off the
        path of the next; 0.6 ms for the system directories' 160 rules). A failure is the
        next run's to meet, building its own. Only from a policy's second run on: one run
        once (the CLI's) would build it for nothing."""
        if self._run_rulesets < 2:
            return
        try:
            ruleset = self.run_ruleset(extra)
        except PolicyError:
            return
        if ruleset is None:
            return
        with self._next_lock:
            old, self._next = self._next, (_extra_key(extra), ruleset)
        if old is not None:
            old[1].close()

    # The fds live exactly as long as this object: a launch holds a reference while it
    # passes them to the child, and a Sandbox drops its Confinement when a field changes.
    def close(self) -> None:
        if self.bpf_fd >= 0:
            os.close(self.bpf_fd)
            self.bpf_fd = -1
        if self.protect_fd >= 0:
            os.close(self.protect_fd)
            self.protect_fd = -1
        if self.ruleset is not None:
            self.ruleset.close()
        with self._next_lock:
            ahead, self._next = self._next, None
        if ahead is not None:
            ahead[1].close()

    def __del__(self):
        try:
            self.close()
        except OSError:
            pass


def _extra_key(extra: dict | None) -> tuple:
    return tuple(sorted((extra or {}).items()))


def _plan(policy: Policy) -> dict[str, int]:
    return fs_rules.plan_path_rules(policy.fs_readable, policy.fs_writable,
                                    policy.fs_denied, policy.write_excluded)


def grant(conf: "Confinement", policy: Policy, path: str) -> None:
    """`policy` is `conf`'s policy plus a writable `path` made since the build (a private
    TMPDIR's root: sandbox._private_tmp_now), under no other grant's denied or excluded
    path. Give `conf` what a build of `policy` would have: `path`'s own rules (a grant's
    rules are planned from that grant alone, and merged by path) in the ruleset, which no
    run may have used yet (the rules of a restricted domain are its ruleset's then), its
    write root for the guard, and the plan of per-run rulesets."""
    rules = fs_rules.plan_path_rules((), (path,), policy.fs_denied, policy.write_excluded)
    if conf.ruleset is not None:
        fs_rules.add_path_rules(conf.ruleset, rules)
    if conf.guard:
        conf.write_roots = conf.write_roots | _write_roots(rules, features.detect().landlock_abi)
    if conf._policy is not None:
        conf._policy, conf._rules = policy, None


def _needs_socket_access(policy: Policy) -> str:
    """What in this policy needs the supervisor to act on the sandbox's sockets ("" if
    nothing): everything but Landlock's TCP port rules and a default-deny of unix sockets."""
    needs = []
    if not policy.tcp_by_landlock:
        needs.append("network rules naming hosts or addresses, or HTTP rules")
    explicit_udp = any(r.spec.startswith("udp://") for r in policy.endpoints.allow)
    if policy.icmp or explicit_udp or policy.endpoints.hostnames:
        needs.append("UDP, ICMP or host-name (DNS) rules")
    if policy.unix_allow:
        needs.append("unix socket grants (net_allow_unix)")
    if "network" in policy.runtime_events:
        needs.append("policy_fn network events")
    bind = policy.tcp_bind
    if not bind.any_port and bind.ports - {0}:
        needs.append("TCP bind rules for specific ports (a listen() must be checked)")
    return "; ".join(needs)


def _write_roots(rules: dict[str, int], abi: int) -> frozenset:
    """Identities of the planned rules that grant every write right this ABI handles."""
    need = fs_rules.WRITE_RIGHTS & landlock.fs_rights_for_abi(abi)
    out = set()
    for path, rights in rules.items():
        if rights & need == need:
            try:
                st = os.stat(path, follow_symlinks=False)
            except OSError:
                continue
            out.add((st.st_dev, st.st_ino))
    return frozenset(out)


def _build_ruleset(policy: Policy, abi: int, network: bool = True,
                   rules: dict | None = None) -> landlock.LandlockRuleset | None:
    """`network=False` (confine()) leaves TCP unhandled: without the seccomp filter and the
    supervisor, Landlock's port rules alone would look stricter than they are."""
    if abi < 1:
        return None
    handled_net = 0
    waived = policy.waived
    if abi >= 4 and network and Protection.NET_TCP not in waived:
        if not policy.tcp_connect.any_port:
            handled_net |= landlock.NET_CONNECT_TCP
        if not policy.tcp_bind.any_port:
            handled_net |= landlock.NET_BIND_TCP
    fs_rights, scopes = landlock.fs_rights_for_abi(abi), landlock.scopes_for_abi(abi)
    for protection, right in ((Protection.FS_REFER, landlock.FS_REFER),
                              (Protection.FS_TRUNCATE, landlock.FS_TRUNCATE),
                              (Protection.FS_IOCTL_DEV, landlock.FS_IOCTL_DEV)):
        if protection in waived:
            fs_rights &= ~right  # not handled: that access is Landlock's no more
    if Protection.SIGNAL_SCOPE in waived:
        scopes &= ~landlock.SCOPE_SIGNAL
    if Protection.ABSTRACT_UNIX_SOCKET_SCOPE in waived:
        scopes &= ~landlock.SCOPE_ABSTRACT_UNIX_SOCKET
    ruleset = landlock.LandlockRuleset(abi, fs_rights, handled_net, scopes)
    try:
        fs_rules.add_path_rules(ruleset, rules if rules is not None else _plan(policy))
        if handled_net & landlock.NET_CONNECT_TCP:
            for port in sorted(policy.tcp_connect.ports):
                ruleset.allow_port(port, landlock.NET_CONNECT_TCP)
        if handled_net & landlock.NET_BIND_TCP:
            for port in sorted(policy.tcp_bind.ports):
                ruleset.allow_port(port, landlock.NET_BIND_TCP)
    except OSError as e:
        ruleset.close()
        raise PolicyError(f"building the Landlock ruleset failed: {e.strerror}") from None
    return ruleset


def _sealed_memfd(name: str, data: bytes) -> int:
    """A close-on-exec memfd with `data`, sealed so that nothing can change it later."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.write(fd, data)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW
                | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
    return fd


def build(policy: Policy) -> Confinement:
    accepted = features.check(policy.allow_degraded, policy.waived)
    kf = features.detect()
    no_tcp_rules = kf.landlock_abi < 4 or Protection.NET_TCP in policy.waived
    if Protection.NET_TCP in policy.waived and (
            policy.endpoints.allow or policy.tcp_bind.ports or policy.tcp_bind.any_port
            or policy.http is not None):
        raise PolicyError("disable=[Protection.NET_TCP]: without Landlock's TCP rules every "
                          "TCP socket is refused, so the network rules of this policy could "
                          "not apply; remove them or the waiver")
    supervised = features.supervisor_available(kf)
    base = caps.capget()
    cap_sets = None
    if base.mask("permitted") or base.mask("effective"):
        keep = policy.keep_caps & base.mask("permitted")
        cap_sets = caps.CapSets(keep, keep, keep)
    elif policy.keep_caps:
        raise PolicyError("keep_capabilities: this process holds no capabilities to keep")
    limits = []
    if policy.no_coredump:
        limits.append((resource.RLIMIT_CORE, 0, 0))
    if policy.max_open_files is not None:
        limits.append((resource.RLIMIT_NOFILE, policy.max_open_files, policy.max_open_files))
    lim = policy.limits
    if lim is not None and lim.memory:
        limits.append((resource.RLIMIT_DATA, lim.memory, lim.memory))
    if lim is not None and lim.processes and not supervised:
        raise PolicyError("max_processes needs the supervisor, which this kernel cannot run "
                          "(see `sandlock check`)")
    if policy.net_supervised and not supervised and not (
            policy.tcp_by_landlock and not policy.udp and not policy.icmp):
        raise PolicyError("network rules naming hosts, addresses, UDP or ICMP need the "
                          "supervisor, which this kernel cannot run (see `sandlock check`)")
    if policy.workspace is not None and not supervised:
        raise PolicyError("workdir (copy-on-write) needs the supervisor, which this kernel "
                          "cannot run (see `sandlock check`)")
    if policy.policy_fn is not None and not supervised:
        raise PolicyError("policy_fn needs the supervisor, which this kernel cannot run "
                          "(see `sandlock check`)")
    net_supervised, unix_pairs_only, listen = policy.net_supervised, False, "notify"
    notices: list[str] = []
    tcp_bind = policy.tcp_bind
    if tcp_bind.any_port or 0 in tcp_bind.ports:
        listen = "allow"  # an ephemeral port is allowed anyway: nothing to check
    if supervised and not kf.pidfd_getfd:
        needs = _needs_socket_access(policy)
        if needs:
            raise PolicyError(f"this policy has {needs}: they need the supervisor to act on "
                              f"the sandbox's sockets (pidfd_getfd), which this system refuses; "
                              f"{features.SOCKETS_HOW} (see `sandlock check`)")
        net_supervised, unix_pairs_only = False, True
        if policy.udp:
            notices.append("UDP to the ports the rules name is refused here (the supervisor "
                           "cannot act on sockets without pidfd_getfd); TCP is allowed")
        if listen == "notify":
            listen = "deny"  # no port may be bound: a listen() could only bind one
    guard, protect_fd, write_roots = "", -1, frozenset()
    rules: list[dict] = []

    def planned() -> dict[str, int]:
        """The policy's path rules, planned once for this build (a plan stats and
        resolves every grant: ~1.5 ms here), for the ruleset, the write roots and a
        workspace's per-run rulesets alike."""
        if not rules:
            rules.append(_plan(policy))
        return rules[0]
    plan = policy.protection
    if plan is not None:
        from . import protect
        if protect.needs_guard(plan):
            if not supervised:
                raise PolicyError("protect_user_files under a writable grant needs the "
                                  "supervisor, which this kernel cannot run (see `sandlock "
                                  "check`)")
            guard = policy.protect_mode
            write_roots = _write_roots(planned(), kf.landlock_abi)
        listing = protect.spec(plan) if policy.protect_mode == "mounts" else b""
    else:
        listing = b""
    spec = policy.intercept
    for bundle, spliced in (spec.bundles if spec is not None else ()):
        # http_inject_ca=[...]: the spliced copy (written by NetState) shown in place.
        listing += b"f" + os.fsencode(spliced) + b"\0b" + os.fsencode(bundle) + b"\0"
    if listing:
        protect_fd = _sealed_memfd("sandlock-protect", listing)
    bpf = syscall_filter.compile_filter(policy.deny_syscalls, supervised,
                                        deny_inet=no_tcp_rules,
                                        net_supervised=net_supervised,
                                        udp=policy.udp and net_supervised,
                                        icmp=policy.icmp and net_supervised,
                                        runtime_events=policy.runtime_events,
                                        cow=policy.workspace is not None
                                        and policy.workspace.backend == "seccomp",
                                        overlay=policy.workspace is not None
                                        and policy.workspace.backend == "overlay",
                                        guard=guard, unix_pairs_only=unix_pairs_only,
                                        listen=listen,
                                        # a policy_fn seeing process events may lower
                                        # max_processes later (it sees forks anyway)
                                        count_forks=bool(lim and lim.processes)
                                        or "process" in policy.runtime_events,
                                        pin_cpus=bool(lim and lim.cores))
    workspace = policy.workspace is not None
    overlay = workspace and policy.workspace.backend == "overlay"
    return Confinement(
        ruleset=_build_ruleset(policy, kf.landlock_abi, rules=planned())
        if kf.landlock_abi >= 1 else None,
        bpf_fd=_sealed_memfd("sandlock-bpf", bpf),
        supervised=supervised,
        cap_sets=cap_sets,
        keep_caps=policy.keep_caps,
        cap_last=caps.cap_last_cap(),
        rlimits=tuple(limits),
        degradations=tuple(accepted),
        subreaper=policy.policy_fn is not None,
        overlay_rights=(landlock.fs_rights_for_abi(kf.landlock_abi) & fs_rules.WRITE_RIGHTS
                        if overlay else 0),
        protect_fd=protect_fd, private_shm=policy.private_shm, guard=guard,
        write_roots=write_roots, send_listener=not net_supervised, net_supervised=net_supervised,
        notices=tuple(notices), cores=lim.cores if lim is not None else (),
        control_lines=tuple(lim.control_lines()) if lim is not None else (),
        _policy=policy if workspace else None, _abi=kf.landlock_abi,
        _rules=rules[0] if workspace and rules else None,
    )
