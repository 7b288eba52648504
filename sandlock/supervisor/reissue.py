"""Making the kernel redo a call with arguments the supervisor chose: exec and chdir of what
a seccomp-backend workspace holds (a program built in the layer, a directory created
there).

exec and chdir cannot be performed on another process's behalf, and a call let through
(CONTINUE) re-reads its path from the caller's memory at the address in its register, so
the kernel would resolve the workdir's path, not the layer's object. The call is re-issued
instead:
  1. the calling thread is seized (ptrace) and interrupted;
  2. the notification is answered with -ERESTARTNOINTR: on its way back to user space
     the thread stops for the interrupt, before the kernel restarts the call;
  3. in that stop, the argument registers are pointed at copies written below the
     thread's stack pointer (past the red zone): the layer object's real path, and for a
     `#!` script the interpreter and the argv the kernel would build, as binfmt_script
     does, so that the script is opened by its own name through the layer;
  4. the thread is detached and the kernel restarts the call with those arguments; it
     reaches the supervisor again as a new notification, which now names the object
     directly and continues in the kernel.

Why this is safe: the new arguments name objects of this sandbox's own layer, which
Landlock lets it read and execute (never write: the supervisor alone changes the layer),
or objects outside the workdir that the policy lets it reach. A racing thread rewriting
the copies can only make the kernel resolve something the policy already allows, and the
restarted call is judged again as any other (a policy_fn's freeze and exec verification
included). Any failure answers the call with an error; nothing is re-issued twice.
"""

from __future__ import annotations

import errno
import os
import struct
import time

from .._kernel import ptrace
from .._kernel.memory import write_memory

ERESTARTNOINTR = 513
RED_ZONE = 128
STOP_WAIT = 1.0


class Reissue:
    """Handler result: re-issue the call with `args` (register name -> bytes for a string
    written to the caller's stack, a list of bytes for a NULL-terminated array of such
    strings, or an int)."""

    def __init__(self, args: dict, reason: str):
        self.args = args
        self.reason = reason  # what the re-issue does, for a failure's message


def _layout(sp: int, args: dict) -> tuple[bytes, int, dict]:
    """(bytes to write, their address, register values) for `args`, below `sp`."""
    blob = bytearray()
    fixups = []  # (offset of a pointer slot, offset of what it points to)
    values = {}
    order = []
    for reg, value in args.items():
        if isinstance(value, int):
            values[reg] = value
        elif isinstance(value, bytes):
            order.append((reg, len(blob)))
            blob += value + b"\0"
        else:
            strings = []
            for item in value:
                strings.append(len(blob))
                blob += item + b"\0"
            blob += b"\0" * (-len(blob) % 8)
            order.append((reg, len(blob)))
            for off in strings:
                fixups.append((len(blob), off))
                blob += b"\0" * 8
            blob += b"\0" * 8  # the NULL terminator
    base = (sp - RED_ZONE - len(blob) - 64) & ~0xF
    for slot, target in fixups:
        blob[slot:slot + 8] = struct.pack("<Q", base + target)
    for reg, off in order:
        values[reg] = base + off
    return bytes(blob), base, values


def run(req, session, reissue: Reissue) -> None:
    """Answer `req` so that its thread re-issues the call with `reissue.args`. Runs on a
    worker, which is the tracer for the duration (only it may act on the tracee)."""
    tid = req.pid
    err = ptrace.seize_errno(tid)
    if err == 0:
        err = ptrace.interrupt_errno(tid)
    if err != 0:
        session.record_denial(req, "reissue", errno.EACCES,
                              f"cannot {reissue.reason}: ptrace: {os.strerror(-err)}")
        _answer(req, session, -errno.EACCES)
        return
    _answer(req, session, -ERESTARTNOINTR)
    deadline = time.monotonic() + STOP_WAIT
    while True:
        event = ptrace.poll_tracee(tid)
        if event is not None and event[0] != "stop":
            return  # the thread is gone (killed meanwhile): nothing to re-issue
        if event is not None:
            break
        if time.monotonic() > deadline:
            os.kill(tid, 9)  # a thread that neither stops nor dies would restart as is
            return
        time.sleep(0.0002)
    try:
        regs = ptrace.getregs(tid)
        if regs.orig_rax != req.nr or regs.rax != (-ERESTARTNOINTR) & 0xFFFFFFFFFFFFFFFF:
            raise OSError(errno.EINTR, "the call is no longer being restarted")
        blob, base, values = _layout(regs.rsp, reissue.args)
        write_memory(tid, base, blob)
        for reg, value in values.items():
            setattr(regs, reg, value)
        ptrace.setregs(tid, regs)
    except OSError as e:
        session.record_denial(req, "reissue", errno.EACCES,
                              f"cannot {reissue.reason}: {e.strerror}")
        try:  # fail the call rather than let it restart with its own arguments
            regs = ptrace.getregs(tid)
            regs.rax = (-errno.EACCES) & 0xFFFFFFFFFFFFFFFF
            ptrace.setregs(tid, regs)
        except OSError:
            os.kill(tid, 9)
    finally:
        ptrace.detach_errno(tid)


def _answer(req, session, error: int) -> None:
    from .._kernel import seccomp

    def send():
        try:
            seccomp.notif_send(req.listener, req.id, 0, error)
        except OSError:
            pass
    req.close()
    session.respond(req.id, send)
