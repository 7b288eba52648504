"""inotify(7): a descriptor that tells when directories change (entries created, removed,
renamed, or their attributes changed), used to know when a scan must be redone."""

from __future__ import annotations

import os
import struct

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


def watch_directory(fd: int, path: str) -> int:
    """Watch directory `path` itself (not a symlink to one) for CHANGES; its watch
    descriptor (the same for every path to one directory)."""
    return syscall(NR_INOTIFY_ADD_WATCH, fd, os.fsencode(path),
                   CHANGES | IN_ONLYDIR | IN_DONT_FOLLOW)


_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then the name)


def events(fd: int, limit: int = 1 << 16):
    """(wd, name) of every event queued so far, read from `fd` (non-blocking); the name
    is b"" for an event on the watched directory itself, wd -1 for a queue overflow, as
    is what lies past `limit` bytes of events (left unread)."""
    total = 0
    while total < limit:
        try:
            data = os.read(fd, 16384)
        except BlockingIOError:
            return
        if not data:
            return
        total += len(data)
        pos = 0
        while pos + _EVENT.size <= len(data):
            wd, _, _, n = _EVENT.unpack_from(data, pos)
            name = data[pos + _EVENT.size:pos + _EVENT.size + n].rstrip(b"\0")
            pos += _EVENT.size + n
            yield wd, name
    yield -1, b""  # more than `limit`: as an overflow


def drain(fd: int) -> None:
    """Read every event queued so far."""
    while True:
        try:
            if not os.read(fd, 65536):
                return
        except BlockingIOError:
            return
