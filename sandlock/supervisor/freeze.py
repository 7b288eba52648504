"""Freezing a sandbox around one held syscall, so that what the supervisor read is what the
kernel acts on.

A syscall whose pointer arguments the supervisor inspected may be let through (CONTINUE)
only if nothing can rewrite that memory, or the file system the path names, between the
inspection and the kernel's own re-read. execve cannot be performed on the sandbox's
behalf, so for it (and for the few other held calls that need it) the whole sandbox is
frozen instead.

Invariant, enforced by `Freeze.run`: from the moment `body` starts reading the caller's
memory until the held call has returned to the caller, no other task of the sandbox runs
user code or a syscall. A task counts as frozen when
  1. it reported a ptrace stop to our tracer thread (only that thread can resume it), or
  2. it has exited, or
  3. it is blocked in a seccomp notification of this sandbox that has been received and
     whose answer the session's gate holds back until the freeze ends, or
  4. it is a vfork parent waiting for its child (it cannot run before the child execs or
     exits).
The sandbox is the process tree below its root (sandlock-init.c: a child subreaper outside
the sandbox, so orphans stay in the tree whatever group or session they made), so
membership is kernel state the sandbox cannot misreport: the tree is walked
(sandlock.process_tree). A fork already inside the kernel when its caller is interrupted
still completes, so tasks are enumerated again once every known task is frozen: a task in
a ptrace stop or held by the gate cannot be inside a fork, so a round that then finds no
new task is complete.

If the freeze cannot be established within its deadline (ptrace refused, a task that keeps
running), the held call is denied: the invariant is never relaxed. If the released call
does not return within the deadline, the calling process is killed rather than released
with others running. The tracer is a thread of its own: when it ends, the kernel detaches
every tracee at once, including tasks that never reached their stop.
"""

from __future__ import annotations

import os
import signal
import threading
import time

from .. import process_tree
from .._kernel import ptrace

# Syscalls a vfork parent may be blocked in until its child execs or exits (x86-64).
_NR_CLONE, _NR_VFORK = 56, 58
_CLONE_VFORK = 0x4000
_POLL = 0.0002


def _await_exit(tid: int | None) -> None:
    """Wait (bounded) until the tracer thread `tid` is gone from the kernel, not only from
    Python: its tracees are detached by its exit, and the next freeze of the sandbox (the
    caller holds its freeze_lock until this returns) could not seize a task still traced by
    it (PTRACE_SEIZE fails with EPERM)."""
    deadline = time.monotonic() + 1.0
    delay = 0.00002
    while tid is not None and os.path.exists(f"/proc/self/task/{tid}"):
        if time.monotonic() > deadline:
            return  # the next freeze fails closed (denies) if it cannot seize
        time.sleep(delay)
        delay = min(_POLL, delay * 2)


class FreezeError(Exception):
    """The sandbox could not be frozen; the held call must be denied."""


class Freeze:
    """One freeze of `session`'s sandbox for the held call `req` of thread `req.pid`."""

    def __init__(self, session, req, tgid: int, limit: float, decision_time: float):
        """`limit` bounds freezing and, again, the released call's return; `decision_time`
        bounds what `body` may take (the policy_fn timeout)."""
        self.session = session
        self.caller = req.pid
        self.tgid = tgid
        self.limit = limit
        self.decision_time = decision_time
        self.deadline = time.monotonic() + limit
        self.seized: dict[int, int] = {}  # tid -> pid
        self.frozen: set[int] = set()

    def run(self, body, respond, after=None) -> None:
        """Freeze, then `respond(body())`; when the response lets the call through
        (`body` returns a truthy `passes`), wait for the call to return, then (before
        thawing anything) ask `after(outcome)` whether its effect is what was judged: a
        refusal kills the caller's process while it is still stopped (network.Frozen).

        `body()` returns (response, passes). A FreezeError before `body` runs denies."""
        outcome: list = []

        def tracer():
            try:
                self._freeze()
                response, passes = body()
                respond(response)
                outcome.append(response)
                if passes:
                    self.deadline = time.monotonic() + self.limit
                    try:
                        returned = self._await_return()
                        refusal = after(returned) if after is not None else None
                    except BaseException:
                        # Released but not seen to return (or not verified): the caller
                        # must not run on beside tasks about to be thawed.
                        self._kill_caller()
                        raise
                    if refusal is not None:
                        self._kill_caller()
            except BaseException as e:  # reported to the worker, which denies
                outcome.append(e)

        t = threading.Thread(target=tracer, name="sandlock-freeze", daemon=True)
        t.start()
        t.join(2 * self.limit + self.decision_time + 2.0)
        if t.is_alive():
            # The released call has not returned (an exec stuck loading its file, say):
            # others stay frozen until the caller is gone, never released beside it.
            self._kill_caller()
            t.join(2.0)
        if t.is_alive():  # cannot happen with bounded waits; never leave tracees behind
            self._kill_group()
            raise FreezeError("the freeze did not end in time; the sandbox was killed")
        _await_exit(t.native_id)
        if outcome and isinstance(outcome[0], BaseException):
            raise outcome[0]

    # -- freezing --

    def _seize(self, pid: int, tid: int, options: int = 0) -> None:
        err = ptrace.seize_errno(tid, options)
        if err == 0:
            err = ptrace.interrupt_errno(tid)
        if err == 0:
            self.seized[tid] = pid
            return
        if ptrace.thread_state(pid, tid) in ("", "Z", "X"):
            self.frozen.add(tid)  # exited meanwhile: nothing left to freeze
            return
        raise FreezeError(f"cannot freeze task {tid}: ptrace: {os.strerror(-err)}")

    def _freeze(self) -> None:
        self._seize(self.tgid, self.caller, ptrace.PTRACE_O_TRACEEXEC)
        known = {self.caller}
        while True:
            new = [(p, t) for p, t in process_tree.tasks(self.session.root) if t not in known]
            if not new:
                return  # every task was frozen before this enumeration began
            for pid, tid in new:
                known.add(tid)
                self._seize(pid, tid)
            self._wait_frozen([t for _, t in new])
            self._check_deadline("enumerating the sandbox")

    def _wait_frozen(self, waiting: list[int]) -> None:
        delay = 0.0
        while True:
            waiting = [t for t in waiting if t not in self.frozen and not self._is_frozen(t)]
            if not waiting:
                return
            self._check_deadline(f"task {waiting[0]} did not stop")
            time.sleep(delay)  # 0 first: most tasks stop within microseconds
            delay = min(_POLL, delay * 2 or 0.00002)

    def _is_frozen(self, tid: int) -> bool:
        event = ptrace.poll_tracee(tid)
        if event is not None:
            self.frozen.add(tid)
            return True
        if self.session.held_by_gate(tid):
            return True
        # A vfork parent waits in the kernel until its child execs or exits. Its child
        # is in the tree by then; the next enumeration round finds it if it is new.
        blocked = ptrace.blocked_syscall(self.seized[tid], tid)
        if blocked is not None and (blocked[0] == _NR_VFORK or (
                blocked[0] == _NR_CLONE and blocked[1] & _CLONE_VFORK)):
            return True
        return False

    def _check_deadline(self, what: str) -> None:
        if time.monotonic() > self.deadline:
            raise FreezeError(f"could not freeze the sandbox in time: {what}")

    # -- after the response --

    def _await_return(self) -> str:
        """Wait until the released call has returned to the caller (its pending interrupt
        then stops it) or the caller is gone: "exec" when an exec succeeded (the new
        program is stopped before its first instruction), "returned" or "gone". Other
        tracees are waited for too: an exec ends the caller's other threads, and a traced
        thread's exit completes only once its tracer has collected it. Polled, never a
        blocking wait: every wait is bounded, and a stop taken by someone else's wait(-1)
        cannot hang this thread."""
        watch = [self.caller] if self.caller == self.tgid else [self.caller, self.tgid]
        others = [t for t in self.seized if t not in watch]
        killed = False
        delay = 0.0
        while True:
            for tid in others:
                ptrace.poll_tracee(tid)
            for tid in watch:
                event = ptrace.poll_tracee(tid)
                if event is None:
                    continue
                kind, detail = event
                if kind == "stop" and detail == ptrace.PTRACE_EVENT_EXEC:
                    return "exec"  # the caller, or a non-leader that took the leader's id
                if tid == self.caller and kind != "gone":
                    return "returned" if kind == "stop" else "gone"
                if tid == self.tgid and tid != self.caller and kind != "stop":
                    if tid not in self.seized and self._caller_exists():
                        continue  # a leader gone before the freeze (never ours) says nothing
                    return "gone"  # all exited
                if kind == "gone" and len(watch) == 1:
                    return "gone"
                if kind == "gone":
                    watch = [t for t in watch if t != tid]
            if time.monotonic() > self.deadline:
                if killed and time.monotonic() > self.deadline + 1.0:
                    return "gone"  # SIGKILL cannot be refused: the process is dying
                if not killed:
                    killed = True
                    try:
                        os.kill(self.tgid, signal.SIGKILL)
                    except ProcessLookupError:
                        return "gone"
            time.sleep(delay)
            delay = min(_POLL, delay * 2 or 0.00002)

    def _caller_exists(self) -> bool:
        return ptrace.thread_state(self.tgid, self.caller) not in ("", "Z", "X")

    def _kill_caller(self) -> None:
        try:
            os.kill(self.tgid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _kill_group(self) -> None:
        try:
            os.kill(self.session.root, signal.SIGTERM)  # the root ends the whole tree
        except OSError:
            pass
