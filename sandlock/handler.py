"""Custom syscall handlers in Python (upstream's handler ABI): `Handler.handle(ctx)`
returns a `NotifAction` for each call of the syscalls it was registered for with
`Sandbox.run_with_handlers(cmd, [(syscall, handler), ...])`.

What a handler can and cannot do (sandlock/supervisor/user_handlers.py enforces it):
- The policy decides first: a call the sandbox's own filter refuses never reaches a
  handler, and a call the supervisor handles itself (a copy-on-write workdir, the guard
  of the user's files, a policy_fn) is handled that way after the handlers said
  `continue_()`. A handler can refuse (`errno`), answer (`returns`, `inject_fd_send`,
  `inject_bytes`), park (`hold`) or end the sandbox (`kill`); it cannot make a refused
  call pass.
- `continue_()` lets the kernel perform the call with the arguments as they are in the
  caller's memory *then*: what `read`/`read_path` returned may have changed since (another
  thread can rewrite it). Decide on it only to refuse; a decision to allow that rests on a
  pointer argument is unsafe unless the task cannot be raced (upstream's caveat).
- Handlers run on worker threads of their own (at most 256 at once across all sandboxes,
  32 per sandbox), possibly several at once, never on the notification loop: a slow
  handler delays its caller, and past 32 blocked calls, that sandbox's other calls that
  need a worker; never another sandbox's on-behalf calls. `async def handle` is run to
  completion there too.
- A handler that raises, or returns anything but a NotifAction, gets its `on_exception`
  policy: KILL (default: the sandbox is killed), DENY_EPERM, DENY_EIO or CONTINUE.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace


class _ActionKind(enum.IntEnum):  # upstream's SANDLOCK_ACTION_* values
    UNSET = 0
    CONTINUE = 1
    ERRNO = 2
    RETURN_VALUE = 3
    INJECT_FD_SEND = 4
    INJECT_FD_SEND_TRACKED = 5
    HOLD = 6
    KILL = 7


@dataclass(frozen=True)
class NotifAction:
    """A handler's decision; build it with the class methods."""
    kind: int
    errno_value: int = 0
    return_value: int = 0
    srcfd: int = -1
    newfd_flags: int = 0
    sig: int = 0
    pgid: int = 0
    _owned: bool = field(default=False, repr=False, compare=False)  # our memfd (inject_bytes)

    @classmethod
    def continue_(cls) -> "NotifAction":
        return cls(kind=int(_ActionKind.CONTINUE))

    @classmethod
    def errno(cls, value: int) -> "NotifAction":
        return cls(kind=int(_ActionKind.ERRNO), errno_value=value)

    @classmethod
    def returns(cls, value: int) -> "NotifAction":
        return cls(kind=int(_ActionKind.RETURN_VALUE), return_value=value)

    @classmethod
    def hold(cls) -> "NotifAction":
        """Leave the call unanswered: the caller waits until the sandbox ends."""
        return cls(kind=int(_ActionKind.HOLD))

    @classmethod
    def kill(cls, sig: int, pgid: int = 0) -> "NotifAction":
        """Send `sig` to every process of the sandbox (pgid 0; another pgid is refused)."""
        return cls(kind=int(_ActionKind.KILL), sig=sig, pgid=pgid)

    @classmethod
    def inject_fd_send(cls, srcfd: int, newfd_flags: int = 0) -> "NotifAction":
        """The call returns a new fd in the caller, a copy of `srcfd`. Unlike upstream,
        `srcfd` stays the handler's: a duplicate is sent, and the handler closes its own
        when it no longer needs it (one fd may answer many calls)."""
        if not isinstance(srcfd, int) or isinstance(srcfd, bool) or srcfd < 0:
            raise ValueError(f"inject_fd_send: srcfd must be a non-negative int, got "
                             f"{srcfd!r}")
        return cls(kind=int(_ActionKind.INJECT_FD_SEND), srcfd=srcfd, newfd_flags=newfd_flags)

    @classmethod
    def inject_bytes(cls, data: bytes, *, seal: bool = True,
                     cloexec: bool = True) -> "NotifAction":
        """The call returns an fd of a memfd holding `data` (sealed read-only unless
        `seal=False`), at offset 0."""
        import fcntl
        import os
        fd = os.memfd_create("sandlock-content",
                             os.MFD_CLOEXEC | (os.MFD_ALLOW_SEALING if seal else 0))
        try:
            os.write(fd, data)
            os.lseek(fd, 0, os.SEEK_SET)
            if seal:
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SEAL | fcntl.F_SEAL_WRITE
                            | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK)
        except OSError:
            os.close(fd)
            raise
        return replace(cls.inject_fd_send(fd, os.O_CLOEXEC if cloexec else 0), _owned=True)


class ExceptionPolicy(enum.IntEnum):
    KILL = 0
    DENY_EPERM = 1
    CONTINUE = 2
    DENY_EIO = 3


class Handler:
    """Subclass and override `handle(ctx)`; set `on_exception` to choose what a failure
    of the handler does (default: kill the sandbox, fail closed). `handle` may be called
    concurrently from several threads."""

    on_exception: ExceptionPolicy = ExceptionPolicy.KILL

    def handle(self, ctx: "HandlerCtx") -> NotifAction:
        raise NotImplementedError("Handler subclasses must override handle(ctx) -> NotifAction")


# Single-path syscalls: name -> index of the path argument. Multi-path ones need arg=.
_PATH_ARG: dict[str, int] = {
    "openat": 1, "open": 0, "unlinkat": 1, "unlink": 0, "mkdirat": 1, "mkdir": 0,
    "rmdir": 0, "newfstatat": 1, "statx": 1, "stat": 0, "lstat": 0, "faccessat": 1,
    "access": 0, "readlinkat": 1, "readlink": 0, "execve": 0, "execveat": 1,
}
_MULTI_PATH: set[str] = {"renameat2", "rename", "linkat", "link", "symlinkat", "symlink"}
assert not set(_PATH_ARG) & _MULTI_PATH
_REVERSE_PATH_TABLE: dict[int, str] | None = None


def _reverse_path_table() -> dict[int, str]:
    global _REVERSE_PATH_TABLE
    if _REVERSE_PATH_TABLE is None:
        from ._sdk import _lib
        rev = {}
        for name in [*_PATH_ARG, *_MULTI_PATH]:
            nr = _lib.sandlock_syscall_nr(name.encode())
            if nr >= 0:
                rev[nr] = name
        _REVERSE_PATH_TABLE = rev
    return _REVERSE_PATH_TABLE


class _MemHandle:
    """The caller's memory, usable only while its handle() call runs: the dispatcher
    invalidates it when the call returns, so a ctx kept afterwards reads nothing."""

    __slots__ = ("_ptr", "_live")

    def __init__(self, ptr: object) -> None:
        self._ptr, self._live = ptr, True

    def invalidate(self) -> None:
        self._live, self._ptr = False, None

    @property
    def live(self) -> bool:
        return self._live

    @property
    def ptr(self) -> object:
        return self._ptr


@dataclass(frozen=True)
class HandlerCtx:
    """The notification (upstream's sandlock_notif_data_t fields) and copy-once reads of
    the caller's memory."""
    id: int
    pid: int
    flags: int
    syscall_nr: int
    arch: int
    instruction_pointer: int
    args: tuple
    _mem_handle: object = None
    _request: object = None  # the supervisor's Request (sandlock's own handlers use it)

    def _pid(self) -> int | None:
        cell = self._mem_handle
        return cell.ptr if cell is not None and cell.live else None

    def _still_caller(self) -> bool:
        """The notification is still pending: `pid` is still the caller, not a reused
        pid (checked after a read, before a write)."""
        req = self._request
        if req is None:
            return True
        from ._kernel import seccomp
        return seccomp.notif_id_valid(req.listener, req.id)

    def read(self, addr: int, length: int) -> bytes | None:
        pid = self._pid()
        if pid is None or addr == 0 or length < 0:
            return None
        from ._kernel import memory
        try:
            data = memory.read_memory(pid, addr, length)
        except OSError:
            return None
        return data if len(data) == length and self._still_caller() else None

    def read_cstr(self, addr: int, max_len: int) -> str | None:
        """The NUL-terminated string at `addr` (at most max_len bytes with its NUL), or
        None (bad address, longer, caller gone)."""
        pid = self._pid()
        if pid is None or addr == 0 or max_len < 1:
            return None
        from ._kernel import memory
        try:
            raw = memory.read_cstring(pid, addr, max_len)
        except OSError:
            return None
        return raw.decode("utf-8", "surrogateescape") if self._still_caller() else None

    def write(self, addr: int, data: bytes) -> bool:
        """Write into the caller's memory (what it reads after the call returns)."""
        pid = self._pid()
        if pid is None or addr == 0:
            return False
        from ._kernel import memory
        if not self._still_caller():
            return False
        try:
            memory.write_memory(pid, addr, data)
            return True
        except OSError:
            return False

    def read_path(self, arg: int | None = None, max_len: int = 4096) -> str | None:
        """A path argument: by the syscall's known path argument, or `arg` (0..5)."""
        if arg is None:
            name = _reverse_path_table().get(self.syscall_nr)
            if name is None:
                raise ValueError(f"read_path: syscall_nr {self.syscall_nr} is not a known "
                                 f"path syscall; pass arg= explicitly")
            if name in _MULTI_PATH:
                raise ValueError(f"read_path: {name} has more than one path argument; pass "
                                 f"arg= explicitly")
            arg = _PATH_ARG[name]
        if not 0 <= arg < 6:
            raise ValueError(f"read_path: arg must be in 0..5, got {arg}")
        return self.read_cstr(self.args[arg], max_len)
