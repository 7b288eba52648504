"""The supervisor thread: one per Python process, serving every sandbox's listener fd.

Rules enforced here:
- Every notification received is answered exactly once. A handler's refusal (Denied)
  returns its errno; an OSError from the operation performed on behalf of the child returns
  that errno; any other exception denies with EPERM. Nothing is ever allowed by default.
- The thread acts with the sandbox's capabilities: its *effective* set is switched (capset
  is per thread) to the capabilities the sandbox keeps, so an on-behalf operation cannot
  succeed where the child's own call would have failed for lack of privilege.
- The thread owns each listener fd once attached, and closes it when the kernel reports
  that no task uses the filter any more (EPOLLHUP): no fd or state outlives a sandbox.
"""

from __future__ import annotations

import atexit
import errno
import os
import select
import sys
import threading
import time

from .._kernel import caps, seccomp
from . import connect, metadata, send
from .network import CONTINUE, Defer
from .request import Denied, Request


def _dispatch_table() -> dict[int, tuple[str, object]]:
    from ..syscall_filter import syscall_number  # names -> numbers for this architecture
    table = {}
    for handlers in (metadata.HANDLERS, connect.HANDLERS, send.HANDLERS):
        for name, handler in handlers.items():
            table[syscall_number(name)] = (name, handler)
    return table


PENDING_CHECK = 0.2  # seconds between checks for deferred calls whose caller is gone
MAX_DEFERRED_PER_SANDBOX = 32
WORKERS = 128


class Session:
    """The supervisor's view of one sandbox: its policy and what was denied."""

    MAX_RECORDS = 1000

    def __init__(self, policy, name: str | None = None, net=None):
        self.policy = policy
        self.name = name
        self.net = net  # NetState when the network handlers are in use
        self.denials: list[dict] = []
        self.denied_count = 0
        self.deferred = 0  # on-behalf calls in progress on worker threads
        self.pgid = 0      # set once started; every sandboxed process is in this group
        self.released = threading.Event()

    def record_denial(self, req: Request, syscall: str, err: int, reason: str) -> None:
        self.denied_count += 1
        if len(self.denials) < self.MAX_RECORDS:
            self.denials.append({"time": time.time(), "pid": req.pid, "syscall": syscall,
                                 "errno": errno.errorcode.get(err, str(err)),
                                 "reason": reason})


class Supervisor:
    def __init__(self):
        self._dispatch = _dispatch_table()
        self._epoll = select.epoll()
        self._sessions: dict[int, Session] = {}
        self._lock = threading.Lock()
        base = caps.capget()
        self._base_caps = base
        self._privileged = base.mask("permitted") != 0
        self._workers = None
        self._thread_state = threading.local()
        self._pending: set = set()  # (listener, notif id, Guard) of deferred calls
        self._pending_lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, name="sandlock-supervisor",
                                        daemon=True)
        self._thread.start()
        atexit.register(self._kill_all)

    def _kill_all(self) -> None:
        """At interpreter exit the supervisor stops answering: end every sandbox it still
        serves rather than leave it running unsupervised (its trapped calls would fail)."""
        with self._lock:
            groups = [s.pgid for s in self._sessions.values() if s.pgid]
        for pgid in groups:
            try:
                os.killpg(pgid, 9)
            except OSError:
                pass

    def attach(self, listener: int, session: Session) -> None:
        """Take ownership of `listener` and serve it until every task using it is gone."""
        with self._lock:
            self._sessions[listener] = session
        self._epoll.register(listener, select.EPOLLIN)

    def _drop(self, listener: int) -> None:
        with self._lock:
            session = self._sessions.pop(listener, None)
        try:
            self._epoll.unregister(listener)
        except OSError:
            pass
        os.close(listener)
        if session is not None:
            session.released.set()

    def _serve(self) -> None:
        notif = seccomp.Notif()
        while True:
            try:
                events = self._epoll.poll(PENDING_CHECK if self._pending else -1)
            except InterruptedError:
                continue
            if self._pending:
                self._abort_orphans()
            for fd, ev in events:
                try:
                    self._handle_event(fd, ev, notif)
                except Exception as e:  # the loop must outlive any single failure
                    print(f"sandlock: supervisor: {e!r}", file=sys.stderr)

    def _handle_event(self, fd: int, ev: int, notif) -> None:
        with self._lock:
            session = self._sessions.get(fd)
        if session is None:
            return
        if ev & select.EPOLLIN:
            try:
                seccomp.notif_recv(fd, notif)
            except OSError:
                return  # the task died between poll and recv (ENOENT)
            try:
                self._answer(fd, session, notif)
            except Exception:  # received means answered: deny rather than leave it waiting
                try:
                    seccomp.notif_send(fd, notif.id, 0, -errno.EPERM)
                except OSError:
                    pass
                raise
        elif ev & (select.EPOLLHUP | select.EPOLLERR):
            self._drop(fd)

    def _act_as(self, session: Session) -> None:
        """Give the calling thread (the loop or a worker) the sandbox's effective
        capabilities: none, unless kept. capset is per thread; each remembers its set."""
        if not self._privileged:
            return
        want = session.policy.keep_caps & self._base_caps.mask("permitted")
        if getattr(self._thread_state, "effective", None) == want:
            return
        sets = caps.CapSets(want, self._base_caps.mask("permitted"),
                            self._base_caps.mask("inheritable"))
        if caps.capset_errno(sets) != 0:
            raise Denied(errno.EPERM, "cannot drop this thread's capabilities")
        self._thread_state.effective = want

    def _answer(self, listener: int, session: Session, notif: seccomp.Notif) -> None:
        req = Request(listener, notif)
        name, handler = self._dispatch.get(req.nr, (str(req.nr), None))

        def run():
            if handler is None:
                raise Denied(errno.ENOSYS, "no handler for this syscall")
            self._act_as(session)
            return handler(req, session)
        result = self._complete(req, session, name, run)
        if isinstance(result, Defer) and session.deferred >= MAX_DEFERRED_PER_SANDBOX:
            # One sandbox may not occupy every worker: past its quota, it waits its turn
            # by retrying (EAGAIN) rather than starving the others.
            result.guard.close()
            result = ("error", errno.EAGAIN)
        if isinstance(result, Defer):
            # A blocking on-behalf call: finish it on a worker thread, with the same rules.
            # Worker threads keep the supervisor's full capabilities only as *permitted*:
            # they drop the effective set first, like this thread does.
            entry = (listener, req.id, result.guard)
            with self._pending_lock:
                session.deferred += 1
                self._pending.add(entry)
            try:
                self._pool().submit(self._finish_deferred, req, session, name, result.fn,
                                    entry)
            except Exception:  # no worker could be started: deny, never hang
                with self._pending_lock:
                    session.deferred -= 1
                    self._pending.discard(entry)
                result.guard.close()
                self._send(req, ("error", errno.EAGAIN))
            return
        self._send(req, result)

    def _finish_deferred(self, req, session, name, fn, entry) -> None:
        def run():
            self._act_as(session)
            return fn()
        try:
            self._send(req, self._complete(req, session, name, run))
        finally:
            with self._pending_lock:
                session.deferred -= 1
                self._pending.discard(entry)

    def _abort_orphans(self) -> None:
        """Wake deferred calls whose caller died or was killed (its notification is gone)."""
        with self._pending_lock:
            entries = list(self._pending)
        for listener, notif_id, guard in entries:
            if not seccomp.notif_id_valid(listener, notif_id):
                guard.abort()

    def _complete(self, req, session, name, fn):
        """Run `fn`; map its outcome to a result: a value, CONTINUE, a Defer, or an error
        tuple. Nothing but an explicit value or CONTINUE ever lets a call through."""
        try:
            return fn()
        except Denied as d:
            session.record_denial(req, name, d.errno, d.reason)
            return ("error", d.errno)
        except OSError as e:
            return ("error", e.errno or errno.EPERM)  # the on-behalf operation's own result
        except Exception as e:  # fail closed on any supervisor bug
            session.record_denial(req, name, errno.EPERM, f"supervisor error: {e!r}")
            print(f"sandlock: supervisor error in {name}: {e!r}", file=sys.stderr)
            return ("error", errno.EPERM)

    def _send(self, req, result) -> None:
        req.close()
        if result is CONTINUE:
            val, err, flags = 0, 0, seccomp.USER_NOTIF_FLAG_CONTINUE
        elif isinstance(result, tuple):
            val, err, flags = 0, -result[1], 0
        elif isinstance(result, int):
            val, err, flags = result, 0, 0
        else:  # a handler bug: never let an unexpected value allow anything
            val, err, flags = 0, -errno.EPERM, 0
        try:
            seccomp.notif_send(req.listener, req.id, val, err, flags)
        except OSError:
            pass

    def _pool(self):
        if self._workers is None:
            from concurrent.futures import ThreadPoolExecutor
            self._workers = ThreadPoolExecutor(max_workers=WORKERS,
                                               thread_name_prefix="sandlock-onbehalf")
        return self._workers


_instance: Supervisor | None = None
_instance_pid = 0
_instance_lock = threading.Lock()


def supervisor() -> Supervisor:
    """The process-wide supervisor, started on first use (and anew in a forked process,
    where the parent's thread does not exist)."""
    global _instance, _instance_pid
    if _instance is None or _instance_pid != os.getpid():
        with _instance_lock:
            if _instance is None or _instance_pid != os.getpid():
                _instance = Supervisor()
                _instance_pid = os.getpid()
    return _instance
