"""One call, in a CLI service child (server.py forks the children): the peer checked,
its request read, its state taken, today's CLI run with it, its status told.

Protocol (SOCK_SEQPACKET, one message each):
  client -> child: the request, with fds [stdin, stdout, stderr, cwd] (see _parse)
  child -> client: b"A" (accepted) or b"F" + reason (fall back: run the CLI in-process);
                   a refused peer gets its "F" before the child reads anything
  client -> child: b"G" (go: the client still waits; without it nothing runs, so a client
                   that gave up and fell back never runs the command twice)
  child -> client: b"F" if "go" did not come within REPLY_WAIT, or if this process
                   could not take the caller's state (nothing ran)
  client -> child: b"S" + signal number, for each signal the client receives
  child -> client: b"X" + int32 exit status, last
A client that disappears (EOF) is handled as the in-process CLI killed by SIGKILL: the
child dies, and with it (PR_SET_PDEATHSIG in sandlock-init.c) the sandbox. The client
checks the service in turn (sandlock-client.c): a socket that a confined process of the
user's put in the service's place is never handed anything.
"""

from __future__ import annotations

import _thread
import os
import signal
import socket
import struct
import sys
import threading
import time

from .. import private_tmp
from . import peer, prepared

REPLY_WAIT = 2.0      # seconds a child waits for a client's request, then for its "go"
MAX_REQUEST = 1 << 20
MAGIC = b"SLK1"
KIND_RUN, KIND_STATUS, KIND_STOP = 1, 2, 3
NFDS = 4


def _parse(msg: bytes) -> dict:
    """The client's request (integers little-endian; strings NUL-terminated):
    MAGIC, u32 kind, u32 argc, argv, u32 envc, env."""
    if not msg.startswith(MAGIC):
        raise ValueError("not a sandlock client")
    pos = len(MAGIC)

    def u32():
        nonlocal pos
        (v,) = struct.unpack_from("<I", msg, pos)
        pos += 4
        return v

    def strings(n):
        nonlocal pos
        out = []
        for _ in range(n):
            end = msg.index(b"\0", pos)
            out.append(os.fsdecode(msg[pos:end]))
            pos = end + 1
        return out

    kind = u32()
    argv = strings(u32())
    env = strings(u32())
    if pos != len(msg):
        raise ValueError("trailing bytes")
    return {"kind": kind, "argv": argv, "env": env}


def _passed(anc) -> list[int]:
    """The fds a message carried (SCM_RIGHTS), now this process's."""
    fds: list[int] = []
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.extend(struct.unpack(f"{len(data) // 4}i", data[:len(data) // 4 * 4]))
    return fds


def _recv_request(conn: socket.socket):
    conn.settimeout(REPLY_WAIT)
    msg, anc, flags, _ = conn.recvmsg(MAX_REQUEST, socket.CMSG_SPACE(NFDS * 4))
    return msg, _passed(anc), flags


def _discard(conn: socket.socket) -> None:
    """Drop the request (closing the fds it carries) if it comes within 10 ms (the client
    sends it right after its own checks): a socket closed with unread data resets its
    peer (ECONNRESET), which would then not read the refusal sent before. A refused peer
    holds a child no longer than that."""
    try:
        conn.settimeout(0.01)
        _, anc, _, _ = conn.recvmsg(MAX_REQUEST, socket.CMSG_SPACE(NFDS * 4))
    except OSError:
        return
    for fd in _passed(anc):
        os.close(fd)


def serve_one(conn: socket.socket, started: float, client: bytes | None,
              committed, mine: tuple | None = None) -> bool:
    """In a child: one connection. False if nothing of this process changed (a refused
    peer, a malformed request, status, stop): the child then takes the next connection,
    so that connections it refuses cost no warmed child. Otherwise the client's request,
    to its exit status, and True (the child exits). `committed()` tells the service the
    child is taken before anything of it changes; `mine`: peer.own(), read while waiting."""
    fds: list[int] = []
    taken = False
    try:
        why, attrs = peer.inspect(conn, client, mine)
        if why is not None:  # before reading anything: a refused peer holds nothing up
            conn.send(b"F" + why.encode()[:400])
            _discard(conn)
            return False
        msg, fds, flags = _recv_request(conn)
        try:
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                raise ValueError("too large")
            req = _parse(msg)
        except (ValueError, struct.error, IndexError) as e:
            conn.send(b"F" + f"malformed request ({e})".encode()[:400])
            return False
        if req["kind"] == KIND_STATUS:
            conn.send(b"A" + f"pid {os.getppid()}\nsocket {conn.getsockname()}\n"
                             f"up {time.time() - started:.0f}s\n".encode())
            return False
        if req["kind"] == KIND_STOP:
            os.kill(os.getppid(), signal.SIGTERM)
            conn.send(b"A")
            return False
        why = "malformed request" if req["kind"] != KIND_RUN or len(fds) != NFDS else None
        if why is None and not attrs["client"]:
            why = "the caller does not run the sandlock client"
        if why is not None:
            conn.send(b"F" + why.encode()[:400])
            return False
        committed()
        taken = True
        # Accepted before this process is set up, which overlaps the client's answer: its
        # "go" is awaited in _run. A setup that fails is told with "F" (the client falls
        # back; nothing ran).
        conn.send(b"A")
        try:
            why = peer.take_on(attrs)
        except Exception as e:  # any failure is a refusal after the "A" (review)
            why = f"cannot take the caller's attributes ({e!r})"
        if why is not None:
            _refuse_late(conn, why)
            return True
        prepared.CALLER = {k: v for k, v in attrs.items()
                           if k not in ("ignored", "blocked", "client")}
        ready = fds
        fds = []
    except OSError:  # the peer went away: reused unless this process was taken
        return taken
    finally:
        for fd in fds:
            os.close(fd)
    try:  # before the client's "go" is read: a failure here lets it fall back
        for i in range(3):
            os.dup2(ready[i], i)
        os.fchdir(ready[3])
        for fd in ready:
            os.close(fd)
        _take_environment(dict(e.split("=", 1) for e in req["env"] if "=" in e))
        import tempfile
        tempfile.tempdir = None  # the caller's TMPDIR (a private /tmp is made there), as
        peer.take_signals(attrs)  # a CLI started by the caller would find it
    except Exception as e:  # an environment the process cannot take (a name with "="...)
        _refuse_late(conn, f"cannot take the caller's state ({e})")
        return True
    try:
        _run(conn, req["argv"])
    finally:  # its private TMPDIR (a no-go's, a run's once its status is sent, or
        private_tmp.remove_all()  # what escaped _run: a relayed SIGINT before the CLI's...)
    return True


def _refuse_late(conn: socket.socket, why: str) -> None:
    """An "F" after the "A": the client falls back (nothing ran)."""
    try:
        conn.send(b"F" + why.encode()[:400])
        conn.recv(16)  # its "go": closed unread, it would cost the client the "F"
    except OSError:
        pass


def _take_environment(env: dict[str, str]) -> None:
    """os.environ becomes `env`, changing only what differs (the service's own, which
    this process has, is mostly the caller's)."""
    for name in [n for n in os.environ if n not in env]:
        del os.environ[name]
    for name, value in env.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


def _run(conn: socket.socket, argv: list[str]) -> None:
    done = threading.Event()
    went = threading.Event()
    main_thread = threading.get_ident()
    go: list[bytes] = []

    def relay():
        """The client's "go" first (within REPLY_WAIT: the socket's timeout); then the
        signals the client received reach this process as they would have reached the
        in-process CLI; the client gone is the CLI killed."""
        try:
            go.append(conn.recv(16))
            conn.settimeout(None)
        except OSError:  # TimeoutError included
            pass
        went.set()
        if go != [b"G"]:
            return
        while True:
            try:
                m = conn.recv(16)
            except OSError:
                m = b""
            if done.is_set():
                return
            if not m:
                try:  # the one thing SIGKILL would leave (review), within a second
                    private_tmp.remove_all(within=1.0)
                finally:
                    os.kill(os.getpid(), signal.SIGKILL)
            if m[:1] == b"S" and len(m) >= 2:
                # To the main thread, where its handler runs: directed at the process, a
                # signal could be taken by this thread and leave the main one in its wait
                # (review: SIGTERM then SIGHUP hung a run until its program ended).
                signal.pthread_kill(main_thread, m[1])
    # Started before the "go" is read: its start overlaps the client's answer. A bare
    # thread: threading.Thread.start() waits for it to run (~0.3 ms here); this process
    # exits with os._exit, and joins no thread.
    _thread.start_new_thread(relay, ())
    prepared.check_early()  # meanwhile the "go" comes
    went.wait(REPLY_WAIT + 1.0)  # bounded by the socket's timeout; this one is a backstop
    if go != [b"G"]:
        try:  # the client, if still there, falls back: nothing ran
            conn.send(b"F" + b"no go")
        except OSError:
            pass
        return
    sys.argv = ["sandlock", *argv]
    from ..cli import _HungUp, _ending_signals, main
    if argv[:1] in (["run"], ["net-run"]):
        _ending_signals()  # as the CLI's _run does, from the go on: relayed from now on
    try:
        status = main(argv)
    except SystemExit as e:
        code = e.code
        if isinstance(code, str):
            print(code, file=sys.stderr)
            code = 1
        status = 0 if code is None else int(code)
    except KeyboardInterrupt as e:
        status = 128 + signal.SIGHUP if isinstance(e, _HungUp) else 130
    except BaseException:
        import traceback
        traceback.print_exc()
        status = 1
    done.set()  # a signal relayed from now on finds the command over: not raised here
    import atexit
    private_tmp.removal_after_exit()  # serve_one removes them, once the status is sent
    atexit._run_exitfuncs()  # as the in-process CLI's exit runs them, before the status
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    # The caller's stdio let go before its status: a caller reading our stdout to its
    # end (a pipe) would otherwise wait for this process's exit, not the command's.
    try:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
    except OSError:
        pass
    try:
        conn.send(b"X" + struct.pack("<i", status))
    except OSError:
        pass
    prepared.after_call()
