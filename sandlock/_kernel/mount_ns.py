"""A sandbox's own mount namespace, held by the supervisor so that its teardown is not
the sandbox's exit.

The overlay backend and the user-file protection mount inside a mount namespace of the
sandbox's own (sandlock-exec.c). When its last task exits, the kernel tears it down in
that task's exit path, before the task becomes a zombie: every mount is unmounted (an
overlayfs syncs its upper filesystem and drops every inode a run looked up: ~1 ms for
nothing looked up, ~4 ms after `git status` in a 2,000-file tree, here), and the
sandbox's exit status waits for all of it. Holding an fd on the namespace keeps it (and
its mounts) alive past that exit; closing the fd later tears it down in the closing
thread. `close_later` does that in one background thread of this process.

Invariant: a held namespace has no task in it once the sandbox has ended (the supervisor
waits for every task), so nothing reaches its mounts; the supervisor reads and changes the
overlay's upper directory then as it would after the teardown (cow/overlay.py).
"""

from __future__ import annotations

import os
import threading

_closing = None  # the closer's queue.SimpleQueue, once started
_lock = threading.Lock()


def _forget() -> None:
    global _closing
    _closing = None  # a forked child has no closer thread: it starts its own


os.register_at_fork(after_in_child=_forget)


def hold(pid: int) -> int:
    """An fd on the mount namespace of `pid` (a task of the sandbox, waiting before its
    exec), or -1 where it cannot be opened (its teardown is then its exit, as before)."""
    try:
        return os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return -1


def _closer(q) -> None:
    while True:
        fd = q.get()
        try:
            os.close(fd)  # the teardown runs here, in this thread's return from close
        except OSError:
            pass


def close_later(fd: int) -> None:
    """Close a held namespace's fd in the background (in order, one thread for all)."""
    global _closing
    if fd < 0:
        return
    with _lock:
        if _closing is None:
            import queue  # only a run with its own mounts needs it (~1.5 ms to import)
            q = queue.SimpleQueue()
            threading.Thread(target=_closer, args=(q,), name="sandlock-mount-ns",
                             daemon=True).start()
            _closing = q
    _closing.put(fd)
