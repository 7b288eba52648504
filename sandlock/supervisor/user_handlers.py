"""Custom syscall handlers (sandlock.handler) in the supervisor.

A call reaches here when its syscall has handlers in this run (the filter routes it:
sandlock.bpf_program.route_to_supervisor, which leaves the policy's own refusals first).
On a worker thread (never the notification loop: a slow handler delays its caller only):

1. Each handler registered for the syscall, in order, gets a HandlerCtx whose memory
   accessors work only during its call. The first decision other than continue_() is the
   outcome; a handler that raises or returns a non-NotifAction gets its on_exception
   policy (KILL: the sandbox is killed; DENY_EPERM / DENY_EIO; CONTINUE).
2. continue_() from all: if the policy's own program sends this very call to the
   supervisor (replayed on its seccomp_data: bpf_program.evaluate), the built-in handler
   runs, as it would have without handlers; otherwise the kernel performs the call.

Invariant: nothing here lets through a call the policy refuses; an error in this module
refuses the call (fail closed).
"""

from __future__ import annotations

import errno
import os
import signal

from .network import CONTINUE, Inject
from .request import Denied

HOLD = object()  # the call stays unanswered: its caller waits until the sandbox ends
MAX_WORKERS = 256  # threads running custom handlers at once, across all sandboxes


class UserHandlers:
    """One run's handlers: {syscall number: [Handler, ...]}, the policy's own program."""

    def __init__(self, handlers: dict, base_bpf: bytes):
        from ..bpf_program import decode
        self.handlers = handlers
        self.base_bpf = decode(base_bpf)  # replayed per call: decoded once

    def __contains__(self, nr: int) -> bool:
        return nr in self.handlers

    def inline(self, nr: int) -> bool:
        """Only sandlock's own quick recorders here (they may run on the loop)."""
        return all(getattr(h, "inline", False) for h in self.handlers[nr])


def decide(session, req, notif_fields: tuple):
    """The outcome of the user's handlers for this call: a NotifAction (kind other than
    CONTINUE), or CONTINUE."""
    from ..handler import ExceptionPolicy, HandlerCtx, NotifAction, _ActionKind, _MemHandle
    flags, arch, ip = notif_fields
    for handler in session.user_handlers.handlers[req.nr]:
        cell = _MemHandle(req.pid)
        ctx = HandlerCtx(req.id, req.pid, flags, req.nr, arch, ip, tuple(req.args), cell,
                         req)
        try:
            action = handler.handle(ctx)
            if hasattr(action, "__await__"):  # async def handle: run to completion here
                import asyncio
                action = asyncio.run(_awaited(action))
            if not isinstance(action, NotifAction) or action.kind not in {
                    int(k) for k in _ActionKind} - {int(_ActionKind.UNSET),
                                                    int(_ActionKind.INJECT_FD_SEND_TRACKED)}:
                raise TypeError(f"handle() returned {action!r}, not a NotifAction")
            if action.kind == _ActionKind.KILL and action.pgid not in (0, None):
                raise ValueError("kill(pgid=...) names no group of this sandbox")
        except Exception as e:
            policy = getattr(handler, "on_exception", ExceptionPolicy.KILL)
            session.record_denial(req, f"handler:{req.nr}", errno.EPERM,
                                  f"{type(handler).__name__}.handle raised {e!r} "
                                  f"(on_exception={ExceptionPolicy(policy).name})")
            action = {ExceptionPolicy.CONTINUE: NotifAction.continue_(),
                      ExceptionPolicy.DENY_EPERM: NotifAction.errno(errno.EPERM),
                      ExceptionPolicy.DENY_EIO: NotifAction.errno(errno.EIO)}.get(
                ExceptionPolicy(policy), NotifAction.kill(signal.SIGKILL))
        finally:
            cell.invalidate()
        if action.kind != _ActionKind.CONTINUE:
            return action
    return CONTINUE


async def _awaited(coro):
    return await coro


def outcome(session, req, action):
    """A decided NotifAction -> what the supervisor answers (loop._send), or HOLD."""
    from ..handler import _ActionKind
    kind = _ActionKind(action.kind)
    if kind == _ActionKind.ERRNO:
        err = action.errno_value
        if not isinstance(err, int) or not 0 < err < 4096:
            raise Denied(errno.EPERM, f"a handler answered errno {err!r}")
        return ("error", err)
    if kind == _ActionKind.RETURN_VALUE:
        value = int(action.return_value)
        if not -(1 << 63) <= value < (1 << 63) or -4096 < value < 0:
            raise Denied(errno.EPERM, f"a handler answered {value} (a return value is an "
                                      f"int64, not -1..-4095: use errno())")
        return value
    if kind == _ActionKind.INJECT_FD_SEND:
        # A duplicate is sent and closed: the handler's own fd stays the handler's (were it
        # closed here, a later answer with the same number could send whatever the host
        # process opened since). inject_bytes' memfd is ours, and handed over whole.
        cloexec = bool(action.newfd_flags & os.O_CLOEXEC)
        if action._owned:
            return Inject(action.srcfd, cloexec)
        return Inject(os.dup(action.srcfd), cloexec)
    if kind == _ActionKind.HOLD:
        return HOLD
    if kind == _ActionKind.KILL:
        from .._kernel import seccomp
        from ..process_tree import signal_members
        if session.root:
            signal_members(session.root, action.sig)
        if seccomp.notif_id_valid(req.listener, req.id):  # still that caller (no pid reuse)
            try:
                os.kill(req.pid, action.sig)  # the caller, whatever the tree walk saw
            except OSError:
                pass
        return ("error", errno.EPERM)
    raise Denied(errno.EPERM, f"unexpected handler action {kind!r}")


def policy_sends(session, req, notif_fields: tuple) -> bool:
    """Would the policy's own program have sent this call to the supervisor?"""
    from ..bpf_program import RET_ACTION_FULL, RET_USER_NOTIF, evaluate, seccomp_data
    flags, arch, ip = notif_fields
    action = evaluate(session.user_handlers.base_bpf,
                      seccomp_data(req.nr, arch, ip, req.args))
    return action & RET_ACTION_FULL == RET_USER_NOTIF
