"""Process creation and exit under a policy_fn: observed, never held; under max_processes,
counted (supervisor.forks).

clone/fork/vfork/exit_group carry no pointer the decision depends on (clone's flags are a
register), so they continue at once; the callback hears of them in order with the other
events, and its verdict is ignored ("audit" flags). clone's flags are checked here with
the filter's own rules (syscall_filter.clone_refusal): libseccomp drops the filter's
conditional clone rules once clone is sent to the supervisor. A process killed by a
signal makes no exit_group call and produces no exit event.
"""

from __future__ import annotations

import errno

from ..syscall_filter import clone_refusal
from .forks import is_process
from .network import CONTINUE, Defer, Guard
from .request import Denied, Request


def _observed(name: str):
    def handler(req: Request, session):
        from .runtime import SyscallEvent
        if name == "clone":
            refusal = clone_refusal(req.args[0], session.runtime is not None)
            if refusal is not None:
                raise Denied(errno.EPERM, refusal)
        def observe():
            rt = session.runtime
            if rt is not None and "process" in rt.events:
                try:
                    tgid, ppid = req.process_ids()
                except Denied:
                    return
                rt.observe(SyscallEvent(name, "process", tgid, ppid))
        budget = session.forks
        if budget is not None and is_process(name, req.args[0] if name == "clone" else 0) \
                and not budget.try_admit(req.pid):
            # The tree must be counted: on a worker, as walking a large tree must not
            # stall other sandboxes.
            def admit():
                budget.admit(session, req.pid)
                observe()
                return CONTINUE
            return Defer(admit, Guard(-1))
        observe()
        return CONTINUE
    return handler


HANDLERS = {name: _observed(name) for name in ("clone", "fork", "vfork", "exit_group")}
