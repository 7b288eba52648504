"""Removing a tree that sandboxed programs wrote, by fd.

Invariant: every chmod, unlink and rmdir acts through an fd on what was reached from the
top without following a symlink, never by a name checked earlier. A program still running
there (one a run left, another sandbox of this user that may write there) can swap a
directory for a symlink at any moment; a walk by name could be raced into chmod 0700 or
removal of a directory of its choosing outside. Directories the programs locked (mode 0)
are made ours (0700) through an O_PATH fd to the very inode, then opened again through it.
"""

from __future__ import annotations

import errno
import os
import time

from ._kernel.fileops import fchmod_fd


# A walk's bound: a program still writing there could nest new directories as fast as
# they are removed, and keep the walk (and whatever waits for it) going for good.
DEADLINE = 10.0  # seconds


def remove_beneath(dirfd: int, name: str, within: float = DEADLINE) -> None:
    """Remove `name` in the directory `dirfd` and everything beneath it, whatever modes
    were left in it; best effort (what cannot be removed within `within` seconds stays),
    never raising OSError. A walk cut short by a directory moved away meanwhile starts
    again from the top (twice at most: what stays after three walks stays)."""
    deadline = time.monotonic() + within
    try:
        os.unlink(name, dir_fd=dirfd)
        return
    except IsADirectoryError:
        pass
    except OSError:
        return
    for _ in range(3):
        top = _unlocked(dirfd, name)
        if top is None:
            return
        try:
            _empty(top, deadline)
        except OSError:
            pass
        try:
            os.rmdir(name, dir_fd=dirfd)
            return
        except OSError as e:
            if e.errno != errno.ENOTEMPTY or time.monotonic() > deadline:
                return


_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _unlocked(dirfd: int, name: str) -> int | None:
    """An fd to read the directory `name` in `dirfd` (never a symlink's target), made mode
    0700 if it was not (locked, or read-only to us); None if it is no directory or cannot
    be made ours."""
    try:
        fd = os.open(name, _DIR, dir_fd=dirfd)
    except PermissionError:
        fd = _opened_up(dirfd, name)
    except OSError:
        return None
    if fd is not None:
        try:
            if os.fstat(fd).st_mode & 0o700 != 0o700:
                os.fchmod(fd, 0o700)
        except OSError:
            pass
    return fd


def _opened_up(dirfd: int, name: str) -> int | None:
    """A directory we may not read: chmod the very inode through an O_PATH fd, then open
    that inode again through it."""
    try:
        fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                     dir_fd=dirfd)
    except OSError:
        return None
    try:
        fchmod_fd(fd, 0o700)
        return os.open(f"/proc/self/fd/{fd}", _DIR & ~os.O_NOFOLLOW)
    except OSError:
        return None
    finally:
        os.close(fd)


def _empty(top: int, deadline: float) -> None:
    """Remove everything beneath the directory `top` (closed here), depth first with one
    directory fd open at a time whatever the depth: a sandbox may nest directories
    thousands deep, and an fd per level would take this process's fds from every other
    sandbox it serves. Climbing back is by "..", followed only if it reaches the very
    directory we came down from (one moved away meanwhile ends the walk there: the
    caller starts again from the top). Raises OSError where the walk cannot go on."""
    fd = top
    stack = []  # per level above fd: its (st_dev, st_ino), its names left, the one below
    try:
        names = os.listdir(fd)
        while True:
            while names:
                if time.monotonic() > deadline:
                    return
                entry = names.pop()
                try:
                    os.unlink(entry, dir_fd=fd)
                    continue
                except IsADirectoryError:
                    pass
                except OSError:
                    continue
                below = _unlocked(fd, entry)
                if below is None:
                    continue
                try:
                    listed = os.listdir(below)
                    st = os.fstat(fd)
                except OSError:
                    os.close(below)
                    continue
                stack.append(((st.st_dev, st.st_ino), names, entry))
                os.close(fd)
                fd, names = below, listed
            if not stack:
                return
            ident, names, entry = stack.pop()
            up = _parent(fd)
            os.close(fd)
            fd = up
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != ident:
                return
            try:
                os.rmdir(entry, dir_fd=fd)
            except OSError:
                pass
    finally:
        os.close(fd)


def _parent(fd: int) -> int:
    """The directory above `fd`'s, opened to read. One locked again meanwhile (mode 0: no
    lookup of ".." in it) is made ours once more; raises OSError if that is not enough."""
    try:
        return os.open("..", _DIR, dir_fd=fd)
    except PermissionError:
        os.fchmod(fd, 0o700)
        return os.open("..", _DIR, dir_fd=fd)
