"""policy_fn: the user's callback, its events, its verdicts and what it may change.

Rules enforced here:
- The callback runs in the supervising process, on one thread per sandbox run, so events
  reach it one at a time and in order. A held call waits for its verdict at most
  `timeout` seconds; a callback that raises or overruns denies, and is audited. An
  overrunning callback keeps its thread; later events get a fresh one.
- Verdicts map exactly as the API says: None/False/0 allow; True/-1 deny with EPERM; a
  positive int denies with that errno; "audit"/-2 allow and flag; anything else denies.
- What the callback changes through `PolicyContext` narrows the static policy or undoes
  its own narrowing; it can never grant beyond the static ceiling, which is checked first
  and independently. Changes apply from the next syscall the supervisor decides.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import queue
import threading
import time
from dataclasses import dataclass

from ..errors import SandlockError
from .denied import DeniedPaths

EVENT_KINDS = ("exec", "network", "process", "file")


_CATEGORIES = {"execve": "process", "execveat": "process", "clone": "process",
               "fork": "process", "vfork": "process", "exit_group": "process",
               "connect": "network", "sendto": "network", "sendmsg": "network",
               "sendmmsg": "network", "bind": "network"}


def category_of(syscall: str) -> str:
    return _CATEGORIES.get(syscall, "file")


@dataclass(frozen=True)
class SyscallEvent:
    """One syscall the sandbox made. Paths of files are never included; an exec carries
    its argv and `path`, the program the kernel will run (resolved as the caller would,
    and verified after the exec: argv[0] is only what the caller chose to call it)."""
    syscall: str
    category: str  # "file", "network", "process", "memory"
    pid: int
    parent_pid: int = 0
    host: str | None = None
    port: int = 0
    argv: tuple[str, ...] | None = None
    denied: bool = False
    path: str | None = None

    def argv_contains(self, s: str) -> bool:
        """True if an argv element contains `s` (exec events only)."""
        return self.argv is not None and any(s in a for a in self.argv)


@dataclass(frozen=True)
class Verdict:
    allow: bool
    errno: int = 0
    flagged: bool = False
    reason: str = ""


def verdict_of(result) -> Verdict:
    """The API's mapping of a callback's return value. bool is tested before int."""
    if result is None or result is False:
        return Verdict(True)
    if result is True:
        return Verdict(False, errno.EPERM, reason="policy_fn returned True")
    if isinstance(result, str):
        if result == "audit":
            return Verdict(True, flagged=True)
        return Verdict(False, errno.EPERM, reason=f"policy_fn returned {result!r}")
    if isinstance(result, int):
        if result == 0:
            return Verdict(True)
        if result == -2:
            return Verdict(True, flagged=True)
        if result == -1:
            return Verdict(False, errno.EPERM, reason="policy_fn returned -1")
        # Real errnos only: 512 and above are the kernel's restart codes, which would
        # make the held call restart instead of failing.
        if 0 < result < 512:
            return Verdict(False, result, reason=f"policy_fn returned errno {result}")
    return Verdict(False, errno.EPERM, reason=f"policy_fn returned {result!r}, which is "
                                              f"not a verdict")


def _networks(ips, what: str) -> tuple:
    if isinstance(ips, (str, bytes)):
        raise SandlockError(f"{what}: expected a list of addresses, got {ips!r}")
    out = []
    for ip in ips:
        try:
            net = ipaddress.ip_network(str(ip).strip("[]"), strict=False)
        except ValueError:
            raise SandlockError(f"{what}: {ip!r} is not an IP address or CIDR") from None
        if isinstance(net, ipaddress.IPv6Network) and net.prefixlen >= 96 and \
                net.network_address.ipv4_mapped is not None:
            net = ipaddress.ip_network(f"{net.network_address.ipv4_mapped}/"
                                       f"{net.prefixlen - 96}")
        out.append(net)
    return tuple(out)


class PolicyContext:
    """What a callback may change, for the rest of this run."""

    def __init__(self, runtime: "Runtime"):
        self._rt = runtime

    def restrict_network(self, ips) -> None:
        """From now on, destinations must also be in `ips` (addresses or CIDRs; [] = none)."""
        nets = _networks(ips, "restrict_network")
        with self._rt.lock:
            self._rt.allowed = nets

    def grant_network(self, ips) -> None:
        """Add `ips` back to a restriction (the static policy still applies first)."""
        nets = _networks(ips, "grant_network")
        with self._rt.lock:
            if self._rt.allowed is not None:
                self._rt.allowed = self._rt.allowed + nets
            for pid, current in list(self._rt.pid_allowed.items()):
                self._rt.pid_allowed[pid] = current + nets

    def restrict_pid_network(self, pid: int, ips) -> None:
        """Restrict only process `pid` (its later children start unrestricted)."""
        nets = _networks(ips, "restrict_pid_network")
        with self._rt.lock:
            self._rt.pid_allowed[int(pid)] = nets

    def deny_path(self, path) -> None:
        """Refuse opens and execs of `path` and everything beneath it, under any name
        (supervisor.denied), and links and renames that would give it a new one."""
        if "file" not in self._rt.events:
            raise SandlockError("deny_path: opens are not observed; add 'file' to "
                                "policy_fn_events")
        self._rt.denied_paths.add(os.path.realpath(os.fsdecode(path)))

    def allow_path(self, path) -> None:
        """Undo deny_path(path). The static filesystem policy still applies."""
        self._rt.denied_paths.remove(os.path.realpath(os.fsdecode(path)))

    def restrict_max_memory(self, n) -> None:
        """Lower the sandbox's max_memory (never raise it) from the next allocation: the
        root's total and every live process's RLIMIT_DATA (sandlock.limits)."""
        from ..policy import parse_size
        n = parse_size(n, "restrict_max_memory")
        hook = self._rt.on_limits
        if hook is None:
            raise SandlockError("restrict_max_memory: the sandbox has not started")
        hook(memory=n)

    def restrict_max_processes(self, n: int) -> None:
        """Lower the sandbox's max_processes (never raise it) from the next fork."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise SandlockError(f"restrict_max_processes: expected a positive int, got {n!r}")
        hook = self._rt.on_limits
        if hook is None:
            raise SandlockError("restrict_max_processes: the sandbox has not started")
        hook(processes=n)


MAX_ABANDONED = 8  # overrunning callbacks still running; past this, events are denied
CLOSE_WAIT = 2.0  # seconds a run's end waits at most for the events still queued


class _CallbackThread:
    """A thread that runs callbacks in order. Abandoned (left to finish on its own) when a
    callback overruns: it is a daemon thread and holds nothing of the supervisor's. Jobs
    queued behind the overrunning one are failed, never run late beside its successor."""

    abandoned_alive = 0
    _count_lock = threading.Lock()

    def __init__(self, fn, ctx):
        self.abandoned = False
        self.finished = False  # (under _count_lock) _serve has returned
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, args=(fn, ctx), daemon=True,
                                       name="sandlock-policy-fn")
        self.thread.start()

    def abandon(self) -> None:
        with self._count_lock:  # counted while it runs: it uncounts itself as it ends
            if not self.finished:
                _CallbackThread.abandoned_alive += 1
                self.abandoned = True
        self.jobs.put(None)

    def _serve(self, fn, ctx) -> None:
        try:
            while True:
                job = self.jobs.get()
                if job is None:
                    if self.abandoned:
                        while True:  # fail whatever was queued behind the overrun
                            try:
                                job = self.jobs.get_nowait()
                            except queue.Empty:
                                return
                            if job is not None:
                                job[1]("error", RuntimeError("policy_fn overran"))
                    return
                event, then = job
                if self.abandoned:
                    outcome = ("error", RuntimeError("policy_fn overran"))
                else:
                    try:
                        outcome = ("ok", fn(event, ctx))
                    except BaseException as e:
                        outcome = ("error", e)
                try:
                    then(*outcome)
                except Exception:
                    pass
        finally:
            with self._count_lock:
                self.finished = True
                if self.abandoned:
                    _CallbackThread.abandoned_alive -= 1


class Runtime:
    """One run's policy_fn state: the callback, its thread, and the dynamic restrictions."""

    def __init__(self, fn, timeout: float, events: frozenset[str], audit=None, name=None):
        self.fn = fn
        self.timeout = timeout
        self.events = events
        self.audit = audit
        self.name = name
        self.lock = threading.Lock()
        self.allowed: tuple | None = None    # restrict_network
        self.pid_allowed: dict[int, tuple] = {}
        self.denied_paths = DeniedPaths()  # truthy while any path is denied
        self.flagged: list[dict] = []
        self.on_limits = None  # set by the sandbox once started: lowers its limits
        self.report_only = False  # refusals recorded as would-deny, allowed (mode: report)
        self.would_deny = 0
        self.ctx = PolicyContext(self)
        self._worker: _CallbackThread | None = None
        self._order = threading.Lock()  # guards _worker; its queue keeps arrival order

    # -- calling the callback --

    def _submit(self, event: SyscallEvent, then) -> _CallbackThread | None:
        with self._order:
            if _CallbackThread.abandoned_alive >= MAX_ABANDONED:
                then("error", RuntimeError(f"{MAX_ABANDONED} policy_fn calls are still "
                                           f"running past their timeout"))
                return None
            if self._worker is None:
                self._worker = _CallbackThread(self.fn, self.ctx)
            self._worker.jobs.put((event, then))
            return self._worker

    def decide(self, event: SyscallEvent, deadline: float | None = None) -> Verdict:
        """The callback's verdict on a held event; denies on exception or timeout."""
        limit = self.timeout if deadline is None else min(self.timeout,
                                                          deadline - time.monotonic())
        box: list = []
        done = threading.Event()
        worker = self._submit(event, lambda *outcome: (box.append(outcome), done.set()))
        if not done.wait(max(0.0, limit)):
            with self._order:
                if self._worker is worker:
                    worker.abandon()  # it exits once the overrunning call returns
                    self._worker = None
            return self._failed(event, f"policy_fn did not return within "
                                       f"{self.timeout:g}s")
        kind, value = box[0]
        if kind == "error":
            return self._failed(event, f"policy_fn raised {value!r}")
        verdict = verdict_of(value)
        if not verdict.allow and self.report_only:
            # Report-only: the callback's refusal is recorded, and the call goes on (a
            # callback that fails or overruns still denies: that is no verdict).
            self.would_deny += 1
            self.record(event, "would-deny", verdict.reason, verdict.errno)
            return Verdict(True)
        if not verdict.allow:
            self.record(event, "deny", verdict.reason, verdict.errno)
        elif verdict.flagged:
            self.record(event, "flag", "policy_fn flagged this event", 0)
        return verdict

    def observe(self, event: SyscallEvent) -> None:
        """Deliver an event that is not held (process creation and exit), in order with
        the others; its verdict is ignored except for "audit", which flags it."""
        def then(kind, value):
            if kind == "ok" and verdict_of(value).flagged:
                self.record(event, "flag", "policy_fn flagged this event", 0)
        self._submit(event, then)

    def _failed(self, event: SyscallEvent, reason: str) -> Verdict:
        self.record(event, "deny", reason, errno.EPERM)
        return Verdict(False, errno.EPERM, reason=reason)

    def record_refusal(self, pid: int, syscall: str, reason: str) -> None:
        """A held call denied before the callback could see it (e.g. no freeze)."""
        self.record(SyscallEvent(syscall, category_of(syscall), pid), "deny", reason,
                     errno.EPERM)

    def record(self, event: SyscallEvent, decision: str, reason: str, err: int) -> None:
        record = dict(decision=decision, sandbox=self.name, pid=event.pid,
                      syscall=event.syscall, category=event.category, reason=reason,
                      rule="policy_fn")
        if err:
            record["errno"] = errno.errorcode.get(err, err)
        if event.argv is not None:
            record["argv"] = list(event.argv)
        if event.host is not None:
            record.update(host=event.host, port=event.port)
        if decision == "flag":
            with self.lock:
                if len(self.flagged) < 1000:
                    self.flagged.append(record)
        if self.audit is not None:
            self.audit.record(**record)

    def close(self, drain: bool = True) -> None:
        """At the run's end. With `drain` (the program ended on its own), the events still
        queued (the last exit_group, observed and continued at once) reach the callback
        before the run's result is returned, so that what the callback saw and flagged
        is complete; bounded by CLOSE_WAIT (and the callback's own timeout), past which
        the worker is abandoned (counted in MAX_ABANDONED) and fails what is left. A run
        ended by its timeout or kill() does not wait: its caller asked for a bounded
        end (review: run(timeout=1) took 6 s beside a callback blocked on an event)."""
        with self._order:
            worker, self._worker = self._worker, None
        if worker is None:
            return
        worker.jobs.put(None)
        if not drain or worker.thread is threading.current_thread():
            return
        worker.thread.join(min(self.timeout, CLOSE_WAIT))
        if worker.thread.is_alive():
            worker.abandon()

    # -- the dynamic restrictions, read by the handlers --

    def network_refusal(self, pid: int, address) -> str | None:
        """Why `address` is refused to process `pid` by the callback's restrictions."""
        with self.lock:
            allowed, mine = self.allowed, self.pid_allowed.get(pid)
        for nets, what in ((allowed, "restrict_network"), (mine, "restrict_pid_network")):
            if nets is not None and not any(address in n for n in nets
                                            if n.version == address.version):
                return f"{address} is outside policy_fn's {what}"
        return None

    def path_refusal(self, real: str) -> str | None:
        """Why the object at `real` is denied by deny_path (by any of its names), or None."""
        return self.denied_paths.refusal(real)
