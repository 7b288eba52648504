"""The sandbox's processes: the descendants of its root (sandlock-init.c), found from
Python.

The root is a child subreaper outside the sandbox: every process of the sandbox is its
descendant (orphans are handed to it), whatever process group or session it made, and a
pid in the tree cannot be reused before the root reaps it. Walking the tree reads
/proc/PID/task/TID/children of every thread. The root itself ends the tree (it is told
with SIGTERM); from here the tree is walked to freeze it around a held call
(supervisor.freeze) and to pause or resume it.
"""

from __future__ import annotations

import os

from ._kernel import procstat
from ._kernel.pidfd import pidfd_open, pidfd_send_signal


def tasks(root: int) -> list[tuple[int, int]]:
    """(pid, tid) of every thread of every descendant of `root` (not root's own)."""
    out, stack = [], _children(root)
    seen = set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue  # exited meanwhile: its children were handed to the root
        for t in tids:
            out.append((pid, int(t)))
        stack.extend(_children(pid))
    return out


def _children(pid: int) -> list[int]:
    out = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tids:
        try:
            with open(f"/proc/{pid}/task/{t}/children", "rb") as f:
                out.extend(int(c) for c in f.read().split())
        except OSError:
            continue
    return out


def members(root: int) -> list[int]:
    """The pids of the descendants of `root`."""
    return sorted({pid for pid, _ in tasks(root)})


def signal_members(root: int, sig: int) -> None:
    """Send `sig` to every descendant of `root`: each through a pidfd opened while it was
    still, by its parent link, in the tree (a pid freed meanwhile is never signalled)."""
    for pid in members(root):
        try:
            fd = pidfd_open(pid)
        except OSError:
            continue
        try:
            if _in_tree(pid, root):
                pidfd_send_signal(fd, sig)
        except OSError:
            pass
        finally:
            os.close(fd)


def in_tree(pid: int, root: int) -> bool:
    """Whether the process that has `pid` now descends from `root` (by its parent links).
    Pin it with a pidfd opened before, and check the pidfd is still alive after using the
    pid: then the pid named that very process throughout."""
    return _in_tree(pid, root)


def _in_tree(pid: int, root: int) -> bool:
    for _ in range(4096):
        try:
            ppid = int(procstat.fields(procstat.read(f"/proc/{pid}/stat"))[procstat.PPID])
        except (OSError, ValueError, IndexError):
            return False
        if ppid == root:
            return True
        if ppid <= 1:
            return False
        pid = ppid
    return False
