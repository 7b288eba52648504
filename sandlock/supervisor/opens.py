"""open, openat and creat under a policy_fn (openat2 is answered ENOSYS by the filter).

The callback sees the event's category only, never the path: a verdict on it needs no
read of the caller's memory, so the call continues in the kernel (Landlock still decides
the access). While the callback has paths denied (ctx.deny_path), the path must be read,
so the sandbox is frozen first (supervisor.freeze) and the path is resolved under the
freeze as the caller would resolve it (supervisor.paths) and decided on the object it
reaches (supervisor.denied). A path that cannot be resolved that way is refused. Since
the kernel can still write into a frozen sandbox's memory (network.Frozen), the fd the
open installed is checked once it returned, everything still frozen: if it reaches a
denied object the process is killed before it can use it.
"""

from __future__ import annotations

import errno
import os

from .._kernel.fileops import AT_FDCWD
from .network import CONTINUE, Frozen
from .paths import Unresolvable, directory_of, resolve, view
from .request import Denied, Request

O_NOFOLLOW = os.O_NOFOLLOW


def _resolve(req: Request, tgid: int, dirfd: int, path: bytes, flags: int,
             root: str) -> str | None:
    """The file an open of (dirfd, path) reaches, resolved as the caller would."""
    text = os.fsdecode(path)
    base = "/" if text.startswith("/") else directory_of(req.pid, dirfd, AT_FDCWD)
    return resolve(tgid, req.pid, base, text, follow_last=not flags & O_NOFOLLOW, root=root)


def _decide(req: Request, session, name: str, dirfd: int, path_arg: int, flags_of,
            check_path: bool, with_event: bool = True, fds_before=None):
    from .runtime import SyscallEvent
    rt = session.runtime
    tgid, ppid = req.process_ids()
    event = SyscallEvent(name, "file", tgid, ppid)
    if fds_before is not None:  # what the caller holds before the open (see _opened)
        fds_before["table"] = table = f"/proc/{tgid}/task/{req.pid}/fd"  # its own table
        fds_before["fds"] = _listing(table)
        fds_before["event"] = event
    if check_path:
        try:
            real = _resolve(req, tgid, dirfd, req.read_path(path_arg), flags_of(),
                            view(session, tgid))
        except Unresolvable as e:
            raise Denied(errno.EACCES, f"deny_path is active and {e}") from None
        refusal = rt.path_refusal(real) if real is not None else None
        if refusal is not None:
            rt.record(event, "deny", refusal, errno.EACCES)
            raise Denied(errno.EACCES, refusal)
        if not req.still_valid():
            raise Denied(errno.ESRCH, "the calling task is gone")
    if with_event and "file" in rt.events:
        verdict = rt.decide(event)
        if not verdict.allow:
            raise Denied(verdict.errno, verdict.reason)
    return CONTINUE


def _handler(name: str, dirfd_arg: int | None, path_arg: int, flags_arg: int | None,
             with_event: bool = True):
    def handler(req: Request, session):
        dirfd = AT_FDCWD if dirfd_arg is None else req.arg_int(dirfd_arg)

        def flags_of():
            return os.O_CREAT if flags_arg is None else req.arg_int(flags_arg)
        if session.runtime.denied_paths:
            before: dict = {}
            return Frozen(lambda: _decide(req, session, name, dirfd, path_arg, flags_of,
                                          True, with_event, before),
                          lambda outcome: _opened(req, session, before, outcome))
        return _decide(req, session, name, dirfd, path_arg, flags_of, False, with_event)
    return handler


def _listing(table: str) -> set[str]:
    """The fd numbers in one thread's table (/proc/PID/task/TID/fd: still readable when
    the group leader exited, where /proc/PID/fd lists nothing)."""
    return set(os.listdir(table))


def _opened(req: Request, session, before: dict, outcome: str) -> str | None:
    """After an open let through while paths are denied: the fd it installed (the one
    new number in the caller's table; every task is still frozen) must not reach a denied
    object, whatever the path became between our read and the kernel's."""
    if "fds" not in before:
        return None
    table = before["table"]
    if outcome == "exec" or (outcome == "gone" and not os.path.exists(table)):
        return None  # no fd of the open is left to use
    try:
        new = _listing(table) - before["fds"]
        refusal = None
    except OSError as e:
        new, refusal = (), f"the opened file could not be checked ({e.strerror})"
    rt = session.runtime
    for fd in sorted(new):
        refusal = rt.denied_paths.object_refusal(f"{table}/{fd}")
        if refusal is not None:
            break
    if refusal is not None:
        refusal += "; the process was killed before it could use the file"
        rt.record(before["event"], "deny", refusal, errno.EACCES)
        session.record_denial(req, before["event"].syscall, errno.EACCES, refusal)
    return refusal


def decide_event(req: Request, session, name: str) -> None:
    """The callback's verdict on an open (category only), before a copy-on-write workdir
    acts on it (supervisor.cow_calls); raises Denied."""
    rt = session.runtime
    if "file" in rt.events:
        from .runtime import SyscallEvent
        tgid, ppid = req.process_ids()
        verdict = rt.decide(SyscallEvent(name, "file", tgid, ppid))
        if not verdict.allow:
            raise Denied(verdict.errno, verdict.reason)


HANDLERS = {
    "open": _handler("open", None, 0, 1),
    "creat": _handler("creat", None, 0, None),
    "openat": _handler("openat", 0, 1, 2),
}

# An open spelled outside a copy-on-write workdir, whose event was already decided: only
# the callback's denied paths remain to check (under the freeze).
PATH_ONLY = {
    "open": _handler("open", None, 0, 1, False),
    "creat": _handler("creat", None, 0, None, False),
    "openat": _handler("openat", 0, 1, 2, False),
}
