"""The *at metadata syscalls in their AT_EMPTY_PATH form: acting on an O_PATH fd.

The supervisor resolves a path once to an O_PATH fd, checks that fd, and then changes
exactly the inode it checked through these calls. Raw syscalls, because glibc rejects some
of these argument forms (a NULL path for utimensat) before reaching the kernel.
"""

import ctypes
import errno
import os
import stat

from .syscall import NR_FCHMODAT2, syscall

NR_FCHOWNAT = 260
NR_UTIMENSAT = 280
NR_RENAMEAT2 = 316
NR_OPENAT2 = 437

AT_FDCWD = -100
AT_SYMLINK_NOFOLLOW = 0x100
AT_EMPTY_PATH = 0x1000
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


def fchmod_fd(fd: int, mode: int, nofollow: bool = False) -> None:
    """chmod the inode behind `fd` (O_PATH allowed): fchmodat2 (Linux 6.6), or where it is
    missing or refused (a container's seccomp profile) chmod through our /proc/self/fd
    link to the same inode.

    With `nofollow` the kernel refuses a symlink (EOPNOTSUPP), as for the child's own call.
    """
    from ..features import detect
    if not detect().fchmodat2:
        if stat.S_ISLNK(os.fstat(fd).st_mode):
            raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))
        os.chmod(f"/proc/self/fd/{fd}", mode)
        return
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


def openat2(dirfd: int, path: str, flags: int, mode: int, resolve: int) -> int:
    """openat2(2): `resolve` is a set of RESOLVE_* flags."""
    how = _OpenHow(flags, mode if flags & (os.O_CREAT | 0o20000000) else 0, resolve)
    return syscall(NR_OPENAT2, dirfd, os.fsencode(path), ctypes.byref(how),
                   ctypes.c_size_t(ctypes.sizeof(how)))


def open_no_symlinks(path: str, flags: int, mode: int = 0) -> int:
    """open(2) of an absolute path that must contain no symlink at all: a path resolved and
    checked component by component is opened only if nothing on the way was swapped for a
    link since (ELOOP otherwise)."""
    return openat2(AT_FDCWD, path, flags, mode, RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)


def open_beneath(dirfd: int, path: str, flags: int, mode: int = 0) -> int:
    """openat2(dirfd, path) that must stay beneath dirfd and cross no symlink at all:
    ELOOP or EXDEV otherwise."""
    return openat2(dirfd, path, flags | os.O_CLOEXEC, mode,
                   RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)


def renameat2(src: str, dst: str, flags: int, src_dir: int = AT_FDCWD,
              dst_dir: int = AT_FDCWD) -> None:
    """rename(2) with RENAME_NOREPLACE / RENAME_EXCHANGE (absolute paths, or names relative
    to the directory fds)."""
    syscall(NR_RENAMEAT2, src_dir, os.fsencode(src), dst_dir, os.fsencode(dst),
            ctypes.c_uint(flags))


NR_STATX = 332
STATX_BTIME = 0x800


class _Statx(ctypes.Structure):
    _fields_ = [("mask", ctypes.c_uint32), ("blksize", ctypes.c_uint32),
                ("attributes", ctypes.c_uint64), ("nlink", ctypes.c_uint32),
                ("uid", ctypes.c_uint32), ("gid", ctypes.c_uint32),
                ("mode", ctypes.c_uint16), ("_pad", ctypes.c_uint16),
                ("ino", ctypes.c_uint64), ("size", ctypes.c_uint64),
                ("blocks", ctypes.c_uint64), ("attributes_mask", ctypes.c_uint64),
                ("atime", ctypes.c_int64 * 2), ("btime", ctypes.c_int64 * 2),
                ("ctime", ctypes.c_int64 * 2), ("mtime", ctypes.c_int64 * 2),
                ("_rest", ctypes.c_uint64 * 48)]  # the rest of its 256 bytes, and room


def birth_ns(dirfd: int, path: str = "", nofollow: bool = True) -> int | None:
    """When the inode was created (statx STATX_BTIME), in ns since the epoch; None where
    the filesystem does not record it."""
    buf = _Statx()
    flags = (AT_EMPTY_PATH if not path else 0) | (AT_SYMLINK_NOFOLLOW if nofollow else 0)
    syscall(NR_STATX, dirfd, os.fsencode(path), flags, STATX_BTIME, ctypes.byref(buf))
    if not buf.mask & STATX_BTIME:
        return None
    return buf.btime[0] * 1_000_000_000 + (buf.btime[1] & 0xFFFFFFFF)



STATX_MNT_ID = 0x1000


def mount_id(dirfd: int, path: str = "") -> int:
    """The id of the mount the object is reached through (statx STATX_MNT_ID; unique
    across mount namespaces). Decides "on this mount" where st_dev cannot: overlayfs
    reports a non-directory's own filesystem's device when its layers lie on several."""
    buf = _Statx()
    flags = (AT_EMPTY_PATH if not path else 0) | AT_SYMLINK_NOFOLLOW
    syscall(NR_STATX, dirfd, os.fsencode(path), flags, STATX_MNT_ID, ctypes.byref(buf))
    if not buf.mask & STATX_MNT_ID:
        raise OSError(errno.ENOSYS, "statx gave no mount id")
    return buf._rest[2]  # stx_mnt_id, after stx_rdev_* and stx_dev_* (2 x 2 x u32)


def open_regular(path: str) -> int | None:
    """An fd to read the regular file at `path`; None for anything else or an error.
    Opened without blocking (O_NONBLOCK: a FIFO someone put where a file is read — a
    `.git` gitfile, a config, a script's `#!` line — would wait for a writer forever), and
    kept only once fstat says it is a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError:
        return None
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def read_regular(path: str, limit: int) -> bytes | None:
    """The first `limit` bytes of the regular file at `path` (open_regular), or None."""
    fd = open_regular(path)
    if fd is None:
        return None
    try:
        chunks, n = [], 0
        while n < limit:
            chunk = os.read(fd, min(65536, limit - n))
            if not chunk:
                break
            chunks.append(chunk)
            n += len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)
