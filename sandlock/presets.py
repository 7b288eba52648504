"""Ready-made handlers (sandlock.handler): audit the paths a sandbox uses, refuse paths by
pattern, allow only some paths, log every call.

    sb.run_with_handlers(cmd, [(s, AuditPathsHandler(seen.append)) for s in
                               COMMON_PATH_SYSCALLS])

The path a handler sees is read from the caller's memory once; the kernel reads it again
if the call continues. A deny-list handler can therefore be raced by another thread of
the caller (the path changed between the two reads): use fs_denied for what must never
be reached, and these to audit, or to narrow further.
"""

from __future__ import annotations

import errno as _errno
import fnmatch
import logging
from typing import Callable

from .handler import ExceptionPolicy, Handler, HandlerCtx, NotifAction

COMMON_PATH_SYSCALLS: list[str] = ["openat", "unlinkat", "newfstatat", "statx", "faccessat",
                                   "readlinkat", "mkdirat", "execveat", "execve"]


class AuditPathsHandler(Handler):
    """callback(path or None, ctx) for each call; never changes what happens."""
    on_exception = ExceptionPolicy.CONTINUE

    def __init__(self, callback: Callable[[str | None, HandlerCtx], None],
                 max_len: int = 4096) -> None:
        self.callback, self.max_len = callback, max_len

    def handle(self, ctx: HandlerCtx) -> NotifAction:
        self.callback(ctx.read_path(max_len=self.max_len), ctx)
        return NotifAction.continue_()


def _patterns(value, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        raise TypeError(f"{what} must be a list of str patterns, got {type(value).__name__}")
    return value


class PathDenyHandler(Handler):
    """Refuse (errno, default EPERM) a call whose path matches a pattern (fnmatch); an
    unreadable path is left to the policy. Fails closed if it errs."""
    on_exception = ExceptionPolicy.KILL

    def __init__(self, deny: list[str], errno: int = _errno.EPERM, max_len: int = 4096):
        self.deny, self.errno, self.max_len = _patterns(deny, "deny"), errno, max_len

    def handle(self, ctx: HandlerCtx) -> NotifAction:
        path = ctx.read_path(max_len=self.max_len)
        if path is not None and any(fnmatch.fnmatchcase(path, p) for p in self.deny):
            return NotifAction.errno(self.errno)
        return NotifAction.continue_()


class PathAllowHandler(Handler):
    """Refuse (errno, default EACCES) every call whose path matches no pattern, an
    unreadable path included."""
    on_exception = ExceptionPolicy.KILL

    def __init__(self, allow: list[str], errno: int = _errno.EACCES, max_len: int = 4096):
        self.allow, self.errno, self.max_len = _patterns(allow, "allow"), errno, max_len

    def handle(self, ctx: HandlerCtx) -> NotifAction:
        path = ctx.read_path(max_len=self.max_len)
        if path is not None and any(fnmatch.fnmatchcase(path, p) for p in self.allow):
            return NotifAction.continue_()
        return NotifAction.errno(self.errno)


class LogSyscallsHandler(Handler):
    """One line per call to `logger` (default: the "sandlock.audit" logger's info)."""
    on_exception = ExceptionPolicy.CONTINUE

    def __init__(self, logger: Callable[[str], None] | None = None) -> None:
        self.logger = logger or logging.getLogger("sandlock.audit").info

    def handle(self, ctx: HandlerCtx) -> NotifAction:
        self.logger(f"syscall={ctx.syscall_nr} pid={ctx.pid} args={ctx.args}")
        return NotifAction.continue_()
