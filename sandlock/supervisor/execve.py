"""execve and execveat under a policy_fn: the argv the callback judges is the argv the
kernel runs.

exec cannot be performed on the sandbox's behalf, so the call is let through with
CONTINUE. That is safe only because the whole sandbox is frozen first (supervisor.freeze):
argv and the program's path are read after the freeze is complete, and the freeze lasts
until the exec has returned, so the kernel's re-read sees exactly what was checked. The
freeze stops the sandbox's tasks, not other processes: argv held in memory that a process
outside the sandbox could write (a shared file mapping, a memfd, SysV shared memory) is
refused. Shared anonymous memory is shared only with forks of its creator, all frozen.
"""

from __future__ import annotations

import errno
import os
import struct

from .._kernel import memory
from .network import CONTINUE, Frozen
from .paths import Unresolvable, directory_of, interpreter_of, resolve
from .request import Denied, Request

MAX_ARGS = 1 << 17         # pointers read before giving up (E2BIG)
MAX_ARGV_BYTES = 2 << 20   # bytes of argument strings read before giving up (E2BIG)
MAX_ARG_STRLEN = 1 << 17   # the kernel's own limit on one argument
AT_EMPTY_PATH = 0x1000
AT_SYMLINK_NOFOLLOW = 0x100


def read_argv(req: Request, addr: int, ranges: list | None = None) -> tuple[str, ...]:
    """The NULL-terminated argument vector at `addr` in the caller (bounded). `ranges`
    receives the (start, end) of every byte read."""
    if addr == 0:
        return ()
    out, total = [], 0
    ranges = ranges if ranges is not None else []
    start = addr
    while True:
        chunk = memory.read_memory(req.pid, addr, 512)
        if len(chunk) < 8:
            raise Denied(errno.EFAULT, "argv crosses unmapped memory")
        for (ptr,) in struct.iter_unpack("<Q", chunk[: len(chunk) // 8 * 8]):
            if ptr == 0:
                ranges.append((start, start + 8 * (len(out) + 1)))
                return tuple(out)
            try:
                arg = memory.read_cstring(req.pid, ptr, MAX_ARG_STRLEN)
            except OSError as e:
                raise Denied(errno.E2BIG if e.errno == errno.ENAMETOOLONG else errno.EFAULT,
                             "unreadable argument string") from None
            total += len(arg) + 1
            ranges.append((ptr, ptr + len(arg) + 1))
            if len(out) >= MAX_ARGS or total > MAX_ARGV_BYTES:
                raise Denied(errno.E2BIG, "argument list too long to inspect")
            out.append(arg.decode("utf-8", errors="surrogateescape"))
        addr += len(chunk) // 8 * 8


def shared_memory_refusal(pid: int, ranges: list) -> str | None:
    """Why memory at `ranges` could change under a freeze of the sandbox, or None."""
    if not ranges:
        return None
    maps = []
    with open(f"/proc/{pid}/maps", "rb") as f:
        for line in f:
            parts = line.split(None, 5)
            lo, hi = (int(x, 16) for x in parts[0].split(b"-"))
            name = parts[5].strip() if len(parts) > 5 else b""
            if parts[1][3:4] == b"s" and name != b"/dev/zero (deleted)":
                maps.append((lo, hi, name))
    for lo, hi in ranges if maps else ():
        for mlo, mhi, name in maps:
            if mlo < hi and lo < mhi:
                return (f"argv lies in shared memory ({name.decode(errors='replace')}) that "
                        f"a process outside the sandbox could change")
    return None


def _program_paths(req, tgid: int, dirfd: int, path_arg: int, flags: int) -> list[str]:
    """The file the exec runs, resolved as the caller would (the sandbox is frozen), and
    the interpreter of a `#!` script, which the kernel opens without a syscall."""
    from .._kernel.fileops import AT_FDCWD
    path = os.fsdecode(req.read_path(path_arg)) if req.args[path_arg] else ""
    if not path:
        if not flags & AT_EMPTY_PATH:
            return []
        real = directory_of(req.pid, dirfd, AT_FDCWD)  # the fd itself
    else:
        base = "/" if path.startswith("/") else directory_of(req.pid, dirfd, AT_FDCWD)
        real = resolve(tgid, req.pid, base, path,
                       follow_last=not flags & AT_SYMLINK_NOFOLLOW)
    if real is None:
        return []  # the exec fails in the kernel as well
    out = [real]
    interp = interpreter_of(real)
    if interp is not None:
        resolved = resolve(tgid, req.pid, "/", interp, follow_last=True)
        if resolved is not None:
            out.append(resolved)
    return out


def _decide(req: Request, session, name: str, dirfd: int, path_arg: int, argv_arg: int,
            flags: int):
    from .runtime import SyscallEvent
    rt = session.runtime
    ranges: list = []
    argv = read_argv(req, req.args[argv_arg], ranges)
    tgid, ppid = req.process_ids()
    refusal = shared_memory_refusal(req.pid, ranges)
    if refusal is not None:
        rt.record(SyscallEvent(name, "process", tgid, ppid, argv=argv), "deny", refusal,
                  errno.EPERM)
        raise Denied(errno.EPERM, refusal)
    if rt.denied_paths:
        try:
            reals = _program_paths(req, tgid, dirfd, path_arg, flags)
        except Unresolvable as e:
            raise Denied(errno.EACCES, f"deny_path is active and {e}") from None
        refusal = next((r for r in map(rt.path_refusal, reals) if r is not None), None)
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
