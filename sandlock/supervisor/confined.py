"""On-behalf calls the kernel judges as the sandbox's own: supervisor threads confined by
the sandbox's Landlock ruleset.

landlock_restrict_self (without a thread-sync flag) and PR_SET_NO_NEW_PRIVS apply to the
calling thread only. A supervisor thread that restricts itself with a sandbox's ruleset is
therefore judged, for everything it opens or creates, exactly as that sandbox: creating a
name needs the same MAKE_* right on the same directory object, an fd it opens carries the
same truncate and ioctl rights. The guard (supervisor.guard) performs the calls that
create names through these threads, so it decides nothing Landlock decides: it only adds
the names it refuses.

Invariants (enforced here):
- A confined thread serves one sandbox, and never returns to a shared pool: it leaves
  after Workers.IDLE seconds without work; its jobs are the ones the guard submits.
- Before restricting itself, its effective capabilities become the sandbox's (none, unless
  kept): capset is per thread too.
- A thread whose restriction failed runs no call: `confined()` is False there, and the
  guard refuses (EPERM), never acting unconfined.
- Landlock denies ptrace-mode access from the thread to processes outside its domain,
  the sandbox's included, so what needs /proc/PID (the caller's root, cwd and fds) is
  opened by the guard before it hands the call over, and passed as fds.
"""

from __future__ import annotations

import os
import threading

from .._kernel import caps
from .._kernel.landlock import restrict_self_errno
from .workers import Workers

PR_SET_NO_NEW_PRIVS = 38
THREADS = 4  # per sandbox: calls past that wait for one (a FIFO open may block one)

_state = threading.local()


def confined() -> bool:
    """Whether the calling thread is a confined thread that restricted itself."""
    return getattr(_state, "confined", False)


class Confined:
    """The confined threads of one sandbox."""

    def __init__(self, ruleset_fd: int | None, keep_caps: int):
        """`ruleset_fd` None: the sandbox has no Landlock ruleset (a kernel without
        Landlock, accepted as degraded), so neither do these threads."""
        self._fd = os.dup(ruleset_fd) if ruleset_fd is not None else None
        self._keep = keep_caps
        self._lock = threading.Lock()
        self.pool = Workers("sandlock-confined", setup=self._setup, limit=THREADS,
                            queue_when_full=True)

    def _setup(self) -> None:
        _state.confined = False
        with self._lock:
            fd = self._fd
        if fd is not None and fd < 0:
            return  # closed: the sandbox is gone
        base = caps.capget()
        permitted = base.mask("permitted")
        if permitted:
            sets = caps.CapSets(self._keep & permitted, permitted, base.mask("inheritable"))
            if caps.capset_errno(sets) != 0:
                return
        if caps.prctl_errno(PR_SET_NO_NEW_PRIVS, 1) != 0:
            return
        if fd is not None and restrict_self_errno(fd) != 0:
            return
        _state.confined = True

    def submit(self, fn, *args) -> None:
        self.pool.submit(fn, *args)

    def close(self) -> None:
        """The ruleset fd is released; threads started later refuse every call."""
        with self._lock:
            fd, self._fd = self._fd, -1
        if fd is not None and fd >= 0:
            os.close(fd)
