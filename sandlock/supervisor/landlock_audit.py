"""Landlock's own denial records (ABI 7), read from the kernel's audit stream: file
refusals explained at no cost to the program (supervisor.explain is the fallback).

Available when this process may read the audit multicast (CAP_AUDIT_READ: root) and the
audit subsystem is enabled (Sandlock never turns it on: that is the system's). The
trampoline then restricts with LANDLOCK_RESTRICT_SELF_LOG_NEW_EXEC_ON, so the program's
denials are logged after its exec. A Landlock domain is allocated by the process that
restricted itself — the program, at its pid — and its AUDIT_LANDLOCK_DOMAIN record says
so; each AUDIT_LANDLOCK_ACCESS record of that domain is one refusal (blockers, path). One
reader thread serves every sandbox; a record of a domain no watched sandbox owns is
someone else's and ignored.
"""

from __future__ import annotations

import threading
import time

from .._kernel import audit

# Landlock's blocker names -> the access as explain names it
_ACCESS = {"fs.execute": "execute", "fs.write_file": "write", "fs.read_file": "read",
           "fs.read_dir": "read", "fs.remove_dir": "remove", "fs.remove_file": "remove",
           "fs.make_char": "create", "fs.make_dir": "create", "fs.make_reg": "create",
           "fs.make_sock": "create", "fs.make_fifo": "create", "fs.make_block": "create",
           "fs.make_sym": "create", "fs.refer": "create", "fs.truncate": "write",
           "fs.ioctl_dev": "write"}

_lock = threading.Lock()
_watched: dict[int, object] = {}    # program pid -> Explainer-like recorder
_domains: dict[str, object] = {}    # domain id -> recorder
_available: bool | None = None


def available() -> bool:
    """Landlock's records can be read here (the reader is started once; until then the
    audit subsystem's state is asked again, as an administrator may turn it on)."""
    global _available
    with _lock:
        if not _available:
            _available = False
            from ..features import detect
            if detect().landlock_abi >= 7 and audit.enabled():
                try:
                    sock = audit.reader()
                except OSError:
                    sock = None
                if sock is not None:
                    threading.Thread(target=_serve, args=(sock,), daemon=True,
                                     name="sandlock-landlock-audit").start()
                    _available = True
        return _available


def watch(pid: int, recorder) -> None:
    with _lock:
        _watched[pid] = recorder


def unwatch(pid: int) -> None:
    """Forget a finished program: its pid, and the domains filed under it (a later record
    of theirs, or of a process that reused the pid, is no longer this run's)."""
    with _lock:
        recorder = _watched.pop(pid, None)
        for d in [d for d, r in _domains.items() if r is recorder]:
            _domains.pop(d, None)


AUDIT_EOE = 1320  # the end of one event's records
MAX_PENDING = 256


def _serve(sock) -> None:
    # serial -> [access record, syscall record]: an event's records come in one burst
    # (access, domain, syscall, ..., end of event); it is delivered at its end.
    pending: dict[int, list] = {}
    while True:
        try:
            data = sock.recv(1 << 16)
        except OSError:
            time.sleep(0.1)
            continue
        for typ, serial, fields in audit.parse(data):
            if typ == audit.AUDIT_LANDLOCK_DOMAIN and fields.get("status") == "allocated":
                with _lock:
                    rec = _watched.get(int(fields.get("pid", "0") or 0))
                    if rec is not None:
                        _domains[fields.get("domain", "")] = rec
            elif typ == audit.AUDIT_LANDLOCK_ACCESS:
                pending.setdefault(serial, [None, {}])[0] = fields
            elif typ == audit.AUDIT_SYSCALL and serial in pending:
                pending[serial][1] = fields
            elif typ == AUDIT_EOE and serial in pending:
                access, syscall = pending.pop(serial)
                if access is not None:
                    _deliver(access, syscall)
        while len(pending) > MAX_PENDING:  # events whose end never came
            access, syscall = pending.pop(next(iter(pending)))
            if access is not None:
                _deliver(access, syscall)


def _deliver(access: dict, syscall: dict) -> None:
    with _lock:
        recorder = _domains.get(access.get("domain", ""))
    if recorder is None:
        return
    blockers = access.get("blockers", "").split(",")
    kinds = [_ACCESS.get(b) for b in blockers]
    what = next((k for k in ("create", "remove", "write", "execute", "read") if k in kinds),
                None)
    path = access.get("path")
    if what is None or not path:
        return
    pid = int(syscall.get("pid", "0") or 0) or None
    try:
        recorder.kernel_denial(path, what, ",".join(blockers), pid)
    except Exception:  # an explanation lost, never anything else
        pass


