"""max_processes: counting the sandbox's processes at each fork (sandlock.limits).

Every process-creating clone/fork/vfork reaches the supervisor (threads too, since the
flags that tell them apart are checked here: libseccomp drops conditional rules on a
syscall it sends to the supervisor). A fork is let through only if the live processes of
the tree (sandlock.process_tree, the root excluded) plus the forks let through that have
not yet shown up stay below the limit; otherwise it fails with EAGAIN. A fork let through
is "in flight" until its parent has a child it did not have when the fork was allowed, the
parent is gone, or a second has passed: counting it twice for a moment errs on the side
of refusing, never of exceeding.
"""

from __future__ import annotations

import errno
import os
import threading
import time

from .. import process_tree
from .request import Denied

CLONE_THREAD = 0x00010000
IN_FLIGHT = 1.0  # seconds a fork let through is counted before it shows up


RECOUNT = 0.05  # seconds a count of the tree is trusted (while far from the limit)


class ForkBudget:
    """The count is kept cheap: the tree is walked at most every RECOUNT seconds while the
    live processes at the last walk plus every fork let through since stay below the limit
    (an upper bound: exits are only seen at the next walk); near the limit it is walked
    and the forks in flight are checked one by one before anything is refused."""

    def __init__(self, limit: int):
        self.limit = limit
        self._lock = threading.Lock()
        self._in_flight: list[tuple[int, frozenset, float]] = []
        self._live = 0
        self._walked = -1.0
        self._since = 0  # forks let through since the walk

    def lower(self, n: int) -> None:
        with self._lock:
            self.limit = min(self.limit, n)
            self._walked = -1.0

    def admit(self, session, tid: int) -> None:
        """Let a fork by thread `tid` through, or raise Denied(EAGAIN)."""
        with self._lock:
            now = time.monotonic()
            if now - self._walked > RECOUNT or self._live + self._since + 1 >= self.limit:
                self._in_flight = [(t, before, d) for t, before, d in self._in_flight
                                   if d > now and _pending(t, before)]
                self._live = len(process_tree.members(session.root))
                self._walked, self._since = now, len(self._in_flight)
                if self._live + self._since >= self.limit:
                    raise Denied(errno.EAGAIN, f"max_processes ({self.limit}) reached: "
                                               f"{self._live} processes live")
            self._in_flight.append((tid, frozenset(_children(tid)), now + IN_FLIGHT))
            self._since += 1


def _children(tid: int) -> set[int]:
    """The children thread `tid` made (a fork's child is listed under the thread that
    forked it)."""
    try:
        with open(f"/proc/{tid}/task/{tid}/children", "rb") as f:
            return {int(c) for c in f.read().split()}
    except OSError:
        return set()


def _pending(tid: int, before: frozenset) -> bool:
    """The fork has not shown up: its thread lives and has no child it did not have."""
    if not os.path.exists(f"/proc/{tid}/task/{tid}"):
        return False
    return not (_children(tid) - before)


def is_process(name: str, flags: int) -> bool:
    return name in ("fork", "vfork") or (name == "clone" and not flags & CLONE_THREAD)
