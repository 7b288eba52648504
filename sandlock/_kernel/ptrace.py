"""ptrace(2) as the supervisor uses it: seize and interrupt threads to freeze them, wait
for their stops, and (for a call the supervisor re-issues with other arguments,
supervisor.reissue) read and write the registers of a thread in a stop, then detach.

A tracer is a *thread*: only the thread that seized a tracee may act on it, and when that
thread exits the kernel detaches every tracee it held (clearing a pending interrupt, and
resuming any tracee it stopped). sandlock.supervisor.freeze relies on exactly that.
"""

import ctypes
import errno
import os

from . import procstat
from .syscall import NR_PTRACE, syscall_errno

PTRACE_GETREGS = 12
PTRACE_SETREGS = 13
PTRACE_DETACH = 17
PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207
PTRACE_O_TRACEEXEC = 0x10
PTRACE_EVENT_EXEC = 4
WALL = 0x40000000  # __WALL: wait for any thread, clone children included


def seize_errno(tid: int, options: int = 0) -> int:
    """Attach to thread `tid` without stopping it; 0 or -errno."""
    return syscall_errno(NR_PTRACE, ctypes.c_long(PTRACE_SEIZE), ctypes.c_long(tid),
                         ctypes.c_void_p(0), ctypes.c_void_p(options))


def interrupt_errno(tid: int) -> int:
    """Make a seized thread stop before it next runs user code; 0 or -errno."""
    return syscall_errno(NR_PTRACE, ctypes.c_long(PTRACE_INTERRUPT), ctypes.c_long(tid),
                         ctypes.c_void_p(0), ctypes.c_void_p(0))


def poll_tracee(tid: int):
    """One non-blocking wait on tracee `tid`: None (nothing new), ("stop", event),
    ("exit", status) or ("gone", 0) when the thread no longer exists for us."""
    try:
        pid, status = os.waitpid(tid, os.WNOHANG | WALL)
    except ChildProcessError:
        return ("gone", 0)
    except OSError as e:
        if e.errno == errno.EINTR:
            return None
        raise
    if pid == 0:
        return None
    if os.WIFSTOPPED(status):
        return ("stop", status >> 16)
    return ("exit", status)


def thread_state(pid: int, tid: int) -> str:
    """The scheduler state letter of a thread ('R', 'S', 'D', 't', 'Z', ...), or '' if gone."""
    try:
        return procstat.fields(procstat.read(f"/proc/{pid}/task/{tid}/stat"))[
            procstat.STATE].decode()
    except (OSError, ValueError, IndexError):
        return ""


def blocked_syscall(pid: int, tid: int) -> tuple[int, int] | None:
    """(syscall number, first argument) of a thread blocked in a syscall, else None."""
    try:
        with open(f"/proc/{pid}/task/{tid}/syscall", "rb") as f:
            fields = f.read().split()
        return int(fields[0]), int(fields[1], 16)
    except (OSError, ValueError, IndexError):
        return None


# struct user_regs_struct (x86-64), in the kernel's order.
REGS = ("r15", "r14", "r13", "r12", "rbp", "rbx", "r11", "r10", "r9", "r8", "rax", "rcx",
        "rdx", "rsi", "rdi", "orig_rax", "rip", "cs", "eflags", "rsp", "ss", "fs_base",
        "gs_base", "ds", "es", "fs", "gs")


class Regs(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in REGS]


def getregs(tid: int) -> Regs:
    """The registers of a tracee in a ptrace stop (by the thread that seized it)."""
    regs = Regs()
    err = syscall_errno(NR_PTRACE, ctypes.c_long(PTRACE_GETREGS), ctypes.c_long(tid),
                        ctypes.c_void_p(0), ctypes.byref(regs))
    if err < 0:
        raise OSError(-err, os.strerror(-err))
    return regs


def setregs(tid: int, regs: Regs) -> None:
    err = syscall_errno(NR_PTRACE, ctypes.c_long(PTRACE_SETREGS), ctypes.c_long(tid),
                        ctypes.c_void_p(0), ctypes.byref(regs))
    if err < 0:
        raise OSError(-err, os.strerror(-err))


def detach_errno(tid: int) -> int:
    """Let a tracee in a stop run on, untraced; 0 or -errno."""
    return syscall_errno(NR_PTRACE, ctypes.c_long(PTRACE_DETACH), ctypes.c_long(tid),
                         ctypes.c_void_p(0), ctypes.c_void_p(0))
