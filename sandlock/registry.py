"""Running sandboxes by name: the per-user registry behind `sandlock ps`, `inspect` and
`kill`.

Each running sandbox has one file, `<root pid>.json`, in a directory only its user can
reach: `$XDG_RUNTIME_DIR/sandlock/running` (a tmpfs that ends with the session), else
`~/.local/state/sandlock/running`. The directory must be ours and 0700; anything else is
refused, not used (another user could otherwise plant entries). A sandbox of the same
user may still be able to write there: so an entry is believed only if its root is a
live sandlock trampoline, child of the recorded supervisor, both with their recorded
start times (`genuine`); `kill` checks again on a pidfd. Entries hold the policy's
fields but no environment values (names only).

An entry names the sandbox's root process (sandlock-init, which ends the whole tree when
it is signalled) by pid *and* start time, so a pid reused by an unrelated process never
matches: `entries()` lists only sandboxes whose root still runs with that start time and
removes every other file it finds. `kill` signals the root through a pidfd opened after
that check, so the process signalled is the one checked.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import time

from .errors import SandlockError


def directory(create: bool = True) -> str | None:
    base = os.environ.get("XDG_RUNTIME_DIR")
    uid = os.geteuid()
    if base and os.path.isabs(base) and _ours(base, uid, strict=False):
        root = os.path.join(base, "sandlock")
    else:  # not /tmp, which sandboxes are often given to write
        state = os.environ.get("XDG_STATE_HOME") or os.path.join(
            os.environ.get("HOME") or f"/tmp/sandlock-{uid}", ".local", "state")
        os.makedirs(state, mode=0o700, exist_ok=True)
        root = os.path.join(state, "sandlock")
    path = os.path.join(root, "running")
    for d in (root, path):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
        except OSError:
            if not create:
                return None
            raise
        if not _ours(d, uid, strict=True):
            raise SandlockError(f"{d}: not a directory of uid {uid} with mode 0700; the "
                                f"registry of running sandboxes will not use it")
    return path


def _ours(path: str, uid: int, strict: bool) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (stat.S_ISDIR(st.st_mode) and st.st_uid == uid
            and (not strict or stat.S_IMODE(st.st_mode) & 0o077 == 0))


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (stat field 22), or None."""
    from ._kernel import procstat
    try:
        return int(procstat.fields(procstat.read(f"/proc/{pid}/stat"))[19])
    except (OSError, ValueError, IndexError):
        return None


def _cwd() -> str:
    try:
        return os.getcwd()
    except FileNotFoundError:
        return "(a removed directory)"


def register(root: int, pid: int, name: str | None, argv, cwd: str | None,
             fields: dict) -> str | None:
    """Record a started sandbox; returns the entry's path (None if no registry could
    be made: a sandbox still runs without one)."""
    began = start_time(root)
    if began is None:
        return None
    try:
        d = directory()
    except (OSError, SandlockError):
        return None
    entry = {"name": name or f"sandbox-{pid}", "root": root, "pid": pid,
             "start_time": began, "pid_start_time": start_time(pid),
             "supervisor": os.getpid(), "supervisor_start_time": start_time(os.getpid()),
             "started": time.time(),
             "argv": list(argv), "cwd": cwd or _cwd(), "policy": fields}
    path = os.path.join(d, f"{root}.json")
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(entry, f, default=str)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return None
    return path


def unregister(path: str | None) -> None:
    if path:
        try:
            os.unlink(path)
        except OSError:
            pass


_TYPES = {"name": str, "root": int, "pid": int, "start_time": int, "supervisor": int,
          "supervisor_start_time": int, "started": (int, float), "argv": list, "cwd": str,
          "policy": dict}


def _valid(entry) -> bool:
    return isinstance(entry, dict) and all(
        isinstance(entry.get(k), t) and not isinstance(entry.get(k), bool)
        for k, t in _TYPES.items()) and entry["name"].isprintable()


def genuine(entry: dict) -> bool:
    """The entry names a live sandbox root: the process at `root` (with its recorded start
    time) runs sandlock's trampoline and is the child of the recorded supervisor (with its
    start time). A sandbox able to write the registry cannot point it elsewhere: any other
    process fails this."""
    from .launch import HELPER
    root, supervisor = entry["root"], entry["supervisor"]
    if start_time(root) != entry["start_time"] or \
            start_time(supervisor) != entry["supervisor_start_time"]:
        return False
    try:
        from ._kernel import procstat
        ppid = int(procstat.fields(procstat.read(f"/proc/{root}/stat"))[procstat.PPID])
        exe, helper = os.stat(f"/proc/{root}/exe"), os.stat(HELPER)
    except (OSError, ValueError, IndexError):
        return False
    return ppid == supervisor and (exe.st_dev, exe.st_ino) == (helper.st_dev, helper.st_ino)


def entries() -> list[dict]:
    """The live sandboxes of this user, oldest first. Files of ended ones, and files that
    do not describe a live sandbox root (genuine), are removed."""
    d = directory(create=False)
    if d is None or not os.path.isdir(d):
        return []
    out = []
    for name in os.listdir(d):
        if not name.endswith(".json"):
            continue
        path = os.path.join(d, name)
        try:
            with open(path) as f:
                entry = json.load(f)
        except (OSError, ValueError):
            entry = None
        if not _valid(entry) or not genuine(entry):
            unregister(path)
            continue
        entry["path"] = path
        out.append(entry)
    return sorted(out, key=lambda e: e["started"])


def find(name: str) -> list[dict]:
    """Live sandboxes called `name`, or whose main or root pid is `name`."""
    return [e for e in entries()
            if e["name"] == name or name in (str(e["pid"]), str(e["root"]))]


def kill(entry: dict, sig: int = signal.SIGTERM) -> None:
    """End the sandbox. SIGTERM asks its root to end the whole tree (it stops every
    member, then kills them); SIGKILL kills the main process at once, and the root, seeing
    it gone, ends the rest. The pidfd is opened before the start time is checked again:
    the signal goes to the process that passed the check."""
    pid, began = ((entry["root"], entry["start_time"]) if sig != signal.SIGKILL
                  else (entry["pid"], entry.get("pid_start_time")))
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        if not genuine(entry):
            return  # not (or no longer) a sandbox root
        if sig == signal.SIGKILL:  # the main process: a child of that root
            from ._kernel import procstat
            ppid = int(procstat.fields(procstat.read(f"/proc/{pid}/stat"))[procstat.PPID])
            if ppid != entry["root"]:
                return
        if began is None or start_time(pid) != began:
            return  # gone, and the pid is another process's now
        signal.pidfd_send_signal(pidfd, sig)
    except ProcessLookupError:
        pass
    finally:
        os.close(pidfd)
