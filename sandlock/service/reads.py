"""What a sandbox built ahead read (service/prepared.py), recorded while it builds, watched
once it is built, and read again at use.

Recorded: every os.stat / lstat / access / readlink with its result (the os module's
functions are wrapped: os.path, glob and the rest call them at run time), and through a
Python audit hook (PEP 578) every open — its stat fields at that moment (_sig) and, for a
regular file opened to read, its bytes — and every directory listed, with its entries at
that moment. Answers a build takes from elsewhere than files are recorded as it got them
(_ASKED): the user database (pwd: a policy's `~user` path, a git config's hooks path),
which libc reads unaudited; the scan of root-only files under /etc (root_only.files);
whether the kernel's audit subsystem is on (an audit log then takes Landlock's reports).
Any other audited event while recording — a write of any kind, a process started, a
socket, a library loaded, an fd-relative call, an open of something that may block (a
FIFO) — is refused: the operation raises (Refused, a PermissionError) and the recorder
notes it. (Raw system calls made through ctypes raise no audit event: the build's own,
which make kernel objects only — the Landlock ruleset, a memfd for the BPF program.)

Watched (watch()): an inotify descriptor on every directory those paths lie in or under
(as spelled and as resolved) and each directory listed, for entries made, removed,
renamed, or changed in owner or mode. In a directory listed every event matters; in one
a path goes through, only those on the entry looked up there and on the directory itself
(moved()): what resolving the path meets, and nothing else there, can change it. Which
entries those are is found as the kernel resolves the path (_lookups: through `..` and
each symlink of a chain as it takes them, never os.path's lexical normalization), and
a directory that looks names up ignoring case counts whole. What inotify cannot vouch for is read again at use
and compared (changed()): contents read, files of several links, /proc and /sys, the
mount table, anything on or looked up through a filesystem not in _LOCAL_FS (NFS, FUSE:
changed elsewhere, a symlink there re-pointed to a local path included), and every answer
from elsewhere.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import stat
import sys
import threading

MAX_READ = 1 << 20    # bytes of a file read while building that are kept to compare
_WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_KIND = os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY
# Audited events a build raises that are neither file system reads nor effects: the
# interpreter's own (imports of modules not imported yet, code objects), and walks over
# what the recorded calls read (glob, os.walk), fcntl on fds the build holds.
_QUIET = frozenset({"import", "compile", "exec", "marshal.loads", "marshal.load",
                    "object.__getattr__", "object.__setattr__", "object.__delattr__",
                    "sys._getframe", "code.__new__", "function.__new__", "os.walk",
                    "glob.glob", "glob.glob/2", "fcntl.fcntl"})
_WRAPPED = ("stat", "lstat", "access", "readlink", "open")
_recording: "Recorder | None" = None
_hooked = False


class Refused(PermissionError):
    pass


def _sig(st: os.stat_result) -> tuple:
    """What of a stat result a build may depend on: the kind, identity, owner and mode,
    and for a regular file what changes with its contents (size, times, links). Not a
    directory's times, size and link count: they change with its entries, which matter
    only where the build listed it (the listing is then compared itself), and /proc's
    change all the time."""
    m = st.st_mode
    if stat.S_ISREG(m):
        return (m, st.st_ino, st.st_dev, st.st_uid, st.st_gid, st.st_nlink, st.st_size,
                st.st_mtime_ns, st.st_ctime_ns)
    return (m, st.st_ino, st.st_dev, st.st_uid, st.st_gid, st.st_rdev)


def _stat(path, follow: bool):
    try:
        return ("ok", _sig(_STAT(path, follow_symlinks=follow)))
    except OSError as e:
        return ("err", e.errno)


def _call(fn, path, *args, **kw):
    try:
        return ("ok", fn(path, *args, **kw))
    except OSError as e:
        return ("err", e.errno)


def opened(path, kind: int):
    """An open's object: its stat fields and, for a regular file opened to read, its
    bytes (or the errno of reading them); for one over MAX_READ (an interpreter whose
    `#!` line was read: bash, for a pyenv shim), its stat fields stand for its bytes: a
    write changes its ctime, which no one sets."""
    seen = _stat(path, not kind & os.O_NOFOLLOW)
    if seen[0] == "err" or kind & os.O_PATH or not stat.S_ISREG(seen[1][0]):
        return seen
    if seen[1][6] > MAX_READ:  # _sig: size
        return seen + ("content by its stat",)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | (kind & os.O_NOFOLLOW))
    except OSError as e:
        return seen + (e.errno,)
    try:
        chunks, n = [], 0
        while n <= MAX_READ and (chunk := os.read(fd, 65536)):
            chunks.append(chunk)
            n += len(chunk)
    finally:
        os.close(fd)
    if n > MAX_READ:
        raise Refused(f"{path}: over {MAX_READ} bytes read")
    return seen + (b"".join(chunks),)


def _listed(path):
    """A directory's entries: names and kinds (a symlink, a directory), from the listing
    itself (no stat: what a build reads of a DirEntry without one)."""
    try:
        with os.scandir(path) as it:
            return ("ok", tuple(sorted((e.name, e.is_symlink(), e.is_dir(follow_symlinks=False))
                                       for e in it)))
    except OSError as e:
        return ("err", e.errno)


def redo(dep: tuple):
    """What the call `dep` observes now (deps: ("S", path, follow), ("A", path, args,
    kw), ("R", path), ("O", path, open kind), ("L", path), ("Q", name, args))."""
    k = dep[0]
    if k == "S":
        return _stat(dep[1], dep[2])
    if k == "O":
        return opened(dep[1], dep[2])
    if k == "L":
        return _listed(dep[1])
    if k == "A":
        return _call(_REAL["access"], dep[1], *dep[2], **dict(dep[3]))
    if k == "Q":
        return _asked(dep[1], dep[2])
    return _call(_REAL["readlink"], dep[1])


def _frozen(value):
    return tuple(value) if isinstance(value, tuple) else value  # pwd's entries: tuples


def _asked(name: str, args: tuple):
    """The answer of _ASKED[name](*args) now, as a dependency's value."""
    try:
        return ("ok", _frozen(_ASKED[name][1](*args)))
    except (KeyError, OSError) as e:
        return ("err", type(e).__name__, str(e))


class Recorder:
    """What one build read (deps: call -> what it saw), on the thread that builds."""

    def __init__(self):
        self.deps: dict[tuple, tuple] = {}
        self.refused: str | None = None
        self.thread = threading.get_ident()
        self.busy = False  # our own reads, not the build's

    def mine(self) -> bool:
        return not self.busy and threading.get_ident() == self.thread

    def refuse(self, what: str):
        if self.refused is None:
            self.refused = what
        raise Refused(f"sandlock: {what}: not while preparing a sandbox")

    def note(self, dep: tuple, seen) -> None:
        old = self.deps.setdefault(dep, seen)
        if old != seen:  # read twice by the build, with different results
            self.refuse(f"{dep[1]!r} changed while building")

    def call(self, name: str, path, args: tuple, kw: dict):
        """os.<name>(path, *args, **kw) for the build, recorded."""
        if isinstance(path, int) or kw.get("dir_fd") is not None:
            self.refuse(f"os.{name} on an fd")
        p = os.fspath(path)
        if name in ("stat", "lstat"):
            dep = ("S", p, name == "stat" and kw.get("follow_symlinks", True))
        elif name == "access":
            dep = ("A", p, args, tuple(sorted(kw.items())))
        else:
            dep = ("R", p)
        try:
            v = _REAL[name](path, *args, **kw)
        except OSError as e:
            self.note(dep, ("err", e.errno))
            raise
        self.note(dep, ("ok", _sig(v) if dep[0] == "S" else v))
        return v

    def audit(self, event: str, args: tuple) -> None:
        if event == "open":
            path, _, flags = args
            if isinstance(path, int):
                return  # an fd the build holds (os.fdopen): its open was seen
            if flags & _WRITE:
                self.refuse(f"open {path!r} to write")
            dep = ("O", os.fspath(path), flags & _KIND)
        elif event in ("os.scandir", "os.listdir"):
            path = args[0]
            if path is None:
                path = "."
            if isinstance(path, int):
                self.refuse(f"{event} of an fd")
            dep = ("L", os.fspath(path))
        elif event in _QUIET:
            return
        else:
            self.refuse(event)
        self.busy = True
        try:
            seen = redo(dep)
        except Exception as e:  # over MAX_READ, ...: never a dependency left unrecorded
            self.busy = False
            self.refuse(f"{dep[1]!r}: {e}")
        finally:
            self.busy = False
        if dep[0] == "O" and seen[0] == "ok" and not dep[2] & os.O_PATH and \
                not (stat.S_ISREG(seen[1][0]) or stat.S_ISDIR(seen[1][0])):
            self.refuse(f"open {dep[1]!r}: not a file or directory")  # a FIFO may block
        self.note(dep, seen)


def _hook(event: str, args: tuple) -> None:
    rec = _recording
    if rec is not None and rec.mine():
        rec.audit(event, args)


_REAL = {name: getattr(os, name) for name in _WRAPPED}
_STAT = _REAL["stat"]


def _wrapper(name: str):
    real = _REAL[name]

    def wrapped(path, *args, **kw):
        rec = _recording
        if rec is None or not rec.mine():
            return real(path, *args, **kw)
        if name == "open":  # recorded by its audit event, which does not name a dir fd
            if kw.get("dir_fd") is not None:
                rec.refuse("os.open relative to an fd")
            return real(path, *args, **kw)
        return rec.call(name, path, args, kw)
    wrapped.__name__ = name
    return wrapped


def _asking(name: str):
    """_ASKED[name]'s function for the build: its answer recorded (a "Q" dependency)."""
    real = _ASKED[name][1]

    def wrapped(*args):
        rec = _recording
        if rec is None or not rec.mine():
            return real(*args)
        rec.busy = True  # what it reads to answer is not the build's
        try:
            value, error = real(*args), None
        except (KeyError, OSError) as e:
            value, error = None, e
        finally:
            rec.busy = False
        rec.note(("Q", name, args), ("ok", _frozen(value)) if error is None
                 else ("err", type(error).__name__, str(error)))
        if error is not None:
            raise error
        return value
    wrapped.__name__ = real.__name__
    return wrapped


def _asked_functions() -> dict:
    import pwd
    from .. import root_only
    from .._kernel import audit
    return {"pwd.getpwnam": (pwd, pwd.getpwnam), "pwd.getpwuid": (pwd, pwd.getpwuid),
            "root_only.files": (root_only, root_only.files),
            "audit.enabled": (audit, audit.enabled)}


# Answers a build takes from elsewhere than the files it opens: name -> (module, function)
_ASKED = _asked_functions()
# ... of which the kernel takes a while to answer (~0.15 ms): name -> (ask, answer), where
# answer(ask(*args)) is _ASKED[name]'s answer and ask's value, if not None, has close().
_ASKED_AHEAD = {"audit.enabled": (_ASKED["audit.enabled"][0].ask_enabled,
                                  _ASKED["audit.enabled"][0].enabled_answer)}


# Filesystems whose changes inotify reports (made on this machine, through any path): a
# read of anything else is redone at use instead (NFS, FUSE, ...: changed elsewhere).
_LOCAL_FS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "f2fs", "bcachefs",
                       "ramfs", "devtmpfs"})  # not overlay: its layers change beneath it
# unseen. (devtmpfs: /dev, whose nodes the kernel and udev make through the VFS, as any.)
# Files whose contents the running kernel fixed at its start: neither watched nor redone.
_CONSTANT = frozenset({"/proc/sys/kernel/cap_last_cap"})
MOUNT_TABLE = "/proc/self/mountinfo"


def mount_table() -> int:
    """An fd on this process's mount table, opened before a build reads anything: its
    poll() reports (POLLPRI) a mount, an unmount, a move or a remount in the namespace
    since the open (proc(5); checked on this kernel), which inotify does not; asked in
    microseconds where reading the table again and comparing took ~50 µs of every call.
    A build's reads of the table are answered by it (watch() leaves them out): what
    Sandlock reads there (sandlock.mountinfo: device, root, mount point, filesystem type)
    changes by those, or by a rename of a mount point's ancestor or of a bind mount's
    source, which the poll does not report but the watches on every path the build
    looked up do (review: a bind's source renamed to ~/.aws was "a directory it read
    changed"). A change of propagation type, unreported too, changes only fields
    nothing reads. Once reported, the report is gone: one process asks, and keeps the
    answer (mount_table_changed); nothing forks and asks beside it."""
    return os.open(MOUNT_TABLE, os.O_RDONLY | os.O_CLOEXEC)


def mount_table_changed(fd: int) -> bool:
    p = select.poll()
    p.register(fd, select.POLLPRI)
    return any(ev & (select.POLLPRI | select.POLLERR | select.POLLNVAL) for _, ev in p.poll(0))


def mounts() -> list[tuple[str, str]]:
    """(mount point, filesystem type) of this process's mounts, longest point first."""
    from .. import mountinfo
    return sorted(((point, fs) for _, _, point, fs in mountinfo.mounts()),
                  key=lambda m: -len(m[0]))


def watch(deps: dict, mounts) -> tuple[int, dict, dict, dict] | None:
    """(The caller holds a mount_table() opened before `deps` were read.)
    An inotify descriptor watching what a change to any of `deps` changes: each
    directory the kernel looks an entry up in to resolve a path read (from /, through
    `..` and symlinks as it takes them) and each directory listed (entries made,
    removed, renamed, their owner or mode changed; inotify.CHANGES); the deps it cannot
    vouch for, to redo at use: contents read (a write is no entry change), files of
    several links (changed through another name), /proc and /sys, and what lies on, or
    is looked up through, a filesystem not in _LOCAL_FS; and which events matter
    (moved()): in a directory listed, any; in one a path goes through, those on the entry
    it looks up there and on the directory itself, not on its other entries (another file
    made in /tmp or the home changes nothing the build read); and each watch's directory
    (what moved() names). None if a watch cannot be set (no instance or watch left for
    this user, ...), or if what the paths resolve through changed meanwhile."""
    from .._kernel import inotify
    points = {}  # mount point -> the filesystem type of the one seen there: the last
    for point, fs in mounts:  # mounted (mountinfo's order, which `mounts` keeps per point)
        points[point] = fs

    def fs_of(real: str) -> str:
        while real not in points and real != "/":
            real = os.path.dirname(real)
        return points.get(real, "?")
    redo: dict = {}
    chosen: list[tuple[str, bool]] = []  # (absolute path as spelled, listed)
    look = _looker()
    for dep, seen in deps.items():
        if dep[0] == "Q":  # an answer from elsewhere than a file: asked again
            redo[dep] = seen
            continue
        if dep[1] in _CONSTANT or dep[1] == MOUNT_TABLE:  # the latter: mount_table()'s
            continue
        spelled = dep[1] if os.path.isabs(dep[1]) else os.path.join(os.getcwd(), dep[1])
        met, real = _resolve(spelled, look)
        # Local all the way: a lookup in a directory elsewhere (FUSE, NFS, /proc) may meet
        # a symlink re-pointed, or an entry made, with no inotify event (review: a FUSE
        # link to a local directory, re-pointed, kept its old grant).
        if any(fs_of(d) not in _LOCAL_FS for d, _ in met) or (
                fs_of(real) not in _LOCAL_FS) or (dep[0] == "O" and len(seen) == 3) or (
                seen[0] == "ok" and dep[0] in "SO" and stat.S_ISREG(seen[1][0])
                and seen[1][5] > 1):
            redo[dep] = seen
            continue
        chosen.append((spelled, dep[0] == "L" and seen[0] == "ok"))
    names = _lookups(chosen, look)
    try:
        fd = inotify.init()
    except OSError:
        return None
    matter: dict[int, set | None] = {}  # watch descriptor -> names[] of its directory
    where: dict[int, str] = {}  # watch descriptor -> its directory (as first spelled)
    try:
        for d, wanted in names.items():
            try:
                wd = inotify.watch_directory(fd, d)
            except OSError as e:
                if e.errno not in (errno.ENOENT, errno.ENOTDIR):
                    raise  # gone or not a directory: its parent's watch sees it come
                continue
            where.setdefault(wd, d)
            if wanted is None or matter.get(wd, set()) is None:
                matter[wd] = None  # two spellings of one directory: either's names
            else:
                matter[wd] = matter.get(wd, set()) | wanted
    except OSError:
        os.close(fd)
        return None
    if _lookups(chosen, _looker()) != names:  # a symlink re-pointed... before the watches
        os.close(fd)
        return None
    return fd, redo, matter, where


def _looker():
    """lstat, memoized for one walk over many paths: path -> (a symlink's target or None,
    a directory), or None where there is nothing."""
    met: dict[str, tuple | None] = {}

    def look(p: str) -> tuple | None:
        if p not in met:
            try:
                st = os.lstat(p)
                met[p] = (os.readlink(p) if stat.S_ISLNK(st.st_mode) else None,
                          stat.S_ISDIR(st.st_mode))
            except OSError:
                met[p] = None
        return met[p]
    return look


def _resolve(path: str, look) -> tuple[list[tuple[str, str]], str]:
    """How the kernel resolves absolute `path`: the (directory, name) of each lookup,
    component by component from /, `..` to the parent of the directory reached, a
    symlink's target in its place (from / if absolute), up to the first name missing (its
    creation is an event on that name) or a non-directory; and where it leads (with what
    is left of it after a missing name: where it would be made)."""
    cur, stack, hops, met = "/", path.split("/")[::-1], 0, []
    while stack:
        part = stack.pop()
        if part in ("", "."):
            continue
        if part == "..":
            cur = os.path.dirname(cur)
            continue
        met.append((cur, part))
        nxt = os.path.join(cur, part)
        found = look(nxt)
        if found is None or hops > 40:  # missing; ELOOP for the kernel too
            return met, os.path.join(nxt, *stack[::-1])
        target, is_dir = found
        if target is not None:
            hops += 1
            stack.extend(target.split("/")[::-1])
            if target.startswith("/"):
                cur = "/"
            continue
        if not is_dir:
            return met, os.path.join(nxt, *stack[::-1])
        cur = nxt
    return met, cur


def _lookups(walked: list[tuple[str, bool]], look) -> dict[str, set | None]:
    """directory -> the entry names looked up in it to resolve each path of `walked`
    (_resolve), or None for a directory whose every entry counts: one a path flagged
    `listed` leads to, or one whose names are looked up ignoring case (casefolded: another
    spelling is the same entry)."""
    names: dict[str, set | None] = {"/": set()}  # /: its own events count
    for path, listed in walked:
        met, end = _resolve(path, look)
        for d, part in met:
            known = names.setdefault(d, set())
            if known is not None:
                known.add(os.fsencode(part))
        if listed:
            names[end] = None
    for d, known in names.items():
        if known is not None and _casefolded(d):
            names[d] = None
    return names


_FS_IOC_GETFLAGS = 0x80086601
_FS_CASEFOLD_FL = 0x40000000


def _casefolded(path: str) -> bool:
    """Directory `path` looks its names up ignoring case (chattr +F on ext4, f2fs,
    tmpfs); True where it cannot be told (every event then counts)."""
    import fcntl
    import struct
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC |
                     os.O_NONBLOCK)
    except OSError as e:
        return e.errno not in (errno.ENOENT, errno.ENOTDIR)  # gone: its parent's watch
    try:
        flags = struct.unpack("l", fcntl.ioctl(fd, _FS_IOC_GETFLAGS, b"\0" * 8))[0]
    except OSError as e:
        return e.errno not in (errno.ENOTTY, errno.EINVAL, errno.EOPNOTSUPP)
    finally:
        os.close(fd)
    return bool(flags & _FS_CASEFOLD_FL)


def moved(fd: int, matter: dict, where: dict) -> str | None:
    """Where an event queued on watch()'s `fd` that matters (its `matter`) happened, or
    None: one on a listed directory, on a directory itself, on an entry a path read goes
    through, or an event of no known watch (an overflow: wd -1, or more events queued
    than inotify.events parses at once, ~2,000, which a spare reading them every 0.1 s
    while it waits meets only beside ~20,000 changes a second; a watch the kernel
    dropped). The events are read: the caller keeps the answer."""
    from .._kernel import inotify
    for wd, name in inotify.events(fd):
        wanted = matter.get(wd, ())
        if wd not in matter or wanted is None or not name or name in wanted:
            if wd not in where:
                return "inotify's queue overflowed, or a watch was dropped"
            return os.path.join(where[wd], os.fsdecode(name)) if name else where[wd]
    return None


@contextlib.contextmanager
def recording():
    """What the code run inside, on this thread, reads (the _Recorder's deps); anything
    else it does is refused (PermissionError) and noted (rec.refused)."""
    global _recording, _hooked
    if not _hooked:
        sys.addaudithook(_hook)  # for good: an idle hook costs a lookup per event
        _hooked = True
    rec = Recorder()
    for name in _WRAPPED:
        setattr(os, name, _wrapper(name))
    for name, (module, real) in _ASKED.items():
        setattr(module, real.__name__, _asking(name))
    _recording = rec
    try:
        yield rec
    finally:
        _recording = None
        for name in _WRAPPED:
            setattr(os, name, _REAL[name])
        for module, real in _ASKED.values():
            setattr(module, real.__name__, real)


def changed(deps: dict) -> str | None:
    """Which of `deps` (dep -> what it saw) reads otherwise now ("... changed"), or None.
    The questions the kernel answers slowly are asked first and answered last."""
    asked = {}
    try:
        for dep in deps:
            if dep[0] == "Q" and dep[1] in _ASKED_AHEAD:
                asked[dep] = _ASKED_AHEAD[dep[1]][0](*dep[2])
        for dep, seen in sorted(deps.items(), key=lambda d: d[0] in asked):
            if dep in asked:
                now = ("ok", _frozen(_ASKED_AHEAD[dep[1]][1](asked.pop(dep))))
            else:
                now = redo(dep)
            if now != seen:
                return f"{dep[1]} changed"
        return None
    finally:
        for pending in asked.values():
            if pending is not None:
                pending.close()
