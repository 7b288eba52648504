"""The CLI service: one per user, started on demand by the C client, gone after IDLE
seconds without a request (or when Sandlock's code on disk changes).

Design: a pre-forking server. The parent imports and warms the CLI (parsers, policy
building, the filter compiler) and stays single-threaded; it keeps SPARE forked children
waiting in accept() on the listening socket, at most MAX_BUSY serving at once. A child
serves one client and exits (a connection it refuses, or a status or stop request, it
answers and then takes the next: nothing of it changed). It checks the peer and reads
from the kernel the client's process attributes (peer.py: resource limits, scheduling
policy, nice value, affinity, umask, I/O priority, OOM score, execution domain, ignored
and blocked signals), takes its stdin,
stdout, stderr and working directory (SCM_RIGHTS) and environment, and then runs today's
CLI (sandlock.cli.main) with them: the same code, the same output, the same exit status as
`python -m sandlock`, without the interpreter's start and the imports. The sandbox's
supervisor is that child; the parent never supervises anything.

The protocol and a child's side of one call: call.py.

Files (a directory of the user's alone, mode 0700): $XDG_RUNTIME_DIR/sandlock/ or
/tmp/sandlock-service-UID/ (not /tmp/sandlock-UID/, which registry.py makes a HOME of
when there is none): service.sock, service.lock (held by the live service: a second one
started meanwhile exits; a socket left by a dead one is replaced), service.log.
"""

from __future__ import annotations

import fcntl
import os
import select
import signal
import socket
import struct
import sys
import threading
import time

from . import peer, prepared
from .call import KIND_STATUS, KIND_STOP, MAGIC, REPLY_WAIT, serve_one  # noqa: F401

IDLE = 600.0          # seconds without a request before the service exits
# Children waiting in accept() (1 at least while a call is served). Calls back to back
# (5 ms apart) find one warm, not one still warming: 22 -> 13 ms here with 3 (4: no
# better); each costs ~6.5 MB of its own.
SPARE = 3
REBUILD_AFTER = 1.0   # seconds of quiet before a spare builds again what changed while it waits
WATCH_EVERY = 0.1     # seconds between a waiting spare's reads of its build's inotify events
MAX_BUSY = 64         # children serving at once; more clients wait in the backlog or fall back


def directory() -> str:
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    return (os.path.join(xdg, "sandlock") if xdg
            else f"/tmp/sandlock-service-{os.geteuid()}")


def _own_directory(path: str) -> str:
    """The service's directory, made if missing; refused unless it is a directory of this
    user's alone (a directory someone else made or can enter is never used)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    import stat as _stat
    if not _stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise PermissionError(f"{path}: not a directory of this user's alone (mode 0700)")
    return path


WARM_RUNS = (["run", "--", "/bin/true"], ["net-run", "--", "/bin/true"])


def _warm() -> None:
    """What requests need, imported and built once, before any fork: the modules a run and
    a net-run import (learnt from a run in a throw-away child: this process stays
    single-threaded, as forking demands) and the parsers."""
    import importlib
    from .. import cli_parser
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            from ..cli import main
            for argv in WARM_RUNS:
                try:
                    main(list(argv))
                except BaseException:
                    pass
            names = [n for n in sys.modules if n.split(".")[0] in ("sandlock", "netpolicy")]
            os.write(w, "\n".join(names).encode())
        finally:
            os._exit(0)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    os.waitpid(pid, 0)
    for name in b"".join(chunks).decode().split():
        try:
            importlib.import_module(name)
        except Exception:
            pass  # an optional part (the mcp extra): imported, if at all, by the request
    for command in ("run", "net-run", "pipe"):
        cli_parser.build(command)
    _warm_caches()


def _warm_caches() -> None:
    """Fill this process's caches that requests read (the filter compiler's) by building,
    never starting, the sandboxes of WARM_RUNS. Re-run now and then: what is built
    depends on the machine (the root-only files' scan, redone by every request anyway)."""
    from ..cli import _fields_from_args
    from ..cli_parser import build
    from ..errors import SandlockError
    from ..sandbox import Sandbox
    cwd = os.open(".", os.O_PATH)
    try:
        os.chdir("/")
        for argv in WARM_RUNS:
            a, _ = build(argv[0]).parse_known_args(argv)
            try:
                merged, *_ = _fields_from_args(a, argv[0] == "net-run", argv[2:])
                # Not its audit log: where the kernel's audit stream is readable (root,
                # the audit subsystem on) building one starts the thread reading
                # Landlock's records, and this process forks. A child reads them.
                merged.pop("audit_log", None)
                Sandbox(**merged).degradations  # noqa: B018 (compiles the ruleset, filter)
            except SandlockError:
                pass
    finally:
        os.fchdir(cwd)
        os.close(cwd)
    if threading.active_count() != 1:  # forking demands it: a bug, never to be served
        raise RuntimeError("the service started a thread while warming")


def _warm_child() -> None:
    """In a spare child, before it waits: one run of `run -- /bin/true` (output to
    /dev/null), so that what a process does once (the supervisor's thread and its epoll
    set, the fast path's table, the remaining caches) is done before a client waits."""
    from ..cli import main
    saved = [os.dup(fd) for fd in (0, 1, 2)]
    # The run's handlers of its ending signals go with it: a caller's dispositions are
    # taken on only where no handler of Sandlock's is (peer.take_signals), so a SIGHUP
    # a client ignored (nohup) reached its program not ignored (review).
    dispositions = {sig: signal.getsignal(sig)
                    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        main(list(WARM_RUNS[0]))
    except BaseException:
        pass
    finally:
        for stream in (sys.stdout, sys.stderr):  # nothing of it may reach a client's fds
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        for fd, old in zip((0, 1, 2), saved):
            os.dup2(old, fd)
            os.close(old)
        os.close(null)
        for sig, handler in dispositions.items():
            signal.signal(sig, handler)


CLIENT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "_libexec", "sandlock-client")


def _client_bytes() -> bytes | None:
    """The C client's executable, as built with this code (peer._is_client)."""
    try:
        with open(CLIENT, "rb") as f:
            return f.read()
    except OSError:
        return None


def _code_stamp() -> dict[str, float]:
    """Sandlock's modules as loaded, the client and the trampoline (each spare holds one
    started ahead: launch.Parked): a change on disk retires the service."""
    from ..launch import HELPER
    out = {}
    for path in (CLIENT, HELPER):
        try:
            out[path] = os.stat(path).st_mtime
        except OSError:
            out[path] = -1.0
    for name, mod in list(sys.modules.items()):
        path = getattr(mod, "__file__", None)
        if path and name.split(".")[0] in ("sandlock", "netpolicy"):
            try:
                out[path] = os.stat(path).st_mtime
            except OSError:
                out[path] = -1.0
    return out


def _changed(stamp: dict[str, float]) -> bool:
    for path, mtime in stamp.items():
        try:
            if os.stat(path).st_mtime != mtime:
                return True
        except OSError:
            if mtime != -1.0:
                return True
    return False


def _accept(listener: socket.socket, quit_r: int, news: socket.socket | None = None,
            on_news=None) -> socket.socket | None:
    """In a spare child: the next client (the listener is non-blocking: another child may
    take the one that woke us), or None once the service's quit pipe is closed or
    on_news(inputs) — newer inputs to prepare, sent on `news` — returns False.
    The listener is watched with EPOLLEXCLUSIVE: a client wakes one spare waiting, not
    all of them (three Python processes woken for one accept competed with the one that
    serves, and with the client, on two cores); a spare busy building ahead is skipped
    by the kernel, and sees the client only if no spare waits (then it may get EAGAIN)."""
    ep = select.epoll()
    # The build ahead whose inotify fd is watched here (by identity: a new build's fd may
    # reuse the number), the fd, and when to build it again.
    owner, watch, again = None, -1, None
    resume = None  # the watch's events are read at most every WATCH_EVERY: when again
    try:
        ep.register(listener, select.EPOLLIN | select.EPOLLEXCLUSIVE)
        ep.register(quit_r, select.EPOLLIN)
        if news is not None:
            ep.register(news, select.EPOLLIN)
        while True:
            now = time.monotonic()
            if on_news is not None and (prepared.current() is not owner or
                                        (resume is not None and now >= resume)):
                if watch >= 0 and resume is None:
                    try:
                        ep.unregister(watch)
                    except (OSError, ValueError):
                        pass  # closed with the build it watched
                owner, resume = prepared.current(), None
                watch = owner.watch if owner is not None else -1
                if watch >= 0:
                    ep.register(watch, select.EPOLLIN)
            due = [t for t in (again, resume) if t is not None]
            ready = {fd for fd, _ in ep.poll(max(0.0, min(due) - now) if due else -1)}
            if quit_r in ready:
                return None
            if listener.fileno() in ready:  # first: its wakeup was this spare's alone
                try:
                    conn, _ = listener.accept()
                except (BlockingIOError, InterruptedError):
                    conn = None
                if conn is not None:
                    conn.setblocking(True)
                    return conn
            if news is not None and news.fileno() in ready:
                try:
                    m = news.recv(prepared.MAX_REPORT + 1)
                except OSError:
                    m = b""
                if not m:  # the service's end is gone: the quit pipe says the rest
                    ep.unregister(news)
                    news = None
                elif not on_news(m):
                    return None
                again = None  # built from those inputs now
            if watch in ready and resume is None and prepared.current() is owner:
                if prepared.idle():
                    # What the build read changed: built again once nothing that
                    # matters has changed for REBUILD_AFTER (a directory that keeps
                    # changing, an install in the project, is not built for each time).
                    again = time.monotonic() + REBUILD_AFTER
                ep.unregister(watch)  # a busy /tmp's events, read in batches
                resume = time.monotonic() + WATCH_EVERY
            if again is not None and time.monotonic() >= again:
                again = None
                payload = prepared.stale_inputs()
                if payload is not None and not on_news(payload):
                    return None
    finally:
        ep.close()


def _still_ours(path: str, ino: int) -> bool:
    """The socket clients connect to is this service's (not removed or replaced: then
    this one exits, and the next call starts a service clients can reach)."""
    try:
        return os.stat(path).st_ino == ino
    except OSError:
        return False


def _take_inputs(inputs: socket.socket, latest: list, abandoned: list) -> bool:
    """The children's reports (prepared.py): b"R" + a served call's inputs, the next to
    prepare; b"B" + inputs whose preparation a spare abandoned (never tried again).
    Whether the spares are to hear of the inputs to prepare: after every call served,
    new ones or not — a call's own effects (its private /tmp made and removed) may have
    changed what a sandbox built before it read; each spare then checks its own."""
    told = False
    while True:
        try:
            m = inputs.recv(prepared.MAX_REPORT + 2)
        except (BlockingIOError, InterruptedError):
            return told and latest[0] is not None
        if m[:1] == b"B":
            abandoned.append(m[1:])
            del abandoned[:-16]
            if latest[0] == m[1:]:
                latest[0] = None
        elif m[:1] == b"R" and m[1:] not in abandoned:
            latest[0] = m[1:]
            told = True


def serve(idle: float = IDLE) -> int:
    """Run the service in this process until idle, stopped or its code changes. 0, or 1
    when another service holds the lock (not an error for whoever started this one)."""
    own = peer._status("self")
    if own.get("NoNewPrivs") != "0" or own.get("Seccomp") != "0":
        # It would run every request with this confinement, and serve the processes that
        # look alike from outside (the same counts, not the same filters or domains).
        raise PermissionError("the CLI service does not run under no_new_privs or seccomp")
    where = _own_directory(directory())
    os.chdir("/")  # holds no directory of the user's busy; requests bring their own
    lock = os.open(os.path.join(where, "service.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                   0o600)
    try:
        # A POSIX record lock: held by this process alone (never inherited by the
        # children), and its holder's pid is what a client asks for (F_GETLK) to tell
        # the service from any other listener on its socket (sandlock-client.c).
        fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except (BlockingIOError, PermissionError):
        return 1
    path = os.path.join(where, "service.sock")
    try:
        os.unlink(path)  # a dead service's (the lock is ours: nobody serves it)
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    old = os.umask(0o177)
    try:
        listener.bind(path)
    finally:
        os.umask(old)
    listener.listen(128)
    ino = os.stat(path).st_ino
    from .. import protect
    # Made once, here, and removed by this process: every child covers hidden files with
    # it, and a build prepared ahead (prepared.py) may make nothing. In this directory
    # (ours alone, under our lock), where the next service replaces what one killed
    # outright left.
    hidden = os.path.dirname(protect.empty_file(removed_at_exit=False, under=where))
    _warm()
    client = _client_bytes()
    for installed in (CLIENT, os.path.join(sys.prefix, "bin", "sandlock")):
        peer.know_client(installed, client)  # checked by identity, not read per call
    stamp = _code_stamp()
    started = time.time()
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    # A signal wakes the wait below (select() is retried after a handler that does not
    # raise): `service stop` takes effect at once, not at the next timeout.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    took_r, took_w = os.pipe()
    # Spare children wait for a client or for this pipe's end: closed (by this process's
    # exit, however it happens), it tells every waiting child to go. Never a signal: one
    # that has just accepted a client would be killed with the client's command.
    quit_r, quit_w = os.pipe()
    listener.setblocking(False)
    idle_children: set[int] = set()
    busy: set[int] = set()
    # A pidfd per child, readable once it has exited: the end of a call wakes this loop at
    # once, and the spare it used is replaced then, between calls, rather than during the
    # next one (a spare warms itself with a sandbox run, which takes a CPU).
    exits: dict[int, int] = {}
    last = time.monotonic()
    checked = warmed = last
    # The inputs of each call served (prepared.report): the next spares build the last
    # one's sandbox ahead (prepared.py); inputs whose preparation was abandoned are not
    # tried again.
    inputs_r, inputs_w = socket.socketpair(socket.AF_UNIX,
                                           socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    inputs_r.setblocking(False)
    latest: list[bytes | None] = [None]
    abandoned: list[bytes] = []
    # Each idle spare's end of a socket on which newer inputs reach it (it prepares them).
    news: dict[int, socket.socket] = {}

    def spawn():
        news_r, news_w = socket.socketpair(socket.AF_UNIX,
                                           socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        pid = os.fork()
        if pid == 0:
            try:
                news_w.close()
                for other in news.values():
                    other.close()
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.default_int_handler)
                signal.set_wakeup_fd(-1)
                for fd in (wake_r, wake_w, *exits):
                    os.close(fd)
                os.close(took_r)
                os.close(quit_w)
                os.close(lock)
                inputs_r.close()
                _warm_child()
                mine = peer.own()
                prepared.REPORT = inputs_w

                def prepare(inputs: bytes) -> bool:
                    if prepared.still(inputs):
                        return True  # built from these, and nothing it read changed
                    prepared.discard()
                    try:
                        ok = prepared.prepare(inputs)
                    except Exception as e:
                        ok, prepared.abandoned = False, repr(e)
                    if not ok:  # it may have left this process in any state: not served
                        print(f"sandlock: service {os.getppid()}: a sandbox built ahead was "
                              f"abandoned ({prepared.abandoned}); its inputs are not "
                              f"prepared again", file=sys.stderr)
                        prepared.refused(inputs)
                    else:
                        prepared.park()
                    return ok
                if latest[0] is not None and not prepare(latest[0]):
                    return
                from .. import cli
                cli._prepared = prepared.use

                def committed():
                    listener.close()
                    os.close(quit_r)
                    news_r.close()
                    os.write(took_w, struct.pack("i", os.getpid()))
                    os.close(took_w)
                while True:
                    conn = _accept(listener, quit_r, news_r, prepare)
                    if conn is None:
                        return
                    with conn:
                        if serve_one(conn, started, client, committed, mine):
                            return
            finally:
                os._exit(0)
        news_r.close()
        news_w.setblocking(False)
        news[pid] = news_w
        idle_children.add(pid)
        try:
            exits[os.pidfd_open(pid)] = pid
        except OSError:
            pass  # no pidfd (fds exhausted): this child's end is seen at the next wakeup

    why = "stopped"
    try:
        while not stop:
            # One spare at least, always; the others only while no call is being served:
            # a spare warms itself with a sandbox run, which would take a CPU from the
            # call in progress.
            while len(idle_children) < (1 if busy else SPARE) and len(busy) < MAX_BUSY:
                spawn()
            try:
                ready, _, _ = select.select([took_r, wake_r, inputs_r, *exits], [], [], 1.0)
            except InterruptedError:
                ready = []
            if wake_r in ready:
                os.read(wake_r, 4096)  # the handler has run: `stop` is up to date
            for fd in ready:
                if fd in exits:
                    del exits[fd]
                    os.close(fd)  # reaped below
            if inputs_r in ready and _take_inputs(inputs_r, latest, abandoned):
                for sock in news.values():  # the spares waiting prepare the newer inputs
                    try:
                        sock.send(latest[0], socket.MSG_DONTWAIT)
                    except OSError:
                        pass
            if took_r in ready:
                data = os.read(took_r, 4096)
                for (pid,) in struct.iter_unpack("i", data[:len(data) // 4 * 4]):
                    idle_children.discard(pid)
                    busy.add(pid)
                    if pid in news:
                        news.pop(pid).close()
                last = time.monotonic()
            while True:
                try:
                    pid, wstatus = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                if os.WIFSIGNALED(wstatus) or os.WEXITSTATUS(wstatus):
                    print(f"sandlock: service {os.getpid()}: child {pid} "
                          f"{'busy' if pid in busy else 'spare'} ended with wait status "
                          f"{wstatus:#x}", file=sys.stderr)
                idle_children.discard(pid)
                busy.discard(pid)
                if pid in news:
                    news.pop(pid).close()
            now = time.monotonic()
            if not busy and now - last > idle:
                why = "idle"
                break
            if now - checked > 2.0:
                checked = now
                if _changed(stamp):
                    why = "its code changed"
                    break
                if not _still_ours(path, ino):
                    why = "its socket was removed or replaced"
                    break
            if os.geteuid() == 0:  # take in what changed under /etc (root_only.py)
                from .. import policy
                policy.root_only_files()
            if now - warmed > 45.0:
                warmed = now
                _warm_caches()
    finally:
        try:
            if os.stat(path).st_ino == ino:
                os.unlink(path)  # ours still: new clients start a new service
        except OSError:
            pass
        listener.close()
        os.close(quit_w)  # the spare children leave; busy ones finish their client
        import shutil
        shutil.rmtree(hidden, ignore_errors=True)
        print(f"sandlock: service {os.getpid()}: exiting: {why}", file=sys.stderr)
    return 0


def request(kind: int) -> bytes | None:
    """status/stop from Python: the reply, or None when no service answers."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(REPLY_WAIT)
    try:
        s.connect(os.path.join(directory(), "service.sock"))
        body = MAGIC + struct.pack("<III", kind, 0, 0)
        s.send(body)
        return s.recv(4096)
    except OSError:
        return None
    finally:
        s.close()
