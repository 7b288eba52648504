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
        self._since = 0  # forks let through since the walk

    def lower(self, n: int) -> None:
        with self._lock:
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
            if now - self._walked > RECOUNT or self._live + self._since + 1 >= self.limit:
                return False
            self._in_flight.append((tid, now + IN_FLIGHT))
            self._since += 1
            return True
        finally:
            self._lock.release()

    def admit(self, session, tid: int) -> None:
        """Let a fork by thread `tid` through, or raise Denied(EAGAIN)."""
        with self._lock:
            now = time.monotonic()
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
