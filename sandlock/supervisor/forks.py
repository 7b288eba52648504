"""max_processes: counting the sandbox's processes at each fork (sandlock.limits).

Every process-creating clone/fork/vfork reaches the supervisor (threads too, since the
flags that tell them apart are checked here: libseccomp drops conditional rules on a
syscall it sends to the supervisor). A fork is let through only if the live processes of
the tree (sandlock.process_tree, the root excluded) plus the forks let through that have
not yet shown up stay below the limit; otherwise it fails with EAGAIN. A fork let through
is "in flight" until the thread that made it has left the fork syscall (/proc/TID/syscall:
the child exists then, and is in the tree or already gone), or is gone, or IN_FLIGHT has
passed: counting it twice for a moment errs on the side of refusing, never of exceeding.
A tree walk runs on a worker (never the supervisor's loop: a large tree takes a while to
walk), under this sandbox's lock; a fork admitted from a fresh count far from the limit is
admitted on the loop itself (try_admit), without one.

With the C fast path (fastpath.py), a count far from the limit also lends tokens: forks the
budget counts as let through in advance (`_since`), which C continues without Python; C
records each one it lets through. Before any count or decision here the tokens are taken
back (`_take_back`): the unspent ones are uncounted, the spent ones become forks in
flight. So the count is the same upper bound as without C, whichever side let a fork
through.
"""

from __future__ import annotations

import errno
import threading
import time

from .. import process_tree
from .request import Denied

CLONE_THREAD = 0x00010000
IN_FLIGHT = 0.25  # seconds a fork let through is counted at most before it shows up
FORK_CALLS = {56, 57, 58}  # clone, fork, vfork (x86-64): /proc/TID/syscall while inside


RECOUNT = 0.05  # seconds a count of the tree is trusted (while far from the limit)


UNLIMITED = 1 << 30  # a budget no tree reaches (until a policy_fn lowers it)


class ForkBudget:
    """The count is kept cheap: the tree is walked at most every RECOUNT seconds while the
    live processes at the last walk plus every fork let through since stay below the limit
    (an upper bound: exits are only seen at the next walk); near the limit it is walked
    and the forks in flight are checked one by one before anything is refused."""

    def __init__(self, limit: int):
        self.limit = limit
        self._lock = threading.Lock()
        self._in_flight: list[tuple[int, float]] = []  # (thread, deadline)
        self._live = 0
        self._walked = -1.0
        self._since = 0  # forks let through since the walk (tokens lent to C included)
        self._lender = None  # (FastPath, listener) while C may spend tokens
        self._lent = 0       # tokens lent and not taken back

    def lend_to(self, fast, listener: int) -> None:
        """Let the C fast path continue forks of `listener` (fast=None: no more; the
        tokens are taken back)."""
        with self._lock:
            self._take_back(time.monotonic())
            self._lender = (fast, listener) if fast is not None else None

    def _take_back(self, now: float) -> None:
        """With the lock held: the tokens C holds come back; the forks it let through are
        in flight from when it did."""
        if self._lender is None or not self._lent:
            return
        fast, listener = self._lender
        unused, forked = fast.fork_take(listener)
        self._since -= unused
        self._lent = 0
        self._in_flight.extend((tid, at + IN_FLIGHT) for tid, at in forked)

    def _lend(self) -> None:
        """With the lock held and a count just made: lend C the forks that fit, all but
        one (the next decision stays here, with a fresh look)."""
        if self._lender is None or self._lent:
            return
        spare = self.limit - (self._live + self._since) - 1
        if spare >= 2:
            fast, listener = self._lender
            self._lent = fast.fork_lend(listener, spare)
            self._since += self._lent

    def lower(self, n: int) -> None:
        with self._lock:
            self._take_back(time.monotonic())
            self.limit = min(self.limit, n)
            self._walked = -1.0
            self._in_flight, self._since = [], 0  # counted afresh at the next fork

    def try_admit(self, tid: int) -> bool:
        """Let a fork through without counting the tree, if the last count is fresh and far
        from the limit; False if admit() must run. Never blocks (the supervisor's loop
        calls it): a budget another thread holds is left to admit()."""
        if self.limit >= UNLIMITED:
            return True  # nothing to count (yet): a policy_fn may lower it later
        if not self._lock.acquire(blocking=False):
            return False
        try:
            now = time.monotonic()
            self._take_back(now)
            if now - self._walked > RECOUNT or self._live + self._since + 1 >= self.limit:
                return False
            self._in_flight.append((tid, now + IN_FLIGHT))
            self._since += 1
            self._lend()
            return True
        finally:
            self._lock.release()

    def admit(self, session, tid: int) -> None:
        """Let a fork by thread `tid` through, or raise Denied(EAGAIN)."""
        with self._lock:
            now = time.monotonic()
            self._take_back(now)
            if now - self._walked > RECOUNT or self._live + self._since + 1 >= self.limit:
                # A thread asking again has left its previous fork: that one is done.
                self._in_flight = [(t, d) for t, d in self._in_flight
                                   if t != tid and d > now and _pending(t)]
                self._live = len(process_tree.members(session.root))
                self._walked, self._since = now, len(self._in_flight)
                if self._live + self._since >= self.limit:
                    raise Denied(errno.EAGAIN, f"max_processes ({self.limit}) reached: "
                                               f"{self._live} processes live")
            self._in_flight.append((tid, now + IN_FLIGHT))
            self._since += 1
            self._lend()


def _pending(tid: int) -> bool:
    """The fork has not returned: its thread is still inside a fork syscall."""
    try:
        with open(f"/proc/{tid}/task/{tid}/syscall", "rb") as f:
            first = f.read().split(b" ", 1)[0]
    except PermissionError:
        return True  # not ours to read (a non-dumpable program): counted until IN_FLIGHT
    except OSError:
        return False  # gone
    return first.lstrip(b"-").isdigit() and int(first) in FORK_CALLS


def is_process(name: str, flags: int) -> bool:
    return name in ("fork", "vfork") or (name == "clone" and not flags & CLONE_THREAD)
