"""What a sandboxed program is started with, and what follows its start: its environment,
its executable found on PATH, its standard streams; the policy_fn limits lowered before
its Process exists; Landlock's audit records mapped to it (supervisor.landlock_audit)."""

from __future__ import annotations

import os
import threading

from .errors import SandlockError
from .modes import StdioMode
from .policy import Policy

_CLEAN_ENV_KEEP = (b"PATH", b"HOME", b"TERM", b"LANG", b"LC_ALL", b"TZ", b"USER", b"LOGNAME",
                   b"SHELL")
_DEFAULT_PATH = b"/usr/local/bin:/usr/bin:/bin"


def _environment(policy: Policy, extra: dict[bytes, bytes]):
    """The program's environment. Unchanged, it is os.environ itself (posix_spawn converts
    it in C; copying it in Python costs more than the rest of a run's set-up)."""
    if not (policy.clean_env or policy.env or extra):
        return os.environ
    environ = os.environb
    if policy.clean_env:
        env = {k: environ[k] for k in _CLEAN_ENV_KEEP if k in environ}
        env.setdefault(b"PATH", _DEFAULT_PATH)
    else:
        env = dict(environ)
    for k, v in policy.env:
        env[os.fsencode(k)] = os.fsencode(v)
    for k, v in extra.items():  # None: removed
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def _find_executable(name: str, path: str, cwd: str | None) -> str | None:
    if "/" in name:
        return name if os.path.isabs(name) or cwd is None else os.path.join(cwd, name)
    for directory in path.split(os.pathsep):
        candidate = os.path.join(directory or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _stdio(stdin, stdout, stderr):
    """(parent ends [in, out, err], child fds [0, 1, 2], fds to close after spawn)."""
    parent = [-1, -1, -1]
    child = [-1, -1, -1]
    to_close: list[int] = []
    devnull = -1
    for i, mode in enumerate((stdin, stdout, stderr)):
        if isinstance(mode, int) and not isinstance(mode, bool):
            child[i] = mode  # a caller's fd
        elif mode == StdioMode.PIPED:
            r, w = os.pipe2(os.O_CLOEXEC)
            parent[i], child[i] = (w, r) if i == 0 else (r, w)
            to_close.append(child[i])
        elif mode == StdioMode.NULL:
            if devnull < 0:
                devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
                to_close.append(devnull)
            child[i] = devnull
        elif mode != StdioMode.INHERIT:
            raise TypeError(f"stdio mode must be a StdioMode or an fd, got {mode!r}")
    return parent, tuple(child), to_close


def _watch(recorder, pid: int) -> None:
    from .supervisor import landlock_audit
    landlock_audit.watch(pid, recorder)


def _unwatch_later(pid: int, delay: float = 0.5) -> None:
    """The kernel's audit thread delivers records shortly after the fact: wait a little for
    the last ones before the Result is made, and stop mapping the program's Landlock
    domain later still."""
    import time
    from .supervisor import landlock_audit
    time.sleep(FLUSH_AUDIT)
    t = threading.Timer(delay, landlock_audit.unwatch, (pid,))
    t.daemon = True
    t.start()


FLUSH_AUDIT = 0.03  # seconds


def _settled(pid: int, limit: float = 0.5) -> None:
    """Until the held program waits for its start (asleep), at most `limit` seconds: what
    create() hands back is a parked process, as upstream's."""
    import time
    from ._kernel import procstat
    end = time.monotonic() + limit
    while time.monotonic() < end:
        try:
            if procstat.fields(procstat.read(f"/proc/{pid}/stat"))[procstat.STATE] != b"R":
                return
        except (OSError, ValueError):
            return
        time.sleep(0.001)


def _early_limits(session, early: dict, memory, processes) -> None:
    """A policy_fn's restrict_max_* before its Process exists (Process._lower_limits)."""
    if processes is not None:
        if session.forks is None:
            raise SandlockError("restrict_max_processes: forks are counted only with "
                                "max_processes or 'process' in policy_fn_events")
        session.forks.lower(processes)
    if memory is not None:
        early["memory"] = min(memory, early.get("memory") or memory)
        import resource
        from .process_tree import members
        for pid in members(session.root) if session.root else ():
            try:  # lower only
                soft, hard = resource.prlimit(pid, resource.RLIMIT_DATA)
                if hard == resource.RLIM_INFINITY or hard > early["memory"]:
                    resource.prlimit(pid, resource.RLIMIT_DATA, (early["memory"],) * 2)
            except OSError:
                pass
