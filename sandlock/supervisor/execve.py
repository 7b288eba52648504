"""execve and execveat under a policy_fn: no argv the callback refused ever runs.

exec cannot be performed on the sandbox's behalf, so the call is let through with
CONTINUE, under a freeze of the whole sandbox (supervisor.freeze): argv and the program's
path are read, resolved and judged with every task stopped. A freeze does not stop the
kernel, though: a frozen task that is killed still has its exit path write into memory it
registered earlier (clear_child_tid, robust futex lists), and a CLONE_VM sibling could
thus change argv between our read and the kernel's. So the decision is verified after the
exec, on the new program's own memory, which nothing else shares: while it is stopped at
its PTRACE_EVENT_EXEC (before its first instruction), its argv (/proc/PID/cmdline) and
executable (/proc/PID/exe, by device and inode) must be the ones judged — the file the
path reached, or for a `#!` script its interpreter with the argv the kernel builds — and
outside deny_path; otherwise the process is killed there and the refusal recorded.

argv held in memory that a process outside the sandbox could write (a shared file mapping,
a memfd, SysV shared memory) is refused before the exec.
"""

from __future__ import annotations

import errno
import os
import struct

from .._kernel import memory
from .network import CONTINUE, Frozen
from .paths import Unresolvable, directory_of, interpreter_of, resolve, view
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


class Judged:
    """What an exec was judged on, to compare with what the kernel ran (`verify`)."""

    def __init__(self):
        self.argv: tuple[bytes, ...] = ()
        self.filename = b""              # the kernel's bprm->filename for this call
        self.program = None              # (st_dev, st_ino) of the file the path reached
        self.interpreters: set = set()   # ... of the #! interpreters it names, in a chain
        self.event = None                # the SyscallEvent the callback saw


MAX_INTERPRETERS = 4  # the kernel's BINPRM_MAX_RECURSION


def _identity(st) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _program(req, tgid: int, dirfd: int, path: bytes, flags: int, judged: Judged,
             root: str) -> list:
    """Resolve the file the exec runs as the caller would (the sandbox is frozen), and the
    interpreters of a `#!` chain, which the kernel opens without a syscall; fill `judged`
    with their identities. Returns their paths (for deny_path)."""
    from .._kernel.fileops import AT_FDCWD
    text = os.fsdecode(path)
    if dirfd == AT_FDCWD or text.startswith("/"):
        judged.filename = path
    elif not text:
        judged.filename = b"/dev/fd/%d" % dirfd
    else:
        judged.filename = b"/dev/fd/%d/%s" % (dirfd, path)
    if not text:
        if not flags & AT_EMPTY_PATH:
            return []
        fd = req.dup_fd(dirfd)  # fexecve: the fd itself, whatever its name
        try:
            judged.program = _identity(os.fstat(fd))
        finally:
            os.close(fd)
        real = directory_of(req.pid, dirfd, AT_FDCWD)
    else:
        base = "/" if text.startswith("/") else directory_of(req.pid, dirfd, AT_FDCWD)
        real = resolve(tgid, req.pid, base, text, follow_last=not flags & AT_SYMLINK_NOFOLLOW,
                       root=root)
        if real is None:
            return []  # the exec fails in the kernel as well
        try:
            judged.program = _identity(os.stat(root + real))
        except OSError:
            return [real]
    out = [real]
    for _ in range(MAX_INTERPRETERS):
        interp = interpreter_of(out[-1], root)
        if interp is None:
            break
        resolved = resolve(tgid, req.pid, "/", interp, follow_last=True, root=root)
        if resolved is None:
            break
        try:
            judged.interpreters.add(_identity(os.stat(root + resolved)))
        except OSError:
            break
        out.append(resolved)
    return out


def _decide(req: Request, session, name: str, dirfd: int, path_arg: int, argv_arg: int,
            flags: int, judged: Judged):
    from .runtime import SyscallEvent
    rt = session.runtime
    ranges: list = []
    argv = read_argv(req, req.args[argv_arg], ranges)
    tgid, ppid = req.process_ids()
    judged.argv = tuple(os.fsencode(a) for a in argv)
    judged.event = event = SyscallEvent(name, "process", tgid, ppid, argv=argv)
    refusal = shared_memory_refusal(req.pid, ranges)
    if refusal is not None:
        rt.record(event, "deny", refusal, errno.EPERM)
        raise Denied(errno.EPERM, refusal)
    path = req.read_path(path_arg) if req.args[path_arg] else b""
    try:
        reals = _program(req, tgid, dirfd, path, flags, judged, view(session, tgid))
    except Unresolvable as e:
        if rt.denied_paths:
            raise Denied(errno.EACCES, f"deny_path is active and {e}") from None
        reals = []  # the program is then identified only after the exec (verify)
    if reals:  # the callback decides on the program, not on what argv[0] claims
        judged.event = event = SyscallEvent(name, "process", tgid, ppid, argv=argv,
                                            path=reals[0])
    refusal = next((r for r in map(rt.path_refusal, reals) if r is not None), None)
    if refusal is not None:
        rt.record(event, "deny", refusal, errno.EACCES)
        raise Denied(errno.EACCES, refusal)
    if not req.still_valid():
        raise Denied(errno.ESRCH, "the calling task is gone")
    if "exec" in rt.events:
        verdict = rt.decide(event)
        if not verdict.allow:
            raise Denied(verdict.errno, verdict.reason)
    return CONTINUE


def _ran(tgid: int, judged: Judged) -> str | None:
    """Why what the kernel ran differs from what was judged, or None. Read from the new
    program's own memory and /proc entries: after an exec nothing else shares them, and
    the program is stopped before its first instruction."""
    try:
        with open(f"/proc/{tgid}/cmdline", "rb") as f:
            raw = f.read()
        exe = _identity(os.stat(f"/proc/{tgid}/exe"))
    except OSError as e:
        return f"the new program could not be checked ({e.strerror})"
    ran = tuple(raw[:-1].split(b"\0")) if raw.endswith(b"\0") else tuple(raw.split(b"\0"))
    want = judged.argv or (b"",)  # an empty argv gets "" from the kernel
    if exe == judged.program:
        if ran != want:
            return "the argv the kernel ran is not the one judged"
        return None
    if exe in judged.interpreters:
        # A #! script: the kernel runs [interpreter, (its argument), filename, argv[1:]...].
        rest = len(want) - 1
        head, tail = ran[:len(ran) - rest], ran[len(ran) - rest:]
        if tail != want[1:] or len(head) < 2 or head[-1] != judged.filename:
            return "the argv the kernel ran is not the one judged"
        return None
    return "the program the kernel ran is not the one judged"


def _verify(session, req, judged: Judged, outcome: str) -> str | None:
    """After the released exec: refuse (the caller is killed) a program or argv other than
    the ones judged, and a program deny_path covers. Recorded with the reason."""
    if outcome != "exec" or judged.event is None:
        return None
    rt = session.runtime
    tgid = judged.event.pid
    refusal = _ran(tgid, judged)
    if refusal is None:
        try:
            refusal = rt.path_refusal(os.readlink(f"/proc/{tgid}/exe"))
        except OSError as e:
            refusal = f"the new program could not be checked ({e.strerror})"
    if refusal is not None:
        refusal += "; the process was killed before its first instruction"
        rt.record(judged.event, "deny", refusal, errno.EPERM)
        session.record_denial(req, judged.event.syscall, errno.EPERM, refusal)
    return refusal


def _frozen(req: Request, session, name: str, dirfd: int, path_arg: int, argv_arg: int,
            flags: int) -> Frozen:
    judged = Judged()
    return Frozen(lambda: _decide(req, session, name, dirfd, path_arg, argv_arg, flags, judged),
                  lambda outcome: _verify(session, req, judged, outcome))


def execve(req: Request, session):
    from .._kernel.fileops import AT_FDCWD
    return _frozen(req, session, "execve", AT_FDCWD, 0, 1, 0)


def execveat(req: Request, session):
    return _frozen(req, session, "execveat", req.arg_int(0), 1, 2, req.arg_int(4))


HANDLERS = {"execve": execve, "execveat": execveat}
