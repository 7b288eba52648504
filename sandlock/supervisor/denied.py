"""What a policy_fn's deny_path covers: paths, and the objects they named.

Rule: deny_path is decided on the object reached, not on its spelling. A denied file keeps
its identity (device, inode) under any name, so a hard link or a rename of it, or of a
directory above it, does not make it reachable. `add(path)` records the identity of the
path and, for a directory, of what lies beneath it (up to MAX_RECORDED entries: past that,
what is beneath is still denied through its ancestors); `refusal(real)` refuses a path
that is, or lies beneath, a denied path by spelling, or whose object or any ancestor
directory is a recorded denied object.

The supervisor's handlers (opens, execve, names) also refuse calls that would give a
denied object a new name, and check after an open or exec which object it reached
(network.Frozen), so a path changed under the decision reaches nothing denied either.
"""

from __future__ import annotations

import os
import threading

MAX_RECORDED = 20000  # objects recorded beneath one denied directory


def _identity(st) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _record(real: str) -> frozenset:
    """The identities of `real` and (for a directory) of what is beneath it, bounded."""
    try:
        top = os.lstat(real)
    except OSError:
        return frozenset()
    ids = {_identity(top)}
    if not os.path.isdir(real) or os.path.islink(real):
        return frozenset(ids)
    stack = [real]
    while stack and len(ids) < MAX_RECORDED:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    ids.add(_identity(st))
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    if len(ids) >= MAX_RECORDED:
                        break
        except OSError:
            continue
    return frozenset(ids)


class DeniedPaths:
    def __init__(self):
        self._lock = threading.Lock()
        self._paths: dict[str, frozenset] = {}  # denied path -> identities recorded
        self._ids: dict[tuple[int, int], str] = {}

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(self._paths)

    def __bool__(self) -> bool:
        return bool(self._paths)

    def add(self, real: str) -> None:
        ids = _record(real)
        with self._lock:
            self._paths[real] = ids
            self._reindex()

    def remove(self, real: str) -> None:
        with self._lock:
            self._paths.pop(real, None)
            self._reindex()

    def _reindex(self) -> None:
        self._ids = {i: p for p, ids in self._paths.items() for i in ids}

    def spelled(self, real: str) -> str | None:
        from ..fs_rules import is_beneath
        for d in self._paths:
            if is_beneath(real, d):
                return d
        return None

    def refusal(self, real: str) -> str | None:
        """Why `real` (an absolute path, as resolved) may not be reached, or None."""
        if not self._paths:
            return None
        d = self.spelled(real)
        if d is not None:
            return f"{real} is denied by policy_fn's deny_path({d})"
        ids = self._ids
        path = real
        while True:
            try:
                st = os.stat(path) if path == real else os.lstat(path)
            except OSError:
                st = None
            if st is not None and _identity(st) in ids:
                what = "is" if path == real else f"lies beneath {path}, which is"
                return (f"{real} {what} what policy_fn's deny_path({ids[_identity(st)]}) "
                        f"denied, under another name")
            if path == "/":
                return None
            path = os.path.dirname(path) or "/"

    def object_refusal(self, proc_link: str) -> str | None:
        """The same for an open object (a /proc/PID/fd/N or /proc/PID/exe link)."""
        if not self._paths:
            return None
        try:
            st = os.stat(proc_link)
            target = os.readlink(proc_link)
        except OSError as e:
            return f"the object reached could not be checked ({e.strerror})"
        with self._lock:
            owner = self._ids.get(_identity(st))
        if owner is not None:
            return f"{target} is what policy_fn's deny_path({owner}) denied"
        if target.startswith("/"):
            return self.refusal(target.removesuffix(" (deleted)"))
        return None  # a pipe, socket or anonymous inode: nothing deny_path names
