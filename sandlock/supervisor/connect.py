"""connect() and listen(): where a socket may connect to, and whether it may listen.

Decisions follow sandlock.supervisor.network (copy once, decide, act on our duplicate).
Every stream connect finishes on a worker thread; see connect_action.
"""

from __future__ import annotations

import errno
import os
import socket
import struct

from .._kernel import sockets
from .network import (AF_INET, AF_INET6, AF_UNIX, AF_UNSPEC, CONTINUE, SOCK_DGRAM,
                      SOCK_STREAM, Frozen, abstract_granted, deny, inet_verdict, parse_sockaddr,
                      proc_fd_sockaddr, protocol_of, run_action, single_threaded,
                      socket_info_of, unix_target)
from .fastpath import expiry, fast_path
from .request import Denied, Request

def connect(req: Request, session):
    net = session.net
    # Threads are counted before the fd is duplicated. Counted after, a second thread could
    # swap the fd for another socket (UDP, which Landlock does not check) right after our
    # duplicate and exit before the count: the kernel would then re-read the other socket.
    # Counted before, a caller found alone stays alone (it is blocked here) and an exited
    # thread has released the fd table before it leaves the count.
    single = single_threaded(req.pid)
    fd = req.dup_fd(req.arg_int(0))
    try:
        domain, stype, proto = socket_info_of(fd)
        addrlen = req.args[2] & 0xFFFFFFFF
        if not 2 <= addrlen <= 128:
            raise Denied(errno.EINVAL, "bad address length")
        if domain not in (AF_UNIX, AF_INET, AF_INET6):
            # Netlink: no destination policy. The kernel may redo the call only if no other
            # thread can swap this fd for an inet socket meanwhile; else we connect it.
            if single:
                os.close(fd)
                return CONTINUE
            raw = req.read_bytes(req.args[1], addrlen)
            return run_action(fd, False, lambda: _connect(fd, raw))
        landlock_decides = (domain != AF_UNIX and stype == SOCK_STREAM and net.tcp_by_landlock
                            and session.runtime is None and single)
        if landlock_decides and net.audit is None:
            os.close(fd)
            return CONTINUE  # Landlock checks the port in the kernel, whatever is re-read
        dest = parse_sockaddr(req.read_bytes(req.args[1], addrlen))
        if landlock_decides and dest.family in (AF_INET, AF_INET6):
            # With an audit log: a refusal is recorded here; what the rules allow continues
            # and Landlock still checks the port on what the kernel re-reads.
            inet_verdict(req, session, "connect", "tcp", dest)
            os.close(fd)
            return CONTINUE
    except BaseException:
        os.close(fd)
        raise
    if domain == AF_UNIX:
        return _connect_unix(req, session, fd, dest, stype)
    if dest.family == AF_UNSPEC:  # dissolving a UDP association
        return connect_action(fd, dest.raw, stype)
    if dest.family not in (AF_INET, AF_INET6):
        os.close(fd)
        raise Denied(errno.EAFNOSUPPORT, "address family does not match the socket")
    protocol = protocol_of(domain, stype, proto)
    learns = session.fast and protocol == "tcp" and dest.family == domain
    generation = fast_path().generation if learns else 0
    # Before the decision: the names live now include every name the decision can see, so
    # the first of their expiries is never later than the verdict's real lifetime.
    expires = expiry(session, dest.address) if learns else None
    if net.is_dns(dest):
        if protocol == "tcp":  # a worker: even a local connect can wait on a full backlog
            return run_action(fd, True, lambda: _redirect_dns(req, session, fd, domain))
        os.close(fd)
        deny(req, session, "connect", "connected UDP DNS cannot be filtered per query; "
              "resolvers use TCP in sandboxes (RES_OPTIONS=use-vc)", errno.EPERM,
              protocol=protocol, address=str(dest.address), port=dest.port, rule="default:dns")
    try:
        names = inet_verdict(req, session, "connect", protocol, dest)
    except BaseException:
        os.close(fd)
        raise
    if protocol == "tcp" and net.http_filtered(dest, names):
        # The endpoint policy admits the destination; the HTTP filter judges each request
        # (netpolicy.http_proxy) and connects there itself once one is allowed.
        from netpolicy.http_proxy import http_proxy
        ctx = net.http_context(req, session, dest, fd)
        return run_action(fd, True, lambda: _redirect(fd, domain, http_proxy(), ctx))
    if learns:
        # A plain allowed TCP connect: the C fast path may replay this verdict (fastpath.py)
        fast_path().learn(req.listener, domain, dest.raw, expires, generation)
    # The pidfd behind our duplicate was checked with ID_VALID when it was opened, so the
    # socket is the caller's even if the caller has died since.
    return connect_action(fd, dest.raw, stype)


def _connect_unix(req, session, fd, dest, stype):
    try:
        if dest.family != AF_UNIX:
            raise Denied(errno.EINVAL, "address family does not match the socket")
        if dest.path is None:
            # Abstract names: never CONTINUE (another process sharing the memory could turn
            # the name into a path before the kernel re-reads it), and an on-behalf connect
            # is outside Landlock's scope, so only names the policy grants are reachable.
            abstract_granted(req, session, "connect", dest)
            return connect_action(fd, dest.raw, stype)
        target = unix_target(req, session, "connect", dest)
    except BaseException:
        os.close(fd)
        raise
    return connect_action(fd, proc_fd_sockaddr(target), stype, target)


def _connect(fd: int, raw: bytes) -> int:
    sockets.connect(fd, raw)
    return 0


def _redirect_dns(req, session, fd, domain):
    """Connect the child's TCP socket to our DNS responder instead of its nameserver."""
    return _redirect(fd, domain, session.net.dns_proxy(), session.net.dns_context(req))


def _redirect(fd, domain, proxy, ctx):
    """Connect the child's TCP socket to one of our loopback responders (DNS, HTTP filter)
    instead of where it asked, registered under the socket's own address with `ctx`."""
    host, port = proxy.address
    if domain == AF_INET6:
        mapped = socket.inet_pton(AF_INET6, "::ffff:" + host)
        local = struct.pack("<H", AF_INET6) + b"\0\0" + b"\0" * 4 + mapped + b"\0" * 4
        remote = (struct.pack("<H", AF_INET6) + struct.pack("!H", port) + b"\0" * 4 + mapped
                  + b"\0" * 4)
    else:
        local = struct.pack("<H", AF_INET) + b"\0\0" + socket.inet_aton(host) + b"\0" * 8
        remote = (struct.pack("<H", AF_INET) + struct.pack("!H", port) + socket.inet_aton(host)
                  + b"\0" * 8)
    try:
        sockets.bind(fd, local)
    except OSError as e:
        if e.errno != errno.EINVAL:  # EINVAL: already bound, keep that address
            raise
    client = struct.unpack_from("!H", sockets.getsockname(fd), 2)[0]
    proxy.expect((host, client), ctx)
    try:
        sockets.connect(fd, remote)
    except OSError as e:
        if e.errno not in (errno.EINPROGRESS, errno.EALREADY, errno.EINTR):
            proxy.forget((host, client), ctx)  # no connection will claim it
        raise
    return 0


def connect_action(fd: int, raw: bytes, stype: int, *closers):
    """Connect our duplicate as the child asked. Datagram connects never block and are
    answered here; every stream connect finishes on a worker: whether the socket blocks is
    a flag the sandbox can flip at any moment (it is shared through the open file), so the
    supervisor thread itself never calls a connect() that could wait on the network."""
    return run_action(fd, stype != SOCK_DGRAM, lambda: _connect(fd, raw), *closers)


def listen(req: Request, session):
    """listen() on an unbound inet socket binds an ephemeral port without passing Landlock's
    bind check: refused unless the policy lets the sandbox bind port 0.

    The kernel records who called listen() as the listening socket's credentials, which
    every client that connects reads (SO_PEERCRED, SO_PEERPIDFD) to learn whom it talks
    to: performed here, a sandboxed server would pass for its unconfined supervisor. So
    the call continues in the caller's own context whenever that cannot change the
    outcome: when the policy allows an ephemeral port (nothing to check), or when the
    caller has a single thread (checked on a duplicate of the fd, which the kernel's
    re-read cannot then differ from: network.py; counted before the duplicate, as
    connect() does). Only a multi-threaded caller that may not bind an ephemeral port has
    its listen() performed here, with the supervisor's credentials (docs/threat-model.md)."""
    bind = session.policy.tcp_bind
    if bind.any_port or 0 in bind.ports:
        return CONTINUE
    single = single_threaded(req.pid)
    fd = req.dup_fd(req.arg_int(0))
    try:
        domain, stype, _ = socket_info_of(fd)
        if domain in (AF_INET, AF_INET6) and stype == SOCK_STREAM:
            port = struct.unpack_from("!H", sockets.getsockname(fd), 2)[0]
            if port == 0:
                raise Denied(errno.EACCES, "listen() on an unbound socket would bind an "
                             "ephemeral port; allow net_allow_bind=[0] or bind() first")
    except BaseException:
        os.close(fd)
        raise
    if single:
        os.close(fd)
        return CONTINUE
    backlog = req.arg_int(1)
    return run_action(fd, False, lambda: (sockets.listen(fd, backlog), 0)[1])


def bind(req: Request, session):
    """bind() under a policy_fn (trapped only then): the callback sees inet binds. The call
    continues in the kernel, whose Landlock rules still decide the port, under a freeze
    (supervisor.freeze); once it returned, the address the socket took must be the one the
    callback judged (the kernel may still have written into the address meanwhile:
    network.Frozen), or the process is killed before it uses it."""
    judged: dict = {}
    return Frozen(lambda: _bind_decide(req, session, judged),
                  lambda outcome: _bound(req, session, judged, outcome))


def _bound(req: Request, session, judged: dict, outcome: str) -> str | None:
    if outcome != "returned" or "event" not in judged:
        return None
    from .._kernel.pidfd import pidfd_getfd, pidfd_open
    event = judged["event"]
    try:
        pidfd = pidfd_open(event.pid)  # stopped: its number cannot be reused meanwhile
        try:
            fd = pidfd_getfd(pidfd, judged["fd"])
        finally:
            os.close(pidfd)
        try:
            name = sockets.getsockname(fd)
        finally:
            os.close(fd)
    except OSError as e:
        refusal = f"the bound address could not be checked ({e.strerror})"
    else:
        port = struct.unpack_from("!H", name, 2)[0]
        domain = judged["domain"]
        address = socket.inet_ntop(domain, name[4:8] if domain == AF_INET else name[8:24])
        refusal = None
        unspecified = event.host in ("0.0.0.0", "::")
        if port and ((event.port and port != event.port)
                     or (not unspecified and address != event.host)):
            refusal = (f"the socket was bound to {address} port {port}, not the judged "
                       f"{event.host} port {event.port}")
    if refusal is not None:
        refusal += "; the process was killed before it could use the socket"
        session.runtime.record(event, "deny", refusal, errno.EPERM)
        session.record_denial(req, "bind", errno.EPERM, refusal)
    return refusal


def _bind_decide(req: Request, session, judged: dict):
    from .runtime import SyscallEvent
    fd = req.dup_fd(req.arg_int(0))
    try:
        domain, stype, _ = socket_info_of(fd)
    finally:
        os.close(fd)
    rt = session.runtime
    if domain in (AF_INET, AF_INET6) and "network" in rt.events:
        addrlen = req.args[2] & 0xFFFFFFFF
        if not 2 <= addrlen <= 128:
            raise Denied(errno.EINVAL, "bad address length")
        raw = req.read_bytes(req.args[1], addrlen)
        family = struct.unpack_from("<H", raw)[0]
        # The kernel binds an AF_INET socket given AF_UNSPEC (with INADDR_ANY) as AF_INET.
        if family not in (domain, AF_UNSPEC) or len(raw) < (16 if domain == AF_INET else 24):
            raise Denied(errno.EAFNOSUPPORT if family != domain else errno.EINVAL,
                         "address family or length does not match the socket")
        port = struct.unpack_from("!H", raw, 2)[0]
        address = socket.inet_ntop(domain, raw[4:8] if domain == AF_INET else raw[8:24])
        bind_ports = session.policy.tcp_bind
        denied = stype == SOCK_STREAM and not (bind_ports.any_port or port in bind_ports.ports)
        tgid, ppid = req.process_ids()
        event = SyscallEvent("bind", "network", tgid, ppid, host=address, port=port,
                             denied=denied)
        judged.update(event=event, fd=req.arg_int(0), domain=domain)
        if denied:
            rt.observe(event)
        else:
            verdict = rt.decide(event)
            if not verdict.allow:
                raise Denied(verdict.errno, verdict.reason)
    if not req.still_valid():
        raise Denied(errno.ESRCH, "the calling task is gone")
    return CONTINUE


HANDLERS = {"connect": connect, "listen": listen, "bind": bind}
