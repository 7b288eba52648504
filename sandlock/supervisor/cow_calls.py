"""The path syscalls of a sandbox with a copy-on-write workdir (sandlock.cow.layer).

Three phases, as everywhere in the supervisor. Parse: the path (and the other pointer
arguments) are copied out of the child once. Decide/resolve: the layer resolves the copy in
the sandbox's view of the workdir. Act: the supervisor performs the call itself on what it
resolved — opens return an fd installed in the child (SECCOMP_IOCTL_NOTIF_ADDFD), stat-like
calls copy the kernel's answer into the child's buffer — so the kernel never re-reads a
path the child could have rewritten in between.

This module: opens, namespace changes (mkdir, unlink, rename, link, symlink, truncate),
the metadata calls' target; supervisor.cow_exec: execve and chdir; supervisor.cow_reads:
stat-like calls; supervisor.cow_paths: what they share. Paths spelled outside the workdir continue in the
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
import fcntl
import os
import stat
from types import SimpleNamespace

from .._kernel.fileops import (AT_EMPTY_PATH, AT_FDCWD, fchmod_fd, open_no_symlinks,
                               renameat2)
from ..cow.location import LOWER, MISSING, OUTSIDE, UPPER, Loc
from . import cow_reads
from .cow_exec import _REGISTERS, _kernel_path, _object, chdir
from .cow_paths import (credentials, located, lookup_follows, may, owns, quota, rel_of,
                        runtime_path_check, umask_of)
from .network import CONTINUE, Defer, Guard, Inject
from .request import Denied, Request

AT_REMOVEDIR = 0x200
AT_SYMLINK_FOLLOW = 0x400
O_ACCMODE = 3
O_TMPFILE_BIT = os.O_TMPFILE  # __O_TMPFILE | O_DIRECTORY (O_DIRECTORY differs by architecture)
RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2


# --- opens -----------------------------------------------------------------------------------

def _open(req: Request, session, dirfd: int, path: bytes, flags: int, mode: int,
          path_arg: int = 0):
    layer = session.cow
    rel = rel_of(session, req, dirfd, path)
    if rel is None:
        return CONTINUE
    if flags & os.O_PATH:
        # An O_PATH fd cannot be handed over (SECCOMP_IOCTL_NOTIF_ADDFD takes none): the
        # kernel opens it, re-issued with the real path of what the sandbox sees there.
        from .reissue import Reissue
        follow = lookup_follows(rel, not flags & os.O_NOFOLLOW)
        runtime_path_check(session, located(session, req, rel, follow, False))
        same, target = _object(session, req, dirfd, path, follow)
        if same or target is None:
            return CONTINUE
        return Reissue({_REGISTERS[path_arg]: _kernel_path(layer, target)},
                       f"open {os.fsdecode(path)} (O_PATH) in the workspace")
    acc = flags & O_ACCMODE
    creat = bool(flags & os.O_CREAT)
    excl = creat and bool(flags & os.O_EXCL)
    follow = lookup_follows(rel, not (flags & os.O_NOFOLLOW)) and not excl
    writes = acc != os.O_RDONLY or bool(flags & os.O_TRUNC)
    if creat and rel.endswith("/"):  # the kernel's answer, once the parent is found
        parent = located(session, req, os.path.dirname(rel.rstrip("/")) or ".", True, False)
        if parent.kind == MISSING:
            raise OSError(errno.ENOENT, "No such file or directory")
        raise OSError(errno.EISDIR, "Is a directory")
    with layer.lock:
        loc = located(session, req, rel, follow, writes or creat)
        runtime_path_check(session, loc)
        if loc.kind == OUTSIDE:
            # Truncated only once the object is known not to be a protected one.
            fd = layer.open_real(loc.real, (flags | os.O_NONBLOCK) & ~os.O_TRUNC,
                                 mode & ~umask_of(req) & 0o7777)
            st = os.fstat(fd)
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                os.close(fd)  # devices, FIFOs, sockets: only through the kernel's own checks
                raise Denied(errno.EACCES, f"{loc.real}: only files and directories are "
                                           f"reached through a symlink in the workdir")
            try:
                _refuse_protected(session, st, loc.real, writes or creat)
            except Denied:
                os.close(fd)
                raise
            if flags & os.O_TRUNC and stat.S_ISREG(st.st_mode) and acc != os.O_RDONLY:
                os.ftruncate(fd, 0)
            if not flags & os.O_NONBLOCK:
                os.set_blocking(fd, True)
            return Inject(fd, bool(flags & os.O_CLOEXEC))
        if loc.kind == MISSING:
            if not creat:
                raise OSError(errno.ENOENT, "No such file or directory")
            quota(session)
            loc = layer.concrete(loc)
            _may_change_names(req, layer, os.path.dirname(loc.upper))
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
                may_change(req, os.lstat(loc.real), "write")  # the copy would be ours
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


def _refuse_protected(session, st: os.stat_result, real: str, write: bool) -> None:
    """An object reached outside the workdir that is another name of one the protection of
    the user's files keeps (cow_paths._outside checked the name itself): a secret, and for
    a write a persistence vector too."""
    prot = session.protection
    if prot is not None and (st.st_dev, st.st_ino) in (
            prot.identities if write else prot.hidden_identities):
        raise Denied(errno.EACCES, f"{real} is a persistence vector or secret (another "
                                   f"name of it)")


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
    return _open(req, session, req.arg_int(0), req.read_path(1), req.arg_int(2), req.args[3],
                 1)


# --- namespace changes -------------------------------------------------------------------------

def _inside(session, loc: Loc) -> Loc:
    if loc.kind == OUTSIDE:
        # Renames and links between the workspace and the rest of the filesystem: EXDEV, as
        # across filesystems (mv and friends fall back to copying).
        raise OSError(errno.EXDEV, "Invalid cross-device link")
    return loc


def _may_change_names(req, layer, udir: str, target: str | None = None) -> None:
    """The kernel's test for making or removing a name in the sandbox's directory at upper
    path `udir`, made here because the supervisor acts with its own rights on the layer's
    copy: write and search permission for the task on the directory as the sandbox sees
    it (its mode, the workdir directory's owner: CowLayer.owner); in a sticky directory,
    removing or replacing `target` (an upper path) needs owning it or the directory."""
    st = os.lstat(udir)
    uid, gid = layer.owner(udir)
    creds = credentials(req)
    if not may(req, SimpleNamespace(st_mode=st.st_mode, st_uid=uid, st_gid=gid), 3, creds):
        raise OSError(errno.EACCES, "Permission denied")
    if target is not None and st.st_mode & stat.S_ISVTX and os.path.lexists(target) and \
            not owns(req, SimpleNamespace(st_uid=layer.owner(target)[0]), creds) and \
            not owns(req, SimpleNamespace(st_uid=uid), creds):
        raise OSError(errno.EPERM, "Operation not permitted")


def _refuse_slashed(session, req, rel: str, directory: bool = False) -> None:
    """A name to create spelled with a trailing '/' (it names a directory): the kernel's
    refusal (filename_create), EEXIST if the name exists, else ENOENT unless a directory
    is what is made (hunt: the layer made a file `zz` for `ln f zz/` and `mv f zz/`)."""
    if located(session, req, rel.rstrip("/") or rel, False, False).kind != MISSING:
        raise OSError(errno.EEXIST, "File exists")
    if not directory:
        raise OSError(errno.ENOENT, "No such file or directory")


def _create_at(req, session, dirfd, path_arg, make, directory: bool = False):
    path = req.read_path(path_arg)
    rel = rel_of(session, req, dirfd, path)
    if rel is None:
        return CONTINUE
    with session.cow.lock:
        if rel.endswith("/"):
            _refuse_slashed(session, req, rel, directory)
        loc = located(session, req, rel, False, True)
        if loc.kind != MISSING and loc.kind != OUTSIDE:
            raise OSError(errno.EEXIST, "File exists")
        quota(session)
        if loc.kind == MISSING:
            loc = session.cow.concrete(loc)
            _may_change_names(req, session.cow, os.path.dirname(loc.upper))
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
        # A directory made in a setgid one inherits its setgid bit (its entries then take
        # its group), as the kernel gives it: keep that bit, which the mode asked cannot
        # set (the filter refuses a mkdir asking for a set-id bit).
        inherited = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode & stat.S_ISGID
        _set_mode(parent, name, (mode & ~umask & 0o7777) | inherited)
    return make


def mkdir(req, session):
    return _create_at(req, session, AT_FDCWD, 0, _mkdir(req.args[1]), directory=True)


def mkdirat(req, session):
    return _create_at(req, session, req.arg_int(0), 1, _mkdir(req.args[2]), directory=True)


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
        _may_change_names(req, layer, os.path.dirname(loc.upper), loc.upper)
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
        if nrel.endswith("/") and not stat.S_ISDIR(os.lstat(old.real).st_mode):
            raise OSError(errno.ENOTDIR, "Not a directory")  # "new/" names a directory
        if layer.upper in (old.upper, new.upper):
            raise OSError(errno.EBUSY, "Device or resource busy")
        old = layer.concrete(old)
        new = layer.concrete(new)
        _may_change_names(req, layer, os.path.dirname(old.upper), old.upper)
        _may_change_names(req, layer, os.path.dirname(new.upper), new.upper)
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
        if nrel.endswith("/"):
            _refuse_slashed(session, req, nrel)
        old = _inside(session, located(session, req, orel, follow, True))
        new = _inside(session, located(session, req, nrel, False, True))
        for loc in (old, new):
            runtime_path_check(session, loc)
        if old.kind == MISSING:
            raise OSError(errno.ENOENT, "No such file or directory")
        if new.kind != MISSING:
            raise OSError(errno.EEXIST, "File exists")
        st = os.lstat(old.real)
        if stat.S_ISDIR(st.st_mode):
            raise OSError(errno.EPERM, "Operation not permitted")
        creds = credentials(req)
        if old.kind == LOWER and not (owns(req, st, creds) or may(req, st, 6, creds)):
            # fs.protected_hardlinks: another user's file, unless readable and writable
            raise OSError(errno.EPERM, "Operation not permitted")
        new = layer.concrete(new)
        _may_change_names(req, layer, os.path.dirname(new.upper))
        old = layer.copy_up(old)  # two names must share one private inode
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
        if loc.kind == LOWER:
            may_change(req, os.lstat(loc.real), "write")  # the copy would be ours
        loc = session.cow.copy_up(loc)
        try:  # never waiting for a FIFO's reader (the layer's lock is held)
            fd = session.cow.open_real(loc.real, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:
            if e.errno == errno.ENXIO:  # a FIFO without a reader
                raise OSError(errno.EINVAL, "Invalid argument") from None
            raise
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # the kernel's answer for those
                raise OSError(errno.EINVAL, "Invalid argument")
            if loc.kind == OUTSIDE:
                _refuse_protected(session, os.fstat(fd), loc.real, True)
            os.ftruncate(fd, length)
        finally:
            os.close(fd)
    return 0


def may_change(req, st: os.stat_result, need: str) -> None:
    """What the kernel asks of the caller to change a workdir object, tested on the object
    itself before the layer copies it (the copy is ours: the kernel's own test would then
    be ours): "write" permission, "owner" (or CAP_FOWNER), or "write_or_owner" (times set
    to now). Raises the kernel's errno."""
    creds = credentials(req)
    if need == "write" or (need == "write_or_owner" and not owns(req, st, creds)):
        if not may(req, st, 2, creds):
            raise OSError(errno.EACCES, "Permission denied")
    elif need == "owner" and not owns(req, st, creds):
        raise OSError(errno.EPERM, "Operation not permitted")


def metadata_target(req, session, dirfd: int, path: bytes, follow: bool,
                    need: str = "owner") -> int | None:
    """An O_PATH fd on what a chmod/chown/utimes/xattr call under the workdir changes: the
    private upper copy (made now if needed), once the caller may (`need`: may_change).
    None for paths spelled outside the workdir."""
    rel = rel_of(session, req, dirfd, path)
    if rel is None:
        return None
    with session.cow.lock:
        loc = located(session, req, rel, lookup_follows(rel, follow), True)
        if loc.kind == MISSING:
            raise OSError(errno.ENOENT, "No such file or directory")
        if loc.kind == LOWER:
            may_change(req, os.lstat(loc.real), need)
        if loc.kind != OUTSIDE:
            # A directory is materialized first: a pending one stands for the workdir's,
            # whose mode and times a stat reports, and the change would not show.
            loc = session.cow.copy_up(session.cow.concrete(loc, itself=True))
        return session.cow.open_real(loc.real, os.O_PATH | os.O_NOFOLLOW)


def fd_metadata_target(req, session, fd: int) -> int | None:
    """fchmod/fchown on an fd the kernel opened on a workdir file (read-only, before any
    change to it): an O_PATH fd on the upper copy (made now, once the caller owns the file:
    may_change) of what the sandbox sees at that name, if that is still the very file
    behind `fd`; None otherwise (the call is
    then decided on `fd` itself). An O_PATH fd is never redirected (EBADF, as for the
    kernel). The caller's fd still reads the workdir's file, whose content is the copy's;
    an fstat through it shows the file as it was before the change."""
    layer = session.cow
    if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_PATH:
        return None
    try:
        path = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    if not path.startswith(layer.lower + "/"):
        return None
    st = os.fstat(fd)
    with layer.lock:
        try:
            loc = layer.resolve(layer.relative(path), follow_last=False)
        except OSError:
            return None
        if loc.kind == UPPER:  # copied up already: its copy, if of this very file
            if layer.identity(loc.real) != (st.st_dev, st.st_ino):
                return None
        else:
            if loc.kind != LOWER:
                return None
            now = os.lstat(loc.real)
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                return None
            may_change(req, now, "owner")
            loc = layer.copy_up(layer.concrete(loc, itself=True))  # as metadata_target
        return layer.open_real(loc.real, os.O_PATH | os.O_NOFOLLOW)


# The calls that only look: while the layer holds no change (CowLayer.pristine) the kernel
# does them as the sandbox, with its own rights, on the workdir that Landlock keeps
# read-only (the C fast path's cow_read_only, fastcow.c, continues the same ones).
ONLY_LOOK = frozenset({"stat", "lstat", "access", "readlink", "fstat", "newfstatat", "statx",
                       "faccessat", "faccessat2", "readlinkat", "getxattr", "lgetxattr",
                       "listxattr", "llistxattr", "getcwd", "chdir", "execve", "execveat",
                       "getdents64", "getdents"})
_TMPFILE_BIT = 0o20000000  # O_TMPFILE without O_DIRECTORY (fastcow.c TMPFILE_BIT)


def only_looks(name: str, args) -> bool:
    """The call only looks: one of ONLY_LOOK, or an open for reading that creates and
    truncates nothing."""
    if name in ONLY_LOOK:
        return True
    flags = args[1] if name == "open" else args[2] if name == "openat" else None
    return flags is not None and flags & (os.O_ACCMODE | os.O_CREAT | os.O_TRUNC
                                          | _TMPFILE_BIT) == os.O_RDONLY


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
