"""A private temporary directory for each sandbox (`private_tmp`, on by default with a
workdir and under `net-run`): compilers and package managers get a writable TMPDIR
without a grant on the host's /tmp, where other users' and programs' files are.

With it comes a private /dev/shm, where the kernel lets this user make a mount namespace
(policy.private_shm): the root's `.shm`, granted like the root (a rule of its own: Landlock
does not reach a bind mount's root through the directory it was bound from), is bound
over /dev/shm by the trampoline (sandlock-exec.c, private_shm). POSIX semaphores and
shared memory (sem_open, shm_open: multiprocessing's locks, queues and pools) then work
without the host's /dev/shm, where other programs' objects are, and go with the root.

Each Sandbox has one root, made when its kernel objects are built (Landlock grants writes
beneath it, and only there); each run gets a directory of its own beneath that root as
TMPDIR, removed when the run ends (a Sandbox that runs one program only, the CLI's, gives
it the root itself); the root is removed with the Sandbox (or when the process exits).
"""

from __future__ import annotations

import errno
import os
import tempfile
import weakref

from ._kernel.fileops import open_no_symlinks
from .errors import SandlockError
from .tree_removal import DEADLINE, remove_beneath


def _remove(path: str, within: float = DEADLINE) -> None:
    """Remove `path` and what the sandbox left in it (tree_removal: by fd, never following
    a symlink swapped in meanwhile): only `path` and what lies beneath it, never `path`'s
    parent (the host's /tmp). `path` was canonical when made (PrivateTmp.root is a
    realpath), so a symlink anywhere on it now is such a swap, and nothing is removed."""
    parent, name = os.path.split(path)
    try:
        pfd = open_no_symlinks(parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        try:  # what most runs leave: an empty directory
            os.rmdir(name, dir_fd=pfd)
            return
        except OSError:
            pass
        remove_beneath(pfd, name, within)
    finally:
        os.close(pfd)


_LIVE: dict = {}  # the roots this process made and has not removed yet: their finalizers


def remove_all(within: float = DEADLINE) -> None:
    """Remove every root this process made: before it ends in a way that runs no
    finalizer (a CLI-service child killing itself as its client went away), or once a
    CLI-service child's client has its exit status (removal_after_exit)."""
    for root, finalizer in list(_LIVE.items()):
        finalizer.detach()  # not finalizer(): after the exit functions, a no-op
        _removed(root, within)


def removal_after_exit() -> None:
    """The roots made so far are not removed by this process's exit functions: a
    CLI-service child runs them before its client gets the exit status, and calls
    remove_all() after it (the run is over then; removing a tree is no part of its
    status, ~0.2 ms of a net-run call)."""
    for finalizer in _LIVE.values():
        finalizer.atexit = False


def _removed(root: str, within: float = DEADLINE) -> None:
    _LIVE.pop(root, None)
    _remove(root, within)


def _candidates() -> list[str]:
    """Where tempfile.gettempdir() looks, in its order: tempfile.tempdir if set; else
    TMPDIR, TEMP, TMP, /tmp, /var/tmp, /usr/tmp, the working directory. Asked afresh (a
    CLI-service child takes its caller's environment)."""
    if tempfile.tempdir is not None:
        return [tempfile.tempdir]
    found = [d for d in map(os.environ.get, ("TMPDIR", "TEMP", "TMP")) if d]
    found += ["/tmp", "/var/tmp", "/usr/tmp"]
    try:
        found.append(os.getcwd())
    except OSError:
        pass
    return [os.path.abspath(d) for d in found]


def _make_root() -> str:
    """A new private root in the first candidate where one can be made, as tempfile's
    choice and mkdtemp would make it, with the directory made standing for tempfile's
    probe (a file created, written and removed there: ~0.5 ms of a call on this ext4
    /tmp). A refusal moves on to the next candidate, as tempfile's probe does: what
    os.access cannot see refuses too (a caller confined by Landlock, a full filesystem)."""
    refused = []
    for d in _candidates():
        try:
            return _mkdtemp("sandlock-tmp-", d)
        except OSError as e:
            refused.append(f"{d} ({e.strerror})")
    raise SandlockError(f"private TMPDIR: no directory where one can be made: "
                        f"{', '.join(refused)} (set TMPDIR to a directory you may write, or "
                        f"private_tmp: false)")


def _mkdtemp(prefix: str, parent: str) -> str:
    """A new directory (mode 0700 less the umask) named `prefix` + 12 random hex digits
    in `parent`, as tempfile.mkdtemp makes one (without its name generator's reseeding
    in every new process)."""
    for _ in range(100):
        path = os.path.join(parent, prefix + os.urandom(6).hex())
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        return path
    raise FileExistsError(errno.EEXIST, f"no free name for a temporary directory in {parent}")


SHM = "/dev/shm"
SHM_ENV = "SANDLOCK_SHM"  # names the directory to bind, for the trampoline (removed there)
SHM_UNAVAILABLE = "this user cannot make a mount namespace here"


def shm_refusal(writable, within=()) -> str | None:
    """Why a sandbox with a private TMPDIR and these writable grants gets no private
    /dev/shm, or None: there is none to cover, a grant already gives the host's, a path
    the sandbox uses lies in the host's (`within`: grants, its workdir and layer storage,
    which the cover would hide), or no mount namespace can be made (the protection
    mounts' probe: protect.mode)."""
    from .fs_rules import is_beneath
    import stat
    try:
        if not stat.S_ISDIR(os.lstat(SHM).st_mode):  # a symlink (to /run/shm...) too: the
            return f"{SHM} is not a directory here"  # trampoline covers no symlink
    except OSError:
        return f"{SHM} is not a directory here"
    if any(is_beneath(SHM, w) for w in writable):
        return f"{SHM} is granted"
    inside = [p for p in (*writable, *within) if p and is_beneath(p, SHM)]
    if inside:
        return f"{inside[0]} lies in the host's {SHM}"
    from . import protect
    return None if protect.mode() == "mounts" else SHM_UNAVAILABLE


class PrivateTmp:
    def __init__(self):
        self.root = os.path.realpath(_make_root())
        self.shm: str | None = None
        self.lent = False
        self._finalizer = weakref.finalize(self, _removed, self.root)
        _LIVE[self.root] = self._finalizer

    def make_shm(self) -> str:
        """The directory bound over the sandbox's /dev/shm: the root's .shm, mode 0700
        (the sandbox's alone, as the root is)."""
        if self.shm is None:
            path = os.path.join(self.root, ".shm")
            os.mkdir(path, 0o700)
            os.chmod(path, 0o700)  # whatever the umask
            self.shm = path
        return self.shm

    def new_run(self) -> str:
        """A fresh directory for one run's TMPDIR."""
        self._not_lent()
        path = _mkdtemp("run-", self.root)
        os.chmod(path, 0o700)
        return path

    def lend_root(self) -> str:
        """The root itself as the TMPDIR of the one run its sandbox makes (the CLI's):
        what the run leaves goes with the root. Lent once: the root is that run's alone."""
        self._not_lent()
        os.chmod(self.root, 0o700)  # as new_run's, whatever the umask
        self.lent = True
        return self.root

    def _not_lent(self) -> None:
        if self.lent:
            raise SandlockError("this sandbox's private TMPDIR was its one run's "
                                "(popen(only_run=True)): it makes no other run")

    def end_run(self, path: str) -> None:
        if os.path.dirname(path) == self.root:  # never the root (lend_root): close()'s
            _remove(path)

    def close(self) -> None:
        self._finalizer()
