"""The *at metadata syscalls in their AT_EMPTY_PATH form: acting on an O_PATH fd.

The supervisor resolves a path once to an O_PATH fd, checks that fd, and then changes
exactly the inode it checked through these calls. Raw syscalls, because glibc rejects some
of these argument forms (a NULL path for utimensat) before reaching the kernel.
"""

import ctypes

from .syscall import NR_FCHMODAT2, syscall

NR_FCHOWNAT = 260
NR_UTIMENSAT = 280

AT_FDCWD = -100
AT_SYMLINK_NOFOLLOW = 0x100
AT_EMPTY_PATH = 0x1000


def fchmod_fd(fd: int, mode: int, nofollow: bool = False) -> None:
    """chmod the inode behind `fd` (O_PATH allowed); needs fchmodat2 (Linux 6.6).

    With `nofollow` the kernel refuses a symlink (EOPNOTSUPP), as for the child's own call.
    """
    flags = AT_EMPTY_PATH | (AT_SYMLINK_NOFOLLOW if nofollow else 0)
    syscall(NR_FCHMODAT2, fd, b"", ctypes.c_uint(mode), flags)


def fchown_fd(fd: int, uid: int, gid: int) -> None:
    syscall(NR_FCHOWNAT, fd, b"", ctypes.c_uint(uid), ctypes.c_uint(gid), AT_EMPTY_PATH)


def utimens_fd(fd: int, times: bytes | None, empty_path: bool) -> None:
    """Set times on the inode behind `fd`. `times` is a raw `struct timespec[2]` or None (now).

    With empty_path the fd may be O_PATH (AT_EMPTY_PATH); without it this is futimens(),
    which fails with EBADF on O_PATH fds exactly as the kernel would for the child.
    """
    buf = ctypes.create_string_buffer(times, 32) if times is not None else None
    if empty_path:
        syscall(NR_UTIMENSAT, fd, b"", buf, AT_EMPTY_PATH)
    else:
        syscall(NR_UTIMENSAT, fd, None, buf, 0)
