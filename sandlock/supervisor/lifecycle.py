"""Process creation and exit under a policy_fn: observed, never held.

clone/fork/vfork/exit_group carry no pointer the decision depends on (clone's flags are a
register, already checked by the BPF filter), so they continue at once; the callback
hears of them in order with the other events, and its verdict is ignored ("audit" flags).
A process killed by a signal makes no exit_group call and produces no exit event.
"""

from __future__ import annotations

from .network import CONTINUE
from .request import Denied, Request


def _observed(name: str):
    def handler(req: Request, session):
        from .runtime import SyscallEvent
        rt = session.runtime
        if rt is not None and "process" in rt.events:
            try:
                tgid, ppid = req.process_ids()
            except Denied:
                return CONTINUE
            rt.observe(SyscallEvent(name, "process", tgid, ppid))
        return CONTINUE
    return handler


HANDLERS = {name: _observed(name) for name in ("clone", "fork", "vfork", "exit_group")}
