"""A running sandbox: its Process (stdio streams, wait, communicate, kill, pause), and the
watch that makes sure an ended sandbox's root really ends (_RootWatch).

The sandbox is its root's process tree (sandlock-init.c): the Process waits on the root's
pidfd, which becomes readable only once every process of the sandbox is gone, and reads
the root's reason for an end it decided (max_memory) from its control socket.
"""

from __future__ import annotations

import dataclasses
import io
import os
import selectors
import signal
import socket
import struct
import threading
import time

from typing import TYPE_CHECKING

from . import process_tree
from ._kernel import mount_ns
from ._kernel.pidfd import pidfd_send_signal
from .errors import SandlockError
from .result import ExitReason, Result

if TYPE_CHECKING:
    from . import launch
    from .workspace_run import _Workspace
    from .supervisor.loop import Session

_DRAIN_AFTER_KILL = 2.0
# How long the root may take to end the tree once asked (sandlock-init.c: its kill rounds
# are bounded well below this); past it, this process kills the tree and the root itself.
_ROOT_GRACE = 10.0


class _Pipe(io.FileIO):
    """The parent end of a PIPED stream as an unbuffered binary file (Process.stdin,
    .stdout, .stderr). It owns the fd: closing it closes the fd once and tells the
    Process, which never closes that number itself afterwards (it may be reused)."""

    def __init__(self, proc: "Process", attr: str, mode: str):
        super().__init__(getattr(proc, attr), mode, closefd=True)
        self._owner = (proc, attr)

    def close(self) -> None:
        if not self.closed:
            proc, attr = self._owner
            setattr(proc, attr, -1)
        super().close()


class _RootWatch:
    """Once the root was asked to end the tree: if it has not ended within _ROOT_GRACE
    (it should always have: sandlock-init.c bounds its kill rounds), every member is
    killed from here, a few rounds (a fork in flight shows up in the next), then the root
    itself, so that nothing waiting for the sandbox can hang. Holds its own duplicate of
    the root's pidfd: the root it signals is always that process, never a reused pid."""

    def __init__(self, pidfd: int, root: int):
        self._fd = os.dup(pidfd)
        self._root = root
        self._lock = threading.Lock()
        self._timer = threading.Timer(_ROOT_GRACE, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        with self._lock:
            if self._fd < 0:
                return
            try:
                if not select_poll(self._fd).poll(0):  # alive: its pid is still its own
                    for _ in range(5):
                        process_tree.signal_members(self._root, signal.SIGKILL)
                        time.sleep(0.01)
                    pidfd_send_signal(self._fd, signal.SIGKILL)
            except OSError:
                pass
            finally:
                os.close(self._fd)
                self._fd = -1

    def cancel(self) -> None:
        self._timer.cancel()
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


_HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _signals_held:
    """In the main thread: the Python handlers of SIGINT, SIGTERM and SIGHUP (which raise,
    as the CLI's do) only note a signal meanwhile; each noted one is raised again at the
    end, to its handler. Elsewhere (no handler runs there), nothing to hold. A default
    action is left as it is: it ends the process, whose workdir commit is crash-safe."""

    def __enter__(self):
        self.saved, self.noted = {}, []
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in _HELD:
            handler = signal.getsignal(sig)
            if callable(handler):
                self.saved[sig] = handler
                signal.signal(sig, lambda signum, frame: self.noted.append(signum))
        return self

    def __exit__(self, *exc):
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)
        raised = None
        for sig in dict.fromkeys(self.noted):
            try:  # each to its handler, even after one raised
                signal.raise_signal(sig)
            except BaseException as e:
                raised = raised or e
        if raised is not None:
            raise raised
        return False


class Process:
    """A running sandboxed process. The sandbox is its whole process group: when the main
    process ends, or on kill()/timeout, every process left in the group is killed too."""

    def __init__(self, spawned: launch.Spawned, session: Session, parent_ends,
                 workspace: "_Workspace | None" = None):
        self._workspace = workspace
        self.pid = spawned.pid
        self.root = spawned.root  # sandlock-init.c: keeps and ends the process tree
        self._pidfd = spawned.pidfd  # the root's: it ends as the program ended
        self._control = spawned.control
        self._memory: int | None = None  # max_memory lowered by a policy_fn
        self._exec_error = spawned.exec_error
        self._spawned = spawned  # a held start is released through it (start())
        self._session = session
        self._stdin_fd, self._stdout_fd, self._stderr_fd = parent_ends
        self._pipes: dict[str, _Pipe] = {}
        self._status: tuple[ExitReason, int, int] | None = None
        self._killed_by_us: ExitReason | None = None
        self._lock = threading.Lock()
        self._cleanup: list = []  # run once every task is gone (its private TMPDIR)
        self._watch: _RootWatch | None = None  # once the root was asked to end the tree
        self._result: Result | None = None  # once ended and reported (wait, communicate)

    # -- lifecycle --

    @property
    def is_running(self) -> bool:
        return self._status is None and not self._exited(0)

    def _exited(self, timeout: float | None) -> bool:
        if self._pidfd < 0:
            return True
        p = select_poll(self._pidfd)
        return bool(p.poll(None if timeout is None else max(0, int(timeout * 1000))))

    def _end(self) -> None:
        """Ask the root to end the whole tree (it stops every member, kills them, reaps
        them, then ends as killed)."""
        if self._status is None and self._pidfd >= 0:
            try:
                pidfd_send_signal(self._pidfd, signal.SIGTERM)
            except OSError:
                pass
            if self._watch is None:
                self._watch = _RootWatch(self._pidfd, self.root)

    def start(self) -> None:
        """Let a program held before its exec (Sandbox.popen(hold=True)) run."""
        self._spawned.release()
        self._exec_error = self._spawned.exec_error

    def kill(self) -> None:
        self._killed_by_us = self._killed_by_us or ExitReason.KILLED
        self._end()

    def time_out(self) -> None:
        """Kill the whole sandbox because its time is up (reason TIMEOUT), unless it has
        already ended."""
        with self._lock:
            if self._status is None and self._killed_by_us is None and not self._exited(0):
                self._killed_by_us = ExitReason.TIMEOUT
                self._end()

    def pause(self) -> None:
        if self._status is None:
            process_tree.signal_members(self.root, signal.SIGSTOP)

    def resume(self) -> None:
        if self._status is None:
            process_tree.signal_members(self.root, signal.SIGCONT)

    def _reap(self) -> tuple[ExitReason, int, int]:
        """Collect the exit status: the root's, which ends only once every process of the
        sandbox is gone, as the program ended. Python's handlers of the ending signals
        wait for its end (_signals_held): a KeyboardInterrupt raised inside it left a
        workdir half-applied under a summary saying "applied", or a closed pidfd still
        in use (review)."""
        with self._lock, _signals_held():
            if self._status is None:
                try:
                    info = os.waitid(os.P_PIDFD, self._pidfd, os.WEXITED)
                except ChildProcessError:  # this process ignores SIGCHLD: the kernel
                    info = None            # reaped the root; its status is in its record
                if self._watch is not None:
                    self._watch.cancel()
                os.close(self._pidfd)
                self._pidfd = -1
                decided, told = self._root_messages()
                if info is not None and info.si_code == os.CLD_EXITED:
                    status = (ExitReason.EXITED, info.si_status, -1)
                elif info is not None:
                    status = (ExitReason.SIGNALED, -1, info.si_status)
                elif told is not None and os.WIFEXITED(told):
                    status = (ExitReason.EXITED, os.WEXITSTATUS(told), -1)
                elif told is not None and os.WIFSIGNALED(told):
                    status = (ExitReason.SIGNALED, -1, os.WTERMSIG(told))
                else:  # ended without a word (killed from outside): as killed
                    status = (ExitReason.SIGNALED, -1, int(signal.SIGKILL))
                if decided is not None and self._killed_by_us is None:
                    self._killed_by_us = decided
                if self._killed_by_us is not None:
                    status = (self._killed_by_us,) + status[1:]
                self._status = status
                if self._session.runtime is not None:
                    self._session.runtime.close(drain=self._killed_by_us is None)
                if self._session.protection is not None:
                    self._session.protection.threads.close()
                for cleanup in self._cleanup:
                    try:
                        cleanup()
                    except OSError:
                        pass
                try:
                    if self._workspace is not None:
                        self._workspace.finish(self._session,
                                               status[0] == ExitReason.EXITED
                                               and status[1] == 0)
                finally:
                    # Its mounts' teardown: after the layer is read and applied, off the
                    # caller's path (_kernel/mount_ns.py).
                    mount_ns.close_later(self._spawned.mount_ns)
                    self._spawned.mount_ns = -1
            return self._status

    def _lower_limits(self, memory: int | None = None, processes: int | None = None) -> None:
        """A policy_fn's restrict_max_memory / restrict_max_processes (lower only)."""
        if processes is not None:
            if self._session.forks is None:
                raise SandlockError("restrict_max_processes: forks are counted only with "
                                    "max_processes or 'process' in policy_fn_events")
            self._session.forks.lower(processes)
        if memory is not None:
            current = self._session.policy.limits.memory if self._session.policy.limits \
                else None
            memory = min(memory, current or memory, self._memory or memory)
            self._memory = memory
            try:
                self._control.send(b"memory %d" % memory)
            except OSError:
                pass
            import resource
            for pid in process_tree.members(self.root):
                try:  # from the next allocation of each live process
                    soft, hard = resource.prlimit(pid, resource.RLIMIT_DATA)
                    if hard == resource.RLIM_INFINITY or hard > memory:
                        resource.prlimit(pid, resource.RLIMIT_DATA, (memory, memory))
                except OSError:
                    pass

    def _root_messages(self) -> "tuple[ExitReason | None, int | None]":
        """What the root said as it ended (sandlock-init.c): why it ended the sandbox
        itself, if it did ('M': past max_memory), and the program's wait status ('W')."""
        reason, told = None, None
        try:
            while True:
                data = self._control.recv(16, socket.MSG_DONTWAIT)
                if not data:
                    break
                if data == b"M":
                    reason = ExitReason.MEMORY
                elif data[:1] == b"W" and len(data) == 5:
                    (told,) = struct.unpack("<i", data[1:])
        except OSError:
            pass
        self._control.close()
        return reason, told

    def wait(self, timeout: float | None = None) -> Result:
        """Wait for the sandbox to end and return its Result, as upstream Sandlock's
        Process.wait: at `timeout` every process of it is killed and the Result says
        TIMEOUT, so the wait never outlasts it. A piped stdin still open is closed first
        (a program reading to its end can then exit); piped stdout and stderr stay the
        caller's to read, and the Result carries neither. A second call returns the same
        Result. wait_code() is the subprocess-like spelling."""
        if self._result is not None:
            return self._result
        self._close_stdin()
        if self._status is None and not self._exited(timeout):
            self.time_out()
        self._finish(b"", b"")
        return self._result  # the same object at every call

    def wait_code(self, timeout: float | None = None) -> int:
        """Wait for exit; returns the exit code (negative signal number if signalled).
        Raises TimeoutError if `timeout` passes first (the process keeps running)."""
        if self._status is None and not self._exited(timeout):
            raise TimeoutError(f"sandboxed process {self.pid} still running after {timeout}s")
        reason, code, sig = self._reap()
        return code if sig < 0 else -sig

    @property
    def returncode(self) -> int | None:
        if self._status is None and not self._exited(0):
            return None
        _, code, sig = self._reap()
        return code if sig < 0 else -sig

    def communicate(self, input: bytes | None = None, timeout: float | None = None) -> Result:
        """Feed `input`, read stdout/stderr to the end, wait; kill the group at `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        out, err = bytearray(), bytearray()
        sel = selectors.DefaultSelector()
        sinks = {}
        if self._stdout_fd >= 0:
            sel.register(self._stdout_fd, selectors.EVENT_READ)
            sinks[self._stdout_fd] = out
        if self._stderr_fd >= 0:
            sel.register(self._stderr_fd, selectors.EVENT_READ)
            sinks[self._stderr_fd] = err
        pending = memoryview(input or b"")
        if self._stdin_fd >= 0:
            if pending:
                os.set_blocking(self._stdin_fd, False)
                sel.register(self._stdin_fd, selectors.EVENT_WRITE)
            else:
                self._close_stdin()
        if self._pidfd >= 0:
            sel.register(self._pidfd, selectors.EVENT_READ)
        drain_deadline = None
        try:
            while sinks or (self._pidfd >= 0 and self._status is None):
                now = time.monotonic()
                if deadline is not None and now >= deadline and drain_deadline is None:
                    self.time_out()
                    drain_deadline = now + _DRAIN_AFTER_KILL
                if drain_deadline is not None and now >= drain_deadline:
                    break  # a pipe held open by something outside the group: stop reading
                limits = [d for d in (deadline if drain_deadline is None else None,
                                      drain_deadline) if d is not None]
                wait = max(0.0, min(limits) - now) if limits else None
                for key, _ in sel.select(wait):
                    fd = key.fd
                    if fd == self._pidfd:
                        sel.unregister(fd)
                        self._reap()
                        if drain_deadline is None:
                            drain_deadline = time.monotonic() + _DRAIN_AFTER_KILL
                    elif fd == self._stdin_fd:
                        try:
                            n = os.write(fd, pending[:65536])
                            pending = pending[n:]
                        except (BrokenPipeError, BlockingIOError) as e:
                            if isinstance(e, BrokenPipeError):
                                pending = pending[:0]
                        if not pending:
                            sel.unregister(fd)
                            self._close_stdin()
                    else:
                        chunk = os.read(fd, 65536)
                        if chunk:
                            sinks[fd] += chunk
                        else:
                            sel.unregister(fd)
                            del sinks[fd]
        finally:
            sel.close()
        if self._status is None:
            self._end()
        return self._finish(bytes(out), bytes(err))

    def _finish(self, out: bytes, err: bytes) -> Result:
        """The Result of the ended sandbox (its workspace reported once)."""
        reason, code, sig = self._reap()
        if self._result is not None:
            return dataclasses.replace(self._result, stdout=out, stderr=err)
        result = Result(success=(reason == ExitReason.EXITED and code == 0),
                        exit_code=code, stdout=out, stderr=err,
                        error=self._error_text(reason), reason=reason, signal=sig,
                        denials=list(self._session.denials), flagged=self.flagged)
        if self._workspace is not None:
            self._workspace.report(result)
        self._result = dataclasses.replace(result, stdout=b"", stderr=b"")
        return result

    @property
    def changes(self) -> list:
        """What the run changed in its copy-on-write workdir (after it ended)."""
        return list(self._workspace.changes) if self._workspace is not None else []

    @property
    def workspace(self) -> "_Workspace | None":
        """The copy-on-write workspace of this run (outcome, commit(), abort())."""
        return self._workspace

    @property
    def exec_error(self) -> str | None:
        """Why execve failed (the process then exits 126/127), or None."""
        return self._exec_error

    def _error_text(self, reason: ExitReason) -> str | None:
        if self._exec_error:
            return self._exec_error
        if reason == ExitReason.TIMEOUT:
            return "timed out; every process of the sandbox was killed"
        if reason == ExitReason.MEMORY:
            limit = self._memory or self._session.policy.limits.memory
            return (f"its processes together went past max_memory ({limit} bytes); every "
                    f"process of the sandbox was killed")
        return None

    # -- the PIPED streams --

    @property
    def stdin(self) -> _Pipe | None:
        """With stdin=PIPED: a binary file writing to the program's stdin (close it to
        send EOF); else None."""
        return self._pipe("_stdin_fd", "w")

    @property
    def stdout(self) -> _Pipe | None:
        """With stdout=PIPED: a binary file reading the program's output as it comes."""
        return self._pipe("_stdout_fd", "r")

    @property
    def stderr(self) -> _Pipe | None:
        return self._pipe("_stderr_fd", "r")

    def _pipe(self, attr: str, mode: str) -> _Pipe | None:
        f = self._pipes.get(attr)
        if f is None or f.closed:
            if getattr(self, attr) < 0:
                return None
            f = self._pipes[attr] = _Pipe(self, attr, mode)
        return f

    def _close_fd(self, attr: str) -> None:
        f = self._pipes.get(attr)
        if f is not None and not f.closed:
            f.close()  # sets the attribute to -1
        elif getattr(self, attr) >= 0:
            os.close(getattr(self, attr))
            setattr(self, attr, -1)

    def _close_stdin(self):
        self._close_fd("_stdin_fd")

    def close(self) -> None:
        """Kill whatever is still running and release every fd."""
        self._spawned.discard()  # held before its exec and never started: it never runs
        if self._status is None:
            if not self._exited(0):
                self.kill()
            self._reap()
        for name in ("_stdin_fd", "_stdout_fd", "_stderr_fd"):
            self._close_fd(name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def would_deny(self) -> int:
        """Report-only: the policy_fn's refusals let through."""
        rt = self._session.runtime
        return rt.would_deny if rt is not None else 0

    @property
    def denials(self) -> list[dict]:
        return list(self._session.denials)

    @property
    def flagged(self) -> list[dict]:
        """Events a policy_fn flagged with "audit" (allowed, recorded)."""
        rt = self._session.runtime
        return list(rt.flagged) if rt is not None else []


def select_poll(fd: int):
    import select
    p = select.poll()
    p.register(fd, select.POLLIN)
    return p
