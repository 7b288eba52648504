"""link, rename and symlink under a policy_fn: no object deny_path covers gets a new name.

These calls reach the supervisor whenever a policy_fn observes file events, and continue
in the kernel at once while no path is denied (Landlock decides them). While paths are
denied, a new name for a denied object (a hard link to a denied file, a rename of it or of
a directory above it) would let a later open reach it by a spelling deny_path does not
cover, so the call is decided under a freeze (supervisor.freeze), on the objects its paths
reach as the caller would resolve them: the source (link, rename), a symlink's target, and
the destination (renaming or linking over a denied object would change it) must not be, or
lie beneath, a denied object (supervisor.denied). The callback is not asked: these are not
events of its own.

What a freeze cannot stop (the kernel writing into the sandbox's memory between our read
and its own, network.Frozen) is caught where it matters: an open or exec of a denied
object is refused by identity, under any name, and verified after it returned.
"""

from __future__ import annotations

import errno
import os

from .._kernel.fileops import AT_FDCWD
from .network import CONTINUE, Frozen
from .paths import Unresolvable, directory_of, resolve, view
from .request import Denied, Request

AT_SYMLINK_FOLLOW = 0x400
AT_EMPTY_PATH = 0x1000


def _where(req: Request, session, tgid: int, dirfd: int, path: bytes,
           follow: bool) -> str | None:
    text = os.fsdecode(path)
    base = "/" if text.startswith("/") else directory_of(req.pid, dirfd, AT_FDCWD)
    return resolve(tgid, req.pid, base, text, follow_last=follow, root=view(session, tgid))


def _check(req: Request, session, name: str, paths) -> object:
    """`paths`: (dirfd, path argument index, follow) of each name the call uses."""
    rt = session.runtime
    tgid, _ = req.process_ids()
    for dirfd, arg, follow in paths:
        try:
            real = _where(req, session, tgid, dirfd, req.read_path(arg), follow)
        except Unresolvable as e:
            raise Denied(errno.EACCES, f"deny_path is active and {e}") from None
        refusal = rt.path_refusal(real) if real is not None else None
        if refusal is not None:
            raise Denied(errno.EACCES, f"{name}: {refusal}")
    if not req.still_valid():
        raise Denied(errno.ESRCH, "the calling task is gone")
    return CONTINUE


def _symlink_check(req: Request, session, ndirfd: int, target_arg: int, link_arg: int):
    """A symlink's target, resolved from the directory the link will be in."""
    rt = session.runtime
    tgid, _ = req.process_ids()
    target = os.fsdecode(req.read_path(target_arg))
    try:
        link = _where(req, session, tgid, ndirfd, req.read_path(link_arg), False)
        if link is None:
            return CONTINUE  # ENOENT in the kernel too
        base = os.path.dirname(link) or "/"
        real = resolve(tgid, req.pid, "/" if target.startswith("/") else base, target,
                       follow_last=True, root=view(session, tgid))
    except Unresolvable as e:
        raise Denied(errno.EACCES, f"deny_path is active and {e}") from None
    for path in (link, real):
        refusal = rt.path_refusal(path) if path is not None else None
        if refusal is not None:
            raise Denied(errno.EACCES, f"symlink: {refusal}")
    if not req.still_valid():
        raise Denied(errno.ESRCH, "the calling task is gone")
    return CONTINUE


def _held(check):
    def handler(req: Request, session):
        if not session.runtime.denied_paths:
            return CONTINUE
        return Frozen(lambda: check(req, session))
    return handler


def _link(req, session, odirfd, oarg, ndirfd, narg, flags):
    if flags & AT_EMPTY_PATH:
        raise Denied(errno.EPERM, "linkat(AT_EMPTY_PATH) while deny_path is active")
    return _check(req, session, "link", ((odirfd, oarg, bool(flags & AT_SYMLINK_FOLLOW)),
                                         (ndirfd, narg, False)))


def _rename(req, session, odirfd, oarg, ndirfd, narg):
    return _check(req, session, "rename", ((odirfd, oarg, False), (ndirfd, narg, False)))


HANDLERS = {
    "link": _held(lambda r, s: _link(r, s, AT_FDCWD, 0, AT_FDCWD, 1, 0)),
    "linkat": _held(lambda r, s: _link(r, s, r.arg_int(0), 1, r.arg_int(2), 3,
                                       r.arg_int(4))),
    "rename": _held(lambda r, s: _rename(r, s, AT_FDCWD, 0, AT_FDCWD, 1)),
    "renameat": _held(lambda r, s: _rename(r, s, r.arg_int(0), 1, r.arg_int(2), 3)),
    "renameat2": _held(lambda r, s: _rename(r, s, r.arg_int(0), 1, r.arg_int(2), 3)),
    "symlink": _held(lambda r, s: _symlink_check(r, s, AT_FDCWD, 0, 1)),
    "symlinkat": _held(lambda r, s: _symlink_check(r, s, r.arg_int(1), 0, 2)),
}
