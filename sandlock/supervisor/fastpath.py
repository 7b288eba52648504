"""The C fast path (sandlock/_libexec/fastconnect.c, with fastcow.c for workspaces; built
by `make helper`).

The supervisor thread waits for notifications inside the library, without the GIL. For a
sandbox the loop enables, the library answers by itself the connects whose verdict is
already known: CONTINUE for a TCP socket of a single-threaded process when Landlock decides
every TCP port (as connect.py would), and an on-behalf connect to a destination connect.py
allowed before for the same sandbox (`learn`). In a copy-on-write workspace whose layer has
no change yet it lets the kernel do the calls that only look (stat, opens for reading, ...):
the workspace is then the workdir itself, which Landlock keeps read-only; the flag is
cleared before the layer's first change (CowLayer.on_first_change); after it, an fstat
is continued unless its file carries the layer's identity xattr (a copied-up file, whose
fstat must report the identity a stat by path reports: cow_reads._fd_stat), and so is a
listing (getdents) unless it starts at the beginning of a directory fd on the workdir
(which Python may point at the layer's directory: cow_reads.getdents). Under max_processes it
continues the forks that fit in tokens the fork budget lent it (supervisor/forks.py: forks
already counted as let through), and threads; a clone with flags the filter refuses goes
to Python (its checks are replayed in C: keep them in step with
syscall_filter.clone_refusal and lifecycle.py). Everything else reaches Python, received.

What may be replayed is decided here, in one place:
- only sandboxes without a policy_fn (no freezes, no per-process rules), without audit
  records of allowed calls, and whose supervisor thread acts without capabilities;
- only plain TCP connects Python allowed: never a denial, never a DNS or HTTP redirect;
- only forks Python counted in advance (a fork with no token left is Python's);
- a verdict that rests on DNS pins expires with them, and every change of any pins
  forgets all verdicts (`forget_all`).

The wait itself is in C (fastconnect.c, wait_events): while the supervisor serves at most
8 sandboxes it polls their listeners directly rather than through the epoll set, so that
with SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP (set at attach) a trapped call wakes it on the
trapping task's CPU and the answer wakes the task on the same one: on this project's VM a
trapped call costs ~7 us instead of ~45 us. C owns the set's membership (add/remove): the
epoll set and the directly polled listeners change together.

Without the library every connect takes the Python path: same decisions, slower.
SANDLOCK_NO_FASTPATH=1 forces that (benchmarks compare the two).
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading

from .. import libexec

VERSION = 7  # sl_fast_version() of the fastconnect.c this module speaks to
LIBRARY = libexec.path("libsandlock-fastconnect.so")
CONTINUE_TCP = 1
COW_PRISTINE = 2
FORK_BUDGET = 4
FORK_RING = 64  # fastconnect.c: forks let through in C that Python has not taken back


class FastPath:
    def __init__(self, lib):
        self._lib = lib
        lib.sl_fast_wait.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                     ctypes.POINTER(ctypes.c_uint32),
                                     ctypes.POINTER(ctypes.c_int)]
        lib.sl_fast_enable.argtypes = [ctypes.c_int, ctypes.c_uint]
        lib.sl_fast_disable.argtypes = [ctypes.c_int]
        lib.sl_fast_learn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p,
                                      ctypes.c_size_t, ctypes.c_int64]
        lib.sl_fast_flush.argtypes = [ctypes.c_int]
        lib.sl_fast_add.argtypes = [ctypes.c_int, ctypes.c_int]
        lib.sl_fast_remove.argtypes = [ctypes.c_int, ctypes.c_int]
        lib.sl_fast_clear.argtypes = [ctypes.c_int, ctypes.c_uint]
        lib.sl_fast_cow_lower.argtypes = [ctypes.c_int, ctypes.c_char_p]
        lib.sl_fast_init.argtypes = []
        lib.sl_fast_stats.argtypes = [ctypes.POINTER(ctypes.c_uint64 * 6)]
        lib.sl_fast_fork_lend.argtypes = [ctypes.c_int, ctypes.c_int]
        lib.sl_fast_fork_take.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int32),
                                          ctypes.POINTER(ctypes.c_int64),
                                          ctypes.POINTER(ctypes.c_int)]
        self._events = ctypes.c_uint32()
        self._received = ctypes.c_int()
        # Verdicts are learnt only if nothing was forgotten since they were decided: a
        # pin recorded between a decision and its learn() cannot leave a stale verdict.
        self._lock = threading.Lock()
        self._generation = 0
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        """A forked child starts with an empty table and fresh locks (no thread that held
        them came along)."""
        self._lock = threading.Lock()
        self._lib.sl_fast_init()

    def init(self) -> None:
        """Before a new supervisor thread starts (anew in a forked process)."""
        self._lib.sl_fast_init()

    def wait(self, epfd: int, timeout: float, notif) -> tuple[int, int, bool] | None:
        """The next event for Python: (fd, epoll events, notification received into
        `notif`), or None when `timeout` seconds (<0: none) ran out."""
        ms = -1 if timeout < 0 else int(timeout * 1000)
        fd = self._lib.sl_fast_wait(epfd, ms, ctypes.byref(notif), ctypes.byref(self._events),
                                    ctypes.byref(self._received))
        if fd == -errno.ETIMEDOUT:
            return None
        if fd < 0:
            raise OSError(-fd, os.strerror(-fd))
        return fd, self._events.value, bool(self._received.value)

    def add(self, epfd: int, listener: int) -> None:
        """Register `listener` in the epoll set `epfd` (EPOLLIN), and with it among the
        listeners the wait polls directly while there are few (fastconnect.c,
        wait_events: trapped calls are then answered on their own CPU)."""
        rc = self._lib.sl_fast_add(epfd, listener)
        if rc < 0:
            raise OSError(-rc, os.strerror(-rc))

    def remove(self, epfd: int, listener: int) -> None:
        """Unregister `listener` (before it is closed); nothing if it is not registered."""
        self._lib.sl_fast_remove(epfd, listener)

    def enable(self, listener: int, continue_tcp: bool, cow_pristine: bool,
               fork_budget: bool = False) -> bool:
        flags = (CONTINUE_TCP if continue_tcp else 0) | (COW_PRISTINE if cow_pristine else 0) \
            | (FORK_BUDGET if fork_budget else 0)
        return self._lib.sl_fast_enable(listener, flags) == 0

    def cow_lower(self, listener: int, lower: str) -> None:
        """The workdir of the listener's workspace: after its first change, listings from
        the start of directory fds under it go to Python (cow_reads.getdents)."""
        # Speed only: unset (a path too long), every such listing is Python's, as correct.
        self._lib.sl_fast_cow_lower(listener, os.fsencode(lower))

    def fork_lend(self, listener: int, n: int) -> int:
        """Let C continue up to `n` (at most FORK_RING) process-creating forks; the number
        lent (0 if the listener is not served here)."""
        return max(self._lib.sl_fast_fork_lend(listener, n), 0)

    def fork_take(self, listener: int) -> tuple[int, list[tuple[int, float]]]:
        """Take the tokens back: (how many were not spent, [(thread, time.monotonic() when
        let through)] of the forks C continued since the last take)."""
        tids, at = (ctypes.c_int32 * FORK_RING)(), (ctypes.c_int64 * FORK_RING)()
        unused = ctypes.c_int()
        n = self._lib.sl_fast_fork_take(listener, tids, at, ctypes.byref(unused))
        return unused.value, [(tids[i], at[i] / 1e9) for i in range(n)]

    def clear(self, listener: int, flags: int) -> None:
        """Stop answering what `flags` allowed (synchronously: no answer based on them is
        sent after this returns)."""
        self._lib.sl_fast_clear(listener, flags)

    def disable(self, listener: int) -> None:
        """Before the listener is closed (its number can be reused at once)."""
        self._lib.sl_fast_disable(listener)

    @property
    def generation(self) -> int:
        """Read before deciding; given to learn()."""
        return self._generation

    def learn(self, listener: int, family: int, sockaddr: bytes, expires: float | None,
              generation: int) -> None:
        """Python allowed an on-behalf TCP connect of a `family` socket to `sockaddr`, a
        verdict that holds until `expires` (time.monotonic(); None: until forgotten)."""
        ns = -1 if expires is None else int(expires * 1e9)
        with self._lock:
            if generation == self._generation:
                self._lib.sl_fast_learn(listener, family, sockaddr, len(sockaddr), ns)

    def forget_all(self) -> None:
        with self._lock:
            self._generation += 1
            self._lib.sl_fast_flush(-1)

    def stats(self) -> dict[str, int]:
        """Calls answered so far (connects continued, connected on behalf, workspace reads
        continued, forks continued), lookups that missed (to_python), on-behalf connects
        in progress."""
        out = (ctypes.c_uint64 * 6)()
        self._lib.sl_fast_stats(ctypes.byref(out))
        return {"continued": out[0], "connected": out[1], "to_python": out[2],
                "in_flight": out[3], "cow_continued": out[4], "forks_continued": out[5]}


_loaded: list = []


def fast_path() -> FastPath | None:
    """The library, loaded once; None if it was not built, is stale, or is switched off."""
    if not _loaded:
        raw = None
        if os.environ.get("SANDLOCK_NO_FASTPATH") != "1":
            raw = libexec.load(LIBRARY, "sl_fast_version", VERSION,
                               "the supervisor does everything in Python")
        if raw is not None:
            # fastcow.c continues an fstat unless the file carries this xattr: the two
            # must name the same one, or copied files would report their own identity.
            from ..cow.location import IDENTITY
            raw.sl_fast_identity_xattr.restype = ctypes.c_char_p
            if raw.sl_fast_identity_xattr() != IDENTITY.encode():
                import warnings
                warnings.warn(f"{LIBRARY} names another identity xattr than {IDENTITY} "
                              f"(a stale build: run `make helper`); the supervisor does "
                              f"everything in Python")
                raw = None
        _loaded.append(FastPath(raw) if raw is not None else None)
    return _loaded[0]


def forget_all() -> None:
    """Every verdict learnt so far no longer holds (DNS pins changed)."""
    fast = _loaded[0] if _loaded else None
    if fast is not None:
        fast.forget_all()


def eligible(session, acts_with_caps: bool) -> bool:
    """Whether the library may answer this sandbox's calls (see the module note)."""
    net = session.net
    # Custom handlers see every call of their syscalls: none is answered in C.
    return (session.runtime is None and session.user_handlers is None and not acts_with_caps
            and (net is not None or session.cow is not None or session.forks is not None)
            and not (net is not None and net.audit is not None and net.audit.log_allowed))


def expiry(session, address) -> float | None:
    """Until when a verdict on `address` holds: until the first of its pinned names
    expires (a new pin forgets every verdict at once)."""
    pins = session.net.pins
    return pins.expiry(address) if pins is not None else None
