"""Protecting the user's files (protect_user_files): from the plan (home_policy) to what
enforces it.

Two modes, chosen once per process by what the kernel lets this user do:
- "mounts": the sandbox gets a mount namespace of its own (and a user namespace unless
  started as root), where the trampoline covers each secret (an empty tmpfs of mode 0 over
  a directory, an empty file of mode 0 over a file) and makes each persistence vector a
  read-only bind of itself. The kernel then refuses reads of secrets (EACCES) and writes
  (EROFS), unlinks and renames (EBUSY) of persistence vectors, whatever the spelling,
  while every other entry of the same directories stays fully usable. The supervisor's
  guard (supervisor.guard) refuses the new names.
- "landlock": no namespace can be made (a container's seccomp profile refuses unshare, a
  distribution restricts user namespaces). Secrets become Landlock-denied paths (with
  Landlock's limit: the directories on the way to one accept no new entries, e.g. the
  home directory itself under `-w ~`), and the guard also keeps persistence vectors:
  opens that may write, truncate, unlink and rmdir reach the supervisor. `notice` says so.
"""

from __future__ import annotations

import atexit
import os
import threading

from . import libexec
from .home_policy import HomePlan, plan

_lock = threading.Lock()
_mode: str | None = None
_empty: str | None = None


def mode() -> str:
    """"mounts" when this user can make the sandbox's protection mounts here, else
    "landlock" (probed once: the trampoline tries them in a throwaway namespace)."""
    global _mode
    forced = os.environ.get("SANDLOCK_TEST_PROTECT_MODE")  # the tests run both modes
    if forced in ("mounts", "landlock"):
        return forced
    with _lock:
        if _mode is None:
            import subprocess
            try:
                r = subprocess.run([libexec.path("sandlock-exec"), "--probe-protect"],
                                   capture_output=True, timeout=10)
                _mode = "mounts" if r.returncode == 0 else "landlock"
            except (OSError, subprocess.TimeoutExpired):
                _mode = "landlock"
        return _mode


def empty_file(removed_at_exit: bool = True, under: str | None = None) -> str:
    """An empty file of mode 0 that hidden files are covered with (one per process, and
    its children). removed_at_exit=False: the caller removes its directory (the CLI
    service, whose children inherit it and run atexit handlers of their own). `under`: in
    that directory's `hidden`, replacing what a previous holder left there (the CLI
    service's own directory, where a service killed outright left its cover) rather than
    in a new directory of TMPDIR."""
    global _empty
    with _lock:
        if _empty is None:
            import shutil
            import tempfile
            if under is None:
                directory = tempfile.mkdtemp(prefix="sandlock-hidden-")
            else:
                directory = os.path.join(under, "hidden")
                try:  # a dead holder's (rmtree follows no symlink), or anything put there
                    if os.path.isdir(directory) and not os.path.islink(directory):
                        shutil.rmtree(directory, ignore_errors=True)
                    else:
                        os.unlink(directory)
                except FileNotFoundError:
                    pass
                os.mkdir(directory, 0o700)
            path = os.path.join(directory, "hidden")
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0))
            os.chmod(path, 0)
            if removed_at_exit:
                atexit.register(shutil.rmtree, directory, True)
            _empty = path
        return _empty


def user_plan(readable, writable, denied) -> HomePlan:
    """The plan for these grants: what the user wrote in a grant is theirs (exempt)."""
    named = tuple(readable) + tuple(writable)
    return plan(readable, writable, named)


def needs_guard(p: HomePlan) -> bool:
    return bool(p.roots or p.readonly or p.guarded)


def spec(p: HomePlan) -> bytes:
    """The trampoline's protection list (sandlock-exec.c): records "<kind><path>\\0"."""
    out = []
    hidden_files = [h for h in p.hidden if os.path.lexists(h) and not os.path.isdir(h)]
    if hidden_files:
        out.append(b"e" + os.fsencode(empty_file()) + b"\0")
    out += [b"h" + os.fsencode(h) + b"\0" for h in p.hidden]
    out += [b"r" + os.fsencode(r) + b"\0" for r in p.readonly]
    if hidden_files:
        # Last, the directory of the empty file itself is covered: the sandbox cannot
        # reach it to chmod or fill it (the covers bound from it keep the inode).
        out.append(b"h" + os.fsencode(os.path.dirname(empty_file())) + b"\0")
    return b"".join(out)


def notice(p: HomePlan, how: str) -> str | None:
    if how != "landlock" or not p.hidden:
        return None
    parents = sorted({os.path.dirname(h) for h in p.hidden})
    return ("no mount namespace can be made here: secrets are Landlock-denied, so "
            f"{', '.join(parents[:3])}{' ...' if len(parents) > 3 else ''} accept(s) no new "
            "entries in this sandbox")
