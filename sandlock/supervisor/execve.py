"""execve and execveat under a policy_fn: the argv the callback judges is the argv the
kernel runs.

exec cannot be performed on the sandbox's behalf, so the call is let through with
CONTINUE. That is safe only because the whole sandbox is frozen first (supervisor.freeze):
argv and the program's path are read after the freeze is complete, and the freeze lasts
until the exec has returned, so the kernel's re-read sees exactly what was checked.
"""

from __future__ import annotations

import errno
import os
import struct

from .._kernel import memory
from .network import CONTINUE, Frozen
from .request import Denied, Request

MAX_ARGS = 1 << 17         # pointers read before giving up (E2BIG)
MAX_ARGV_BYTES = 2 << 20   # bytes of argument strings read before giving up (E2BIG)
MAX_ARG_STRLEN = 1 << 17   # the kernel's own limit on one argument
AT_EMPTY_PATH = 0x1000
AT_SYMLINK_NOFOLLOW = 0x100


def read_argv(req: Request, addr: int) -> tuple[str, ...]:
    """The NULL-terminated argument vector at `addr` in the caller (bounded)."""
    if addr == 0:
        return ()
    out, total = [], 0
    while True:
        chunk = memory.read_memory(req.pid, addr, 512)
        if len(chunk) < 8:
            raise Denied(errno.EFAULT, "argv crosses unmapped memory")
        for (ptr,) in struct.iter_unpack("<Q", chunk[: len(chunk) // 8 * 8]):
            if ptr == 0:
                return tuple(out)
            try:
                arg = memory.read_cstring(req.pid, ptr, MAX_ARG_STRLEN)
            except OSError as e:
                raise Denied(errno.E2BIG if e.errno == errno.ENAMETOOLONG else errno.EFAULT,
                             "unreadable argument string") from None
            total += len(arg) + 1
            if len(out) >= MAX_ARGS or total > MAX_ARGV_BYTES:
                raise Denied(errno.E2BIG, "argument list too long to inspect")
            out.append(arg.decode("utf-8", errors="surrogateescape"))
        addr += len(chunk) // 8 * 8


def _program_path(req, dirfd: int, path_arg: int, flags: int) -> str | None:
    """Where the exec'd file is, resolved as the kernel will (the sandbox is frozen)."""
    path = req.read_path(path_arg) if req.args[path_arg] else b""
    try:
        fd = req.open_target(dirfd, path, flags & AT_EMPTY_PATH,
                             follow=not flags & AT_SYMLINK_NOFOLLOW)
    except OSError:
        return None  # the exec itself will fail (ENOENT & co.)
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


def _decide(req: Request, session, name: str, dirfd: int, path_arg: int, argv_arg: int,
            flags: int):
    from .runtime import SyscallEvent
    rt = session.runtime
    argv = read_argv(req, req.args[argv_arg])
    tgid, ppid = req.process_ids()
    if rt.denied_paths:
        real = _program_path(req, dirfd, path_arg, flags)
        refusal = rt.path_refusal(real) if real is not None else None
        if refusal is not None:
            rt.record(SyscallEvent(name, "process", tgid, ppid, argv=argv), "deny", refusal,
                      errno.EACCES)
            raise Denied(errno.EACCES, refusal)
    if not req.still_valid():
        raise Denied(errno.ESRCH, "the calling task is gone")
    if "exec" in rt.events:
        verdict = rt.decide(SyscallEvent(name, "process", tgid, ppid, argv=argv))
        if not verdict.allow:
            raise Denied(verdict.errno, verdict.reason)
    return CONTINUE


def execve(req: Request, session):
    from .._kernel.fileops import AT_FDCWD
    return Frozen(lambda: _decide(req, session, "execve", AT_FDCWD, 0, 1, 0))


def execveat(req: Request, session):
    return Frozen(lambda: _decide(req, session, "execveat", req.arg_int(0), 1, 2,
                                  req.arg_int(4)))


HANDLERS = {"execve": execve, "execveat": execveat}
