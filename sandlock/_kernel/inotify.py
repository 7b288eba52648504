"""inotify(7): a descriptor that tells when directories change (entries created, removed,
renamed, or their attributes changed), used to know when a scan must be redone."""

from __future__ import annotations

import os

from .syscall import syscall

NR_INOTIFY_INIT1 = 294
NR_INOTIFY_ADD_WATCH = 254
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
IN_ATTRIB, IN_MOVED_FROM, IN_MOVED_TO = 0x4, 0x40, 0x80
IN_CREATE, IN_DELETE, IN_DELETE_SELF, IN_MOVE_SELF = 0x100, 0x200, 0x400, 0x800
IN_ONLYDIR, IN_DONT_FOLLOW = 0x01000000, 0x02000000
# What changes a directory's entries, or an entry's owner and mode.
CHANGES = (IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF
           | IN_MOVE_SELF)


def init() -> int:
    """A new non-blocking, close-on-exec inotify descriptor."""
    return syscall(NR_INOTIFY_INIT1, IN_NONBLOCK | IN_CLOEXEC)


def watch_directory(fd: int, path: str) -> None:
    """Watch directory `path` itself (not a symlink to one) for CHANGES."""
    syscall(NR_INOTIFY_ADD_WATCH, fd, os.fsencode(path),
            CHANGES | IN_ONLYDIR | IN_DONT_FOLLOW)


def drain(fd: int) -> None:
    """Read every event queued so far."""
    while True:
        try:
            if not os.read(fd, 65536):
                return
        except BlockingIOError:
            return
