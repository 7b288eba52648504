"""explain=True (--explain): the file accesses the filesystem policy refuses, recorded with
the path, the access asked for and the grant that would allow it, where the kernel cannot
report Landlock's denials itself (its audit records need the audit subsystem on and
CAP_AUDIT_READ).

The sandbox's path calls come to the supervisor (as a custom handler's would:
supervisor.user_handlers) and continue in the kernel unchanged: Landlock still decides,
and the program sees its own error. Here the call is judged against the policy's grants
(the same lists Landlock was given) on the path resolved as the caller would resolve it;
one that no grant allows is recorded once per (path, access). An explanation, not an
enforcement: it never refuses anything, and an error here only loses a record.
"""

from __future__ import annotations

import os
import time

from .._kernel.fileops import AT_FDCWD
from .paths import directory_of, resolve, view

O_ACCMODE = 0o3
# syscall -> (dirfd argument or None, path argument, what it asks: "open" reads the flags
# argument that follows the path)
CALLS = {
    "open": (None, 0, "open"), "openat": (0, 1, "open"), "creat": (None, 0, "create"),
    "execve": (None, 0, "execute"), "execveat": (0, 1, "execute"),
    "mkdir": (None, 0, "create"), "mkdirat": (0, 1, "create"),
    "unlink": (None, 0, "remove"), "unlinkat": (0, 1, "remove"), "rmdir": (None, 0, "remove"),
    "truncate": (None, 0, "write"),
}
MAX_RECORDS = 256
MAX_OBSERVED = 20000  # sandlock learn: distinct accesses kept
MAX_COMPONENTS = 64   # paths longer than this are not explained


def _exe(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return "?"


def _needs(flags: int) -> str:
    if flags & os.O_CREAT:
        return "create"
    if flags & os.O_TRUNC or flags & O_ACCMODE in (os.O_WRONLY, os.O_RDWR):
        return "write"
    return "read"


def _beneath(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def judge(policy, path: str, access: str) -> tuple[str, str] | None:
    """(rule, reason) when the policy's grants refuse `access` to `path`, else None."""
    for d in policy.fs_denied:
        if _beneath(path, d):
            return f"fs_denied:{d}", f"{path} lies beneath the denied {d}"
    writable = list(policy.fs_writable)
    ws = policy.workspace
    if ws is not None:
        writable.append(ws.workdir)
    if access in ("write", "create", "remove"):
        target = os.path.dirname(path) if access in ("create", "remove") else path
        if any(_beneath(target, w) for w in writable):
            return None
        return "default:fs", f"{access} {path}: no writable grant covers it"
    if any(_beneath(path, g) for g in [*policy.fs_readable, *writable]):
        return None
    return "default:fs", f"{access} {path}: no grant covers it"


def suggestion(path: str, access: str, in_directory: bool = False) -> dict:
    """The smallest grant that would allow it, as a flag and as YAML. `in_directory`: the
    path is already the directory a create/remove happens in (Landlock names that)."""
    from ..home_policy import persistence_paths, secret_paths
    target = os.path.dirname(path) if access in ("create", "remove") and not in_directory \
        else path
    flag, key = ("-w", "write") if access in ("write", "create", "remove") else ("-r", "read")
    out = {"flag": f"{flag} {target}", "yaml": f"filesystem: {{{key}: [{target}]}}"}
    home = os.path.expanduser("~")
    exposed = [p for p in (*secret_paths(home), *persistence_paths(home))
               if _beneath(p, target) or _beneath(target, p)]
    if exposed:
        out["warning"] = (f"this grant would expose {exposed[0]} (a secret or a "
                          f"persistence vector of the user's)")
    return out


class Explainer:
    """One run's file denials (Result.denials, and the audit log when there is one)."""

    def __init__(self, session, audit=None, sink: list | None = None):
        self.session, self.audit = session, audit
        self.seen: set = set()
        self.sink = sink  # sandlock learn: every (path, access, program) observed
        self.observed: set = set()

    def observe(self, req, name: str) -> None:
        dirfd_arg, path_arg, what = CALLS[name]
        raw = req.read_path(path_arg)
        text = os.fsdecode(raw)
        if text.count("/") > MAX_COMPONENTS:
            return  # an explanation is not worth a long walk on the loop thread
        dirfd = req.arg_int(dirfd_arg) if dirfd_arg is not None else AT_FDCWD
        tgid, _ = req.process_ids()
        base = "/" if text.startswith("/") else directory_of(req.pid, dirfd, AT_FDCWD)
        access = _needs(req.arg_int(path_arg + 1)) if what == "open" else what
        root = view(self.session, tgid)
        path = resolve(tgid, req.pid, base, text, follow_last=access != "create",
                       root=root) if text else None
        if path is not None and access == "create" and os.path.lexists(root + path):
            access = "write"  # O_CREAT on what exists creates nothing
        elif path is not None and access != "create" and not os.path.lexists(root + path):
            return  # ENOENT, not a refusal (a probe of what is not there)
        if path is not None and self.sink is not None and (path, access) not in self.observed \
                and len(self.observed) < MAX_OBSERVED:
            self.observed.add((path, access))
            self.sink.append((path, access, os.path.basename(_exe(req.pid))))
        if path is None or (path, access) in self.seen or len(self.seen) >= MAX_RECORDS:
            return
        verdict = judge(self.session.policy, path, access)
        if verdict is None:
            return
        self.seen.add((path, access))
        rule, reason = verdict
        self._record(req.pid, name, path, access, rule, reason)

    def kernel_denial(self, path: str, access: str, blockers: str, pid: int | None) -> None:
        """A refusal Landlock reported itself (supervisor.landlock_audit)."""
        if (path, access) in self.seen or len(self.seen) >= MAX_RECORDS:
            return
        self.seen.add((path, access))
        where = "in " if access in ("create", "remove") else ""
        self._record(pid, None, path, access, "landlock",
                     f"{access} {where}{path}: Landlock refused {blockers} (no grant covers "
                     f"it)", in_directory=True)

    def _record(self, pid, name, path, access, rule, reason, in_directory=False) -> None:
        from .network import argv_of
        rec = {"time": round(time.time(), 6), "decision": "deny", "sandbox": self.session.name,
               "pid": pid, "argv": argv_of(pid) if pid else [], "syscall": name,
               "protocol": "file", "path": path, "access": access, "errno": "EACCES",
               "rule": rule, "reason": reason,
               "suggest": suggestion(path, access, in_directory)}
        if len(self.session.denials) < self.session.MAX_RECORDS:
            self.session.denials.append(rec)
        if self.audit is not None:
            self.audit.record(**{k: v for k, v in rec.items() if k != "time"})


def handler_for(explainer: Explainer, name: str):
    """The Handler (sandlock.handler) that records and continues."""
    from ..handler import ExceptionPolicy, Handler, NotifAction

    class Explain(Handler):
        on_exception = ExceptionPolicy.CONTINUE  # an explanation never blocks a call
        inline = True  # reads /proc and the caller's memory only: on the loop's thread

        def handle(self, ctx):
            explainer.observe(ctx._request, name)
            return NotifAction.continue_()
    return Explain()
