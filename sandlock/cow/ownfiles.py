"""The layer's own files, whatever modes the sandbox left on them: read, listed, copied,
removed by the supervisor, which has no capability that would pass those modes (an
unprivileged user's case; as root too, once it dropped them).

Every function here is given objects of a layer's storage (the upper tree, its scratch
directory, a copy being made), never the workdir's nor anything outside, and is called
under the layer's lock or once no sandboxed task runs: a mode opened up for a moment is
seen by nobody else. No symlink is above an entry of the upper tree, and none is followed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

from .._kernel.fileops import fchmod_fd, open_no_symlinks
from .location import XATTR_PREFIX


# Upper directories opened up for a diff or a commit (searchable): path -> the mode the
# sandbox left, which is what a change reports (changes.entry). Several layers' at once.
LEFT: dict[str, int] = {}


def permits(st, uid: int, gid: int, groups, want: int) -> bool:
    """The kernel's mode test, without capabilities or ACLs: the bits `want` (4 read,
    2 write, 1 execute) of the class `uid`/`gid`/`groups` is in for an object of `st`'s
    owner, group and mode."""
    shift = 6 if st.st_uid == uid else 3 if st.st_gid == gid or st.st_gid in groups else 0
    return (st.st_mode >> shift) & want == want


def open_read(path: str, flags: int = 0) -> int:
    """An fd reading the layer's own regular file `path` (last component not followed),
    even if its owner made it unreadable (read_unreadable)."""
    flags |= os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(path, flags)
    except PermissionError as e:
        if e.errno != errno.EACCES:
            raise
        return read_unreadable(path, lambda p: os.open(p, flags & ~os.O_NOFOLLOW))


def read_unreadable(path: str, read):
    """`read(p)` on a layer object whose owner took its own read right away (chmod 000: a
    user xattr, like the content, needs it, and the supervisor acts without capabilities):
    with the owner's read bit added for that moment, through an O_PATH fd (the object
    itself, never a path re-resolved), then the mode as it was. Only the upper tree's own
    objects are passed here (the sandbox's, which it could chmod back itself), under the
    layer's lock or at commit."""
    # No symlink on the way (the upper tree has none above its entries): the mode change
    # can only reach the object named, never something a link leads to.
    fd = open_no_symlinks(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if stat.S_ISLNK(st.st_mode):
            raise OSError(errno.EPERM, "a symlink has no user xattrs")
        try:
            fchmod_fd(fd, stat.S_IMODE(st.st_mode) | stat.S_IRUSR)
        except OSError:  # not the supervisor's own: unreadable it stays (never "absent")
            raise OSError(errno.EACCES, os.strerror(errno.EACCES), path) from None
        try:
            return read(f"/proc/self/fd/{fd}")
        finally:
            fchmod_fd(fd, stat.S_IMODE(st.st_mode))
    finally:
        os.close(fd)


@contextlib.contextmanager
def searchable(upper: str):
    """The upper tree's directories readable and searchable by us for the block, and
    their modes as the sandbox left them put back after. A sandbox may leave one mode 000
    or 0300 (its owner's choice: the real directory would commit so), which diff and
    commit must list and enter all the same; the supervisor has no capability that would
    let it: the modes left are in LEFT meanwhile, for the changes to report. Only the
    layer's own directories, with no sandboxed task running (no symlink is above an entry of the upper
    tree, and os.walk follows none)."""
    changed: dict[str, int] = {}
    me = os.geteuid()

    def open_up(path: str) -> None:
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode) and st.st_uid == me and st.st_mode & 0o700 != 0o700 \
                and path not in LEFT:  # not already (a diff inside a commit)
            os.chmod(path, stat.S_IMODE(st.st_mode) | 0o700)
            changed[path] = LEFT[path] = stat.S_IMODE(st.st_mode)
    try:
        if not _reads_anything() and os.path.isdir(upper):
            open_up(upper)
            for top, dirs, _ in os.walk(upper):  # each opened before the walk enters it
                for name in dirs:
                    open_up(os.path.join(top, name))
        yield changed
    finally:
        for path, mode in sorted(changed.items(), reverse=True):  # deepest first
            LEFT.pop(path, None)
            try:
                os.chmod(path, mode)
            except FileNotFoundError:
                pass  # committed and removed


def in_own_dir(parent: str, action):
    """`action()`, which changes an entry of the upper directory `parent` for the layer's
    own bookkeeping (a copy-up), with our write and search rights on it for that moment if
    its mode (the sandbox's to choose) lacks them. Under the layer's lock."""
    try:
        return action()
    except PermissionError:
        st = os.lstat(parent)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() \
                or st.st_mode & 0o300 == 0o300:
            raise
        os.chmod(parent, stat.S_IMODE(st.st_mode) | 0o300)
        try:
            return action()
        finally:
            os.chmod(parent, stat.S_IMODE(st.st_mode))


def _reads_anything() -> bool:
    """This process may read and search any directory (CAP_DAC_READ_SEARCH)."""
    from .._kernel import caps
    try:
        return bool(caps.capget().mask("effective") & (1 << 2))
    except OSError:
        return False


def copy_data(src_fd: int, dst_fd: int) -> None:
    """The content of regular file `src_fd` into the empty file `dst_fd`, holes kept as
    holes (a sparse file stays sparse: `truncate -s 50G disk.img` is not 50 GB written at
    a copy-up or a commit). By offset: neither fd's position is used."""
    size = os.fstat(src_fd).st_size
    pos = 0
    while pos < size:
        try:
            start = os.lseek(src_fd, pos, os.SEEK_DATA)
            end = os.lseek(src_fd, start, os.SEEK_HOLE)
        except OSError as e:
            if e.errno == errno.ENXIO:  # nothing but a hole up to the end
                break
            if e.errno != errno.EINVAL:  # EINVAL: no SEEK_DATA here, all of it is data
                raise
            start, end = pos, size
        while start < end:
            chunk = os.pread(src_fd, min(1 << 20, end - start), start)
            if not chunk:  # shrunk meanwhile
                end = start
                break
            view, done = memoryview(chunk), 0
            while done < len(chunk):
                done += os.pwrite(dst_fd, view[done:], start + done)
            start += len(chunk)
        pos = end
    os.ftruncate(dst_fd, size)


# Xattrs of the layers' own (the seccomp layer's; overlayfs' with userxattr, and as root
# without it), never copied: a commit gave every changed workdir file of an overlay run
# overlayfs' user.overlay.origin (hunt), which tools and later runs then saw.
LAYER_XATTRS = (XATTR_PREFIX, "user.overlay.", "trusted.overlay.")


def copy_metadata(src_fd: int, dst_fd: int, st) -> None:
    """Owner (when permitted), mode, times and xattrs (except the layers' own)."""
    try:
        os.fchown(dst_fd, st.st_uid, st.st_gid)
    except PermissionError:
        pass
    try:
        for name in os.listxattr(src_fd):
            if not name.startswith(LAYER_XATTRS):
                try:
                    os.setxattr(dst_fd, name, os.getxattr(src_fd, name))
                except OSError:
                    pass
    except OSError:
        pass
    os.fchmod(dst_fd, stat.S_IMODE(st.st_mode))
    os.utime(dst_fd, ns=(st.st_atime_ns, st.st_mtime_ns))


def tree_usage(path: str) -> int:
    """Bytes the files below `path` take on disk."""
    total = 0
    for dirpath, _, filenames in os.walk(path):
        for name in filenames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:
                pass
    return total


def remove_tree(path: str) -> None:
    """Remove a tree of ours, whatever modes a sandbox left in it (a directory of mode 000
    is opened up, then removed with what it holds), by fd: tree_removal."""
    from ..tree_removal import remove_beneath
    parent, name = os.path.split(path)
    try:  # the layers' storage: its path may pass through the user's own symlinks (a
        # ~/.cache on another disk), unlike a private TMPDIR's realpath
        pfd = os.open(parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        remove_beneath(pfd, name)
    finally:
        os.close(pfd)
