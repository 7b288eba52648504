"""pidfd_open and pidfd_getfd: handles on processes that a reused pid cannot redirect."""

import ctypes

from .syscall import NR_PIDFD_GETFD, NR_PIDFD_OPEN, syscall

PIDFD_THREAD = 0o200  # O_EXCL: a pidfd on one thread (Linux 6.9)


def pidfd_open(pid: int, flags: int = 0) -> int:
    return syscall(NR_PIDFD_OPEN, ctypes.c_int(pid), ctypes.c_uint(flags))


def pidfd_getfd(pidfd: int, targetfd: int) -> int:
    """Duplicate `targetfd` of the process behind `pidfd` into this process (O_CLOEXEC).

    Needs ptrace-attach rights over the target: the supervisor is the sandbox's ancestor.
    """
    return syscall(NR_PIDFD_GETFD, ctypes.c_int(pidfd), ctypes.c_int(targetfd), ctypes.c_uint(0))



NR_PIDFD_SEND_SIGNAL = 424


def pidfd_send_signal(pidfd: int, sig: int) -> None:
    """Signal the process behind `pidfd` (never a process that reused its pid)."""
    syscall(NR_PIDFD_SEND_SIGNAL, ctypes.c_int(pidfd), ctypes.c_int(sig), None,
            ctypes.c_uint(0))
