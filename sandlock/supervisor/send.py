"""sendto() with an address, sendmsg(), sendmmsg(): every destination a send may carry.

Decisions follow sandlock.supervisor.network: the msghdr, payload and control messages are
copied once, checked, and the checked copies are sent on our duplicate of the socket.
"""

from __future__ import annotations

import errno
import os
import socket
import struct

from .._kernel import sockets
from .network import (AF_INET, AF_INET6, AF_UNIX, AF_UNSPEC, CONTINUE,
                      MSG_FASTOPEN, SOCK_DGRAM, SOCK_SEQPACKET, SOCK_STREAM, Defer, Guard,
                      blocking, deny, inet_verdict, parse_sockaddr,
                      proc_fd_sockaddr, protocol_of, single_threaded, socket_info_of,
                      unix_target)
from .request import Denied, Request

SCM_RIGHTS, SCM_CREDENTIALS = 1, 2
MAX_SEND = 4 << 20          # on-behalf sends copy at most this much (a partial send)
MAX_CONTROL = 4096
MAX_MMSG = 1024
_MSGHDR = struct.Struct("<QI4xQQQQi4x")  # name, namelen, iov, iovlen, control, controllen, flags
_IOVEC = struct.Struct("<QQ")


class Message:
    """A copied outgoing message: destination (or None), payload buffers, control bytes."""

    __slots__ = ("dest", "buffers", "control")

    def __init__(self, dest, buffers, control):
        self.dest, self.buffers, self.control = dest, buffers, control


def _can_continue(single: bool, domain, stype, flags) -> bool:
    """Socket types that ignore a destination address, in a single-threaded process
    (`single`: counted before the fd was duplicated, see connect.connect)."""
    stream_like = ((domain in (AF_INET, AF_INET6) and stype == SOCK_STREAM
                    and not flags & MSG_FASTOPEN)
                   or (domain == AF_UNIX and stype in (SOCK_STREAM, SOCK_SEQPACKET))
                   or domain not in (AF_UNIX, AF_INET, AF_INET6))
    return stream_like and single


def _read_msghdr(req, addr: int) -> Message:
    name_p, namelen, iov_p, iovlen, ctl_p, ctllen, _ = _MSGHDR.unpack(req.read_bytes(addr, 56))
    dest = None
    if name_p and namelen:
        if namelen > 128:
            raise Denied(errno.EINVAL, "bad address length")
        dest = parse_sockaddr(req.read_bytes(name_p, namelen))
    if iovlen > 1024:
        raise Denied(errno.EMSGSIZE, "too many iovecs")
    buffers, total = [], 0
    if iovlen:
        raw = req.read_bytes(iov_p, iovlen * 16)
        for i in range(iovlen):
            base, length = _IOVEC.unpack_from(raw, i * 16)
            length = min(length, MAX_SEND - total)
            if length:
                buffers.append(req.read_bytes(base, length))
                total += length
    control = b""
    if ctl_p and ctllen:
        if ctllen > MAX_CONTROL:
            raise Denied(errno.ENOBUFS, "control data too large")
        control = req.read_bytes(ctl_p, ctllen)
    return Message(dest, buffers, control)


def _cmsgs(control: bytes):
    """(level, type, data) of each control message; malformed control data is refused."""
    off = 0
    while off + 16 <= len(control):
        length, level, ctype = struct.unpack_from("<Qii", control, off)
        if length < 16 or off + length > len(control):
            raise Denied(errno.EINVAL, "malformed control message")
        yield level, ctype, control[off + 16: off + length]
        off += (length + 7) & ~7


def _translate_control(req, control: bytes, opened: list) -> bytes:
    """Rewrite SCM_RIGHTS fds from the child's numbering to our duplicates; refuse
    SCM_CREDENTIALS (the kernel would check them against the supervisor, not the child)."""
    out = b""
    for level, ctype, data in _cmsgs(control):
        if level == socket.SOL_SOCKET and ctype == SCM_CREDENTIALS:
            raise Denied(errno.EPERM, "SCM_CREDENTIALS cannot be sent on the sandbox's behalf")
        if level == socket.SOL_SOCKET and ctype == SCM_RIGHTS:
            ours = []
            for (child_fd,) in struct.iter_unpack("<i", data[: len(data) // 4 * 4]):
                ours.append(req.dup_fd(child_fd))
                opened.append(ours[-1])
            data = struct.pack(f"<{len(ours)}i", *ours)
        cmsg = struct.pack("<Qii", 16 + len(data), level, ctype) + data
        out += cmsg + b"\0" * (-len(cmsg) % 8)
    return out


def _check_message(req, session, syscall, domain, stype, proto, flags, msg, fd, opened):
    """Decide on one message; returns the (name, control) to send it with."""
    dest = msg.dest
    if domain not in (AF_UNIX, AF_INET, AF_INET6):  # netlink: the kernel is the only peer
        if msg.control:  # sent by us, control data would carry the supervisor's fds/creds
            raise Denied(errno.EPERM, "control data on a netlink send")
        return (dest.raw if dest is not None else None), b""
    if dest is not None and dest.family != AF_UNSPEC and (
            (domain == AF_UNIX) != (dest.family == AF_UNIX)):
        raise Denied(errno.EINVAL, "address family does not match the socket")
    if domain == AF_UNIX:
        if dest is not None and dest.family == AF_UNIX:
            if dest.path is None:
                deny(req, session, syscall, "abstract unix datagrams cannot be checked",
                      errno.EPERM, protocol="unix", rule="default:unix")
            target = unix_target(req, session, syscall, dest)
            opened.append(target)
            name = proc_fd_sockaddr(target)
        else:
            name = None
        return name, _translate_control(req, msg.control, opened)
    if dest is None or dest.family == AF_UNSPEC:
        return None, _inet_control(msg.control)  # to the connected peer, checked at connect
    protocol = protocol_of(domain, stype, proto)
    if protocol == "udp" and session.net.is_dns(dest):
        _check_dns_datagram(req, session, syscall, dest, b"".join(msg.buffers))
    else:
        inet_verdict(req, session, syscall, protocol, dest)
    return dest.raw, _inet_control(msg.control)


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


def _check_dns_datagram(req, session, syscall, dest, payload):
    """A UDP query to a configured resolver for allowed names only; our own resolution
    pins the answer before the query is forwarded."""
    from netpolicy.dns import question_names
    net = session.net
    info = dict(protocol="udp", address=str(dest.address), port=dest.port, rule="default:dns")
    if (dest.address, dest.port) not in net.dns_servers:
        deny(req, session, syscall, f"DNS to {dest.address} (not a configured resolver)",
              errno.EPERM, **info)
    try:
        questions = question_names(payload)
    except ValueError as e:
        deny(req, session, syscall, str(e), errno.EPERM, **info)
    for name, _ in questions:
        if net.policy.name_allowed(name) is None:
            deny(req, session, syscall, f"DNS query for {name}: no rule allows that name",
                  errno.EPERM, host=name, **info)
        try:
            net.pin(name)
        except Exception:  # the query still goes out; its answer will say why
            pass


def _send_one(req, session, syscall, fd, domain, stype, proto, flags, msg, opened) -> int:
    name, control = _check_message(req, session, syscall, domain, stype, proto, flags, msg,
                                   fd, opened)
    return sockets.sendmsg(fd, name, msg.buffers, control, flags)


def _inline(flags: int) -> int:
    """Flags for a send performed on the supervisor thread: it must never wait, whatever
    the shared O_NONBLOCK flag says by the time the kernel looks at it."""
    return flags | socket.MSG_DONTWAIT


_FLAGS_ARG = {"sendto": 3, "sendmsg": 2, "sendmmsg": 3}


def _send_common(req, session, syscall, msgs_fn):
    single = single_threaded(req.pid)  # before the duplicate: see connect.connect
    fd = req.dup_fd(req.arg_int(0))
    opened: list[int] = []
    try:
        domain, stype, proto = socket_info_of(fd)
        flags = req.arg_int(_FLAGS_ARG[syscall])
        if _can_continue(single, domain, stype, flags):
            os.close(fd)
            return CONTINUE
        messages = msgs_fn()
    except BaseException:
        os.close(fd)
        raise

    guard = Guard(fd, opened)

    def action(send_flags=flags):
        try:
            results = []
            for m in messages:
                try:
                    results.append(_send_one(req, session, syscall, fd, domain, stype, proto,
                                             send_flags, m, opened))
                except OSError:
                    if not results:
                        raise
                    break  # sendmmsg: report the messages sent before the failure
            return results
        finally:
            guard.close()
    return domain, stype, flags, fd, action, guard


def _may_block(session, fd, stype, flags) -> bool:
    """A blocking socket, a Fast Open send (a connect), or a datagram that may be DNS
    (checked with our own resolution, which waits on the network): finish on a worker."""
    if stype == SOCK_DGRAM and session.net.dns_enabled or flags & MSG_FASTOPEN:
        return True
    return blocking(fd) and not flags & socket.MSG_DONTWAIT


def _send(req: Request, session, syscall: str, messages, finish=lambda sent: sent[0]):
    """Common to the three sends: check every message, send the checked copies, and turn
    the per-message counts into the syscall's result with `finish`."""
    res = _send_common(req, session, syscall, messages)
    if res is CONTINUE:
        return res
    domain, stype, flags, fd, action, guard = res
    if _may_block(session, fd, stype, flags):
        return Defer(lambda: finish(action(flags)), guard)
    return finish(action(_inline(flags)))


def sendto(req: Request, session):
    """Reaches us only with a destination address (the filter passes NULL-address sends)."""
    def messages():
        length = min(req.args[2], MAX_SEND)
        data = req.read_bytes(req.args[1], length) if length else b""
        addrlen = req.args[5] & 0xFFFFFFFF
        if not 2 <= addrlen <= 128:
            raise Denied(errno.EINVAL, "bad address length")
        return [Message(parse_sockaddr(req.read_bytes(req.args[4], addrlen)), [data], b"")]
    return _send(req, session, "sendto", messages)


def sendmsg(req: Request, session):
    return _send(req, session, "sendmsg", lambda: [_read_msghdr(req, req.args[1])])


def sendmmsg(req: Request, session):
    vlen = min(req.args[2] & 0xFFFFFFFF, MAX_MMSG)
    base = req.args[1]

    def finish(sent):
        from .._kernel.memory import write_memory
        with session.memory_lock:  # never while a freeze holds the sandbox (freeze.py)
            for i, n in enumerate(sent):  # msg_len, as the kernel would have stored it
                write_memory(req.pid, base + 64 * i + 56, struct.pack("<I", n))
        return len(sent)
    return _send(req, session, "sendmmsg",
                 lambda: [_read_msghdr(req, base + 64 * i) for i in range(vlen)], finish)


HANDLERS = {"sendto": sendto, "sendmsg": sendmsg, "sendmmsg": sendmmsg}
