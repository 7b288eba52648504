"""The libc handle and the single raw-syscall entry point.

Every wrapper in this package calls `syscall()` (or a libc function declared here), which
raises OSError with the real errno. ctypes releases the GIL around foreign calls, so a
blocking syscall never stalls other Python threads.
"""

import ctypes
import os

libc = ctypes.CDLL(None, use_errno=True)

_syscall = libc.syscall
_syscall.restype = ctypes.c_long

# x86-64 syscall numbers used by this package (asm/unistd_64.h).
NR_SECCOMP = 317
NR_PIDFD_OPEN = 434
NR_PIDFD_GETFD = 438
NR_LANDLOCK_CREATE_RULESET = 444
NR_LANDLOCK_ADD_RULE = 445
NR_LANDLOCK_RESTRICT_SELF = 446
NR_FCHMODAT2 = 452
NR_PROCESS_VM_READV = 310
NR_PROCESS_VM_WRITEV = 311
NR_CAPGET = 125
NR_CAPSET = 126
NR_PRCTL = 157
NR_PTRACE = 101
NR_PERSONALITY = 135
NR_IOPRIO_SET = 251
NR_IOPRIO_GET = 252
NR_RT_SIGACTION = 13


def syscall(nr: int, *args) -> int:
    """Call syscall `nr`; raise OSError(errno) on failure, return the result otherwise."""
    ret = _syscall(ctypes.c_long(nr), *args)
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ret


def syscall_errno(nr: int, *args) -> int:
    """Like `syscall` but returns -errno instead of raising (callers that report errors
    themselves)."""
    ret = _syscall(ctypes.c_long(nr), *args)
    if ret < 0:
        return -ctypes.get_errno()
    return ret

