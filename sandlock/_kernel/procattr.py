"""Process attributes Python's os module does not wrap: the execution domain
(personality(2)) and the I/O priority (ioprio_get/ioprio_set(2)), each read of another
process by pid or set on this one."""

from __future__ import annotations

from .syscall import NR_IOPRIO_GET, NR_IOPRIO_SET, NR_PERSONALITY, syscall

IOPRIO_WHO_PROCESS = 1
_QUERY = 0xFFFFFFFF


def personality() -> int:
    """This process's execution domain."""
    return syscall(NR_PERSONALITY, _QUERY)


def set_personality(value: int) -> None:
    """Set this process's execution domain; OSError if the kernel refuses it (the value
    is checked by reading it back: personality(2) reports no error for unknown domains)."""
    syscall(NR_PERSONALITY, value & 0xFFFFFFFF)
    if personality() != value:
        raise OSError(22, f"personality {value:#x} not taken")


def ioprio(pid: int) -> int:
    """The I/O priority of process `pid` (0: this one)."""
    return syscall(NR_IOPRIO_GET, IOPRIO_WHO_PROCESS, pid)


def set_ioprio(value: int) -> None:
    """Set this process's I/O priority; OSError (EPERM) if it may not."""
    syscall(NR_IOPRIO_SET, IOPRIO_WHO_PROCESS, 0, value)
