"""Which handler serves which trapped syscall (Supervisor._dispatch, built once per
process): each module's own handlers, wrapped where two concerns share a call — the
protection of the user's files (supervisor.guard) and a copy-on-write workdir
(supervisor.cow_calls; supervisor.overlay_calls for the overlay backend) in front of the
handlers a policy_fn needs (opens, exec). A wrapper decides which one acts, in a fixed
order: a policy_fn's file event first, then the layer, then the guard for what the layer
left to the kernel.
"""

from __future__ import annotations

import errno

from . import connect, execve, lifecycle, metadata, names, opens, overlay_calls, send
from .network import CONTINUE
from .request import Denied


def table() -> dict[int, tuple[str, object]]:
    """Syscall number -> (name, handler)."""
    from ..syscall_filter import syscall_number  # names -> numbers for this architecture
    table = {}
    for handlers in (metadata.HANDLERS, connect.HANDLERS, send.HANDLERS, execve.HANDLERS,
                     lifecycle.HANDLERS, opens.HANDLERS, names.HANDLERS):
        for name, handler in handlers.items():
            table[syscall_number(name)] = (name, handler)
    from . import guard
    for name in guard.HANDLERS:
        nr = syscall_number(name)
        table[nr] = (name, _with_guard(name, table.get(nr, (name, None))[1]))
    from ..syscall_filter import COW_SYSCALLS
    for name in COW_SYSCALLS:
        if name in ("execve", "execveat"):
            continue
        nr = syscall_number(name)
        table[nr] = (name, _with_workspace(name, table.get(nr, (name, None))[1]))
    for name in ("execve", "execveat"):
        nr = syscall_number(name)
        table[nr] = (name, _exec_in_workspace(name, table[nr][1]))
    return table


def _with_guard(name, other):
    """A call the guard serves (supervisor.guard: it creates a name, or may write where no
    mount namespace keeps the user's files) in a sandbox with a protection plan; otherwise
    the handler it has without one (a policy_fn's), if any. A policy_fn's file event is
    decided before the guard acts."""
    from . import guard
    from ..syscall_filter import guard_wants
    act = guard.HANDLERS[name]

    def handler(req, session):
        prot = session.protection
        if prot is not None and guard_wants(name, req.args, prot.mode):
            if session.runtime is not None and name in opens.HANDLERS:
                opens.decide_event(req, session, name)
            return act(req, session)
        if other is None:
            raise Denied(errno.ENOSYS, "no handler for this syscall")
        return other(req, session)
    return handler


def _guard_outside(name, req, session, result):
    """A workspace left the call to the kernel (spelled outside the workdir): the guard's,
    if it wants it (inside, a commit never applies protected paths: _Workspace)."""
    prot = session.protection
    if result is CONTINUE and prot is not None:
        from . import guard
        from ..syscall_filter import guard_wants
        if name in guard.HANDLERS and guard_wants(name, req.args, prot.mode):
            return guard.HANDLERS[name](req, session)
    return result


def _with_workspace(name, other):
    """A call the copy-on-write layer serves in a sandbox with a workdir; otherwise the
    handler it has without one (the guard's, a policy_fn's opens), if any. A policy_fn's
    file event is decided before the layer acts. The workspace's modules load with the
    first such call."""
    def handler(req, session):
        if session.cow is None:
            if session.overlay and name in overlay_calls.HANDLERS:
                return _guard_outside(name, req, session,
                                      overlay_calls.HANDLERS[name](req, session))
            if other is None:
                raise Denied(errno.ENOSYS, "no handler for this syscall")
            return other(req, session)
        from . import cow_calls
        if session.cow.pristine and session.runtime is None and \
                cow_calls.only_looks(name, req.args):
            return _guard_outside(name, req, session, CONTINUE)
        cow_handler = cow_calls.HANDLERS[name]
        if other is None or session.runtime is None:
            return _guard_outside(name, req, session, cow_handler(req, session))
        if name in opens.HANDLERS:
            opens.decide_event(req, session, name)
        result = cow_handler(req, session)  # checks the callback's denied paths itself
        if result is CONTINUE and session.protection is not None:
            return _guard_outside(name, req, session, result)
        if result is CONTINUE and session.runtime.denied_paths:
            # Spelled outside the workdir: the callback's denied paths only (no new event).
            return opens.PATH_ONLY.get(name, other)(req, session)
        return result
    return handler


def _exec_in_workspace(name, other):
    def handler(req, session):
        if session.cow is not None and not session.cow.pristine:
            from . import cow_exec
            if name == "execve":
                redo = cow_exec.execve_check(req, session, -100, 0, 1, 0)
            else:
                redo = cow_exec.execve_check(req, session, req.arg_int(0), 1, 2,
                                             req.arg_int(4))
            if redo is not None:
                return redo  # re-issued with the layer's object (supervisor.reissue)
        return other(req, session) if session.runtime is not None else CONTINUE
    return handler
