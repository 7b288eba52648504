"""A private temporary directory for each sandbox (`private_tmp`, on by default with a
workdir and under `net-run`): compilers and package managers get a writable TMPDIR
without a grant on the host's /tmp, where other users' and programs' files are.

Each Sandbox has one root, made when its kernel objects are built (Landlock grants writes
beneath it, and only there); each run gets a directory of its own beneath that root as
TMPDIR, removed when the run ends; the root is removed with the Sandbox (or when the
process exits).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref


def _remove(path: str) -> None:
    """Remove `path` and what the sandbox left in it, making the directories it locked
    (mode 0) ours to empty first: only `path` and what lies beneath it, never `path`'s
    parent (the host's /tmp)."""
    try:  # what most runs leave: an empty directory (rmdir never follows a last symlink)
        os.rmdir(path)
        return
    except OSError:
        pass
    top = os.path.realpath(path)
    if not os.path.isdir(top) or os.path.islink(path):
        return
    try:
        os.chmod(top, 0o700)
    except OSError:
        pass
    for dirpath, dirnames, _ in os.walk(top):  # top-down: unlocked before entered
        for d in dirnames:
            p = os.path.join(dirpath, d)
            if not os.path.islink(p):
                try:
                    os.chmod(p, 0o700)
                except OSError:
                    pass
    shutil.rmtree(top, ignore_errors=True)


_LIVE: set = set()  # the roots this process made and has not removed yet


def remove_all() -> None:
    """Remove every root this process made: before it ends in a way that runs no
    finalizer (a CLI-service child killing itself as its client went away)."""
    for root in list(_LIVE):
        _removed(root)


def _removed(root: str) -> None:
    _LIVE.discard(root)
    _remove(root)


class PrivateTmp:
    def __init__(self):
        self.root = os.path.realpath(tempfile.mkdtemp(prefix="sandlock-tmp-"))
        _LIVE.add(self.root)
        self._finalizer = weakref.finalize(self, _removed, self.root)

    def new_run(self) -> str:
        """A fresh directory for one run's TMPDIR."""
        path = tempfile.mkdtemp(prefix="run-", dir=self.root)
        os.chmod(path, 0o700)
        return path

    def end_run(self, path: str) -> None:
        if os.path.dirname(path) == self.root:
            _remove(path)

    def close(self) -> None:
        self._finalizer()
