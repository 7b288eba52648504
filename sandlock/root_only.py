"""The files under /etc (and /usr/local/etc) that only root may read: a sandbox started as
root is uid 0 without capabilities, and would read them by ownership alone, so the system
grants exclude them (policy.system_denied).

Scanning takes milliseconds (a stat of every entry), so a process reuses its last scan
while nothing there changed, and knows that from the kernel: inotify watches on every
directory scanned, and on every ancestor of each scanned root (a root created, removed or
renamed), report any entry created, removed, renamed, or whose owner or mode changed; and
the mount table (/proc/self/mountinfo, compared whole: a mount raises no inotify event)
must be the one the scan saw. Invariants:
  - a scan is reused only if no event is queued, (in a forked process) the process it was
    inherited from has not drained one since, the mount table is unchanged, every file
    the scan met with several links has the owner and mode it had (a chmod through
    another hard link reaches no watch on /etc: these are stat'ed again), and it is
    younger than MAX_AGE (a file linked elsewhere only after the scan, then changed
    through that link, is seen no sooner);
  - a directory is watched before it is listed, so an entry made during the scan is either
    listed or reported;
  - without inotify (no instance or watch left for this user), a scan is reused for
    MAX_AGE seconds at most, and inotify is tried again after that.
Processes forked from one that scanned share its inotify descriptor: they never drain it
(that would hide events from the others), they only look whether events are queued; the
process that made the watcher drains, and counts each drain in a page all of them share.
A process that builds a sandbox or two and ends (the in-process CLI: one_shot()) watches
nothing: its ~140 watches cost more to set, and to tear down at its exit (~9 ms here), than
a scan. It reuses a scan for ONE_SHOT_AGE at most (a build asks twice), with the same mount
table, as a build made that much earlier would have seen it.
"""

from __future__ import annotations

import errno
import mmap
import os
import select
import stat
import struct
import threading
import time

from ._kernel import inotify

SCAN = ("/etc", "/usr/local/etc")
MAX_AGE = 60.0
ONE_SHOT_AGE = 1.0

_lock = threading.Lock()
_fd = -1                      # the inotify descriptor, or -1
_retry_at = 0.0               # without inotify: when to try to get it again
_owner = 0                    # the pid that made it (it alone drains)
_shared: mmap.mmap | None = None  # u64: drains so far, seen by every forked process
_seen = -1                    # the drain count the cached scan is valid for
_mounts = b""                 # the mount table the cached scan saw
_cached: tuple[str, ...] | None = None
_linked: tuple = ()           # (path, identity) of the scan's files of several links
_expires = 0.0
_one_shot = False             # one_shot(): nothing watched, a scan reused ONE_SHOT_AGE


def _pending() -> bool:
    p = select.poll()
    p.register(_fd, select.POLLIN)
    return bool(p.poll(0))


def _drains() -> int:
    return struct.unpack_from("<Q", _shared, 0)[0]


def _mount_table() -> bytes:
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            return f.read()
    except OSError:
        return b"?"  # unreadable: never equal to a table read before (see files())


def _start(now: float) -> None:
    global _fd, _owner, _shared, _retry_at
    try:
        _fd = inotify.init()
    except OSError:
        _retry_at = now + MAX_AGE
        return
    _owner = os.getpid()
    _shared = mmap.mmap(-1, 8, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)


def _give_up(now: float) -> None:
    global _fd, _retry_at
    if _owner == os.getpid():
        os.close(_fd)
    _fd, _retry_at = -1, now + MAX_AGE


def _watch(d: str) -> bool:
    """Watch `d`; False if the watches ran out. A directory gone (or replaced by a file)
    since it was listed needs none: its parent's watch reported that."""
    try:
        inotify.watch_directory(_fd, d)
        return True
    except OSError as e:
        return e.errno in (errno.ENOENT, errno.ENOTDIR)


def _identity(st: os.stat_result) -> tuple:
    return st.st_dev, st.st_ino, st.st_uid, st.st_mode


def _unchanged(linked) -> bool:
    for path, identity in linked:
        try:
            if _identity(os.lstat(path)) != identity:
                return False
        except OSError:
            return False
    return True


def _scan() -> tuple[tuple[str, ...], bool, tuple]:
    """(the files, whether every directory scanned, and the ancestors of each root, are
    watched, the files of several links met)."""
    found, linked = [], []
    watched = _fd >= 0
    for root in SCAN:  # a root made, removed or renamed: an event on an ancestor
        d = os.path.dirname(root)
        while watched:
            if os.path.isdir(d) and not _watch(d):
                watched = False
            if d == "/":
                break
            d = os.path.dirname(d)
    stack = [p for p in SCAN if os.path.isdir(p)]
    while stack:
        d = stack.pop()
        if watched and not _watch(d):
            watched = False  # out of watches: this scan is not kept past MAX_AGE
        try:
            with os.scandir(d) as entries:
                for entry in entries:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if st.st_nlink > 1 and stat.S_ISREG(st.st_mode):
                        linked.append((entry.path, _identity(st)))  # whoever owns it
                    if stat.S_ISLNK(st.st_mode) or st.st_uid != 0:
                        continue
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(entry.path)
                    elif not st.st_mode & 0o004:
                        found.append(entry.path)
        except OSError:
            continue
    return tuple(sorted(found)), watched, tuple(linked)


def files() -> tuple[str, ...]:
    """The files under SCAN that belong to root and that others may not read. Files, not
    directories, so that every directory stays listable (fs_rules: a denied directory
    takes listing from the directories above it)."""
    global _cached, _seen, _expires, _mounts, _linked
    with _lock:
        now = time.monotonic()
        if _fd < 0 and now >= _retry_at and not _one_shot:
            _start(now)
        mounts = _mount_table()
        if _cached is not None and now < _expires and mounts == _mounts != b"?" and (
                _fd < 0 or (not _pending() and _drains() == _seen)) and _unchanged(_linked):
            return _cached
        seen = -1
        if _fd >= 0:
            if _owner == os.getpid():
                struct.pack_into("<Q", _shared, 0, _drains() + 1)  # before: see above
                inotify.drain(_fd)
            seen = _drains()
        result, watched, linked = _scan()
        if _fd >= 0 and not watched:
            _give_up(now)
        age = ONE_SHOT_AGE if _one_shot else MAX_AGE
        _cached, _seen, _expires, _mounts, _linked = result, seen, now + age, mounts, linked
        return result


def one_shot() -> None:
    """This process builds its sandboxes and ends: files() sets no watch, and reuses a
    scan for ONE_SHOT_AGE at most (sandlock/__main__.py, for run, net-run and pipe)."""
    global _one_shot
    _one_shot = True


def forget() -> None:
    """Scan again at the next call."""
    global _cached
    with _lock:
        _cached = None
