"""chmod / chown / utimes / xattr changes: allowed only on inodes under fs_writable.

Landlock does not mediate metadata changes, so these syscalls are trapped. Three phases:
parse (copy the path, name and value out of the child once), decide (the inode the path
resolves to, seen through an O_PATH fd, must lie under fs_writable, outside fs_denied, and
not be a device node), act (change that very inode through the fd). The kernel never
re-reads the child's path after the decision, so rewriting it concurrently achieves nothing.
The supervisor thread acts with the sandbox's capabilities (see loop), so the kernel's own
ownership checks apply exactly as they would to the child.
"""

from __future__ import annotations

import errno
import os
import stat
import struct

from .._kernel import fileops
from .._kernel.fileops import AT_EMPTY_PATH, AT_SYMLINK_NOFOLLOW
from .._kernel.fileops import AT_FDCWD as AT_FDCWD_
from ..fs_rules import is_beneath
from .request import Denied, Request

XATTR_NAME_MAX = 255
XATTR_SIZE_MAX = 65536
_UID_UNCHANGED = 0xFFFFFFFF


def _check(fd: int, session) -> None:
    """Decide on the inode behind `fd`; raise Denied unless it may be changed."""
    st = os.fstat(fd)
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        raise Denied(errno.EPERM, "metadata of device nodes never changes from a sandbox")
    path = os.readlink(f"/proc/self/fd/{fd}")
    if not path.startswith("/") or path.endswith(" (deleted)"):
        raise Denied(errno.EPERM, f"target has no path under fs_writable ({path})")
    policy = session.policy
    if session.cow is not None and is_beneath(path, session.cow.upper):
        return  # the sandbox's private copy in its copy-on-write layer
    prot = session.protection
    if session.shm_mount is not None and _on_mount(fd, session.shm_mount):
        # its private /dev/shm (a directory of its private TMPDIR's root); a protected
        # file is no more changeable through a hard link made there
        if prot is not None and (st.st_dev, st.st_ino) in prot.identities:
            raise Denied(errno.EPERM, f"{path} is one of the user's protected files")
        return
    ws = policy.workspace
    if session.own_mounts and ws is not None and is_beneath(path, ws.workdir) and \
            on_overlay(fd, session):
        return  # the overlay backend's view of the workdir: changes reach its layer
    if ws is not None and is_beneath(path, ws.workdir) or any(
            is_beneath(path, e) for e in policy.write_excluded):
        # The real workdir, reached by a spelling the layer does not map (/proc/self/root,
        # a symlink made elsewhere): a writable grant around it does not cover it.
        raise Denied(errno.EPERM, f"{path} is in the copy-on-write workdir: it changes "
                                  f"through its layer only")
    if any(is_beneath(path, d) for d in policy.fs_denied):
        raise Denied(errno.EPERM, f"{path} is in fs_denied")
    if not any(is_beneath(path, w) for w in policy.fs_writable):
        raise Denied(errno.EPERM, f"{path} is outside fs_writable")
    if prot is not None and ((st.st_dev, st.st_ino) in prot.identities or
                             prot.refusal(path) is not None):
        raise Denied(errno.EPERM, f"{path} is one of the user's protected files")


def on_overlay(fd: int, session) -> bool:
    """Is the object behind `fd` in the overlay over the workdir (not the real workdir
    beneath it)? By the mount the overlay was made as (launch.spawn, before the program
    ran), not by device — with the layer's storage on another filesystem overlayfs reports
    a file's own filesystem's device (hunt: chmod, utimes and xattrs of every file were
    refused) — and not by the workdir's path in the sandbox's view, which a sandbox that
    may write above the workdir can point at a directory of its own (review)."""
    return session.overlay_mount is not None and _on_mount(fd, session.overlay_mount)


def _on_mount(fd: int, mount: int) -> bool:
    try:
        return fileops.mount_id(fd) == mount
    except OSError:
        return False


def _path_target(req: Request, session, dirfd: int, path_arg: int, at_flags: int,
                 follow: bool, need: str = "owner") -> int:
    """`need`: what the kernel asks of the caller for this change (cow_calls.may_change),
    tested by the supervisor on a workdir object it copies up for it."""
    path = req.read_path(path_arg)
    if session.cow is None:
        return req.open_target(dirfd, path, at_flags, follow)
    from .cow_calls import metadata_target  # a copy-on-write workdir: the upper copy
    fd = metadata_target(req, session, dirfd, path, follow, need)
    if fd is not None:
        return fd
    fd = req.open_target(dirfd, path, at_flags, follow)
    if not path:  # AT_EMPTY_PATH: the fd itself, as trusted as in fchmod(fd)
        return fd
    # _check accepts the layer's upper tree (fds the layer handed out are the sandbox's
    # private copies); reached by a path the layer did not map, it is not the sandbox's.
    try:
        reached = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        reached = ""
    layer = session.cow
    if is_beneath(reached, layer.upper) and path.startswith(b"/proc/"):
        # Through an fd the layer handed out (chmod("/proc/self/fd/N"), as glibc's
        # fchmodat(AT_SYMLINK_NOFOLLOW) does): the object the sandbox sees at that name,
        # copied up first if it was the workdir's.
        os.close(fd)
        rel = layer.relative(reached)
        fd = metadata_target(req, session, AT_FDCWD_, os.fsencode(
            os.path.join(layer.lower, rel) if rel else layer.lower), False, need)
        if fd is None:
            raise Denied(errno.EACCES, "the workspace's storage is not the sandbox's to change")
        return fd
    if is_beneath(reached, layer.root):
        os.close(fd)
        raise Denied(errno.EACCES, "the workspace's storage is not the sandbox's to change")
    return fd


def _run(req: Request, session, fd: int, act) -> int:
    """Check, confirm the notification is still live, act; always close `fd`."""
    try:
        _check(fd, session)
        if not req.still_valid():
            raise Denied(errno.ESRCH, "the calling task is gone")
        act(fd)
        return 0
    finally:
        os.close(fd)


def _uid(v: int) -> int:
    v &= 0xFFFFFFFF
    return -1 if v == _UID_UNCHANGED else v


def _at_flags(req: Request, i: int, allowed: int) -> int:
    flags = req.arg_int(i)
    if flags & ~allowed:
        raise Denied(errno.EINVAL, "unknown flags")
    return flags


# --- chmod family --------------------------------------------------------------------------

def _mode(fd: int, mode: int) -> int:
    """The mode to set; setuid/setgid on a file is refused: a sandbox started as root could
    otherwise plant a root-owned setuid binary for someone outside to run."""
    mode &= 0o7777
    if mode & 0o6000 and not stat.S_ISDIR(os.fstat(fd).st_mode):
        raise Denied(errno.EPERM, "setuid/setgid bits are never set from a sandbox")
    return mode


def chmod(req, session):
    fd = _path_target(req, session, fileops.AT_FDCWD, 0, 0, follow=True)
    return _run(req, session, fd, lambda t: fileops.fchmod_fd(t, _mode(t, req.args[1])))


def fchmodat(req, session):
    fd = _path_target(req, session, req.arg_int(0), 1, 0, follow=True)
    return _run(req, session, fd, lambda t: fileops.fchmod_fd(t, _mode(t, req.args[2])))


def fchmodat2(req, session):
    flags = _at_flags(req, 3, AT_SYMLINK_NOFOLLOW | AT_EMPTY_PATH)
    nofollow = flags & AT_SYMLINK_NOFOLLOW
    fd = _path_target(req, session, req.arg_int(0), 1, flags, follow=not nofollow)
    return _run(req, session, fd,
                lambda t: fileops.fchmod_fd(t, _mode(t, req.args[2]), nofollow))


def _fd_target(req: Request, session) -> tuple[int, bool]:
    """Our duplicate of the fd argument, or with a copy-on-write workdir, the upper copy of
    the workdir file it was opened on (cow_calls.fd_metadata_target); True for the latter
    (an O_PATH fd)."""
    fd = req.dup_fd(req.arg_int(0))
    if session.cow is None:
        return fd, False
    from .cow_calls import fd_metadata_target
    try:
        upper = fd_metadata_target(req, session, fd)
    except BaseException:
        os.close(fd)
        raise
    if upper is None:
        return fd, False
    os.close(fd)
    return upper, True


def fchmod(req, session):
    fd, upper = _fd_target(req, session)
    if upper:
        return _run(req, session, fd, lambda t: fileops.fchmod_fd(t, _mode(t, req.args[1])))
    return _run(req, session, fd, lambda t: os.fchmod(t, _mode(t, req.args[1])))


# --- chown family --------------------------------------------------------------------------

def _chown_path(follow):
    def handler(req, session):
        fd = _path_target(req, session, fileops.AT_FDCWD, 0, 0, follow=follow)
        return _run(req, session, fd,
                    lambda t: fileops.fchown_fd(t, req.args[1], req.args[2]))
    return handler


chown = _chown_path(follow=True)
lchown = _chown_path(follow=False)


def fchownat(req, session):
    flags = _at_flags(req, 4, AT_SYMLINK_NOFOLLOW | AT_EMPTY_PATH)
    fd = _path_target(req, session, req.arg_int(0), 1, flags, follow=not flags & AT_SYMLINK_NOFOLLOW)
    return _run(req, session, fd, lambda t: fileops.fchown_fd(t, req.args[2], req.args[3]))


def fchown(req, session):
    fd, upper = _fd_target(req, session)
    if upper:
        return _run(req, session, fd,
                    lambda t: fileops.fchown_fd(t, req.args[1], req.args[2]))
    return _run(req, session, fd,
                lambda t: os.fchown(t, _uid(req.args[1]), _uid(req.args[2])))


# --- times -----------------------------------------------------------------------------------

def _timespecs_from_pairs(raw: bytes, scale: int, check_frac: int | None) -> bytes:
    a_sec, a_frac, m_sec, m_frac = struct.unpack("<qqqq", raw)
    if check_frac is not None and not (0 <= a_frac < check_frac and 0 <= m_frac < check_frac):
        raise Denied(errno.EINVAL, "invalid time value")
    return struct.pack("<qqqq", a_sec, a_frac * scale, m_sec, m_frac * scale)


UTIME_NOW, UTIME_OMIT = (1 << 30) - 1, (1 << 30) - 2


def _times_need(times: bytes | None) -> str:
    """Setting a file's times to now needs write permission or ownership; to any other
    time, ownership (utimensat(2))."""
    if times is None:
        return "write_or_owner"
    nsecs = struct.unpack("<qqqq", times)[1::2]
    return "write_or_owner" if all(n in (UTIME_NOW, UTIME_OMIT) for n in nsecs) else "owner"


def utime(req, session):
    times = None
    if req.args[1]:
        a, m = struct.unpack("<qq", req.read_bytes(req.args[1], 16))
        times = struct.pack("<qqqq", a, 0, m, 0)
    fd = _path_target(req, session, fileops.AT_FDCWD, 0, 0, follow=True,
                      need=_times_need(times))
    return _run(req, session, fd, lambda t: fileops.utimens_fd(t, times, True))


def _timeval_times(req, i):
    if not req.args[i]:
        return None
    return _timespecs_from_pairs(req.read_bytes(req.args[i], 32), 1000, 1_000_000)


def utimes(req, session):
    times = _timeval_times(req, 1)
    fd = _path_target(req, session, fileops.AT_FDCWD, 0, 0, follow=True,
                      need=_times_need(times))
    return _run(req, session, fd, lambda t: fileops.utimens_fd(t, times, True))


def futimesat(req, session):
    times = _timeval_times(req, 2)
    if not req.args[1]:  # NULL path: acts on dirfd itself
        fd = req.dup_fd(req.arg_int(0))
        return _run(req, session, fd, lambda t: fileops.utimens_fd(t, times, False))
    fd = _path_target(req, session, req.arg_int(0), 1, 0, follow=True,
                      need=_times_need(times))
    return _run(req, session, fd, lambda t: fileops.utimens_fd(t, times, True))


def utimensat(req, session):
    flags = _at_flags(req, 3, AT_SYMLINK_NOFOLLOW | AT_EMPTY_PATH)
    times = req.read_bytes(req.args[2], 32) if req.args[2] else None
    if not req.args[1]:  # futimens(): the fd itself, EBADF for O_PATH as in the kernel
        fd = req.dup_fd(req.arg_int(0))
        return _run(req, session, fd, lambda t: fileops.utimens_fd(t, times, False))
    fd = _path_target(req, session, req.arg_int(0), 1, flags,
                      follow=not flags & AT_SYMLINK_NOFOLLOW, need=_times_need(times))
    return _run(req, session, fd, lambda t: fileops.utimens_fd(t, times, True))


# --- extended attributes ---------------------------------------------------------------------

def _xattr_name(req, i) -> bytes:
    name = req.read_path(i)
    if not name or len(name) > XATTR_NAME_MAX:
        raise Denied(errno.ERANGE, "bad xattr name")
    if name.startswith(b"user.sandlock."):
        raise Denied(errno.EPERM, "user.sandlock.* xattrs belong to the copy-on-write layer")
    return name


def _xattr_value(req, addr, size) -> bytes:
    if size > XATTR_SIZE_MAX:
        raise Denied(errno.E2BIG, "xattr value too large")
    return req.read_bytes(addr, size) if size else b""


_ACL_ACCESS = b"system.posix_acl_access"


def _xattr_need(name: bytes) -> str:
    """A user xattr needs write permission; an ACL, ownership."""
    return "owner" if name.startswith(b"system.posix_acl") else "write"


def _acl_refusal(fd: int, name: bytes) -> None:
    """An access ACL rewrites a file's permission bits: never on a setuid/setgid file (it
    could make a set-id program executable for others)."""
    if name == _ACL_ACCESS:
        mode = os.fstat(fd).st_mode
        if mode & 0o6000 and not stat.S_ISDIR(mode):
            raise Denied(errno.EPERM, "ACLs are never set on setuid/setgid files from a "
                                      "sandbox")


def _set_on_opath(name, value, flags):
    def act(t):
        if stat.S_ISLNK(os.fstat(t).st_mode):
            raise Denied(errno.EPERM, "xattrs on symlinks")
        _acl_refusal(t, name)
        os.setxattr(f"/proc/self/fd/{t}", name, value, flags)
    return act


def _remove_on_opath(name):
    def act(t):
        if stat.S_ISLNK(os.fstat(t).st_mode):
            raise Denied(errno.EPERM, "xattrs on symlinks")
        os.removexattr(f"/proc/self/fd/{t}", name)
    return act


def _setxattr_path(follow):
    def handler(req, session):
        name = _xattr_name(req, 1)
        value = _xattr_value(req, req.args[2], req.args[3])
        flags = req.arg_int(4)
        fd = _path_target(req, session, fileops.AT_FDCWD, 0, 0, follow=follow,
                          need=_xattr_need(name))
        return _run(req, session, fd, _set_on_opath(name, value, flags))
    return handler


setxattr = _setxattr_path(follow=True)
lsetxattr = _setxattr_path(follow=False)


def fsetxattr(req, session):
    name = _xattr_name(req, 1)
    value = _xattr_value(req, req.args[2], req.args[3])
    flags = req.arg_int(4)
    fd = req.dup_fd(req.arg_int(0))

    def act(t):
        _acl_refusal(t, name)
        os.setxattr(t, name, value, flags)
    return _run(req, session, fd, act)


def setxattrat(req, session):
    at_flags = _at_flags(req, 2, AT_SYMLINK_NOFOLLOW | AT_EMPTY_PATH)
    name = _xattr_name(req, 3)
    if req.args[5] < 16:
        raise Denied(errno.EINVAL, "short struct xattr_args")
    value_ptr, size, flags = struct.unpack("<QII", req.read_bytes(req.args[4], 16))
    value = _xattr_value(req, value_ptr, size)
    fd = _path_target(req, session, req.arg_int(0), 1, at_flags,
                      follow=not at_flags & AT_SYMLINK_NOFOLLOW, need=_xattr_need(name))
    return _run(req, session, fd, _set_on_opath(name, value, flags))


def _removexattr_path(follow):
    def handler(req, session):
        name = _xattr_name(req, 1)
        fd = _path_target(req, session, fileops.AT_FDCWD, 0, 0, follow=follow,
                          need=_xattr_need(name))
        return _run(req, session, fd, _remove_on_opath(name))
    return handler


removexattr = _removexattr_path(follow=True)
lremovexattr = _removexattr_path(follow=False)


def fremovexattr(req, session):
    name = _xattr_name(req, 1)
    fd = req.dup_fd(req.arg_int(0))
    return _run(req, session, fd, lambda t: os.removexattr(t, name))


def removexattrat(req, session):
    at_flags = _at_flags(req, 2, AT_SYMLINK_NOFOLLOW | AT_EMPTY_PATH)
    name = _xattr_name(req, 3)
    fd = _path_target(req, session, req.arg_int(0), 1, at_flags,
                      follow=not at_flags & AT_SYMLINK_NOFOLLOW, need=_xattr_need(name))
    return _run(req, session, fd, _remove_on_opath(name))


HANDLERS = {
    "chmod": chmod, "fchmod": fchmod, "fchmodat": fchmodat, "fchmodat2": fchmodat2,
    "chown": chown, "fchown": fchown, "lchown": lchown, "fchownat": fchownat,
    "utime": utime, "utimes": utimes, "futimesat": futimesat, "utimensat": utimensat,
    "setxattr": setxattr, "lsetxattr": lsetxattr, "fsetxattr": fsetxattr,
    "setxattrat": setxattrat, "removexattr": removexattr, "lremovexattr": lremovexattr,
    "fremovexattr": fremovexattr, "removexattrat": removexattrat,
}
