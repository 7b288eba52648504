"""The path syscalls of a sandbox with a copy-on-write workdir (sandlock.cow.layer).

Three phases, as everywhere in the supervisor. Parse: the path (and the other pointer
arguments) are copied out of the child once. Decide/resolve: the layer resolves the copy in
the sandbox's view of the workdir. Act: the supervisor performs the call itself on what it
resolved — opens return an fd installed in the child (SECCOMP_IOCTL_NOTIF_ADDFD), stat-like
calls copy the kernel's answer into the child's buffer — so the kernel never re-reads a
path the child could have rewritten in between.

Paths spelled outside the workdir continue in the kernel (Landlock decides, as without a
workdir). A path under the workdir that leads outside through a symlink is acted on here
only if the sandbox's own rules allow it (fs_readable / fs_writable / fs_denied, the
same test Landlock applies), through RESOLVE_NO_SYMLINKS so nothing swapped meanwhile is
followed. execve and chdir cannot be performed on another process's behalf: they continue
in the kernel when the real path names exactly what the sandbox sees, and are refused with
EACCES and a recorded reason otherwise (a program created or changed inside the workspace
is run through its interpreter, e.g. `sh ./configure`, `python3 tool.py`).
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import struct

from .._kernel import memory
from .._kernel.fileops import AT_EMPTY_PATH, AT_FDCWD, AT_SYMLINK_NOFOLLOW, renameat2
from .._kernel.syscall import syscall
from ..cow.layer import LOWER, MISSING, OUTSIDE, UPPER, XATTR_PREFIX, Loc
from ..fs_rules import is_beneath
from .network import CONTINUE, Inject
from .paths import Unresolvable, directory_of
from .request import Denied, Request

NR_NEWFSTATAT = 262
NR_STATX = 332
AT_REMOVEDIR = 0x200
AT_SYMLINK_FOLLOW = 0x400
AT_EACCESS = 0x200
O_ACCMODE = 3
O_TMPFILE_BIT = 0o20200000  # __O_TMPFILE | O_DIRECTORY
RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2
_STAT_SIZE = 144
_STATX_SIZE = 256


# --- parse -----------------------------------------------------------------------------------

def _umask(req: Request) -> int:
    try:
        with open(f"/proc/{req.pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    return 0o022


def _spelled(req: Request, dirfd: int, path: bytes) -> str:
    """The absolute path as spelled by the child (not resolved)."""
    text = os.fsdecode(path)
    if text.startswith("/"):
        return text
    try:
        base = directory_of(req.pid, dirfd, AT_FDCWD)
    except Unresolvable as e:
        raise Denied(errno.EBADF, str(e)) from None
    return base.rstrip("/") + "/" + text if text else base


def _rel(session, req: Request, dirfd: int, path: bytes) -> str | None:
    """The path relative to the workdir, or None when it is spelled outside it."""
    if not path:
        return None
    return session.cow.relative(_spelled(req, dirfd, path))


# --- decide on a path that left the workdir ------------------------------------------------

def _outside(session, loc: Loc, write: bool, follow: bool = True) -> str:
    """The real path of an OUTSIDE location, if the sandbox's own rules let it be reached."""
    path = loc.real
    real = os.path.realpath(path) if follow else os.path.join(
        os.path.realpath(os.path.dirname(path)), os.path.basename(path))
    policy = session.policy
    if any(is_beneath(real, d) for d in policy.fs_denied):
        raise Denied(errno.EACCES, f"{real} is in fs_denied")
    grants = policy.fs_writable if write else policy.fs_writable + policy.fs_readable
    if not any(is_beneath(real, g) for g in grants):
        raise Denied(errno.EACCES, f"{real} (reached through a symlink in the workdir) is "
                                   f"not {'writable' if write else 'readable'} by the policy")
    return real


def _located(session, rel: str, follow: bool, write: bool, inspect: bool = False) -> Loc:
    """Resolve; a path that left the workdir must pass the sandbox's rules, except for
    `inspect` calls (stat, access, readlink, getxattr), which Landlock does not govern
    either: the kernel would answer them for the sandbox anywhere."""
    loc = session.cow.resolve(rel, follow_last=follow)
    if loc.kind == OUTSIDE:
        if inspect:
            real = loc.real if not follow else os.path.realpath(loc.real)
            return Loc(OUTSIDE, real)
        return Loc(OUTSIDE, _outside(session, loc, write, follow))
    return loc


def _quota(session) -> None:
    """max_disk, checked whenever something in the layer is created or opened for writing
    (a measurement of the upper tree each time: the layer's writes go through fds the
    supervisor cannot count). What an open fd writes past the limit is caught at the next
    check and at the end of the run, where an oversized layer is never committed."""
    limit = session.cow_max_disk
    if limit is None:
        return
    if session.cow.usage() >= limit:
        raise Denied(errno.ENOSPC, f"the workspace's upper layer reached max_disk "
                                   f"({limit} bytes)")


# --- act: results written into the child -----------------------------------------------------

def _write_child(req: Request, session, addr: int, data: bytes) -> None:
    if addr == 0:
        raise Denied(errno.EFAULT, "NULL buffer")
    with session.memory_lock:  # never while a freeze inspects the sandbox's memory
        try:
            memory.write_memory(req.pid, addr, data)
        except OSError:
            raise Denied(errno.EFAULT, "result buffer not writable") from None


def _raw_stat(real: str, size: int, statx_args=None) -> bytes:
    buf = ctypes.create_string_buffer(size)
    if statx_args is None:
        syscall(NR_NEWFSTATAT, AT_FDCWD, os.fsencode(real), buf, AT_SYMLINK_NOFOLLOW)
    else:
        flags, mask = statx_args
        syscall(NR_STATX, AT_FDCWD, os.fsencode(real),
                (flags & ~AT_EMPTY_PATH) | AT_SYMLINK_NOFOLLOW, ctypes.c_uint(mask), buf)
    return buf.raw


def _runtime_path_check(session, loc: Loc) -> None:
    """A policy_fn's deny_path, on the path as the sandbox sees it (resolved above from the
    one copy of the argument, so there is nothing to freeze)."""
    rt = session.runtime
    if rt is None or not rt.denied_paths:
        return
    path = loc.real if loc.kind == OUTSIDE else (
        os.path.join(session.cow.lower, loc.rel) if loc.rel else session.cow.lower)
    refusal = rt.path_refusal(path)
    if refusal is not None:
        raise Denied(errno.EACCES, refusal)


# --- opens -----------------------------------------------------------------------------------

def _open(req: Request, session, dirfd: int, path: bytes, flags: int, mode: int):
    layer = session.cow
    rel = _rel(session, req, dirfd, path)
    if rel is None:
        return CONTINUE
    acc = flags & O_ACCMODE
    creat = bool(flags & os.O_CREAT)
    excl = creat and bool(flags & os.O_EXCL)
    follow = not (flags & os.O_NOFOLLOW) and not excl
    writes = acc != os.O_RDONLY or bool(flags & os.O_TRUNC)
    with layer.lock:
        loc = _located(session, rel, follow, writes or creat)
        _runtime_path_check(session, loc)
        if loc.kind == OUTSIDE:
            fd = layer.open_real(loc.real, flags, mode & ~_umask(req) & 0o7777)
            return Inject(fd, bool(flags & os.O_CLOEXEC))
        if loc.kind == MISSING:
            if not creat:
                raise OSError(errno.ENOENT, "No such file or directory")
            _quota(session)
            loc = layer.concrete(loc)
            fd = layer.open_real(loc.real, flags | os.O_EXCL, 0o600)
            os.fchmod(fd, mode & ~_umask(req) & 0o7777 & ~0o6000)
            return Inject(fd, bool(flags & os.O_CLOEXEC))
        if excl:
            raise OSError(errno.EEXIST, "File exists")
        if loc.kind == LOWER:
            if not writes:  # an untouched file or directory: the workdir's own
                fd = layer.open_real(loc.real, flags & ~(os.O_CREAT | os.O_TRUNC))
                return Inject(fd, bool(flags & os.O_CLOEXEC))
            _quota(session)
            if stat.S_ISDIR(os.lstat(loc.real).st_mode):
                if flags & O_TMPFILE_BIT != O_TMPFILE_BIT:
                    raise OSError(errno.EISDIR, "Is a directory")
                loc = layer.concrete(loc, itself=True)
            else:
                loc = layer.copy_up(loc)
        elif writes:
            _quota(session)
        if stat.S_ISDIR(os.lstat(loc.real).st_mode) and not flags & os.O_PATH:
            layer._materialize(loc.real)
        tmpfile = flags & O_TMPFILE_BIT == O_TMPFILE_BIT
        fd = layer.open_real(loc.real, flags if tmpfile else flags & ~os.O_CREAT,
                             mode & ~_umask(req) & 0o7777)
        return Inject(fd, bool(flags & os.O_CLOEXEC))


def open_(req, session):
    return _open(req, session, AT_FDCWD, req.read_path(0), req.arg_int(1), req.args[2])


def creat(req, session):
    return _open(req, session, AT_FDCWD, req.read_path(0),
                 os.O_CREAT | os.O_WRONLY | os.O_TRUNC, req.args[1])


def openat(req, session):
    return _open(req, session, req.arg_int(0), req.read_path(1), req.arg_int(2), req.args[3])


def openat2(req, session):
    if req.args[3] < 24:
        raise Denied(errno.EINVAL, "open_how too small")
    flags, mode, resolve = struct.unpack("<QQQ", req.read_bytes(req.args[2], 24))
    path = req.read_path(1)
    if _rel(session, req, req.arg_int(0), path) is None:
        return CONTINUE
    if resolve:
        # RESOLVE_* scoping is not reproduced in the workspace view: ENOSYS makes callers
        # fall back to openat (as on kernels without openat2).
        raise Denied(errno.ENOSYS, "openat2 RESOLVE_* flags inside a copy-on-write workdir")
    return _open(req, session, req.arg_int(0), path, flags, mode)


# --- stat-like reads ---------------------------------------------------------------------------

def _stat_common(req, session, dirfd, path_arg, buf_arg, at_flags, statx_args=None):
    path = req.read_path(path_arg)
    if not path and at_flags & AT_EMPTY_PATH:
        return CONTINUE  # fstat of an fd: the kernel answers for the inode it holds
    rel = _rel(session, req, dirfd, path)
    if rel is None:
        return CONTINUE
    with session.cow.lock:
        loc = _located(session, rel, not at_flags & AT_SYMLINK_NOFOLLOW, False, inspect=True)
        if loc.kind == MISSING:
            raise OSError(errno.ENOENT, "No such file or directory")
        raw = _raw_stat(loc.real, _STATX_SIZE if statx_args else _STAT_SIZE, statx_args)
    _write_child(req, session, req.args[buf_arg], raw)
    return 0


def stat_(req, session):
    return _stat_common(req, session, AT_FDCWD, 0, 1, 0)


def lstat(req, session):
    return _stat_common(req, session, AT_FDCWD, 0, 1, AT_SYMLINK_NOFOLLOW)


def newfstatat(req, session):
    return _stat_common(req, session, req.arg_int(0), 1, 2, req.arg_int(3))


def statx(req, session):
    flags = req.arg_int(2)
    return _stat_common(req, session, req.arg_int(0), 1, 4, flags,
                        (flags, req.args[3] & 0xFFFFFFFF))


def _access(req, session, dirfd, path_arg, mode, flags):
    path = req.read_path(path_arg)
    rel = _rel(session, req, dirfd, path)
    if rel is None:
        return CONTINUE
    with session.cow.lock:
        loc = _located(session, rel, not flags & AT_SYMLINK_NOFOLLOW, False, inspect=True)
        if loc.kind == MISSING:
            raise OSError(errno.ENOENT, "No such file or directory")
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
    rel = _rel(session, req, dirfd, path)
    if rel is None:
        return CONTINUE
    size = req.arg_int(size_arg)
    if size <= 0:
        raise OSError(errno.EINVAL, "Invalid argument")
    with session.cow.lock:
        loc = _located(session, rel, False, False, inspect=True)
        if loc.kind == MISSING:
            raise OSError(errno.ENOENT, "No such file or directory")
        target = os.fsencode(os.readlink(loc.real))
    data = target[:size]
    _write_child(req, session, req.args[buf_arg], data)
    return len(data)


def readlink(req, session):
    return _readlink(req, session, AT_FDCWD, 0, 1, 2)


def readlinkat(req, session):
    return _readlink(req, session, req.arg_int(0), 1, 2, 3)


def _getxattr(follow):
    def handler(req, session):
        path = req.read_path(0)
        rel = _rel(session, req, AT_FDCWD, path)
        if rel is None:
            return CONTINUE
        name = os.fsdecode(req.read_path(1))
        size = req.args[3]
        with session.cow.lock:
            loc = _located(session, rel, follow, False, inspect=True)
            if loc.kind == MISSING:
                raise OSError(errno.ENOENT, "No such file or directory")
            if name.startswith(XATTR_PREFIX):
                raise OSError(errno.ENODATA, "No data available")
            value = os.getxattr(loc.real, name, follow_symlinks=False)
        if size == 0:
            return len(value)
        if len(value) > size:
            raise OSError(errno.ERANGE, "Numerical result out of range")
        if value:
            _write_child(req, session, req.args[2], value)
        return len(value)
    return handler


def _listxattr(follow):
    def handler(req, session):
        path = req.read_path(0)
        rel = _rel(session, req, AT_FDCWD, path)
        if rel is None:
            return CONTINUE
        size = req.args[2]
        with session.cow.lock:
            loc = _located(session, rel, follow, False, inspect=True)
            if loc.kind == MISSING:
                raise OSError(errno.ENOENT, "No such file or directory")
            names = [n for n in os.listxattr(loc.real, follow_symlinks=False)
                     if not n.startswith(XATTR_PREFIX)]
        data = b"".join(os.fsencode(n) + b"\0" for n in names)
        if size == 0:
            return len(data)
        if len(data) > size:
            raise OSError(errno.ERANGE, "Numerical result out of range")
        if data:
            _write_child(req, session, req.args[1], data)
        return len(data)
    return handler


def getcwd(req, session):
    """After fchdir() to a directory fd of the workspace, the kernel's cwd is in the upper
    tree: report it as the workdir path the sandbox knows."""
    try:
        cwd = os.readlink(f"/proc/{req.pid}/cwd")
    except OSError:
        return CONTINUE
    layer = session.cow
    if not (cwd == layer.upper or cwd.startswith(layer.upper + "/")):
        return CONTINUE
    data = os.fsencode(layer.to_sandbox_path(cwd)) + b"\0"
    if len(data) > req.args[1]:
        raise OSError(errno.ERANGE, "Numerical result out of range")
    _write_child(req, session, req.args[0], data)
    return len(data)


# --- namespace changes -------------------------------------------------------------------------

def _inside(session, loc: Loc) -> Loc:
    if loc.kind == OUTSIDE:
        # Renames and links between the workspace and the rest of the filesystem: EXDEV, as
        # across filesystems (mv and friends fall back to copying).
        raise OSError(errno.EXDEV, "Invalid cross-device link")
    return loc


def _create_at(req, session, dirfd, path_arg, make):
    path = req.read_path(path_arg)
    rel = _rel(session, req, dirfd, path)
    if rel is None:
        return CONTINUE
    with session.cow.lock:
        loc = _located(session, rel, False, True)
        if loc.kind != MISSING and loc.kind != OUTSIDE:
            raise OSError(errno.EEXIST, "File exists")
        _quota(session)
        if loc.kind == MISSING:
            loc = session.cow.concrete(loc)
        make(loc.real, _umask(req))
    return 0


def _mkdir(mode):
    def make(real, umask):
        os.mkdir(real, 0o700)
        os.chmod(real, mode & ~umask & 0o7777)
    return make


def mkdir(req, session):
    return _create_at(req, session, AT_FDCWD, 0, _mkdir(req.args[1]))


def mkdirat(req, session):
    return _create_at(req, session, req.arg_int(0), 1, _mkdir(req.args[2]))


def _mknod(mode, dev):
    kind = stat.S_IFMT(mode) or stat.S_IFREG
    if kind not in (stat.S_IFREG, stat.S_IFIFO, stat.S_IFSOCK):
        raise Denied(errno.EPERM, "device nodes are never created from a sandbox")

    def make(real, umask):
        os.mknod(real, kind | 0o600, dev)
        os.chmod(real, mode & ~umask & 0o777)
    return make


def mknod(req, session):
    return _create_at(req, session, AT_FDCWD, 0, _mknod(req.args[1], req.args[2]))


def mknodat(req, session):
    return _create_at(req, session, req.arg_int(0), 1, _mknod(req.args[2], req.args[3]))


def _symlink(target: bytes):
    def make(real, umask):
        os.symlink(target, real)
    return make


def symlink(req, session):
    return _create_at(req, session, AT_FDCWD, 1, _symlink(req.read_path(0)))


def symlinkat(req, session):
    return _create_at(req, session, req.arg_int(1), 2, _symlink(req.read_path(0)))


def _remove(req, session, dirfd, path_arg, directory: bool):
    path = req.read_path(path_arg)
    rel = _rel(session, req, dirfd, path)
    if rel is None:
        return CONTINUE
    layer = session.cow
    with layer.lock:
        loc = _inside(session, _located(session, rel, False, True))
        if loc.kind == MISSING:
            raise OSError(errno.ENOENT, "No such file or directory")
        if loc.upper == layer.upper:
            raise OSError(errno.EBUSY, "Device or resource busy")
        loc = layer.concrete(loc, itself=directory)
        if directory:
            if loc.kind == LOWER or not stat.S_ISDIR(os.lstat(loc.upper).st_mode):
                raise OSError(errno.ENOTDIR, "Not a directory")
            layer._materialize(loc.upper)  # its lower entries make it non-empty
            os.rmdir(loc.upper)
        else:
            if stat.S_ISDIR(os.lstat(loc.upper).st_mode):
                raise OSError(errno.EISDIR, "Is a directory")
            os.unlink(loc.upper)
    return 0


def unlink(req, session):
    return _remove(req, session, AT_FDCWD, 0, False)


def rmdir(req, session):
    return _remove(req, session, AT_FDCWD, 0, True)


def unlinkat(req, session):
    flags = req.arg_int(2)
    if flags & ~AT_REMOVEDIR:
        raise OSError(errno.EINVAL, "Invalid argument")
    return _remove(req, session, req.arg_int(0), 1, bool(flags & AT_REMOVEDIR))


def _rename(req, session, odirfd, oarg, ndirfd, narg, flags):
    if flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE):
        raise OSError(errno.EINVAL, "Invalid argument")  # RENAME_WHITEOUT needs privilege
    opath, npath = req.read_path(oarg), req.read_path(narg)
    orel = _rel(session, req, odirfd, opath)
    nrel = _rel(session, req, ndirfd, npath)
    if orel is None and nrel is None:
        return CONTINUE
    if orel is None or nrel is None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")
    layer = session.cow
    with layer.lock:
        old = _inside(session, _located(session, orel, False, True))
        new = _inside(session, _located(session, nrel, False, True))
        if old.kind == MISSING:
            raise OSError(errno.ENOENT, "No such file or directory")
        if layer.upper in (old.upper, new.upper):
            raise OSError(errno.EBUSY, "Device or resource busy")
        old = layer.concrete(old)
        new = layer.concrete(new)
        if new.kind == UPPER and stat.S_ISDIR(os.lstat(new.upper).st_mode):
            layer._materialize(new.upper)  # replacing a directory needs it empty
        if flags & RENAME_EXCHANGE and old.kind == UPPER and stat.S_ISDIR(
                os.lstat(old.upper).st_mode):
            layer._materialize(old.upper)
        renameat2(old.upper, new.upper, flags)
    return 0


def rename(req, session):
    return _rename(req, session, AT_FDCWD, 0, AT_FDCWD, 1, 0)


def renameat(req, session):
    return _rename(req, session, req.arg_int(0), 1, req.arg_int(2), 3, 0)


def renameat2_(req, session):
    return _rename(req, session, req.arg_int(0), 1, req.arg_int(2), 3, req.args[4] & 0xFFFFFFFF)


def _link(req, session, odirfd, oarg, ndirfd, narg, follow):
    opath, npath = req.read_path(oarg), req.read_path(narg)
    orel = _rel(session, req, odirfd, opath)
    nrel = _rel(session, req, ndirfd, npath)
    if orel is None and nrel is None:
        return CONTINUE
    if orel is None or nrel is None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")
    layer = session.cow
    with layer.lock:
        old = _inside(session, _located(session, orel, follow, True))
        new = _inside(session, _located(session, nrel, False, True))
        if old.kind == MISSING:
            raise OSError(errno.ENOENT, "No such file or directory")
        if new.kind != MISSING:
            raise OSError(errno.EEXIST, "File exists")
        if stat.S_ISDIR(os.lstat(old.real).st_mode):
            raise OSError(errno.EPERM, "Operation not permitted")
        old = layer.copy_up(old)  # two names must share one private inode
        new = layer.concrete(new)
        os.link(old.upper, new.upper, follow_symlinks=False)
    return 0


def link(req, session):
    return _link(req, session, AT_FDCWD, 0, AT_FDCWD, 1, False)


def linkat(req, session):
    flags = req.arg_int(4)
    if flags & ~(AT_SYMLINK_FOLLOW | AT_EMPTY_PATH):
        raise OSError(errno.EINVAL, "Invalid argument")
    if flags & AT_EMPTY_PATH:
        raise Denied(errno.EPERM, "linkat(AT_EMPTY_PATH) into a copy-on-write workdir")
    return _link(req, session, req.arg_int(0), 1, req.arg_int(2), 3,
                 bool(flags & AT_SYMLINK_FOLLOW))


def truncate(req, session):
    path = req.read_path(0)
    rel = _rel(session, req, AT_FDCWD, path)
    if rel is None:
        return CONTINUE
    length = req.args[1]
    if length >= 1 << 63:
        raise OSError(errno.EINVAL, "Invalid argument")
    with session.cow.lock:
        loc = _located(session, rel, True, True)
        if loc.kind == MISSING:
            raise OSError(errno.ENOENT, "No such file or directory")
        _quota(session)
        loc = session.cow.copy_up(loc)
        fd = session.cow.open_real(loc.real, os.O_WRONLY)
        try:
            os.ftruncate(fd, length)
        finally:
            os.close(fd)
    return 0


def metadata_target(req, session, dirfd: int, path: bytes, follow: bool) -> int | None:
    """An O_PATH fd on what a chmod/chown/utimes/xattr call under the workdir changes: the
    private upper copy (made now if needed). None for paths spelled outside the workdir."""
    rel = _rel(session, req, dirfd, path)
    if rel is None:
        return None
    with session.cow.lock:
        loc = _located(session, rel, follow, True)
        if loc.kind == MISSING:
            raise OSError(errno.ENOENT, "No such file or directory")
        if loc.kind != OUTSIDE:
            loc = session.cow.copy_up(loc)
        return session.cow.open_real(loc.real, os.O_PATH | os.O_NOFOLLOW)


# --- exec and chdir: the kernel must find what the sandbox sees ---------------------------------

def _same_in_lower(session, req, dirfd, path: bytes, follow: bool) -> str | None:
    """None when the kernel, resolving `path` in the real tree, reaches exactly the object
    the sandbox sees; otherwise why not."""
    rel = _rel(session, req, dirfd, path)
    if rel is None:
        return None
    layer = session.cow
    spelled = _spelled(req, dirfd, path)
    if not (spelled == layer.lower or spelled.startswith(layer.lower + "/")):
        return "it is spelled inside the workspace's storage"
    with layer.lock:
        loc = layer.resolve(rel, follow_last=follow)
        if loc.kind == OUTSIDE:
            return None
        if loc.kind == MISSING:
            raise OSError(errno.ENOENT, "No such file or directory")
        normal = os.path.normpath(rel) if rel else ""
        normal = "" if normal == "." else normal
        if normal != loc.rel:
            return "a symlink created inside the workspace is on its way"
        lower = os.path.join(layer.lower, loc.rel) if loc.rel else layer.lower
        if loc.kind == LOWER:
            return None if loc.real == lower else "it was renamed inside the workspace"
        st = os.lstat(loc.upper)
        if stat.S_ISDIR(st.st_mode):
            return None if os.path.isdir(lower) else "it was created inside the workspace"
        return "it was created or changed inside the workspace"


def execve_check(req, session, dirfd, path_arg, at_flags):
    path = req.read_path(path_arg)
    if not path and at_flags & AT_EMPTY_PATH:
        return None
    why = _same_in_lower(session, req, dirfd, path, not at_flags & AT_SYMLINK_NOFOLLOW)
    if why is not None:
        raise Denied(errno.EACCES, f"cannot execute {os.fsdecode(path)} by path: {why} "
                                   f"(run it through its interpreter)")
    return None


def chdir(req, session):
    path = req.read_path(0)
    why = _same_in_lower(session, req, AT_FDCWD, path, True)
    if why is not None:
        raise Denied(errno.EACCES, f"cannot chdir to {os.fsdecode(path)}: {why}")
    return CONTINUE


# Name -> handler. The metadata calls (chmod, chown, utimes, xattrs) keep their handlers in
# supervisor.metadata, which resolve workspace paths through Request.open_target.
HANDLERS = {
    "open": open_, "creat": creat, "openat": openat, "openat2": openat2,
    "stat": stat_, "lstat": lstat, "newfstatat": newfstatat, "statx": statx,
    "access": access, "faccessat": faccessat, "faccessat2": faccessat2,
    "readlink": readlink, "readlinkat": readlinkat,
    "getxattr": _getxattr(True), "lgetxattr": _getxattr(False),
    "listxattr": _listxattr(True), "llistxattr": _listxattr(False),
    "getcwd": getcwd, "chdir": chdir,
    "mkdir": mkdir, "mkdirat": mkdirat, "mknod": mknod, "mknodat": mknodat,
    "symlink": symlink, "symlinkat": symlinkat,
    "unlink": unlink, "unlinkat": unlinkat, "rmdir": rmdir,
    "rename": rename, "renameat": renameat, "renameat2": renameat2_,
    "link": link, "linkat": linkat, "truncate": truncate,
}
