"""The path syscalls of a sandbox with a copy-on-write workdir (sandlock.cow.layer).

Three phases, as everywhere in the supervisor. Parse: the path (and the other pointer
arguments) are copied out of the child once. Decide/resolve: the layer resolves the copy in
the sandbox's view of the workdir. Act: the supervisor performs the call itself on what it
resolved — opens return an fd installed in the child (SECCOMP_IOCTL_NOTIF_ADDFD), stat-like
calls copy the kernel's answer into the child's buffer — so the kernel never re-reads a
path the child could have rewritten in between.

This module: opens, namespace changes (mkdir, unlink, rename, link, symlink, truncate),
the metadata calls' target, execve and chdir; supervisor.cow_reads: stat-like calls;
supervisor.cow_paths: what they share. Paths spelled outside the workdir continue in the
kernel (Landlock decides, as without a workdir). A path under the workdir that leads
outside through a symlink is acted on here only if the sandbox's own rules allow it
(fs_readable / fs_writable / fs_denied, the same test Landlock applies), through
RESOLVE_NO_SYMLINKS so nothing swapped meanwhile is followed. execve and chdir cannot be performed on another process's behalf: they continue
in the kernel when the real path names exactly what the sandbox sees, and are refused with
EACCES and a recorded reason otherwise (a program created or changed inside the workspace
is run through its interpreter, e.g. `sh ./configure`, `python3 tool.py`).
"""

from __future__ import annotations

import errno
import os
import stat

from .._kernel.fileops import (AT_EMPTY_PATH, AT_FDCWD, AT_SYMLINK_NOFOLLOW, fchmod_fd,
                               open_no_symlinks, renameat2)
from ..cow.location import LOWER, MISSING, OUTSIDE, UPPER, Loc
from . import cow_reads
from .cow_paths import located, quota, rel_of, runtime_path_check, spelled, umask_of
from .network import CONTINUE, Defer, Guard, Inject
from .request import Denied, Request

AT_REMOVEDIR = 0x200
AT_SYMLINK_FOLLOW = 0x400
O_ACCMODE = 3
O_TMPFILE_BIT = 0o20200000  # __O_TMPFILE | O_DIRECTORY
RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2


# --- opens -----------------------------------------------------------------------------------

def _open(req: Request, session, dirfd: int, path: bytes, flags: int, mode: int):
    layer = session.cow
    rel = rel_of(session, req, dirfd, path)
    if rel is None:
        return CONTINUE
    acc = flags & O_ACCMODE
    creat = bool(flags & os.O_CREAT)
    excl = creat and bool(flags & os.O_EXCL)
    follow = not (flags & os.O_NOFOLLOW) and not excl
    writes = acc != os.O_RDONLY or bool(flags & os.O_TRUNC)
    with layer.lock:
        loc = located(session, req, rel, follow, writes or creat)
        runtime_path_check(session, loc)
        if loc.kind == OUTSIDE:
            fd = layer.open_real(loc.real, flags | os.O_NONBLOCK, mode & ~umask_of(req) & 0o7777)
            st = os.fstat(fd)
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                os.close(fd)  # devices, FIFOs, sockets: only through the kernel's own checks
                raise Denied(errno.EACCES, f"{loc.real}: only files and directories are "
                                           f"reached through a symlink in the workdir")
            if not flags & os.O_NONBLOCK:
                os.set_blocking(fd, True)
            return Inject(fd, bool(flags & os.O_CLOEXEC))
        if loc.kind == MISSING:
            if not creat:
                raise OSError(errno.ENOENT, "No such file or directory")
            quota(session)
            loc = layer.concrete(loc)
            fd = layer.open_real(loc.real, flags | os.O_EXCL, 0o600)
            os.fchmod(fd, mode & ~umask_of(req) & 0o7777 & ~0o6000)
            return Inject(fd, bool(flags & os.O_CLOEXEC))
        if excl:
            raise OSError(errno.EEXIST, "File exists")
        if loc.kind == LOWER:
            if not writes:  # an untouched file or directory: the workdir's own
                oflags = flags & ~(os.O_CREAT | os.O_TRUNC)
                if stat.S_ISFIFO(os.lstat(loc.real).st_mode) and not flags & os.O_NONBLOCK:
                    return _fifo_open(layer, loc.real, oflags)
                fd = layer.open_real(loc.real, oflags)
                return Inject(fd, bool(flags & os.O_CLOEXEC))
            quota(session)
            if stat.S_ISDIR(os.lstat(loc.real).st_mode):
                if flags & O_TMPFILE_BIT != O_TMPFILE_BIT:
                    raise OSError(errno.EISDIR, "Is a directory")
                loc = layer.concrete(loc, itself=True)
            else:
                loc = layer.copy_up(loc)
        elif writes:
            quota(session)
        if stat.S_ISDIR(os.lstat(loc.real).st_mode) and not flags & os.O_PATH:
            layer._materialize(loc.real)
        tmpfile = flags & O_TMPFILE_BIT == O_TMPFILE_BIT
        oflags = flags if tmpfile else flags & ~os.O_CREAT
        if stat.S_ISFIFO(os.lstat(loc.real).st_mode) and not flags & os.O_NONBLOCK:
            return _fifo_open(layer, loc.real, oflags)
        fd = layer.open_real(loc.real, oflags, mode & ~umask_of(req) & 0o7777)
        return Inject(fd, bool(flags & os.O_CLOEXEC))


class _FifoGuard(Guard):
    """A blocking FIFO open waits on a worker for its peer; if the caller goes away, abort()
    also plays the peer (O_RDWR never blocks on a FIFO) so the worker is released."""

    def __init__(self, path: str):
        super().__init__(-1)
        self.path = path

    def abort(self) -> None:
        super().abort()
        try:
            os.close(open_no_symlinks(self.path, os.O_RDWR | os.O_NONBLOCK))
        except OSError:
            pass


def _fifo_open(layer, real: str, flags: int):
    """Opening a FIFO blocks until the other end is opened, which may be this sandbox's
    next call: it waits on a worker, never on the supervisor's loop."""
    def finish():
        return Inject(layer.open_real(real, flags), bool(flags & os.O_CLOEXEC))
    return Defer(finish, _FifoGuard(real))


def open_(req, session):
    return _open(req, session, AT_FDCWD, req.read_path(0), req.arg_int(1), req.args[2])


def creat(req, session):
    return _open(req, session, AT_FDCWD, req.read_path(0),
                 os.O_CREAT | os.O_WRONLY | os.O_TRUNC, req.args[1])


def openat(req, session):
    return _open(req, session, req.arg_int(0), req.read_path(1), req.arg_int(2), req.args[3])


# --- namespace changes -------------------------------------------------------------------------

def _inside(session, loc: Loc) -> Loc:
    if loc.kind == OUTSIDE:
        # Renames and links between the workspace and the rest of the filesystem: EXDEV, as
        # across filesystems (mv and friends fall back to copying).
        raise OSError(errno.EXDEV, "Invalid cross-device link")
    return loc


def _create_at(req, session, dirfd, path_arg, make):
    path = req.read_path(path_arg)
    rel = rel_of(session, req, dirfd, path)
    if rel is None:
        return CONTINUE
    with session.cow.lock:
        loc = located(session, req, rel, False, True)
        if loc.kind != MISSING and loc.kind != OUTSIDE:
            raise OSError(errno.EEXIST, "File exists")
        quota(session)
        if loc.kind == MISSING:
            loc = session.cow.concrete(loc)
        # Created through its parent, opened with no symlink on the way: a path resolved
        # and checked above is not re-resolved (a directory swapped meanwhile -> ELOOP).
        parent = open_no_symlinks(os.path.dirname(loc.real), os.O_PATH | os.O_DIRECTORY)
        try:
            make(parent, os.path.basename(loc.real), umask_of(req))
        finally:
            os.close(parent)
    return 0


def _set_mode(parent: int, name: str, mode: int) -> None:
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    try:
        fchmod_fd(fd, mode)
    finally:
        os.close(fd)


def _mkdir(mode):
    def make(parent, name, umask):
        os.mkdir(name, 0o700, dir_fd=parent)
        _set_mode(parent, name, mode & ~umask & 0o7777)
    return make


def mkdir(req, session):
    return _create_at(req, session, AT_FDCWD, 0, _mkdir(req.args[1]))


def mkdirat(req, session):
    return _create_at(req, session, req.arg_int(0), 1, _mkdir(req.args[2]))


def _mknod(mode, dev):
    kind = stat.S_IFMT(mode) or stat.S_IFREG
    if kind not in (stat.S_IFREG, stat.S_IFIFO, stat.S_IFSOCK):
        raise Denied(errno.EPERM, "device nodes are never created from a sandbox")

    def make(parent, name, umask):
        os.mknod(name, kind | 0o600, dev, dir_fd=parent)
        _set_mode(parent, name, mode & ~umask & 0o777)
    return make


def mknod(req, session):
    return _create_at(req, session, AT_FDCWD, 0, _mknod(req.args[1], req.args[2]))


def mknodat(req, session):
    return _create_at(req, session, req.arg_int(0), 1, _mknod(req.args[2], req.args[3]))


def _symlink(target: bytes):
    def make(parent, name, umask):
        os.symlink(target, name, dir_fd=parent)
    return make


def symlink(req, session):
    return _create_at(req, session, AT_FDCWD, 1, _symlink(req.read_path(0)))


def symlinkat(req, session):
    return _create_at(req, session, req.arg_int(1), 2, _symlink(req.read_path(0)))


def _remove(req, session, dirfd, path_arg, directory: bool):
    path = req.read_path(path_arg)
    rel = rel_of(session, req, dirfd, path)
    if rel is None:
        return CONTINUE
    layer = session.cow
    with layer.lock:
        loc = _inside(session, located(session, req, rel, False, True))
        if loc.kind == MISSING:
            raise OSError(errno.ENOENT, "No such file or directory")
        if loc.upper == layer.upper:
            raise OSError(errno.EBUSY, "Device or resource busy")
        loc = layer.concrete(loc, itself=directory)
        if directory:
            if loc.kind == LOWER or not stat.S_ISDIR(os.lstat(loc.upper).st_mode):
                raise OSError(errno.ENOTDIR, "Not a directory")
            layer._materialize(loc.upper)  # its lower entries make it non-empty
            layer.note_dirs_changed()  # fds the sandbox holds on it go by name again
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


def _two_rels(req, session, odirfd, oarg, ndirfd, narg):
    """Both paths of a rename or link, relative to the workdir; CONTINUE when both are
    spelled outside it (the kernel and Landlock decide), EXDEV when only one is."""
    orel = rel_of(session, req, odirfd, req.read_path(oarg))
    nrel = rel_of(session, req, ndirfd, req.read_path(narg))
    if orel is None and nrel is None:
        return CONTINUE
    if orel is None or nrel is None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")
    return orel, nrel


def _rename(req, session, odirfd, oarg, ndirfd, narg, flags):
    if flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE):
        raise OSError(errno.EINVAL, "Invalid argument")  # RENAME_WHITEOUT needs privilege
    rels = _two_rels(req, session, odirfd, oarg, ndirfd, narg)
    if rels is CONTINUE:
        return CONTINUE
    orel, nrel = rels
    layer = session.cow
    with layer.lock:
        old = _inside(session, located(session, req, orel, False, True))
        new = _inside(session, located(session, req, nrel, False, True))
        for loc in (old, new):  # no new name for what a policy_fn's deny_path covers
            runtime_path_check(session, loc)
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
        if any(os.path.isdir(p) and not os.path.islink(p) for p in (old.upper, new.upper)):
            layer.note_dirs_changed()  # fds the sandbox holds on them follow (lower_dir_now)
        renameat2(old.upper, new.upper, flags)
    return 0


def rename(req, session):
    return _rename(req, session, AT_FDCWD, 0, AT_FDCWD, 1, 0)


def renameat(req, session):
    return _rename(req, session, req.arg_int(0), 1, req.arg_int(2), 3, 0)


def renameat2_(req, session):
    return _rename(req, session, req.arg_int(0), 1, req.arg_int(2), 3, req.args[4] & 0xFFFFFFFF)


def _link(req, session, odirfd, oarg, ndirfd, narg, follow):
    rels = _two_rels(req, session, odirfd, oarg, ndirfd, narg)
    if rels is CONTINUE:
        return CONTINUE
    orel, nrel = rels
    layer = session.cow
    with layer.lock:
        old = _inside(session, located(session, req, orel, follow, True))
        new = _inside(session, located(session, req, nrel, False, True))
        for loc in (old, new):
            runtime_path_check(session, loc)
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
    rel = rel_of(session, req, AT_FDCWD, path)
    if rel is None:
        return CONTINUE
    length = req.args[1]
    if length >= 1 << 63:
        raise OSError(errno.EINVAL, "Invalid argument")
    with session.cow.lock:
        loc = located(session, req, rel, True, True)
        if loc.kind == MISSING:
            raise OSError(errno.ENOENT, "No such file or directory")
        quota(session)
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
    rel = rel_of(session, req, dirfd, path)
    if rel is None:
        return None
    with session.cow.lock:
        loc = located(session, req, rel, follow, True)
        if loc.kind == MISSING:
            raise OSError(errno.ENOENT, "No such file or directory")
        if loc.kind != OUTSIDE:
            loc = session.cow.copy_up(loc)
        return session.cow.open_real(loc.real, os.O_PATH | os.O_NOFOLLOW)


# --- exec and chdir: the kernel must find what the sandbox sees ---------------------------------

def _same_in_lower(session, req, dirfd, path: bytes, follow: bool) -> str | None:
    """None when the kernel, resolving `path` in the real tree, reaches exactly the object
    the sandbox sees; otherwise why not."""
    rel = rel_of(session, req, dirfd, path)
    if rel is None:
        return None
    layer = session.cow
    text = spelled(req, dirfd, path)  # as the kernel will resolve it
    if not (text == layer.lower or text.startswith(layer.lower + "/")):
        return "it is spelled inside the workspace's storage"
    if spelled(req, dirfd, path, layer) != text:
        return "the directory it is relative to was renamed inside the workspace"
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
            # The kernel will hold the workdir's directory of that name, which relative
            # paths then follow (lower_dir_now): it must be the one meant, or gone.
            if not os.path.isdir(lower):
                return "it was created inside the workspace"
            if layer.lower_dir_now(loc.rel) != loc.rel:
                return "the workdir's directory of that name was moved inside the workspace"
            return None
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
    **cow_reads.HANDLERS,
    "open": open_, "creat": creat, "openat": openat,
    "chdir": chdir,
    "mkdir": mkdir, "mkdirat": mkdirat, "mknod": mknod, "mknodat": mknodat,
    "symlink": symlink, "symlinkat": symlinkat,
    "unlink": unlink, "unlinkat": unlinkat, "rmdir": rmdir,
    "rename": rename, "renameat": renameat, "renameat2": renameat2_,
    "link": link, "linkat": linkat, "truncate": truncate,
}
