"""Starting a confined process: posix_spawn the trampoline (or call one a CLI-service
spare started ahead: Parked), hand its listener to the supervisor, let it exec.

The parent may be multi-threaded (the supervisor thread, the caller's threads), so no
Python code runs between fork and exec: posix_spawn (vfork + exec in glibc) starts the
C trampoline `_libexec/sandlock-exec`, which applies the prepared confinement with raw
syscalls and execs the program. Its steps and their order are documented in its source.
A failing step reaches the parent over a close-on-exec pipe as (step, errno); end-of-file
on that pipe means execve succeeded.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import socket
import struct
import sys

from . import libexec
from ._kernel import fileops, mount_ns
from ._kernel.fileops import AT_FDCWD
from ._kernel.pidfd import pidfd_getfd, pidfd_open, pidfd_send_signal
from .confinement import Confinement
from .errors import ChildError, ForkError, NotifError, SandboxError

HELPER = libexec.path("sandlock-exec")

# Must match the enum in sandlock-exec.c.
STEPS = ("listener", "arguments", "closing inherited fds", "chdir", "setrlimit",
         "securebits", "capability bounding set", "capset", "ambient capabilities",
         "no_new_privs", "landlock_restrict_self", "reading the seccomp program", "seccomp",
         "handshake", "close-on-exec", "execve", "subreaper", "user namespace",
         "uid/gid map", "mount propagation", "overlay mount", "overlay Landlock rule",
         "protecting the user's files", "child", "fork", "the parked start's call",
         "private /dev/shm")
_STEP = {name: i for i, name in enumerate(STEPS)}
_RECORD = struct.Struct("<ii")
_FD_STATUS, _FD_ACK, _FD_RULESET, _FD_BPF, _FD_PROTECT, _FD_CONTROL = 3, 4, 5, 6, 7, 8
_FD_PASSED, MAX_PASSED = 9, 64  # fds the program gets at 3, 4, ... (sandlock-exec.c)
SETUP_TIMEOUT = 10.0


class Spawned:
    """A started sandbox: the program's pid; its root (sandlock-init.c: the parent that
    keeps the tree and ends as the program ended), a pidfd on the root and the root's
    control socket (limits in, the reason of an end it decided out); any exec error."""

    def __init__(self, pid: int, root: int, pidfd: int, control: socket.socket,
                 exec_error: str | None, release=None):
        self.pid = pid
        self.root = root
        self.pidfd = pidfd
        self.control = control
        self.exec_error = exec_error
        self._release = release  # a held start: the program waits before its exec
        self.mount_ns = -1  # its own mount namespace, held (_kernel/mount_ns.py): ours

    def release(self) -> None:
        """Let a held program exec (spawn(hold=True)); sets exec_error if the exec failed."""
        if self._release is None:
            raise SandboxError("this sandbox was not held before its exec, or was released")
        release, self._release = self._release, None
        self.exec_error = release()

    def discard(self) -> None:
        """A held program that will never be released (it is being killed): release the
        channels its release would have used."""
        if self._release is not None:
            release, self._release = self._release, None
            release(discard=True)


def _read_record(sock: socket.socket, timeout: float, fds: list | None = None):
    """One (step, value) record, or None at EOF (one message each: SOCK_SEQPACKET); an fd
    it carries (SCM_RIGHTS) is appended to `fds`, any other closed. Raises TimeoutError
    past `timeout`."""
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    if not poller.poll(int(timeout * 1000)):
        raise TimeoutError
    data, ancdata, _, _ = sock.recvmsg(_RECORD.size, socket.CMSG_SPACE(4))
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            for (fd,) in struct.iter_unpack("i", payload[:len(payload) // 4 * 4]):
                if fds is not None:
                    fds.append(fd)
                else:
                    os.close(fd)
    if not data:
        return None
    if len(data) != _RECORD.size:
        raise SandboxError("the sandbox's setup channel sent a malformed record")
    return _RECORD.unpack(data)


def _file_actions(placements: list[tuple[int, int]]) -> list[tuple]:
    """dup2 each (source, target) without clobbering: sources go to scratch slots above
    every fd involved first, then to their targets."""
    scratch = max([s for s, _ in placements] + [t for _, t in placements]) + 1
    actions = []
    for i, (src, _) in enumerate(placements):
        actions.append((os.POSIX_SPAWN_DUP2, src, scratch + i))
    for i, (_, target) in enumerate(placements):
        actions.append((os.POSIX_SPAWN_DUP2, scratch + i, target))
    for i in range(len(placements)):
        actions.append((os.POSIX_SPAWN_CLOSE, scratch + i))
    return actions


def _helper_argv(conf: Confinement, ruleset, exe: bytes, argv: list[bytes],
                 cwd: str | None, overlay=None, passed: int = 0, parked: bool = False) -> list:
    """`overlay`: (lower, upper, work) of an overlay-backend workspace, or None; `passed`:
    how many fds from _FD_PASSED on the program gets (as 3, 4, ...); `parked`: the call
    comes later (Parked)."""
    rlimits = ",".join(f"{r}:{s}:{h}" for r, s, h in conf.rlimits) or "-"
    flags = ((1 if ruleset is not None else 0) | (2 if conf.subreaper else 0)
             | (4 if overlay is not None else 0) | (8 if conf.protect_fd >= 0 else 0)
             | (128 if conf.private_shm else 0)
             | (16 if conf.send_listener else 0) | (32 if conf.landlock_log else 0)
             | (64 if parked else 0) | passed << 8
             | _internal_signals_ignored() << 24)  # 32, 33: sandlock-exec.c's main
    rights = format(conf.overlay_rights, "x") if overlay is not None else "-"
    return [HELPER, cwd or "-", format(conf.keep_caps, "x"), str(conf.cap_last),
            "1" if conf.cap_sets is not None else "0", str(flags), rlimits,
            *(overlay or ("-", "-", "-")), rights, "--", exe] + argv


def spawn(conf: Confinement, exe: bytes, argv: list[bytes], env: dict[str, str],
          cwd: str | None, stdio: tuple[int, int, int], attach, overlay=None,
          run_rules: dict | None = None, ruleset_ready=None, hold: bool = False,
          pass_fds: tuple = (), on_program=None, shm: str | None = None) -> Spawned:
    """Start `exe` confined by `conf`; `stdio` are fds for 0/1/2 (-1 = inherit). With
    `hold`, the program stops short of its exec, confined and attached, until
    Spawned.release() (upstream's create()/start()).

    `attach(listener_fd, root)` hands our duplicate of the listener to the supervisor; it
    runs while the trampoline waits, before the program is exec'd. `root` is the pid of
    the sandbox's root (sandlock-init.c): every process of the sandbox descends from it. `ruleset_ready(fd)` sees the run's Landlock ruleset before
    the start (the guard's confined threads keep a duplicate). `shm`: the directory the
    trampoline binds over the sandbox's /dev/shm (conf.private_shm; named to it in `env`).
    """
    if not os.access(HELPER, os.X_OK):
        raise SandboxError(f"the sandlock-exec helper is missing ({HELPER}); build it with "
                           f"'make helper' or reinstall sandlock")
    if overlay is not None and cwd is None:
        # The working directory a process inherits is the directory itself, not its path:
        # the workdir's own, beneath the overlay mounted over it, where the program would
        # neither see its changes nor be able to make any. The trampoline enters it again
        # by path once the overlay is mounted.
        try:
            cwd = os.getcwd()
        except OSError:
            pass  # a removed directory: inherited as it is
    # A workspace run has rules of its own (its layer; the trampoline adds one for an
    # overlay mount): a ruleset for it alone.
    if overlay is not None or run_rules:
        ruleset = conf.run_ruleset(run_rules)
    else:
        ruleset = conf.ruleset
    parked = _take_parked(conf)
    if parked is not None and (overlay is not None or run_rules or hold or pass_fds
                               or ruleset is not conf.ruleset):
        parked.discard(reap=False)  # never for another kind of start (a pipe's stages)
        parked = None
    try:
        if ruleset_ready is not None and ruleset is not None:
            ruleset_ready(ruleset.fd)
        spawned = _spawn(conf, ruleset, exe, argv, env, cwd, stdio, attach, overlay, hold,
                         tuple(pass_fds), on_program, parked, shm)
    except BaseException:
        if parked is not None:  # not taken (nothing once _spawn sent it its call)
            parked.discard(reap=False)
        raise
    finally:
        if ruleset is not None and ruleset is not conf.ruleset:
            ruleset.close()
    if overlay is not None and ruleset is not None:
        # While this run goes on: an overlay run traps little. (A seccomp-backend run's
        # calls would wait for this thread's Python: /bin/true took 1 ms longer.)
        conf.build_next(run_rules)
    return spawned


def _begin(conf, ruleset, helper_argv: list, env, stdio, pass_fds=(),
           limits: bool = True) -> tuple:
    """posix_spawn the trampoline and read its fork's record: (root pid, pidfd on the root,
    status socket, control socket, ack pipe's write end, program pid), all the caller's;
    nothing left behind if it fails. `limits`: the root gets the limits now (else the
    caller sends them: a parked start's root then watches nothing while it waits)."""
    status, child_status = socket.socketpair(socket.AF_UNIX,
                                             socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    status_w = child_status.detach()
    control, root_control = socket.socketpair(socket.AF_UNIX,
                                              socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    for line in conf.control_lines if limits else ():  # queued: read before the program runs
        control.send(line)
    ack_r, ack_w = os.pipe2(os.O_CLOEXEC)
    ruleset_fd = ruleset.fd if ruleset is not None else conf.bpf_fd
    placements = [(fd, i) for i, fd in enumerate(stdio) if fd >= 0]
    placements += [(status_w, _FD_STATUS), (ack_r, _FD_ACK), (ruleset_fd, _FD_RULESET),
                   (conf.bpf_fd, _FD_BPF)]
    if conf.protect_fd >= 0:
        placements.append((conf.protect_fd, _FD_PROTECT))
    placements.append((root_control.fileno(), _FD_CONTROL))
    placements += [(fd, _FD_PASSED + i) for i, fd in enumerate(pass_fds)]
    try:
        pid = os.posix_spawn(
            HELPER, helper_argv, env, file_actions=_file_actions(placements), setpgroup=0,
            # Python's own ignored ones; the caller's SIGINT and SIGTERM stay as they are
            # (ignored under a shell's background job, nohup-like wrappers), as with
            # subprocess; a handler of Python's is reset by the exec. No setsigmask: the
            # calling thread's blocked signals stay blocked in the program, as with
            # subprocess (sandlock-exec.c gives the root a mask of its own).
            setsigdef=(signal.SIGPIPE, signal.SIGXFSZ))
    except OSError as e:
        for fd in (status_w, ack_r, ack_w):
            os.close(fd)
        status.close()
        control.close()
        root_control.close()
        raise ForkError(f"starting the sandbox failed: posix_spawn: {e.strerror}") from None
    os.close(status_w)
    os.close(ack_r)
    root_control.close()
    pidfd = -1
    try:
        pidfd = pidfd_open(pid)
        rec = _read_record(status, SETUP_TIMEOUT)
        if rec is None or rec[0] != _STEP["child"]:
            raise _setup_error(rec)
    except BaseException as e:
        status.close()
        control.close()
        os.close(ack_w)
        _kill_and_reap(pid, pidfd)
        if isinstance(e, TimeoutError):
            raise SandboxError(f"sandbox setup did not finish within {SETUP_TIMEOUT:.0f}s; "
                               f"the process was killed") from None
        raise
    return pid, pidfd, status, control, ack_w, rec[1]


# A parked start's call larger than this (a huge environment) starts afresh instead: one
# SOCK_SEQPACKET message, within the socket's default send buffer.
MAX_PARKED_CALL = 1 << 16


class Parked:
    """A trampoline started ahead of its call, by a CLI-service spare for the sandbox it
    built ahead (service/prepared.py: a sandbox built ahead is used only by a caller whose
    process attributes are the spare's, which the trampoline has). Forked already into the
    sandbox's root and the program's process, which waits outside any namespace and
    confinement for call(): its stdio, working directory, ignored and blocked signals,
    program, arguments and environment (sandlock-exec.c, receive_call); everything after
    that is a start's as ever. What it saves a call: posix_spawn, the trampoline's exec
    and its fork (~0.45 ms of a warm `sandlock run`, measured in the serving child). Used
    once, or discarded (killed, reaped)."""

    def __init__(self, conf: Confinement, begun: tuple):
        self.conf = conf
        self._begun = begun

    def call(self, exe: bytes, argv: list[bytes], env, cwd: str | None,
             stdio: tuple[int, int, int]) -> tuple | None:
        """Send the call; _begin()'s tuple, now the caller's. None if this call cannot be
        sent (too large): the parked start is discarded, and the caller starts afresh."""
        begun, self._begun = self._begun, None
        if begun is None:
            return None
        try:
            payload = _call_message(exe, argv, env, cwd)
            if len(payload) > MAX_PARKED_CALL:
                _discard(begun)
                return None
            for line in self.conf.control_lines:  # the root reads them as the program
                begun[3].send(line)                # sets up, ms before it runs
            here = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                socket.send_fds(begun[2], [payload], [fd if fd >= 0 else i
                                                      for i, fd in enumerate(stdio)] + [here])
            finally:
                os.close(here)
        except OSError:  # the parked start died meanwhile (killed...): nothing ran
            _discard(begun)
            return None
        except BaseException:  # an environment posix_spawn would refuse too (ValueError)
            _discard(begun)
            raise
        return begun

    def discard(self, reap: bool = True) -> None:
        begun, self._begun = self._begun, None
        if begun is not None:
            _discard(begun, reap)


def _call_message(exe: bytes, argv: list[bytes], env, cwd: str | None) -> bytes:
    """A parked start's call (sandlock-exec.c, receive_call), refusing what posix_spawn
    refuses (ValueError)."""
    items = env.items() if hasattr(env, "items") else env
    strings = []
    for k, v in items:
        k, v = os.fsencode(k), os.fsencode(v)
        if b"=" in k or b"\0" in k or b"\0" in v or not k:
            raise ValueError("illegal environment variable name")
        strings.append(k + b"=" + v)
    if not argv or any(b"\0" in a for a in [exe, *argv]):
        raise ValueError("embedded null byte")
    return b"".join([
        struct.pack("<QQ", _ignored_signals(), _blocked_signals()),
        os.fsencode(cwd) if cwd else b"-", b"\0", exe, b"\0",
        struct.pack("<I", len(argv)), *(a + b"\0" for a in argv),
        struct.pack("<I", len(strings)), *(e + b"\0" for e in strings)])


def _discard(begun: tuple, reap: bool = True) -> None:
    """Kill a parked start; reaped now, or (`reap` False: on a call's path, in a serving
    child, which exits after its call) left to be reaped with that process's end."""
    pid, pidfd, status, control, ack_w, _ = begun
    status.close()
    control.close()
    os.close(ack_w)
    if reap:
        _kill_and_reap(pid, pidfd)
        return
    try:
        pidfd_send_signal(pidfd, signal.SIGKILL)
    except OSError:
        pass
    os.close(pidfd)


def _internal_signals_ignored() -> int:
    """Whether this process ignores glibc's own signals 32 and 33 (bits 0 and 1), which
    glibc's posix_spawn ignores in every child. Asked at each start: glibc installs its
    handler of 33 when the process starts its first thread (a process started by make
    has both ignored until then)."""
    from ._kernel import interrupt
    return int(interrupt.disposition(32) == 1) | int(interrupt.disposition(33) == 1) << 1


def _ignored_signals() -> int:
    """This process's ignored signals (bit n-1: signal n), as a program it starts would
    inherit them."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("SigIgn:"):
                return int(line.split()[1], 16)
    return 0


def _blocked_signals() -> int:
    """The calling thread's blocked signals (bit n-1: signal n), which a program it
    starts with posix_spawn would inherit (sandlock-exec.c's set_blocked drops glibc's
    32 and 33)."""
    return sum(1 << (int(sig) - 1) for sig in signal.pthread_sigmask(signal.SIG_BLOCK, ()))


_parked: Parked | None = None  # this process's one parked start (a spare has one sandbox)


def park(conf: Confinement) -> None:
    """Start the trampoline of `conf`'s next plain start now (a spare, for its sandbox
    built ahead), replacing any parked before; spawn() takes it. A failure parks nothing."""
    global _parked
    discard_parked()
    if not os.access(HELPER, os.X_OK):
        return
    try:
        begun = _begin(conf, conf.ruleset, _helper_argv(
            conf, conf.ruleset, b"-", [b"-"], None, parked=True), os.environ, (-1, -1, -1),
            limits=False)
    except (SandboxError, OSError):
        return
    _parked = Parked(conf, begun)


def parked_for(conf: Confinement) -> bool:
    return _parked is not None and _parked.conf is conf


def discard_parked() -> None:
    global _parked
    parked, _parked = _parked, None
    if parked is not None:
        parked.discard()


def _take_parked(conf: Confinement) -> Parked | None:
    global _parked
    if _parked is None or _parked.conf is not conf:
        return None
    parked, _parked = _parked, None
    return parked


def _spawn(conf, ruleset, exe, argv, env, cwd, stdio, attach, overlay, hold,
           pass_fds=(), on_program=None, parked: "Parked | None" = None,
           shm: str | None = None) -> Spawned:
    if len(pass_fds) > MAX_PASSED:
        raise SandboxError(f"at most {MAX_PASSED} fds can be passed to a program")
    begun = parked.call(exe, argv, env, cwd, stdio) if parked is not None else None
    if begun is not None and os.environ.get("SANDLOCK_SERVICE_DEBUG"):
        print("sandlock: service: its trampoline started ahead took the call",
              file=sys.stderr)
    if begun is None:
        begun = _begin(conf, ruleset, _helper_argv(conf, ruleset, exe, argv, cwd, overlay,
                                                   len(pass_fds)), env, stdio, pass_fds)
    pid, pidfd, status, control, ack_w, program = begun
    passed: list[int] = []
    held = False
    own_ns = -1
    try:
        if on_program is not None:  # before it can do anything (it waits for our ack)
            on_program(program)
        if conf.cores:  # inherited by everything it starts; the filter refuses changes
            os.sched_setaffinity(program, conf.cores)
        rec = _read_record(status, SETUP_TIMEOUT, passed)
        if rec is None or rec[0] != _STEP["listener"]:
            raise _setup_error(rec)
        if conf.send_listener:
            if len(passed) != 1:
                raise NotifError("the sandbox did not pass its seccomp listener")
            listener = passed.pop()
        else:
            program_fd = pidfd_open(program)
            try:
                listener = pidfd_getfd(program_fd, rec[1])
            finally:
                os.close(program_fd)
        if overlay is not None or conf.protect_fd >= 0 or conf.private_shm:  # it has mounted
            own_ns = mount_ns.hold(program)
        mounts = {}
        if overlay is not None:
            # The overlay's mount, taken now, before the program runs: what the supervisor
            # later tells overlay objects by (supervisor.metadata, overlay_calls), never
            # the path again, which the sandbox could have pointed elsewhere (review: its
            # parent renamed, a plain directory made at the workdir's path).
            mounts["overlay_mount"] = fileops.mount_id(
                AT_FDCWD, f"/proc/{program}/root{overlay[0]}")
        if shm is not None:
            mounts["shm_mount"] = _private_shm_mount(program, shm)
        attach(listener, pid, **mounts)
        if hold:
            def release(status=status, ack_w=ack_w, discard=False):
                if discard:
                    os.close(ack_w)
                    status.close()
                    return None
                try:
                    return _release(status, ack_w, exe)
                except BaseException as e:
                    try:  # the Process owns the pidfd and reaps the root
                        pidfd_send_signal(pidfd, signal.SIGKILL)
                    except OSError:
                        pass
                    if isinstance(e, TimeoutError):
                        raise SandboxError(f"the program did not start within "
                                           f"{SETUP_TIMEOUT:.0f}s; it was killed") from None
                    raise
                finally:
                    status.close()
            held, ack_w = True, -1  # both are the release's now
            spawned = Spawned(program, pid, pidfd, control, None, release)
        else:
            ack, ack_w = ack_w, -1  # _release closes it
            spawned = Spawned(program, pid, pidfd, control, _release(status, ack, exe))
        spawned.mount_ns, own_ns = own_ns, -1
        return spawned
    except BaseException as e:
        mount_ns.close_later(own_ns)
        control.close()
        _kill_and_reap(pid, pidfd)
        if isinstance(e, TimeoutError):
            raise SandboxError(f"sandbox setup did not finish within {SETUP_TIMEOUT:.0f}s; "
                               f"the process was killed") from None
        if isinstance(e, OSError):
            raise NotifError(f"handing the seccomp listener to the supervisor failed: "
                             f"{e.strerror}") from None
        raise
    finally:
        for fd in passed:
            os.close(fd)
        if not held:
            status.close()
        if ack_w >= 0:
            os.close(ack_w)


def _private_shm_mount(program: int, shm: str) -> int | None:
    """The mount id of the program's /dev/shm if it is the bind of `shm` the trampoline
    made (the same directory), else None: then nothing there is the sandbox's own."""
    where = f"/proc/{program}/root/dev/shm"
    try:
        if os.stat(where)[1:3] == os.stat(shm, follow_symlinks=False)[1:3]:  # ino, dev
            return fileops.mount_id(AT_FDCWD, where)
    except OSError:
        pass
    return None


def _release(status: socket.socket, ack_w: int, exe: bytes) -> str | None:
    """Tell the trampoline to exec (closing `ack_w`); the exec's error, or None once the
    status channel closes with the exec (close-on-exec)."""
    try:
        os.write(ack_w, b"\x01")
    finally:
        os.close(ack_w)
    rec = _read_record(status, SETUP_TIMEOUT)
    if rec is None:
        return None
    if rec[0] != _STEP["execve"]:
        raise _setup_error(rec)
    error = f"execve {os.fsdecode(exe)}: {os.strerror(rec[1])}"
    if rec[1] == errno.EACCES:
        error += " (is it, and its interpreter, beneath fs_readable?)"
    return error


def _setup_error(rec) -> SandboxError:
    if rec is None:
        return ChildError("the sandbox exited during setup")
    step, err = rec
    name = STEPS[step] if 0 <= step < len(STEPS) else f"step {step}"
    detail = os.strerror(err) if err > 0 else "unexpected error"
    from .errors import STEP_ERRORS
    return STEP_ERRORS.get(name, ChildError)(f"sandbox setup failed at {name}: {detail} "
                                             f"({errno.errorcode.get(err, err)})")


def _kill_and_reap(pid: int, pidfd: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
    if pidfd >= 0:
        os.close(pidfd)
