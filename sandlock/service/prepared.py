"""A sandbox built ahead of a call by a waiting CLI-service child, and used only if
nothing it was built from has changed (server.py starts it; cli._sandbox_from_args
calls use(); call.py, after_call()).

Why: turning a call's arguments into a Sandbox — the policy file, the system view, the
command's toolchain grants, the protection of the user's files, the Landlock ruleset, the
seccomp program — is ~4 ms of a warm `sandlock run`, and a spare child has nothing to do
while it waits. Agents send the same flags from the same directory with the same
environment call after call, most of them through the same shell. So a spare builds the
sandbox of the last call the service served, and a call whose inputs are the same gets
it, if the file system still looks as it did to that build.

What use() checks before a prepared sandbox replaces a new one, each check made on the
request's own state; any difference, or a check that cannot be made, means a new build,
exactly as without this module:
  1. The inputs, compared whole: the parsed arguments (every option, and the command's
     name: its arguments build nothing; another command's name only for its toolchain
     grants, computed again for it at use and compared with the build's, both ways:
     the grants it would lack, and those it would have that its own build would not
     give), the environment, the working directory (device
     and inode, and its path), and this process's attributes (peer._attributes: limits,
     umask, affinity...). Credentials, namespaces and confinement are the service's in
     both cases (peer.inspect). What the arguments build from besides — the policy file,
     the toolchain found for the command, the home — is read from files: 2.
  2. The file system, as the build saw it. While building, every os.stat / lstat /
     access / readlink is recorded with its result (the os module's functions are
     wrapped: os.path, glob and the rest call them at run time), and through a Python
     audit hook (PEP 578) every open — its stat fields at that moment (_sig) and, for a
     regular file opened to read, its bytes — and every directory listed, with its
     entries at that moment. Once built, an inotify descriptor watches every directory
     those paths lie in or under (as spelled and as resolved) and each directory listed,
     for entries made, removed, renamed, or changed in owner or mode; then every read is
     redone and compared once (a change before the watches were set). At use: no event
     may be queued, and what inotify cannot vouch for is redone and compared — contents
     read, files of several links, /proc and /sys, the mount table, anything on a
     filesystem not in _LOCAL_FS (NFS, FUSE: changed elsewhere).
     Besides files, answers a build takes from elsewhere are recorded as it got them and
     asked again at use (_ASKED): the user database (pwd: a policy's `~user` path, a git
     config's hooks path), which libc reads unaudited; the scan of root-only files under
     /etc (root_only.files: cached by the service, and revalidated by that module's own
     watches and age bound); whether the kernel's audit subsystem is on (an audit log
     then takes Landlock's own reports).
  3. Nothing else. Any other audited event while building — a write of any kind, a
     process started, a socket, a library loaded, an fd-relative call, an open of
     something that may block (a FIFO) — is refused (the operation raises), and so is a
     build over PREPARE_LIMIT; the preparation is abandoned: the spare exits rather than serve
     with whatever state the refusal left, and the service does not try that call's
     inputs again (server.py). Fields with side effects known in advance (a workspace,
     the HTTP filter, credentials, explain) are not tried. net-run is: its private /tmp's
     root is made by the run that uses the sandbox, in the caller's TMPDIR, and granted
     then (Sandbox._private_tmp_now: the path rules a build with it has, added to the
     ruleset before any run restricts itself with it), so nothing waits in a directory
     others can write; its audit log is opened when the program starts.
(Raw system calls made through ctypes raise no audit event: the build's own, which make
kernel objects only — the Landlock ruleset, a memfd for the BPF program.)
Once built, the spare also starts the sandbox's trampoline (park(): launch.Parked), which
waits unconfined for its call; it inherits the spare's process attributes, which 1
requires of a caller, and gets the call's stdio, directory, signals and program then.
Invariant: a prepared Sandbox is used at most once, and only after 1-3 passed at that
moment. The checks are made before the program starts, as a new build's reads would be:
the window in which a change goes unseen is a new build's own.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pickle
import select
import signal
import socket
import stat
import sys
import threading

MAX_READ = 1 << 20    # bytes of a file read while building that are kept to compare
MAX_REPORT = 1 << 17  # a call's inputs larger than this are not prepared
PREPARE_LIMIT = 2.0   # seconds a build ahead may take (one that blocks is abandoned)
_WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_KIND = os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY
# Audited events a build raises that are neither file system reads nor effects: the
# interpreter's own (imports of modules not imported yet, code objects), and walks over
# what the recorded calls read (glob, os.walk), fcntl on fds the build holds.
_QUIET = frozenset({"import", "compile", "exec", "marshal.loads", "marshal.load",
                    "object.__getattr__", "object.__setattr__", "object.__delattr__",
                    "sys._getframe", "code.__new__", "function.__new__", "os.walk",
                    "glob.glob", "glob.glob/2", "fcntl.fcntl"})
# Fields whose build has effects (directories made, files opened to write, sockets): not
# prepared (the audit hook would refuse them anyway; this spares a wasted spare).
# Not among them: a private /tmp, whose root the first run makes (Sandbox._private_tmp_now),
# and an audit log, opened when the program starts.
_EFFECTS = ("workdir", "http_allow", "http_deny", "http_auth", "http_ca", "http_key",
            "http_inject_ca", "http_ca_out", "credentials", "credential_env", "explain",
            "report_only")
# The options that set those fields (a policy file may set them too: _EFFECTS, below).
_OPTION_EFFECTS = ("workdir", "http_allow", "http_deny", "http_ca", "http_key",
                   "http_inject_ca", "http_ca_out", "credential", "credential_env",
                   "http_auth", "explain", "report_only", "interactive")
_WRAPPED = ("stat", "lstat", "access", "readlink", "open")

REPORT: socket.socket | None = None  # to the service: the inputs of each call served
_ready: "_Prepared | None" = None
# The caller's attributes as peer.inspect read them, which this process took on
# (peer.take_on) before the CLI runs: _attributes() would read them again.
CALLER: "dict | None" = None
_after: "tuple | None" = None  # use()'s: the call's key, the prepared sandbox checked
_early: "tuple | None" = None  # check_early()'s: the prepared sandbox, why it is stale
_recording: "_Recorder | None" = None
abandoned = ""  # what made prepare() give up (for the service's log)
_hooked = False


class _Refused(PermissionError):
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


def _opened(path, kind: int):
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
        raise _Refused(f"{path}: over {MAX_READ} bytes read")
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


def _redo(dep: tuple):
    """What the call `dep` observes now (deps: ("S", path, follow), ("A", path, args,
    kw), ("R", path), ("O", path, open kind), ("L", path), ("Q", name, args))."""
    k = dep[0]
    if k == "S":
        return _stat(dep[1], dep[2])
    if k == "O":
        return _opened(dep[1], dep[2])
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


class _Recorder:
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
        raise _Refused(f"sandlock: {what}: not while preparing a sandbox")

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
            seen = _redo(dep)
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


class _Prepared:
    def __init__(self, payload, key, env, cwd, attrs, built, toolchain, watch: int,
                 redo: dict):
        self.payload = payload  # the inputs it was built from, as report() sent them
        self.key, self.env, self.cwd, self.attrs = key, env, cwd, attrs
        self.built, self.watch, self.redo = built, watch, redo
        # (toolchain.Toolchains, the grants it gave the build's command), or None where
        # the build consulted no toolchain (--strict, --no-system): the command's name
        # then builds nothing either.
        self.toolchain = toolchain

    def stale(self, key, cmd) -> str | None:
        """Why this sandbox is not the one `key`'s call (its command `cmd`) would build
        now, or None."""
        try:
            if key[:2] != self.key[:2]:
                if key[1] != self.key[1]:
                    return "another subcommand"
                mine, theirs = dict(key[0]), dict(self.key[0])
                return "other options (" + ", ".join(sorted(
                    k for k in {*mine, *theirs} if mine.get(k) != theirs.get(k))) + ")"
        except Exception as e:  # a check that cannot be made: a change
            return f"check failed ({e})"
        if _early is not None and _early[0] is self:
            why = _early[1]
        else:
            why = self.changed()
        if why is None and key[2] != self.key[2]:
            why = self.toolchain_differs(cmd)
        return why

    def toolchain_differs(self, cmd) -> str | None:
        """Why another command than the build's does not take this sandbox, or None: the
        toolchain grants it gets now (its PATH part read by the build, whose reads are
        checked as any other; its own files and the per-user configuration read now)
        are the build's command's, path for path and reason for reason (-v prints
        them)."""
        if self.toolchain is None:
            return None
        chains, grants = self.toolchain
        try:
            if chains.grants(cmd[0]) == grants:
                return None
        except Exception as e:  # a check that cannot be made: a change
            return f"check failed ({e})"
        return "another command, whose toolchain grants differ"

    def changed(self) -> str | None:
        """Why this sandbox is not the one its call would build now, its arguments aside
        (what the build read, the caller's environment, working directory and process
        attributes), or None."""
        try:
            if _compared(os.environ) != self.env:
                return "another environment"
            if (_cwd(), os.getcwd()) != self.cwd:  # the object, and the path the build
                return "another working directory"  # used (bind mounts: one, two paths)
            if (CALLER if CALLER is not None else _attributes()) != self.attrs:
                return "other process attributes"
        except Exception as e:  # a check that cannot be made: a change
            return f"check failed ({e})"
        return self.read_changed()

    def read_changed(self) -> str | None:
        """What the build read that has changed since, or None."""
        asked = {}  # the questions the kernel answers slowly: asked first, answered last
        try:
            for dep in self.redo:
                if dep[0] == "Q" and dep[1] in _ASKED_AHEAD:
                    asked[dep] = _ASKED_AHEAD[dep[1]][0](*dep[2])
            if select.select([self.watch], [], [], 0)[0]:
                return "a directory it read changed"
            for dep, seen in sorted(self.redo.items(), key=lambda d: d[0] in asked):
                if dep in asked:
                    now = ("ok", _frozen(_ASKED_AHEAD[dep[1]][1](asked.pop(dep))))
                else:
                    now = _redo(dep)
                if now != seen:
                    return f"{dep[1]} changed"
        except Exception as e:  # a check that cannot be made: a change
            return f"check failed ({e})"
        finally:
            for pending in asked.values():
                if pending is not None:
                    pending.close()
        return None

    def close(self) -> None:
        os.close(self.watch)


# Filesystems whose changes inotify reports (made on this machine, through any path): a
# read of anything else is redone at use instead (NFS, FUSE, ...: changed elsewhere).
_LOCAL_FS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "f2fs", "bcachefs",
                       "ramfs"})  # not overlay: its layers change beneath it unseen


def _mounts() -> list[tuple[str, str]]:
    """(mount point, filesystem type) of this process's mounts, longest point first."""
    from .. import mountinfo
    return sorted(((point, fs) for _, _, point, fs in mountinfo.mounts()),
                  key=lambda m: -len(m[0]))


def _watch(deps: dict, mounts) -> tuple[int, dict] | None:
    """An inotify descriptor watching what a change to any of `deps` changes: the
    directory of each path read and every directory above it, as spelled and as resolved,
    and each directory listed (entries made, removed, renamed, their owner or mode
    changed; inotify.CHANGES); and the deps it cannot vouch for, to redo at use: contents
    read (a write is no entry change), files of several links (changed through another
    name), /proc and /sys, and what lies on a filesystem not in _LOCAL_FS. None if a watch
    cannot be set (no instance or watch left for this user, ...)."""
    from .._kernel import inotify
    from ..fs_rules import is_beneath
    dirs: set[str] = set()
    redo: dict = {}
    for dep, seen in deps.items():
        if dep[0] == "Q":  # an answer from elsewhere than a file: asked again
            redo[dep] = seen
            continue
        path = os.path.abspath(dep[1])
        real = os.path.realpath(path)
        fs = next((t for point, t in mounts if is_beneath(real, point)), "?")
        if fs not in _LOCAL_FS or (dep[0] == "O" and len(seen) == 3) or (
                seen[0] == "ok" and dep[0] in "SO" and stat.S_ISREG(seen[1][0])
                and seen[1][5] > 1):
            redo[dep] = seen
            continue
        for p in {path, real}:
            if dep[0] == "L" and seen[0] == "ok":
                dirs.add(p)
            d = os.path.dirname(p)
            while d not in dirs:
                dirs.add(d)
                d = os.path.dirname(d)
    try:
        fd = inotify.init()
    except OSError:
        return None
    try:
        for d in dirs:
            try:
                inotify.watch_directory(fd, d)
            except OSError as e:
                if e.errno not in (errno.ENOENT, errno.ENOTDIR):
                    raise  # gone or not a directory: its parent's watch sees it come
    except OSError:
        os.close(fd)
        return None
    return fd, redo


def _cwd() -> tuple[int, int]:
    st = os.stat(".")
    return st.st_dev, st.st_ino


def _attributes() -> dict:
    from . import peer
    attrs = peer._attributes(os.getpid(), peer._status("self"))
    attrs.pop("ignored")
    attrs.pop("blocked")
    return attrs


def _compared(env) -> dict:
    """The environment a build ahead is compared by: all of it but the service's own
    debugging switch, which only makes the service say what it does."""
    return {k: v for k, v in env.items() if k != "SANDLOCK_SERVICE_DEBUG"}


def _key(a, net_run: bool, cmd) -> tuple:
    """What of a call's arguments its sandbox is built from: every option, and the
    command's name (sandlock.toolchain looks it up); its arguments build nothing."""
    return (tuple(sorted((k, v) for k, v in vars(a).items() if k != "cmd")), net_run,
            tuple(cmd[:1]))


def _preparable(key: tuple, env: dict) -> bool:
    # HOME: `~` is read from it (os.path.expanduser); `~user` from the user database, an
    # answer recorded (_ASKED).
    opts = dict(key[0])
    return (bool(env.get("HOME")) and bool(key[2])
            and not any(opts.get(k) for k in _OPTION_EFFECTS))


@contextlib.contextmanager
def recording():
    """What the code run inside, on this thread, reads (the _Recorder's deps); anything
    else it does is refused (PermissionError) and noted (rec.refused)."""
    global _recording, _hooked
    if not _hooked:
        sys.addaudithook(_hook)  # for good: an idle hook costs a lookup per event
        _hooked = True
    rec = _Recorder()
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


def prepare(payload: bytes) -> bool:
    """In a spare child, before it waits: build the sandbox of `payload` (a call's inputs,
    as report() sent them), recording what the build read. False if the build did
    something a prepared build may not: the caller must exit, not serve."""
    global _ready
    key, env, cwd = pickle.loads(payload)
    if not _preparable(key, env):
        return True
    import argparse
    from .. import cli
    from ..sandbox import Sandbox
    a = argparse.Namespace(**dict(key[0]), cmd=list(key[2]))
    saved = dict(os.environ)
    try:
        os.chdir(cwd)
    except OSError:
        return True
    os.environ.clear()
    os.environ.update(env)
    built = None
    try:
        where, attrs = (_cwd(), os.getcwd()), _attributes()
        try:  # made now if missing, not by the call (cli.REGISTER_AFTER): the service's
            from .. import registry  # own directory, where the cover file lies, would
            registry.directory()  # change beneath the build (a new entry)
        except Exception:
            pass
        with recording() as rec:
            def overdue(signum, frame):
                rec.refuse(f"building took over {PREPARE_LIMIT:g}s")
            old = signal.signal(signal.SIGALRM, overdue)
            # Again and again: a build that caught the first refusal may block once more.
            signal.setitimer(signal.ITIMER_REAL, PREPARE_LIMIT, PREPARE_LIMIT)
            try:
                chains: list = []
                merged, _, timeout, said, notes = cli._fields_from_args(a, key[1], a.cmd,
                                                                        chains)
                if not any(merged.get(k) for k in _EFFECTS):
                    sb = Sandbox(**merged)
                    sb._confinement(private_tmp_later=True)  # the ruleset, the filter
                    sb.degradations  # noqa: B018
                    sb.notices  # noqa: B018
                    built = (sb, timeout, said, notes)
            except Exception:
                built = None  # refused (the call will say why itself), or our refusal: below
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, old)
        if rec.refused is not None:
            global abandoned
            abandoned = rec.refused
            return False
        if built is None:
            return True
        # Mount changes raise no inotify event: the table is compared at use.
        rec.deps.setdefault(("O", "/proc/self/mountinfo", 0),
                            _opened("/proc/self/mountinfo", 0))
        try:
            watched = _watch(rec.deps, _mounts())
        except (OSError, ValueError, IndexError):  # the mount table unreadable, ...
            watched = None
        if watched is None:
            return True
        # A change between the build's reads and the watches: every read redone, now that
        # the watches see what comes next.
        try:
            moved = any(_redo(dep) != seen for dep, seen in rec.deps.items())
        except Exception:  # a file now over MAX_READ, ...
            moved = True
        if moved:
            os.close(watched[0])
            return True
        _ready = _Prepared(payload, key, _compared(env), where, attrs, built,
                           chains[0] if chains else None, *watched)
        return True
    finally:
        os.environ.clear()
        os.environ.update(saved)
        os.chdir("/")


def still(payload: bytes) -> bool:
    """In a spare, told of a call served: whether its sandbox was built from `payload`
    and nothing the build read has changed since (then it is kept, not built again)."""
    return _ready is not None and _ready.payload == payload and _ready.read_changed() is None


def discard() -> None:
    """Drop the sandbox built ahead, if any (newer inputs are to be prepared); its kernel
    objects go with it (Confinement.__del__), and its parked trampoline."""
    global _ready
    ready, _ready = _ready, None
    from .. import launch
    launch.discard_parked()
    if ready is not None:
        ready.close()


def park() -> None:
    """In a spare that built a sandbox ahead: its trampoline started too, parked before
    its call (launch.Parked). The spare's process attributes are what the trampoline
    inherits, and a call gets this sandbox only with the same attributes (changed())."""
    if _ready is None:
        return
    from .. import launch
    conf = _ready.built[0]._confinement()
    if not launch.parked_for(conf):
        launch.park(conf)


def report(key: tuple) -> None:
    """In a serving child: tell the service this call's inputs (the next spares prepare
    them). Never waits: a full socket or large inputs skip it."""
    if REPORT is None or not _preparable(key, dict(os.environ)):
        return
    try:
        payload = pickle.dumps((key, dict(os.environ), os.getcwd()))
        if len(payload) <= MAX_REPORT:
            REPORT.send(b"R" + payload, socket.MSG_DONTWAIT)
    except Exception:  # OSError, unpicklable options...: not prepared, nothing else
        pass


def refused(payload: bytes) -> None:
    """In a spare whose preparation was abandoned: never prepare these inputs again."""
    if REPORT is not None:
        try:
            REPORT.send(b"B" + payload, socket.MSG_DONTWAIT)
        except OSError:
            pass


def check_early() -> None:
    """In a serving child that has taken on its caller's state (environment, working
    directory, attributes), while the client's "go" is on its way: whether the sandbox
    built ahead still stands, its arguments aside, which use() compares (~0.4 ms of a
    warm call, no longer waited for after the go). It only reads, as the build did; a
    change after it is one made after the call, as a change after use() always was."""
    global _early
    if _ready is not None:
        _early = (_ready, _ready.changed())


def use(a, net_run: bool, cmd):
    """cli._sandbox_from_args in a serving child: (sandbox, timeout, lines to tell, -v
    notes) built ahead, if that is what these arguments build now, else None (the caller
    builds one). The call is reported, and the inotify descriptor closed, by after_call():
    neither is the caller's to wait for (closing one waits for the kernel's RCU grace)."""
    global _ready, _after
    ready, _ready = _ready, None
    key = _key(a, net_run, cmd)
    why = "none prepared" if ready is None else ready.stale(key, cmd)
    _after = (key, ready)
    from .. import launch
    if why is not None:
        launch.discard_parked()
    if os.environ.get("SANDLOCK_SERVICE_DEBUG"):
        print(f"sandlock: service: prepared sandbox "
              f"{'used' if why is None else 'not used: ' + why}", file=sys.stderr)
    return ready.built if why is None else None


def after_call() -> None:
    """In a serving child, once its client has the exit status: what use() left."""
    global _after
    after, _after = _after, None
    from .. import launch
    launch.discard_parked()  # one this call did not take (a command not found...)
    if after is not None:
        key, ready = after
        report(key)
        if ready is not None:
            ready.close()
