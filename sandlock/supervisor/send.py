"""sendto() with an address, sendmsg(), sendmmsg(): every destination a send may carry.

Decisions follow sandlock.supervisor.network: each message's header, payload and control
messages are copied once, checked, and the checked copies are sent on our duplicate of the
socket. A DNS query to a resolver is never sent as the sandbox wrote it: the question is
parsed and a query of our own is sent instead (netpolicy.dns.parse_query/build_query).

Bounds: what one call can make the supervisor do is limited, so that no sandbox can stall
or exhaust what the others share (the loop thread, the workers, memory, fds).
- Copies: a datagram up to its protocol's own limit (UDP and ICMP 65,535 bytes; unix and
  netlink the socket's send buffer, as the kernel checks), refused with EMSGSIZE above it
  and never truncated; a stream message up to what is left of the call's budget (a partial
  send, as the kernel makes when its buffer is full). Only a single message with few
  iovecs, no fds to pass and at most INLINE_COPY bytes is handled on the supervisor
  thread; anything else goes to a worker, where a call copies at most CALL_COPY bytes and
  handles at most CALL_WORK messages, iovecs and passed fds together; sendmmsg stops at
  either budget and reports the messages sent so far. Messages are read one at a time:
  at most one message's payload is in memory per call.
- Waiting: every send is made with MSG_DONTWAIT. A caller that asked to block is made to
  wait by us, on a worker, in bounded slices: its socket's SO_SNDTIMEO applies, and the
  wait ends when the caller's task is gone (Guard.abort). No on-behalf send outlives the
  task that asked for it.
- fds: SCM_RIGHTS duplicates exist only while their own message is sent, and one sandbox
  holds at most FD_BUDGET of them at a time (past it: ETOOMANYREFS, the kernel's error for
  too many fds in flight).
"""

from __future__ import annotations

import errno
import os
import select
import socket
import struct
import time

from .._kernel import sockets
from .network import (AF_INET, AF_INET6, AF_UNIX, AF_UNSPEC, CONTINUE,
                      MSG_FASTOPEN, SOCK_DGRAM, SOCK_SEQPACKET, SOCK_STREAM, Defer, Guard,
                      blocking, deny, inet_verdict, parse_sockaddr, refuse,
                      proc_fd_sockaddr, protocol_of, single_threaded, socket_info_of,
                      unix_target)
from .request import Denied, Request

SCM_RIGHTS, SCM_CREDENTIALS = 1, 2
MAX_CONTROL = 4096
UIO_MAXIOV = 1024            # iovecs per message, and messages per sendmmsg (the kernel's)
DATAGRAM_MAX = 65535         # udp_sendmsg/ping_sendmsg refuse larger (EMSGSIZE)
INLINE_COPY = 64 << 10       # bytes one call may copy on the supervisor thread
INLINE_IOVECS = 64           # iovecs a call handled on the supervisor thread may have
CALL_COPY = 1 << 20          # bytes one call may copy in all, on a worker
CALL_WORK = 4096             # messages + iovecs + passed fds one call may make us handle
FD_BUDGET = 512              # SCM_RIGHTS duplicates held at once for one sandbox
WAIT_SLICE = 0.05            # seconds between checks while a blocking send waits
_MSGHDR = struct.Struct("<QI4xQQQQi4x")  # name, namelen, iov, iovlen, control, controllen, flags
_IOVEC = struct.Struct("<QQ")


class Header:
    """One outgoing message before its payload is copied: destination (or None), the
    iovecs (address, length) in the caller, its size, and its control bytes."""

    __slots__ = ("dest", "iov", "size", "control")

    def __init__(self, dest, iov, control):
        self.dest, self.iov, self.control = dest, iov, control
        self.size = sum(length for _, length in iov)


def _can_continue(single: bool, domain, stype, flags) -> bool:
    """Socket types that ignore a destination address, in a single-threaded process
    (`single`: counted before the fd was duplicated, see connect.connect)."""
    stream_like = ((domain in (AF_INET, AF_INET6) and stype == SOCK_STREAM
                    and not flags & MSG_FASTOPEN)
                   or (domain == AF_UNIX and stype in (SOCK_STREAM, SOCK_SEQPACKET))
                   or domain not in (AF_UNIX, AF_INET, AF_INET6))
    return stream_like and single


def _read_msghdr(req, addr: int) -> Header:
    name_p, namelen, iov_p, iovlen, ctl_p, ctllen, _ = _MSGHDR.unpack(req.read_bytes(addr, 56))
    dest = None
    if name_p and namelen:
        if namelen > 128:
            raise Denied(errno.EINVAL, "bad address length")
        dest = parse_sockaddr(req.read_bytes(name_p, namelen))
    if iovlen > UIO_MAXIOV:
        raise Denied(errno.EMSGSIZE, "too many iovecs")
    iov = []
    if iovlen:
        raw = req.read_bytes(iov_p, iovlen * 16)
        iov = [_IOVEC.unpack_from(raw, i * 16) for i in range(iovlen)]
        if any(length >> 62 for _, length in iov):
            raise Denied(errno.EINVAL, "iovec length out of range")
    control = b""
    if ctl_p and ctllen:
        if ctllen > MAX_CONTROL:
            raise Denied(errno.ENOBUFS, "control data too large")
        control = req.read_bytes(ctl_p, ctllen)
    return Header(dest, iov, control)


def _payload(req, header: Header, limit: int) -> list[bytes]:
    """The first `limit` bytes of the message, copied once."""
    out, left = [], limit
    for base, length in header.iov:
        n = min(length, left)
        if n:
            out.append(req.read_bytes(base, n))
            left -= n
        if not left:
            break
    return out


def _cmsgs(control: bytes):
    """(level, type, data) of each control message; malformed control data is refused."""
    off = 0
    while off + 16 <= len(control):
        length, level, ctype = struct.unpack_from("<Qii", control, off)
        if length < 16 or off + length > len(control):
            raise Denied(errno.EINVAL, "malformed control message")
        yield level, ctype, control[off + 16: off + length]
        off += (length + 7) & ~7


class _FdBudget:
    """SCM_RIGHTS duplicates one sandbox's sends hold at once."""

    def __init__(self, session):
        self.session = session
        self.taken = 0

    def take(self, n: int) -> None:
        with self.session.fd_budget_lock:
            if self.session.fds_in_flight + n > FD_BUDGET:
                raise Denied(errno.ETOOMANYREFS, f"more than {FD_BUDGET} file descriptors "
                                                 f"in flight for this sandbox")
            self.session.fds_in_flight += n
            self.taken += n

    def release(self) -> None:
        with self.session.fd_budget_lock:
            self.session.fds_in_flight -= self.taken
            self.taken = 0


def _translate_control(req, control: bytes, opened: list, budget: _FdBudget) -> bytes:
    """Rewrite SCM_RIGHTS fds from the child's numbering to our duplicates; refuse
    SCM_CREDENTIALS (the kernel would check them against the supervisor, not the child)."""
    out = b""
    for level, ctype, data in _cmsgs(control):
        if level == socket.SOL_SOCKET and ctype == SCM_CREDENTIALS:
            raise Denied(errno.EPERM, "SCM_CREDENTIALS cannot be sent on the sandbox's behalf")
        if level == socket.SOL_SOCKET and ctype == SCM_RIGHTS:
            fds = [f for (f,) in struct.iter_unpack("<i", data[: len(data) // 4 * 4])]
            budget.take(len(fds))
            ours = []
            for child_fd in fds:
                ours.append(req.dup_fd(child_fd))
                opened.append(ours[-1])
            data = struct.pack(f"<{len(ours)}i", *ours)
        cmsg = struct.pack("<Qii", 16 + len(data), level, ctype) + data
        out += cmsg + b"\0" * (-len(cmsg) % 8)
    return out


# Control messages an inet send may carry: ones that set a field of this packet, none that
# changes where it goes (routing headers, next hop, IP options would carry it on).
_INET_CMSGS = {(socket.SOL_IP, 1), (socket.SOL_IP, 2), (socket.SOL_IP, 8),     # TOS TTL PKTINFO
               (41, 50), (41, 52), (41, 67),      # IPV6_PKTINFO, IPV6_HOPLIMIT, IPV6_TCLASS
               (socket.SOL_UDP, 103)}              # UDP_SEGMENT


def _inet_control(control: bytes) -> bytes:
    for level, ctype, _ in _cmsgs(control):
        if (level, ctype) not in _INET_CMSGS:
            raise Denied(errno.EPERM, f"control message ({level}, {ctype}) is not allowed on "
                         f"a sandbox's behalf")
    return control


def _dns_query(req, session, syscall, dest, payload: bytes) -> bytes:
    """The query we send for the sandbox's UDP DNS message: one question, for a name the
    policy allows, of an ordinary type; built by us. Anything else is refused, audited."""
    from netpolicy.dns import QueryRefused, build_query, parse_query
    net = session.net
    info = dict(protocol="udp", address=str(dest.address), port=dest.port, rule="default:dns")
    if (dest.address, dest.port) not in net.dns_servers:
        deny(req, session, syscall, f"DNS to {dest.address} (not a configured resolver)",
             errno.EPERM, **info)
    _runtime_refusal(req, session, syscall, dest, info)
    try:
        query = parse_query(payload)
    except QueryRefused as e:
        deny(req, session, syscall, f"{e}: refused, never forwarded", errno.EPERM, **info)
    if net.policy.name_allowed(query.name) is None:
        refuse(req, session, syscall, f"DNS query for {query.name}: no rule allows that name",
               errno.EPERM, host=query.name, **info)
    try:
        net.pin(query.name)
    except Exception:  # the query still goes out; its answer will say why
        pass
    return build_query(query)


def _runtime_refusal(req, session, syscall, dest, info) -> None:
    """A policy_fn's restrict_network covers DNS to the resolver as any destination."""
    rt = session.runtime
    if rt is not None:
        tgid, _ = req.process_ids()
        refusal = rt.network_refusal(tgid, dest.address)
        if refusal is not None:
            refuse(req, session, syscall, refusal, errno.EPERM, **dict(info, rule="policy_fn"))


def _message_limit(fd: int, domain: int, stype: int) -> tuple[int, bool]:
    """(largest message, True if it is a datagram: never truncated, EMSGSIZE above)."""
    if stype == SOCK_STREAM:
        return CALL_COPY, False
    if domain in (AF_INET, AF_INET6):
        return DATAGRAM_MAX, True
    try:  # unix and netlink datagrams: the kernel's own check against the send buffer
        sndbuf = sockets.getsockopt_int(fd, socket.SOL_SOCKET, socket.SO_SNDBUF)
    except OSError:
        sndbuf = DATAGRAM_MAX
    return max(0, sndbuf - 32), True


class _Send:
    """One send call: its socket, its messages (read one at a time), how it may wait."""

    def __init__(self, req, session, syscall, fd, domain, stype, proto, flags, header_of,
                 count):
        self.req, self.session, self.syscall = req, session, syscall
        self.fd, self.domain, self.stype, self.proto = fd, domain, stype, proto
        self.flags, self.header_of, self.count = flags, header_of, count
        self.guard = Guard(fd)
        self.limit, self.datagram = _message_limit(fd, domain, stype)
        self.nonblocking = bool(flags & socket.MSG_DONTWAIT) or not blocking(fd)

    def run(self, budget: int) -> list[int]:
        """Send the messages in order within `budget` bytes (and CALL_WORK units of work);
        the count sent of each. A failure after the first message ends the call with what
        was sent (sendmmsg)."""
        sent: list[int] = []
        work = CALL_WORK
        try:
            for i in range(self.count):
                try:
                    header = self.header_of(i)
                    if self.datagram and header.size > self.limit:
                        raise Denied(errno.EMSGSIZE, "message too long for its socket")
                    cost = 1 + len(header.iov) + _passed_fds(header.control)
                    if sent and (header.size > budget or cost > work):
                        break  # what is left goes in the caller's next call
                    work -= cost
                    n = self._send_one(header, min(header.size, max(budget, 0))
                                       if not self.datagram else header.size)
                except (OSError, Denied):
                    if not sent:
                        raise
                    break
                sent.append(n)
                budget -= n
        finally:
            self.guard.close()
        return sent

    def _send_one(self, header: Header, size: int) -> int:
        opened: list[int] = []
        fds = _FdBudget(self.session)
        try:
            name, control, buffers = self._check(header, size, opened, fds)
            return self._transmit(name, buffers, control)
        finally:
            for fd in opened:
                os.close(fd)
            fds.release()

    def _check(self, header: Header, size: int, opened: list, fds: _FdBudget):
        """Decide on one message: (name, control, payload buffers) to send it with."""
        req, session, syscall, dest = self.req, self.session, self.syscall, header.dest
        domain = self.domain
        if domain not in (AF_UNIX, AF_INET, AF_INET6):  # netlink: the kernel is the only peer
            if header.control:  # sent by us, control data would carry our fds/creds
                raise Denied(errno.EPERM, "control data on a netlink send")
            return (dest.raw if dest is not None else None), b"", _payload(req, header, size)
        if dest is not None and dest.family != AF_UNSPEC and (
                (domain == AF_UNIX) != (dest.family == AF_UNIX)):
            raise Denied(errno.EINVAL, "address family does not match the socket")
        if domain == AF_UNIX:
            name = None
            if dest is not None and dest.family == AF_UNIX:
                if dest.path is None:
                    deny(req, session, syscall, "abstract unix datagrams cannot be checked",
                         errno.EPERM, protocol="unix", rule="default:unix")
                target = unix_target(req, session, syscall, dest)
                opened.append(target)
                name = proc_fd_sockaddr(target)
            control = _translate_control(req, header.control, opened, fds)
            return name, control, _payload(req, header, size)
        if dest is None or dest.family == AF_UNSPEC:  # to the connected peer, checked at connect
            return None, _inet_control(header.control), _payload(req, header, size)
        protocol = protocol_of(domain, self.stype, self.proto)
        if protocol == "udp" and session.net.is_dns(dest):
            query = _dns_query(req, session, syscall, dest, b"".join(_payload(req, header,
                                                                               size)))
            return dest.raw, _inet_control(header.control), [query]
        inet_verdict(req, session, syscall, protocol, dest)
        return dest.raw, _inet_control(header.control), _payload(req, header, size)

    def _transmit(self, name, buffers, control) -> int:
        """One sendmsg with MSG_DONTWAIT; a blocking caller's wait is ours, in slices."""
        flags = self.flags | socket.MSG_DONTWAIT
        deadline = None
        backoff = 0.0005
        while True:
            try:
                return sockets.sendmsg(self.fd, name, buffers, control, flags)
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.ENOBUFS) or self.nonblocking:
                    raise
            if deadline is None:
                deadline = self._send_timeout()
            if self.guard.cancelled or (deadline is not None and time.monotonic() > deadline):
                raise OSError(errno.EAGAIN if not self.guard.cancelled else errno.EINTR,
                              "send did not complete")
            # A unix datagram peer's full queue is not visible to poll() on an unconnected
            # socket, so a ready poll is followed by a growing pause, never a spin.
            poller = select.poll()
            poller.register(self.fd, select.POLLOUT)
            if poller.poll(int(WAIT_SLICE * 1000)):
                time.sleep(backoff)
                backoff = min(WAIT_SLICE, backoff * 2)

    def _send_timeout(self) -> float | None:
        """The monotonic deadline SO_SNDTIMEO sets for a blocking send (None: none)."""
        try:
            tv = sockets.getsockopt_bytes(self.fd, socket.SOL_SOCKET, socket.SO_SNDTIMEO, 16)
        except OSError:
            return None
        sec, usec = struct.unpack("<qq", tv)
        return time.monotonic() + sec + usec / 1e6 if sec or usec else None


def _passed_fds(control: bytes) -> int:
    """How many fds the control messages pass (SCM_RIGHTS), without duplicating any."""
    try:
        return sum(len(data) // 4 for level, ctype, data in _cmsgs(control)
                   if level == socket.SOL_SOCKET and ctype == SCM_RIGHTS)
    except Denied:
        return 0  # malformed: refused when the message is checked


_FLAGS_ARG = {"sendto": 3, "sendmsg": 2, "sendmmsg": 3}


def _send(req: Request, session, syscall: str, header_of, count: int,
          finish=lambda sent: sent[0]):
    """Common to the three sends: check every message, send the checked copies, and turn
    the per-message counts into the syscall's result with `finish`."""
    single = single_threaded(req.pid)  # before the duplicate: see connect.connect
    fd = req.dup_fd(req.arg_int(0))
    try:
        domain, stype, proto = socket_info_of(fd)
        flags = req.arg_int(_FLAGS_ARG[syscall])
        if _can_continue(single, domain, stype, flags):
            os.close(fd)
            return CONTINUE
        call = _Send(req, session, syscall, fd, domain, stype, proto, flags, header_of, count)
        first = header_of(0) if count else None
    except BaseException:
        os.close(fd)
        raise
    waits = (not call.nonblocking or flags & MSG_FASTOPEN
             or (stype == SOCK_DGRAM and session.net.dns_enabled))  # DNS: our resolution
    small = (count == 1 and first is not None and first.size <= INLINE_COPY
             and len(first.iov) <= INLINE_IOVECS and not _passed_fds(first.control))
    if waits or not small:
        return Defer(lambda: finish(call.run(CALL_COPY)), call.guard)
    return finish(call.run(INLINE_COPY))


def sendto(req: Request, session):
    """Reaches us only with a destination address (the filter passes NULL-address sends)."""
    def header_of(_):
        addrlen = req.args[5] & 0xFFFFFFFF
        if not 2 <= addrlen <= 128:
            raise Denied(errno.EINVAL, "bad address length")
        dest = parse_sockaddr(req.read_bytes(req.args[4], addrlen))
        length = req.args[2]
        if length >> 62:
            raise Denied(errno.EINVAL, "length out of range")
        return Header(dest, [(req.args[1], length)] if length else [], b"")
    return _send(req, session, "sendto", _cached(header_of), 1)


def sendmsg(req: Request, session):
    return _send(req, session, "sendmsg", _cached(lambda _: _read_msghdr(req, req.args[1])),
                 1)


def sendmmsg(req: Request, session):
    vlen = min(req.args[2] & 0xFFFFFFFF, UIO_MAXIOV)  # the kernel caps it the same way
    base = req.args[1]

    def finish(sent):
        from .._kernel.memory import write_memory
        with session.memory_lock:  # never while a freeze holds the sandbox (freeze.py)
            for i, n in enumerate(sent):  # msg_len, as the kernel would have stored it
                write_memory(req.pid, base + 64 * i + 56, struct.pack("<I", n))
        return len(sent)
    if vlen == 0:
        return 0
    return _send(req, session, "sendmmsg",
                 _cached(lambda i: _read_msghdr(req, base + 64 * i)), vlen, finish)


def _cached(header_of):
    """Read each header once (the first is read on the loop thread to choose where the
    call runs, and again by the call)."""
    seen: dict[int, Header] = {}

    def get(i: int) -> Header:
        if i not in seen:
            seen.clear()  # one header at a time in memory
            seen[i] = header_of(i)
        return seen[i]
    return get


HANDLERS = {"sendto": sendto, "sendmsg": sendmsg, "sendmmsg": sendmmsg}
