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
- Every answer goes through its session's gate (Session.respond): while a freeze holds the
  gate, answers wait, so a task blocked in a notification stays blocked (see freeze.py).
- With a policy_fn, the calls it may hold run entirely on a worker: the callback never
  runs on this thread, so one slow callback cannot stall other sandboxes.
- With the C fast path (fastpath.py) this thread waits inside the library, which answers
  some connects of eligible sandboxes itself; a notification it hands over arrives
  received, and is answered here exactly once like any other.
"""

from __future__ import annotations

import atexit
import collections
import errno
import os
import select
import signal
import sys
import threading
import time

from .._kernel import caps, interrupt, seccomp
from . import dispatch, names
from .fastpath import COW_PRISTINE, eligible, fast_path
from .freeze import Freeze, FreezeError
from .network import CONTINUE, Defer, Frozen, Inject, Replace
from . import reissue
from .reissue import Reissue
from .request import Denied, Request, thread_group
from .workers import Workers
from ..syscall_filter import creation_refusal


PENDING_CHECK = 0.2  # seconds between checks for deferred calls whose caller is gone
MAX_DEFERRED_PER_SANDBOX = 32
# Calls of one sandbox waiting for one of its MAX_DEFERRED workers: each is a task blocked
# in its notification (one at most per task), answered in order as workers free up. Those
# holding duplicates of the caller's fds (an on-behalf send or connect) take the
# supervisor's fds, which every sandbox shares: fewer of them wait.
MAX_BACKLOG_PER_SANDBOX = 4096
MAX_BACKLOG_FDS_PER_SANDBOX = 64
FREEZE_LIMIT = 1.0   # seconds to freeze a sandbox, and again for a released call to return
# Calls a policy_fn may hold: with one, their handlers run on a worker from the start.
HELD = frozenset({"connect", "sendto", "sendmsg", "sendmmsg", "bind", "execve", "execveat",
                  "open", "openat", "creat", *names.HANDLERS, "mkdir", "mkdirat", "mknod",
                  "mknodat", "unlink", "unlinkat", "rmdir", "truncate"})
# (Handlers of the copy-on-write workdir, supervisor.cow_calls, run on this thread: the
# layer's lock orders them with the ones a policy_fn makes run on workers.)


def _fds_held(guard) -> int:
    return 0 if guard is None else sum(1 for fd in (guard.fd, *guard.others) if fd >= 0)


class Session:
    """The supervisor's view of one sandbox: its policy and what was denied."""

    MAX_RECORDS = 1000

    def __init__(self, policy, name: str | None = None, net=None, runtime=None):
        self.policy = policy
        self.name = name
        self.net = net  # NetState when the network handlers are in use
        self.runtime = runtime  # supervisor.runtime.Runtime when there is a policy_fn
        self.cow = None         # sandlock.cow.CowLayer when there is a copy-on-write workdir
        self.own_mounts = False  # the sandbox has a mount namespace of its own
        self.overlay = False    # ... holding an overlay-backend workspace
        self.overlay_mount = None  # ... whose mount has this id (launch.spawn)
        self.shm_mount = None   # its private /dev/shm's mount id (launch.spawn), if any
        self.own_sockets: dict = {}  # socket link -> (pid, fd) where own_socket found it
        self.protection = None  # supervisor.guard.Protection: the user's files kept
        self.forks = None       # supervisor.forks.ForkBudget under max_processes
        self.user_handlers = None  # supervisor.user_handlers.UserHandlers (custom handlers)
        self.cow_max_disk = None
        self.fast = False       # the C fast path answers some of its connects (fastpath.py)
        self.denials: list[dict] = []
        self.denied_count = 0
        self.deferred = 0  # on-behalf calls in progress on worker threads
        self.backlog: collections.deque = collections.deque()  # calls waiting for one
        self.backlog_fds = 0  # fds the waiting calls hold
        self.root = 0      # set once started: every sandboxed process descends from it
        self.listener = -1
        self.released = threading.Event()
        # The gate: notifications received and not yet answered (id -> tid), and while a
        # freeze holds it, the answers waiting for the thaw.
        self._gate_lock = threading.Lock()
        self._inflight: dict[int, int] = {}
        self._held: list | None = None
        self.freeze_lock = threading.Lock()   # one freeze at a time
        self.memory_lock = threading.Lock()   # held by a freeze; taken to write child memory
        self.fd_budget_lock = threading.Lock()
        self.fds_in_flight = 0  # SCM_RIGHTS duplicates its sends hold (send.FD_BUDGET)

    def received(self, notif_id: int, tid: int) -> None:
        with self._gate_lock:
            self._inflight[notif_id] = tid

    def respond(self, notif_id: int, send, exempt: bool = False) -> None:
        """Send an answer now, or at the thaw if a freeze holds the gate. Checking the gate
        and sending happen under one lock: a freeze that saw a task as blocked in a
        notification can rely on it staying blocked."""
        with self._gate_lock:
            if self._held is not None and not exempt:
                self._held.append((notif_id, send))
                return
            self._inflight.pop(notif_id, None)
            send()

    def held_by_gate(self, tid: int) -> bool:
        """True if `tid` is blocked in a notification whose answer the gate holds. The
        notification must still be pending: an entry of a task that died (its tid now
        someone else's) does not count."""
        with self._gate_lock:
            if self._held is None:
                return False
            ids = [i for i, t in self._inflight.items() if t == tid]
        return any(seccomp.notif_id_valid(self.listener, i) for i in ids)

    def close_gate(self) -> None:
        with self._gate_lock:
            self._held = []

    def open_gate(self) -> None:
        with self._gate_lock:
            held, self._held = self._held or [], None
            for notif_id, send in held:
                self._inflight.pop(notif_id, None)
                send()

    def record_denial(self, req: Request, syscall: str, err: int, reason: str) -> None:
        self.denied_count += 1
        if len(self.denials) < self.MAX_RECORDS:
            self.denials.append({"time": time.time(), "pid": req.pid, "syscall": syscall,
                                 "errno": errno.errorcode.get(err, str(err)),
                                 "reason": reason})


class Supervisor:
    def __init__(self):
        self._dispatch = dispatch.table()
        self._epoll = select.epoll()
        self._sessions: dict[int, Session] = {}
        self._lock = threading.Lock()
        base = caps.capget()
        self._base_caps = base
        self._privileged = base.mask("permitted") != 0
        self._workers = None
        self._handler_workers = None  # custom handlers' own (_handler_pool)
        self._thread_state = threading.local()
        self._pending: set = set()  # (listener, notif id, Guard) of deferred calls
        self._pending_lock = threading.Lock()
        self._fast = fast_path()
        if self._fast is not None:
            self._fast.init()
        interrupt.prepare()
        _raise_fd_limit()
        self._thread = threading.Thread(target=self._serve, name="sandlock-supervisor",
                                        daemon=True)
        self._thread.start()
        atexit.register(self._kill_all)

    def _kill_all(self) -> None:
        """At interpreter exit the supervisor stops answering: end every sandbox it still
        serves rather than leave it running unsupervised (its trapped calls would fail)."""
        with self._lock:
            roots = [s.root for s in self._sessions.values() if s.root]
        for root in roots:  # each ends its tree (sandlock-init.c), then itself
            try:
                os.kill(root, signal.SIGTERM)
            except OSError:
                pass

    def attach(self, listener: int, session: Session, root: int) -> None:
        """Take ownership of `listener` and serve it until every task using it is gone."""
        session.root = root
        session.listener = listener
        if self._fast is not None and eligible(session, self._acts_with_caps(session)):
            fast = self._fast
            # TCP connects left to Landlock are continued in C, unless they must be judged
            # here to record a refusal (an audit log: supervisor.connect).
            net = session.net
            session.fast = fast.enable(listener, net is not None and net.tcp_by_landlock
                                       and net.audit is None, session.cow is not None,
                                       session.forks is not None)
            if session.fast and session.forks is not None:
                session.forks.lend_to(fast, listener)
            if session.fast and session.cow is not None:
                fast.cow_lower(listener, session.cow.lower)
                session.cow.on_first_change = lambda: fast.clear(listener, COW_PRISTINE)
        with self._lock:
            self._sessions[listener] = session
        if self._fast is not None:  # the epoll set and C's view of it, in one call
            # Speed only: the C wait polls few listeners directly, where this hint
            # survives (fastconnect.c, wait_events); Python's epoll wait would lose it.
            seccomp.notif_sync_wake_up(listener)
            self._fast.add(self._epoll.fileno(), listener)
        else:
            self._epoll.register(listener, select.EPOLLIN)

    def _drop(self, listener: int) -> None:
        with self._lock:
            session = self._sessions.pop(listener, None)
        if self._fast is None:
            try:
                self._epoll.unregister(listener)
            except OSError:
                pass
        else:
            self._fast.remove(self._epoll.fileno(), listener)
            # Before the number can serve another sandbox: nothing of this one may reach it.
            if session is not None and session.forks is not None:
                session.forks.lend_to(None, -1)
            self._fast.disable(listener)
            if session is not None and session.cow is not None:
                session.cow.on_first_change = None
        os.close(listener)
        if session is not None:
            session.released.set()

    def _serve(self) -> None:
        # This thread (and the C fast path's workers, which it starts and which inherit its
        # mask) takes no process signal: the application's handlers run in its threads.
        interrupt.only_interruptible()
        notif = seccomp.Notif()
        fast = self._fast
        while True:
            try:
                if fast is not None:  # the C fast path waits, and answers what it can
                    # Bounded even when idle: calls answered in C never wake this loop, and
                    # a worker may add a deferred call to watch meanwhile.
                    event = fast.wait(self._epoll.fileno(), PENDING_CHECK, notif)
                    self._thread_state.effective = None  # the wait dropped them
                    events = [event] if event is not None else []
                else:
                    events = [(fd, ev, False) for fd, ev in
                              self._epoll.poll(PENDING_CHECK if self._pending else -1)]
            except InterruptedError:
                continue
            if self._pending:
                self._abort_orphans()
            for fd, ev, received in events:
                try:
                    self._handle_event(fd, ev, notif, received)
                except Exception as e:  # the loop must outlive any single failure
                    print(f"sandlock: supervisor: {e!r}", file=sys.stderr)

    def _handle_event(self, fd: int, ev: int, notif, received: bool) -> None:
        with self._lock:
            session = self._sessions.get(fd)
        if session is None:
            if received:  # answered exactly once, even for a listener being dropped
                seccomp.notif_send(fd, notif.id, 0, -errno.EPERM)
            return
        if received or ev & select.EPOLLIN:
            if not received:
                try:
                    seccomp.notif_recv(fd, notif)
                except OSError:
                    return  # the task died between poll and recv (ENOENT)
            session.received(notif.id, notif.pid)
            try:
                self._answer(fd, session, notif)
            except Exception:  # received means answered: deny rather than leave it waiting
                self._send(Request(fd, notif), session, ("error", errno.EPERM))
                raise
        elif ev & (select.EPOLLHUP | select.EPOLLERR):
            self._drop(fd)

    def _acts_with_caps(self, session: Session) -> bool:
        return self._privileged and bool(session.policy.keep_caps
                                         & self._base_caps.mask("permitted"))

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
        req = Request(listener, notif, session.own_mounts)
        name, handler = self._dispatch.get(req.nr, (str(req.nr), None))
        refusal = creation_refusal(name, req.args)
        if refusal is not None:  # the filter's own rule, where NOTIFY replaced it
            session.record_denial(req, name, errno.EPERM, refusal)
            self._send(req, session, ("error", errno.EPERM))
            return
        if session.user_handlers is not None and req.nr in session.user_handlers:
            fields = (notif.flags, notif.data.arch, notif.data.instruction_pointer)
            if session.user_handlers.inline(req.nr):
                # sandlock's own recorders (explain): quick, never blocking, on this thread
                self._run_user(req, session, name, handler, fields, inline=True)
            else:  # the user's code: on workers of its own (supervisor.user_handlers)
                self._submit(req, session, self._run_user, req, session, name, handler,
                             fields, pool=self._handler_pool())
            return
        self._builtin(req, session, name, handler)

    def _builtin(self, req, session, name, handler) -> None:
        """The policy's own handling of a call, from the notification loop: what blocks
        goes to a worker."""
        if session.runtime is not None and name in HELD:
            self._submit(req, session, self._run_held, req, session, name, handler)
            return

        def run():
            if handler is None:
                raise Denied(errno.ENOSYS, "no handler for this syscall")
            self._act_as(session)
            return handler(req, session)
        result = self._complete(req, session, name, run)
        if isinstance(result, Reissue):
            self._submit(req, session, self._reissue, req, session, result)
            return
        if isinstance(result, Defer):
            # A blocking on-behalf call: finish it on a worker thread, with the same rules.
            # Worker threads keep the supervisor's full capabilities only as *permitted*:
            # they drop the effective set first, like this thread does.
            self._submit(req, session, self._finish_deferred, req, session, name, result.fn,
                         guard=result.guard, pool=result.pool)
            return
        self._send(req, session, result)

    def _submit(self, req, session, fn, *args, guard=None, pool=None) -> None:
        """Run fn(*args) on a worker. One sandbox may not occupy every worker: past its
        quota its calls wait in its backlog for one of its own to finish (a make -j or a
        pool of threads each blocked in a held call must not see EAGAIN from an exec or a
        fork); past the backlog's bound they fail with EAGAIN. A Defer's guard is
        registered so a dead caller aborts it."""
        entry = (req.listener, req.id, guard) if guard is not None else None
        with self._pending_lock:
            if session.deferred >= MAX_DEFERRED_PER_SANDBOX:
                fds = _fds_held(guard)
                if len(session.backlog) < MAX_BACKLOG_PER_SANDBOX and \
                        session.backlog_fds + fds <= MAX_BACKLOG_FDS_PER_SANDBOX:
                    session.backlog_fds += fds
                    session.backlog.append((req, fn, args, entry, pool))
                    if entry is not None:
                        self._pending.add(entry)
                    return
                refused = True
            else:
                refused = False
                session.deferred += 1
                if entry is not None:
                    self._pending.add(entry)
        if refused:
            if guard is not None:
                guard.close()
            self._send(req, session, ("error", errno.EAGAIN))
            return
        self._start(session, req, fn, args, entry, pool)

    def _start(self, session, req, fn, args, entry, pool) -> None:
        """Hand a call counted in session.deferred to a worker (and, if no worker can be
        started, deny it and try the next waiting call: a loop, never a recursion)."""
        call = (req, fn, args, entry, pool)
        while call is not None:
            req, fn, args, entry, pool = call
            try:
                (pool or self._pool()).submit(self._on_worker, session, entry, fn, *args)
                return
            except BaseException:  # no worker could be started: deny, never hang
                call = self._done(session, entry)
                if entry is not None:
                    entry[2].close()
                self._send(req, session, ("error", errno.EAGAIN))

    def _on_worker(self, session, entry, fn, *args) -> None:
        guard = entry[2] if entry is not None else None
        if guard is not None:
            guard.enter()
        try:
            fn(*args)
        finally:
            if guard is not None:
                guard.leave()
            call = self._done(session, entry)
            if call is not None:
                self._start(session, *call)

    def _done(self, session, entry):
        """A deferred call finished: returns the sandbox's next waiting call, now counted
        in session.deferred, for the caller to start, or None (one whose caller has gone
        meanwhile is answered, and its fds released, unrun)."""
        gone = []
        with self._pending_lock:
            session.deferred -= 1
            self._pending.discard(entry)
            nxt = None
            while session.backlog and session.deferred < MAX_DEFERRED_PER_SANDBOX:
                req, fn, args, waiting, pool = session.backlog.popleft()
                session.backlog_fds -= _fds_held(waiting[2] if waiting else None)
                if seccomp.notif_id_valid(req.listener, req.id):
                    nxt = (req, fn, args, waiting, pool)
                    session.deferred += 1
                    break
                self._pending.discard(waiting)
                gone.append((req, waiting))
        for req, waiting in gone:
            if waiting is not None:
                waiting[2].close()
            self._send(req, session, ("error", errno.EINTR))
        return nxt

    def _finish_deferred(self, req, session, name, fn) -> None:
        def run():
            self._act_as(session)
            return fn()
        self._send(req, session, self._complete(req, session, name, run))

    def _run_held(self, req, session, name, handler) -> None:
        """A call a policy_fn may hold, handled start to finish on this worker."""
        def run():
            if handler is None:
                raise Denied(errno.ENOSYS, "no handler for this syscall")
            self._act_as(session)
            result = handler(req, session)
            if isinstance(result, Defer) and result.pool is not None:
                return result  # it runs on its own pool (below)
            if isinstance(result, Defer):
                entry = (req.listener, req.id, result.guard)
                with self._pending_lock:
                    self._pending.add(entry)
                result.guard.enter()
                try:
                    return result.fn()
                finally:
                    result.guard.leave()
                    with self._pending_lock:
                        self._pending.discard(entry)
            return result
        result = self._complete(req, session, name, run)
        if isinstance(result, Frozen):
            self._run_frozen(req, session, name, result)
        elif isinstance(result, Reissue):
            self._reissue(req, session, result)
        elif isinstance(result, Defer):
            self._submit(req, session, self._finish_deferred, req, session, name, result.fn,
                         guard=result.guard, pool=result.pool)
        else:
            self._send(req, session, result)

    def _run_user(self, req, session, name, handler, fields, inline: bool = False) -> None:
        """A call with custom handlers (supervisor.user_handlers), on a worker (or, for
        sandlock's own quick recorders, `inline` on the loop): theirs first; then, if they
        all continue, the policy's own handling, as without them."""
        from . import user_handlers

        def decide():
            decided = user_handlers.decide(session, req, fields)
            if decided is not CONTINUE:
                return user_handlers.outcome(session, req, decided)
            return None
        result = self._complete(req, session, f"handler:{name}", decide)
        if result is user_handlers.HOLD:
            req.close()
            return
        if result is not None:
            self._send(req, session, result)
            return
        sends = self._complete(req, session, name,
                               lambda: user_handlers.policy_sends(session, req, fields))
        if sends is True and inline:
            self._builtin(req, session, name, handler)  # as if no handler were there
        elif sends is True:
            self._run_held(req, session, name, handler)
        else:  # the kernel performs it (or an error replaying the filter refuses it)
            self._send(req, session, CONTINUE if sends is False else sends)

    def _run_frozen(self, req, session, name, frozen: Frozen) -> None:
        """Freeze the sandbox, decide with frozen.body() and answer from inside the freeze
        (see freeze.py). A freeze that cannot be established denies."""
        responded = []

        def respond(result):
            responded.append(result)
            self._send(req, session, result, exempt=True)

        def body():
            result = self._complete(req, session, name, frozen.body)
            return result, result is CONTINUE
        budget = FREEZE_LIMIT + (session.runtime.timeout if session.runtime else 0.0)
        if not session.freeze_lock.acquire(timeout=budget):
            self._deny_unfrozen(req, session, name, "another freeze of this sandbox is "
                                                    "still in progress")
            return
        try:
            with session.memory_lock:
                session.close_gate()
                try:
                    tgid = thread_group(req.pid)
                    Freeze(session, req, tgid, FREEZE_LIMIT,
                           session.runtime.timeout if session.runtime else 0.0
                           ).run(body, respond, frozen.after)
                except (FreezeError, OSError) as e:
                    if not responded:
                        self._deny_unfrozen(req, session, name, str(e))
                except Exception as e:
                    if not responded:
                        self._deny_unfrozen(req, session, name, f"supervisor error: {e!r}")
                finally:
                    session.open_gate()
        finally:
            session.freeze_lock.release()

    def _reissue(self, req, session, result) -> None:
        """Re-issue a call with other arguments (supervisor.reissue): ptrace, so never
        beside a freeze of the same sandbox."""
        if not session.freeze_lock.acquire(timeout=FREEZE_LIMIT + 1.0):
            self._send(req, session, ("error", errno.EAGAIN))
            return
        try:
            reissue.run(req, session, result)
        finally:
            session.freeze_lock.release()

    def _deny_unfrozen(self, req, session, name, reason: str) -> None:
        session.record_denial(req, name, errno.EPERM, reason)
        if session.runtime is not None:
            session.runtime.record_refusal(req.pid, name, reason)
        self._send(req, session, ("error", errno.EPERM), exempt=True)

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

    def _send(self, req, session, result, exempt: bool = False) -> None:
        req.close()
        if isinstance(result, (Inject, Replace)):
            def send_fd():
                try:
                    if isinstance(result, Inject):
                        seccomp.notif_addfd_send(req.listener, req.id, result.fd,
                                                 result.cloexec)
                    else:  # replaced (as dup2), then the call goes on in the kernel
                        seccomp.notif_addfd_at(req.listener, req.id, result.fd,
                                               result.target, result.cloexec)
                        seccomp.notif_send(req.listener, req.id, 0, 0,
                                           seccomp.USER_NOTIF_FLAG_CONTINUE)
                except OSError as e:  # e.g. EMFILE in the child: the call fails with it
                    try:               # (never goes on with the fd not replaced)
                        seccomp.notif_send(req.listener, req.id, 0, -(e.errno or errno.EPERM))
                    except OSError:
                        pass
                finally:
                    os.close(result.fd)
            session.respond(req.id, send_fd, exempt)
            return
        if result is CONTINUE:
            val, err, flags = 0, 0, seccomp.USER_NOTIF_FLAG_CONTINUE
        elif isinstance(result, tuple):
            val, err, flags = 0, -result[1], 0
        elif isinstance(result, int):
            val, err, flags = result, 0, 0
        else:  # a handler bug: never let an unexpected value allow anything
            val, err, flags = 0, -errno.EPERM, 0

        def send():
            try:
                seccomp.notif_send(req.listener, req.id, val, err, flags)
            except OSError:
                pass
        session.respond(req.id, send, exempt)

    def _handler_pool(self) -> Workers:
        """Custom handlers run the user's code, which may block past its sandbox's end:
        they have workers of their own, so that they can never take the on-behalf ones
        every sandbox shares."""
        with self._lock:
            if self._handler_workers is None:
                from .user_handlers import MAX_WORKERS
                self._handler_workers = Workers("sandlock-handler", limit=MAX_WORKERS)
            return self._handler_workers

    def _pool(self) -> Workers:
        if self._workers is None:
            self._workers = Workers()
        return self._workers


def _raise_fd_limit() -> None:
    """The supervisor holds duplicates of its sandboxes' fds while it acts for them: let it
    use its whole hard limit rather than the 1,024 soft default."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass


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
