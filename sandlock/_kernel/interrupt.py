"""Waking a thread blocked in a syscall: a real-time signal with a no-op handler, sent to
that one thread (tgkill).

The supervisor's workers perform blocking calls on a sandbox's behalf (a connect to a
unix listener whose backlog is full waits in the kernel until the listener accepts, and
nothing done to our duplicate of the socket wakes it). When the call's sandbox task is
gone, the worker must not stay blocked: `interrupt(thread)` makes its syscall return EINTR.

The handler is installed without SA_RESTART, so the kernel does not restart the call. It
must do nothing and be async-signal-safe, and it must be a C function: libc's getpid is
used (it ignores its argument and touches nothing). The signal is the highest real-time
signal whose disposition is still the default when this module first installs it, so a
program that uses real-time signals for itself keeps them; exec resets it in sandboxes.
"""

from __future__ import annotations

import ctypes
import signal
import threading

from .syscall import NR_RT_SIGACTION, libc, syscall


class _Sigaction(ctypes.Structure):  # glibc's struct sigaction (x86-64)
    _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_uint64 * 16),
                ("flags", ctypes.c_int), ("restorer", ctypes.c_void_p)]


_lock = threading.Lock()
_signal: int | None = None


def disposition(sig: int) -> int | None:
    """The handler of `sig` in this process (0: default, 1: ignored, else a function's
    address), asked of the kernel (rt_sigaction; its struct has the handler first): glibc's
    sigaction refuses its own signals (32, 33), even to tell. None if the kernel refuses."""
    old = (ctypes.c_uint64 * 4)()
    try:
        syscall(NR_RT_SIGACTION, sig, None, ctypes.byref(old), 8)
    except OSError:
        return None
    return old[0]


def _install() -> int | None:
    """Choose and install the signal once; None if no real-time signal is free."""
    global _signal
    with _lock:
        if _signal is not None:
            return _signal
        noop = ctypes.cast(libc.getpid, ctypes.c_void_p).value
        for sig in range(signal.SIGRTMAX, signal.SIGRTMIN + 3, -1):
            if disposition(sig) != 0:  # 0 = SIG_DFL: nobody uses it
                continue
            # glibc's sigaction (not the raw syscall): it supplies the restorer.
            act = _Sigaction(noop)  # empty mask, no flags: no SA_RESTART
            if libc.sigaction(sig, ctypes.byref(act), None) == 0:
                _signal = sig
                return sig
        return None


def interrupt(thread_id: int) -> bool:
    """Make the syscall thread `thread_id` (threading.get_ident()) is blocked in return
    EINTR. False if no signal could be installed (the call then ends only on its own)."""
    sig = _install()
    if sig is None:
        return False
    try:
        signal.pthread_kill(thread_id, sig)
    except (ProcessLookupError, OSError):
        return False
    return True


def prepare() -> None:
    """Install the handler now (before any worker can need it)."""
    _install()


def installed() -> int | None:
    """The signal `interrupt` sends if this process has installed it already, else None
    (nothing is installed by asking). Python's signal.getsignal does not know it."""
    return _signal


def signal_number() -> int | None:
    """The signal `interrupt` sends (None: none could be installed)."""
    return _install()


def only_interruptible() -> None:
    """Block every signal in the calling thread except the one `interrupt` sends: a
    supervisor thread then never takes (or is interrupted by) the application's signals."""
    sig = _install()
    signal.pthread_sigmask(signal.SIG_BLOCK,
                           set(signal.valid_signals()) - ({sig} if sig else set()))
