"""connect / sendto / sendmsg / sendmmsg: destinations decided by the endpoint policy.

Three phases. Parse: the sockaddr, msghdr and payload are copied out of the child once.
Decide: netpolicy's pure `EndpointPolicy.decide` (or the unix-socket grants) on the copies.
Act: the operation is performed on our duplicate of the child's socket with exactly the
bytes that were checked, and its result is returned to the child.

SECCOMP_USER_NOTIF_FLAG_CONTINUE (the kernel redoes the call and re-reads memory and the
fd) is used only when that re-read cannot change the outcome: the calling process has a
single thread (so no other task can swap the fd: fd tables are shared only by threads,
the filter refuses CLONE_FILES without CLONE_THREAD) *and* every address the kernel could
then use is still checked by the kernel itself (Landlock TCP ports and scopes, or a socket
type that ignores destination addresses).
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct
import threading

from netpolicy.endpoint import canonical_address

from .._kernel import sockets
from .._kernel.fileops import AT_FDCWD
from ..fs_rules import is_beneath
from .request import Denied, Request

CONTINUE = object()  # handler result: let the kernel perform the call


class Defer:
    """Handler result: finish `fn()` on a worker thread (a blocking on-behalf call must not
    stall the supervisor loop). `guard` lets the loop abort the call if the caller dies."""

    def __init__(self, fn, guard=None):
        self.fn = fn
        self.guard = guard


class Guard:
    """Our duplicate socket while a deferred call blocks on it. If the calling task goes
    away, the loop calls abort(): shutdown() wakes a blocked connect/send at once, so no
    worker waits on a peer for a sandbox that no longer exists. The lock makes sure the fd
    is never shut down after the worker closed it (its number could be reused)."""

    def __init__(self, fd: int):
        self.fd = fd
        self._lock = threading.Lock()
        self._done = False

    def abort(self) -> None:
        with self._lock:
            if not self._done:
                sockets.shutdown(self.fd)

    def finish(self) -> None:
        with self._lock:
            self._done = True


AF_UNSPEC, AF_UNIX, AF_INET, AF_INET6, AF_NETLINK = 0, 1, 2, 10, 16
SOCK_STREAM, SOCK_DGRAM, SOCK_SEQPACKET = 1, 2, 5
MSG_FASTOPEN = 0x20000000
SCM_RIGHTS, SCM_CREDENTIALS = 1, 2
MAX_SEND = 4 << 20          # on-behalf sends copy at most this much (a partial send)
MAX_CONTROL = 4096
MAX_MMSG = 1024
_MSGHDR = struct.Struct("<QI4xQQQQi4x")  # name, namelen, iov, iovlen, control, controllen, flags
_IOVEC = struct.Struct("<QQ")


class Destination:
    __slots__ = ("family", "address", "port", "path", "raw")

    def __init__(self, family, raw, address=None, port=0, path=None):
        self.family, self.raw, self.address, self.port, self.path = (family, raw, address,
                                                                      port, path)


def parse_sockaddr(raw: bytes) -> Destination:
    """Parse a copied sockaddr. Unspecified addresses are decided as the loopback address the
    kernel turns them into (0.0.0.0 -> 127.0.0.1, :: -> ::1)."""
    if len(raw) < 2:
        raise Denied(errno.EINVAL, "short socket address")
    family = struct.unpack_from("<H", raw)[0]
    if family == AF_INET:
        if len(raw) < 16:
            raise Denied(errno.EINVAL, "short sockaddr_in")
        port = struct.unpack_from("!H", raw, 2)[0]
        return Destination(family, raw, _as_connected(ipaddress.IPv4Address(raw[4:8])), port)
    if family == AF_INET6:
        if len(raw) < 24:
            raise Denied(errno.EINVAL, "short sockaddr_in6")
        port = struct.unpack_from("!H", raw, 2)[0]
        return Destination(family, raw,
                           _as_connected(canonical_address(ipaddress.IPv6Address(raw[8:24]))),
                           port)
    if family == AF_UNIX:
        path = raw[2:]
        if path[:1] == b"\0":
            return Destination(family, raw, path=None)  # abstract
        return Destination(family, raw, path=path.split(b"\0", 1)[0])
    if family in (AF_UNSPEC, AF_NETLINK):
        return Destination(family, raw)  # no destination policy: passed through as is
    raise Denied(errno.EAFNOSUPPORT, f"address family {family}")


def _as_connected(address):
    if address.is_unspecified:
        return ipaddress.ip_address("127.0.0.1" if address.version == 4 else "::1")
    return address


def _single_threaded(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2:].split()[17]) == 1
    except (OSError, ValueError, IndexError):
        return False


def _argv(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def _protocol(domain: int, stype: int, proto: int) -> str:
    if stype == SOCK_STREAM:
        return "tcp"
    if proto in (socket.IPPROTO_ICMP, socket.IPPROTO_ICMPV6):
        return "icmp"
    return "udp"


def _deny(req, session, syscall, reason, err=errno.EACCES, **dest):
    """Record a network denial (audit log first, then the session) and refuse."""
    net = session.net
    if net is not None and net.audit is not None:
        net.audit.record(decision="deny", sandbox=session.name, pid=req.pid,
                         argv=_argv(req.pid), syscall=syscall,
                         errno=errno.errorcode.get(err, err), reason=reason, **dest)
    raise Denied(err, reason)


def _audit_allow(req, session, syscall, **dest):
    audit = session.net.audit
    if audit is not None and audit.log_allowed:
        audit.record(decision="allow", sandbox=session.name, pid=req.pid,
                     argv=_argv(req.pid), syscall=syscall, **dest)


def _inet_verdict(req, session, syscall, protocol, dest):
    """Decide on an inet destination; returns the names it is pinned to. Raises Denied."""
    net = session.net
    names = net.pins.names_for(dest.address) if net.pins is not None else ()
    verdict = net.policy.decide(protocol, dest.address, dest.port, names)
    info = dict(protocol=protocol, address=str(dest.address), port=dest.port,
                host=names[0] if names else None, rule=verdict.rule)
    if not verdict.allowed:
        _deny(req, session, syscall, verdict.reason, **info)
    _audit_allow(req, session, syscall, **info)
    return names


def _unix_target(req, session, syscall, dest) -> int:
    """Resolve a pathname unix address as the child would; returns an O_PATH fd on the
    socket inode if a grant covers it. Abstract names are the caller's business."""
    fd = req.open_target(AT_FDCWD, dest.path, 0, follow=True)
    real = os.readlink(f"/proc/self/fd/{fd}")
    grants = session.net.unix_allow
    if "*" in grants or any(is_beneath(real, g) for g in grants):
        return fd
    os.close(fd)
    _deny(req, session, syscall, f"unix socket {real} is not in net_allow_unix",
          protocol="unix", path=real, rule="default:unix")


def _proc_fd_sockaddr(target_fd: int) -> bytes:
    """A sockaddr_un naming the socket inode held open at `target_fd` (no re-resolution)."""
    return struct.pack("<H", AF_UNIX) + f"/proc/self/fd/{target_fd}".encode() + b"\0"


def _blocking(fd: int) -> bool:
    import fcntl
    return not fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK


def _run(fd: int, blocking: bool, fn, *closers):
    """Run the on-behalf action now (non-blocking socket) or on a worker thread."""
    guard = Guard(fd)

    def action():
        try:
            return fn()
        finally:
            guard.finish()
            for c in (fd, *closers):
                os.close(c)
    return Defer(action, guard) if blocking else action()


# --- connect ---------------------------------------------------------------------------------

def connect(req: Request, session):
    net = session.net
    fd = req.dup_fd(req.arg_int(0))
    try:
        domain, stype, proto = _socket_info(fd)
        addrlen = req.args[2] & 0xFFFFFFFF
        if not 2 <= addrlen <= 128:
            raise Denied(errno.EINVAL, "bad address length")
        if domain not in (AF_UNIX, AF_INET, AF_INET6):
            # Netlink: no destination policy. The kernel may redo the call only if no other
            # thread can swap this fd for an inet socket meanwhile; else we connect it.
            if _single_threaded(req.pid):
                os.close(fd)
                return CONTINUE
            raw = req.read_bytes(req.args[1], addrlen)
            return _run(fd, False, lambda: _connect(fd, raw))
        if (domain != AF_UNIX and stype == SOCK_STREAM and net.tcp_by_landlock
                and _single_threaded(req.pid)):
            os.close(fd)
            return CONTINUE  # Landlock checks the port in the kernel, whatever is re-read
        dest = parse_sockaddr(req.read_bytes(req.args[1], addrlen))
    except BaseException:
        os.close(fd)
        raise
    if domain == AF_UNIX:
        return _connect_unix(req, session, fd, dest, stype)
    if dest.family == AF_UNSPEC:  # dissolving a UDP association
        return _connect_action(fd, dest.raw, stype)
    if dest.family not in (AF_INET, AF_INET6):
        os.close(fd)
        raise Denied(errno.EAFNOSUPPORT, "address family does not match the socket")
    protocol = _protocol(domain, stype, proto)
    if net.is_dns(dest):
        if protocol == "tcp":  # a worker: even a local connect can wait on a full backlog
            return _run(fd, True, lambda: _redirect_dns(req, session, fd, domain))
        os.close(fd)
        _deny(req, session, "connect", "connected UDP DNS cannot be filtered per query; "
              "resolvers use TCP in sandboxes (RES_OPTIONS=use-vc)", errno.EPERM,
              protocol=protocol, address=str(dest.address), port=dest.port, rule="default:dns")
    try:
        _inet_verdict(req, session, "connect", protocol, dest)
    except BaseException:
        os.close(fd)
        raise
    # No ID_VALID check is needed before acting: the socket came from a pidfd (race-free),
    # so even if the caller died and its pid was reused, only its own orphaned socket moves.
    return _connect_action(fd, dest.raw, stype)


def _connect_unix(req, session, fd, dest, stype):
    try:
        if dest.family != AF_UNIX:
            raise Denied(errno.EINVAL, "address family does not match the socket")
        if dest.path is None:
            # Abstract names: never CONTINUE (another process sharing the memory could turn
            # the name into a path before the kernel re-reads it), and an on-behalf connect
            # is outside Landlock's scope, so only names the policy grants are reachable.
            _abstract_granted(req, session, "connect", dest)
            return _connect_action(fd, dest.raw, stype)
        target = _unix_target(req, session, "connect", dest)
    except BaseException:
        os.close(fd)
        raise
    return _connect_action(fd, _proc_fd_sockaddr(target), stype, target)


def _abstract_granted(req, session, syscall, dest) -> None:
    name = "@" + dest.raw[3:].split(b"\0", 1)[0].decode("latin-1")
    grants = session.net.unix_allow
    if "*" not in grants and name not in grants:
        _deny(req, session, syscall, f"abstract unix socket {name} is not in net_allow_unix",
              errno.EPERM, protocol="unix", path=name, rule="default:unix")


def _connect(fd: int, raw: bytes) -> int:
    sockets.connect(fd, raw)
    return 0


def _redirect_dns(req, session, fd, domain):
    """Connect the child's TCP socket to our DNS responder instead of its nameserver."""
    proxy = session.net.dns_proxy()
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
    proxy.expect((host, client), session.net.dns_context(req))
    sockets.connect(fd, remote)
    return 0


def _socket_info(fd: int):
    try:
        return sockets.socket_info(fd)
    except OSError as e:
        raise Denied(e.errno or errno.ENOTSOCK, "not a socket") from None


def _connect_action(fd: int, raw: bytes, stype: int, *closers):
    """Connect our duplicate as the child asked. Datagram connects never block and are
    answered here; every stream connect finishes on a worker: whether the socket blocks is
    a flag the sandbox can flip at any moment (it is shared through the open file), so the
    supervisor thread itself never calls a connect() that could wait on the network."""
    return _run(fd, stype != SOCK_DGRAM, lambda: _connect(fd, raw), *closers)


# --- sends -----------------------------------------------------------------------------------

class Message:
    """A copied outgoing message: destination (or None), payload buffers, control bytes."""

    __slots__ = ("dest", "buffers", "control", "size")

    def __init__(self, dest, buffers, control):
        self.dest, self.buffers, self.control = dest, buffers, control
        self.size = sum(len(b) for b in buffers)


def _can_continue(req, domain, stype, flags) -> bool:
    """Socket types that ignore a destination address, in a single-threaded process."""
    stream_like = ((domain in (AF_INET, AF_INET6) and stype == SOCK_STREAM
                    and not flags & MSG_FASTOPEN)
                   or (domain == AF_UNIX and stype in (SOCK_STREAM, SOCK_SEQPACKET))
                   or domain not in (AF_UNIX, AF_INET, AF_INET6))
    return stream_like and _single_threaded(req.pid)


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


def _translate_control(req, control: bytes, opened: list) -> bytes:
    """Rewrite SCM_RIGHTS fds from the child's numbering to our duplicates; refuse
    SCM_CREDENTIALS (the kernel would check them against the supervisor, not the child)."""
    out, off = b"", 0
    while off + 16 <= len(control):
        length, level, ctype = struct.unpack_from("<Qii", control, off)
        if length < 16 or off + length > len(control):
            raise Denied(errno.EINVAL, "malformed control message")
        data = control[off + 16: off + length]
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
        off += (length + 7) & ~7
    return out


def _check_message(req, session, syscall, domain, stype, proto, flags, msg, fd, opened):
    """Decide on one message; returns the (name, control) to send it with."""
    dest = msg.dest
    if domain not in (AF_UNIX, AF_INET, AF_INET6):  # netlink: the kernel is the only peer
        return (dest.raw if dest is not None else None), msg.control
    if domain == AF_UNIX:
        if dest is not None and dest.family == AF_UNIX:
            if dest.path is None:
                _deny(req, session, syscall, "abstract unix datagrams cannot be checked",
                      errno.EPERM, protocol="unix", rule="default:unix")
            target = _unix_target(req, session, syscall, dest)
            opened.append(target)
            name = _proc_fd_sockaddr(target)
        else:
            name = None
        return name, _translate_control(req, msg.control, opened)
    if dest is None or dest.family == AF_UNSPEC:
        return None, _inet_control(msg.control)  # to the connected peer, checked at connect
    protocol = _protocol(domain, stype, proto)
    if protocol == "udp" and session.net.is_dns(dest):
        _check_dns_datagram(req, session, syscall, dest, b"".join(msg.buffers))
    else:
        _inet_verdict(req, session, syscall, protocol, dest)
    return dest.raw, _inet_control(msg.control)


# Control messages an inet send may carry: ones that set a field of this packet, none that
# changes where it goes (routing headers, next hop, IP options would carry it on).
_INET_CMSGS = {(socket.SOL_IP, 1), (socket.SOL_IP, 2), (socket.SOL_IP, 8),     # TOS TTL PKTINFO
               (41, 50), (41, 52), (41, 67),      # IPV6_PKTINFO, IPV6_HOPLIMIT, IPV6_TCLASS
               (socket.SOL_UDP, 103)}              # UDP_SEGMENT


def _inet_control(control: bytes) -> bytes:
    off = 0
    while off + 16 <= len(control):
        length, level, ctype = struct.unpack_from("<Qii", control, off)
        if length < 16 or off + length > len(control):
            raise Denied(errno.EINVAL, "malformed control message")
        if (level, ctype) not in _INET_CMSGS:
            raise Denied(errno.EPERM, f"control message ({level}, {ctype}) is not allowed on "
                         f"a sandbox's behalf")
        off += (length + 7) & ~7
    return control


def _check_dns_datagram(req, session, syscall, dest, payload):
    """A UDP query to a configured resolver for allowed names only; our own resolution
    pins the answer before the query is forwarded."""
    from netpolicy.dns import question_names
    net = session.net
    info = dict(protocol="udp", address=str(dest.address), port=dest.port, rule="default:dns")
    if (dest.address, dest.port) not in net.dns_servers:
        _deny(req, session, syscall, f"DNS to {dest.address} (not a configured resolver)",
              errno.EPERM, **info)
    try:
        questions = question_names(payload)
    except ValueError as e:
        _deny(req, session, syscall, str(e), errno.EPERM, **info)
    for name, _ in questions:
        if net.policy.name_allowed(name) is None:
            _deny(req, session, syscall, f"DNS query for {name}: no rule allows that name",
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
    fd = req.dup_fd(req.arg_int(0))
    opened: list[int] = []
    try:
        domain, stype, proto = _socket_info(fd)
        flags = req.arg_int(_FLAGS_ARG[syscall])
        if _can_continue(req, domain, stype, flags):
            os.close(fd)
            return CONTINUE
        messages = msgs_fn()
    except BaseException:
        os.close(fd)
        raise

    guard = Guard(fd)

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
            guard.finish()
            for o in opened:
                os.close(o)
            os.close(fd)
    return domain, stype, flags, fd, action, guard


def _may_block(session, fd, stype, flags) -> bool:
    """A blocking socket, a Fast Open send (a connect), or a datagram that may be DNS
    (checked with our own resolution, which waits on the network): finish on a worker."""
    if stype == SOCK_DGRAM and session.net.dns_enabled or flags & MSG_FASTOPEN:
        return True
    return _blocking(fd) and not flags & socket.MSG_DONTWAIT


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
        for i, n in enumerate(sent):  # msg_len, as the kernel would have stored it
            write_memory(req.pid, base + 64 * i + 56, struct.pack("<I", n))
        return len(sent)
    return _send(req, session, "sendmmsg",
                 lambda: [_read_msghdr(req, base + 64 * i) for i in range(vlen)], finish)


def listen(req: Request, session):
    """listen() on an unbound inet socket binds an ephemeral port without passing Landlock's
    bind check: refused unless the policy lets the sandbox bind port 0."""
    fd = req.dup_fd(req.arg_int(0))
    try:
        domain, stype, _ = _socket_info(fd)
        if domain in (AF_INET, AF_INET6) and stype == SOCK_STREAM:
            port = struct.unpack_from("!H", sockets.getsockname(fd), 2)[0]
            bind = session.policy.tcp_bind
            if port == 0 and not (bind.any_port or 0 in bind.ports):
                raise Denied(errno.EACCES, "listen() on an unbound socket would bind an "
                             "ephemeral port; allow net_allow_bind=[0] or bind() first")
    except BaseException:
        os.close(fd)
        raise
    backlog = req.arg_int(1)
    return _run(fd, False, lambda: (sockets.listen(fd, backlog), 0)[1])


HANDLERS = {"connect": connect, "sendto": sendto, "sendmsg": sendmsg, "sendmmsg": sendmmsg,
            "listen": listen}
