"""rename() in an overlay-backend workspace: directories of the workdir move as on a real
filesystem.

overlayfs without `redirect_dir` (which an unprivileged mount cannot have) refuses to
rename a directory that exists in the lower layer (EXDEV); `mv` copies then, but rename(2)
callers (git mv, Python's os.rename) fail. So in such a sandbox rename, renameat and
renameat2 reach the supervisor, which performs them itself when both names lie inside the
workspace: it resolves the copied paths in the sandbox's own view (from its root, with
RESOLVE_IN_ROOT, so nothing it rewrites later is re-read), renames there, and on EXDEV for
a directory moves it as `mv` would: the tree copied (modes, times, symlinks, hard links
within it), then the old name removed. Inside the workspace the sandbox may do all of that
itself (Landlock grants the overlay's root every right), so acting for it grants nothing;
any name outside the workspace continues in the kernel, where Landlock decides.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat

from .._kernel.fileops import AT_FDCWD, RESOLVE_IN_ROOT, mount_id, openat2, renameat2
from .network import CONTINUE
from .request import Denied, Request

RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2


class _Parent:
    """The directory holding a name, opened in the sandbox's view; None when it is not in
    the workspace's overlay."""

    def __init__(self, req: Request, workdir: str, dirfd: int, path: bytes, mount: int):
        self.fd = -1
        self.name = None
        full = os.fsdecode(path if path.startswith(b"/")
                           else req._base_path(dirfd) + b"/" + path)
        head, name = os.path.split(full.rstrip("/") if full.endswith("/") else full)
        if name in ("", ".", "..") or full.endswith("/"):
            return  # the kernel's own answers (EBUSY, ENOTDIR, ...)
        if not (head == workdir or head.startswith(workdir + "/")):
            return  # spelled outside (the overlay's device is checked below in any case)
        root = os.open(f"/proc/{req.pid}/root", os.O_PATH | os.O_CLOEXEC)
        try:
            fd = openat2(root, head, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, 0,
                         RESOLVE_IN_ROOT)
        finally:
            os.close(root)
        try:  # the overlay's own mount (launch.spawn), not whatever its path names now
            inside = mount_id(fd) == mount
        except OSError:
            inside = False
        if not inside:  # a symlink on the way led out of it, or the path was pointed away
            os.close(fd)
            return
        self.fd, self.name = fd, name

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)

    @property
    def proc(self) -> str:
        return f"/proc/self/fd/{self.fd}/{self.name}"


def _move_tree(old: _Parent, new: _Parent) -> None:
    """A directory of the lower layer to a new name, as `mv` does across filesystems."""
    src, dst = old.proc, new.proc
    try:
        st = os.lstat(dst)
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISDIR(st.st_mode):
            raise OSError(errno.ENOTDIR, "Not a directory")
        os.rmdir(dst)  # ENOTEMPTY, as rename(2) would say
    try:
        shutil.copytree(src, dst, symlinks=True, copy_function=shutil.copy2)
        shutil.copystat(src, dst, follow_symlinks=False)
    except BaseException:
        shutil.rmtree(dst, ignore_errors=True)
        raise
    shutil.rmtree(src)


def _rename(req: Request, session, odirfd, oarg, ndirfd, narg, flags):
    workdir, mount = session.policy.workspace.workdir, session.overlay_mount
    if mount is None:
        return CONTINUE  # never: an overlay sandbox is attached with its mount
    old = _Parent(req, workdir, odirfd, req.read_path(oarg), mount)
    new = _Parent(req, workdir, ndirfd, req.read_path(narg), mount)
    try:
        if old.fd < 0 or new.fd < 0:
            return CONTINUE  # a name outside the workspace: the kernel and Landlock decide
        rt = session.runtime
        if rt is not None and rt.denied_paths:
            for p in (old, new):
                refusal = rt.path_refusal(os.readlink(f"/proc/self/fd/{p.fd}") + "/" + p.name)
                if refusal is not None:
                    raise Denied(errno.EACCES, f"rename: {refusal}")
        if not req.still_valid():
            raise Denied(errno.ESRCH, "the calling task is gone")
        try:
            renameat2(old.name, new.name, flags, old.fd, new.fd)
        except OSError as e:
            if e.errno != errno.EXDEV or flags & RENAME_EXCHANGE or \
                    not stat.S_ISDIR(os.lstat(old.proc).st_mode):
                raise
            if flags & RENAME_NOREPLACE and os.path.lexists(new.proc):
                raise OSError(errno.EEXIST, "File exists") from None
            _move_tree(old, new)
        return 0
    finally:
        old.close()
        new.close()


HANDLERS = {
    "rename": lambda req, s: _rename(req, s, AT_FDCWD, 0, AT_FDCWD, 1, 0),
    "renameat": lambda req, s: _rename(req, s, req.arg_int(0), 1, req.arg_int(2), 3, 0),
    "renameat2": lambda req, s: _rename(req, s, req.arg_int(0), 1, req.arg_int(2), 3,
                                        req.args[4] & 0xFFFFFFFF),
}
