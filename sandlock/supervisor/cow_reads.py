"""Calls that only look inside a copy-on-write workdir: stat (by path and by fd), access,
readlink, getxattr/listxattr, getcwd, and directory listings. The supervisor asks the
kernel itself about the location the layer resolved and copies the answer into the
child's buffer (the same bytes the kernel would have written there); a listing is left to
the kernel, on the layer's directory.
"""

from __future__ import annotations

import errno
import os
import stat

from .._kernel.fileops import AT_EMPTY_PATH, AT_FDCWD, AT_SYMLINK_NOFOLLOW
from ..cow.location import MISSING, UPPER, XATTR_PREFIX
from ..fs_rules import is_beneath
from .cow_paths import (STAT_SIZE, STATX_SIZE, located, lookup_follows, raw_stat,
                        raw_stat_fd, rel_of, with_identity, write_child)
from .network import CONTINUE, Replace

AT_EACCESS = 0x200


# --- stat-like reads ---------------------------------------------------------------------------

def _existing(session, req, rel: str, follow: bool):
    """Where a call that only looks finds `rel` (under the layer's lock); ENOENT if nothing."""
    loc = located(session, req, rel, lookup_follows(rel, follow), False, inspect=True)
    if loc.kind == MISSING:
        raise OSError(errno.ENOENT, "No such file or directory")
    return loc


def _fd_stat(req, session, dirfd, buf_arg, at_flags, statx_args=None):
    """fstat of an fd (fstat, or an empty path with AT_EMPTY_PATH): the kernel's answer for
    the inode the fd holds, with the workdir identity of a copied-up file, as a stat by
    path reports it (cp and install compare the two: "replaced while being copied"). The
    fast path sends only fds on such copies here (fastcow.c cow_fd_stat)."""
    if dirfd == AT_FDCWD:
        return CONTINUE  # the working directory: the kernel's, as a stat of "." by path
    fd = req.dup_fd(dirfd)
    try:
        raw = raw_stat_fd(fd, STATX_SIZE if statx_args else STAT_SIZE, statx_args)
        identity = session.cow.fd_identity(fd)
    finally:
        os.close(fd)
    if identity is not None:
        raw = with_identity(raw, identity, statx_args is not None)
    write_child(req, session, req.args[buf_arg], raw)
    return 0


def _stat_common(req, session, dirfd, path_arg, buf_arg, at_flags, statx_args=None):
    if not req.args[path_arg] and at_flags & AT_EMPTY_PATH:  # NULL: the fd (Linux 6.11)
        return _fd_stat(req, session, dirfd, buf_arg, at_flags, statx_args)
    path = req.read_path(path_arg)
    if not path and at_flags & AT_EMPTY_PATH:
        return _fd_stat(req, session, dirfd, buf_arg, at_flags, statx_args)
    rel = rel_of(session, req, dirfd, path)
    if rel is None:
        return CONTINUE
    with session.cow.lock:
        loc = _existing(session, req, rel, not at_flags & AT_SYMLINK_NOFOLLOW)
        raw = raw_stat(loc.real, STATX_SIZE if statx_args else STAT_SIZE, statx_args)
        identity = session.cow.identity(loc.real) if loc.kind == UPPER else None
    if identity is not None:
        raw = with_identity(raw, identity, statx_args is not None)
    write_child(req, session, req.args[buf_arg], raw)
    return 0


def stat_(req, session):
    return _stat_common(req, session, AT_FDCWD, 0, 1, 0)


def lstat(req, session):
    return _stat_common(req, session, AT_FDCWD, 0, 1, AT_SYMLINK_NOFOLLOW)


def fstat(req, session):
    return _fd_stat(req, session, req.arg_int(0), 1, AT_EMPTY_PATH)


def newfstatat(req, session):
    return _stat_common(req, session, req.arg_int(0), 1, 2, req.arg_int(3))


def statx(req, session):
    flags = req.arg_int(2)
    return _stat_common(req, session, req.arg_int(0), 1, 4, flags,
                        (flags, req.args[3] & 0xFFFFFFFF))


def _access(req, session, dirfd, path_arg, mode, flags):
    path = req.read_path(path_arg)
    rel = rel_of(session, req, dirfd, path)
    if rel is None:
        return CONTINUE
    with session.cow.lock:
        loc = _existing(session, req, rel, not flags & AT_SYMLINK_NOFOLLOW)
        # A placeholder answers for the lower file: writable if that file is (copy-up).
        if not os.access(loc.real, mode, effective_ids=bool(flags & AT_EACCESS),
                         follow_symlinks=False):
            raise OSError(errno.EACCES, "Permission denied")
    return 0


def access(req, session):
    return _access(req, session, AT_FDCWD, 0, req.arg_int(1), 0)


def faccessat(req, session):
    return _access(req, session, req.arg_int(0), 1, req.arg_int(2), 0)


def faccessat2(req, session):
    return _access(req, session, req.arg_int(0), 1, req.arg_int(2), req.arg_int(3))


def _readlink(req, session, dirfd, path_arg, buf_arg, size_arg):
    path = req.read_path(path_arg)
    rel = rel_of(session, req, dirfd, path)
    if rel is None:
        return CONTINUE
    size = req.arg_int(size_arg)
    if size <= 0:
        raise OSError(errno.EINVAL, "Invalid argument")
    with session.cow.lock:
        loc = _existing(session, req, rel, False)
        target = os.fsencode(os.readlink(loc.real))
    data = target[:size]
    write_child(req, session, req.args[buf_arg], data)
    return len(data)


def readlink(req, session):
    return _readlink(req, session, AT_FDCWD, 0, 1, 2)


def readlinkat(req, session):
    return _readlink(req, session, req.arg_int(0), 1, 2, 3)


def _sized(req, session, data: bytes, size: int, addr: int) -> int:
    """The xattr calls' answer: the length for size 0 (a query), ERANGE if it does not
    fit, else the bytes written to the caller's buffer."""
    if size == 0:
        return len(data)
    if len(data) > size:
        raise OSError(errno.ERANGE, "Numerical result out of range")
    if data:
        write_child(req, session, addr, data)
    return len(data)


def _getxattr(follow):
    def handler(req, session):
        path = req.read_path(0)
        rel = rel_of(session, req, AT_FDCWD, path)
        if rel is None:
            return CONTINUE
        name = os.fsdecode(req.read_path(1))
        size = req.args[3]
        with session.cow.lock:
            loc = _existing(session, req, rel, follow)
            if name.startswith(XATTR_PREFIX):
                raise OSError(errno.ENODATA, "No data available")
            value = os.getxattr(loc.real, name, follow_symlinks=False)
        return _sized(req, session, value, size, req.args[2])
    return handler


def _listxattr(follow):
    def handler(req, session):
        path = req.read_path(0)
        rel = rel_of(session, req, AT_FDCWD, path)
        if rel is None:
            return CONTINUE
        size = req.args[2]
        with session.cow.lock:
            loc = _existing(session, req, rel, follow)
            names = [n for n in os.listxattr(loc.real, follow_symlinks=False)
                     if not n.startswith(XATTR_PREFIX)]
        data = b"".join(os.fsencode(n) + b"\0" for n in names)
        return _sized(req, session, data, size, req.args[1])
    return handler


def getcwd(req, session):
    """After fchdir() to a directory fd of the workspace, the kernel's cwd is in the upper
    tree: report it as the workdir path the sandbox knows. A cwd in an untouched directory
    that the sandbox then renamed (or renamed a parent of) is where it is now."""
    try:
        cwd = os.readlink(f"/proc/{req.pid}/cwd")
    except OSError:
        return CONTINUE
    if cwd.endswith(" (deleted)"):
        try:
            gone = os.stat(f"/proc/{req.pid}/cwd").st_nlink == 0
        except OSError:
            return CONTINUE
        if gone:  # removed (the layer's rmdir): the kernel's getcwd says so by ENOENT
            raise OSError(errno.ENOENT, "No such file or directory")
    layer = session.cow
    now = layer.lower_path_now(cwd)
    if now == cwd and not (cwd == layer.upper or cwd.startswith(layer.upper + "/")):
        return CONTINUE  # the kernel's answer is the sandbox's
    cwd = now
    data = os.fsencode(layer.to_sandbox_path(cwd)) + b"\0"
    if len(data) > req.args[1]:
        raise OSError(errno.ERANGE, "Numerical result out of range")
    write_child(req, session, req.args[0], data)
    return len(data)


# --- directory listings ------------------------------------------------------------------------

def _fdinfo(pid: int, fd: int) -> tuple[int, int] | None:
    """(file position, open flags) of the caller's fd `fd`, or None."""
    try:
        with open(f"/proc/{pid}/fdinfo/{fd}") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return int(fields["pos"]), int(fields["flags"], 8)
    except (OSError, KeyError, ValueError):
        return None


def getdents(req, session):
    """A listing from the start (a new or rewound directory fd) of a workdir directory the
    kernel opened itself (while the layer held no change, or an untouched directory since):
    once the layer holds that directory's entries, the caller's fd is replaced by one on
    the layer's directory (as dup2: the same number, close-on-exec and status flags) and
    the kernel lists that one. A listing under way goes on with what it started with
    (whether entries made since appear is unspecified by POSIX until a rewind). The fast
    path sends only listings from the start of fds on the workdir's directories
    (fastcow.c cow_getdents).

    The new fd is a new open file description: copies of the old one (dup, fork) keep
    it, and a flock held through the old one only goes once none is left. The number is
    replaced as dup2 would, whatever it holds then: another thread of the sandbox that
    closed or reused it meanwhile finds the layer's directory there (the sandbox's own fd
    table, and a directory it may open anyway)."""
    layer = session.cow
    target = req.arg_int(0)
    info = _fdinfo(req.pid, target)
    if info is None or info[0] != 0 or info[1] & os.O_PATH:
        return CONTINUE  # under way, or an O_PATH fd (EBADF from the kernel)
    fd = req.dup_fd(target)
    try:
        st = os.fstat(fd)
        path = os.readlink(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)
    if not stat.S_ISDIR(st.st_mode) or not is_beneath(path, layer.lower):
        return CONTINUE  # not a directory of the workdir (the layer's own are current)
    rel = layer.relative(path)
    with layer.lock:
        try:
            now = os.lstat(os.path.join(layer.lower, rel) if rel else layer.lower)
        except OSError:
            return CONTINUE
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            return CONTINUE  # no longer the workdir's directory of that name
        upper = layer.listing_dir(rel)
        if upper is None:
            return CONTINUE
        new = layer.open_real(upper, os.O_RDONLY | os.O_DIRECTORY
                              | info[1] & (os.O_NONBLOCK | os.O_NOATIME))
    return Replace(new, target, bool(info[1] & os.O_CLOEXEC))


HANDLERS = {
    "stat": stat_, "lstat": lstat, "fstat": fstat, "newfstatat": newfstatat, "statx": statx,
    "access": access, "faccessat": faccessat, "faccessat2": faccessat2,
    "readlink": readlink, "readlinkat": readlinkat,
    "getxattr": _getxattr(True), "lgetxattr": _getxattr(False),
    "listxattr": _listxattr(True), "llistxattr": _listxattr(False),
    "getcwd": getcwd, "getdents64": getdents, "getdents": getdents,
}
