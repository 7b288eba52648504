"""Netlink dumps, and the addresses of this machine's own interfaces (rtnetlink
RTM_GETADDR).

A host rule must not reach a service listening on this machine through a name that
resolves to one of its interface addresses, whatever range that address is in (a public
or documentation address on eth0 is as local as 127.0.0.1): the network policy treats
these addresses as special (netpolicy.decision). unix_diag.py asks sock_diag through the
same dump reader.
"""

import ipaddress
import os
import socket
import struct

NETLINK_ROUTE = 0
RTM_NEWADDR, RTM_GETADDR = 20, 22
NLMSG_DONE, NLMSG_ERROR = 3, 2
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
IFA_ADDRESS, IFA_LOCAL = 1, 2
MAX_REPLY = 1 << 20  # bytes of a dump's replies read at most per recv
_NLMSGHDR = struct.Struct("=IHHII")
_IFADDRMSG = struct.Struct("=BBBBI")
_RTATTR = struct.Struct("=HH")


def _align(n: int) -> int:
    return (n + 3) & ~3


def dump(protocol: int, kind: int, body: bytes, timeout: float = 1.0):
    """The messages (kind, payload) of a netlink dump request `kind` + `body`, until the
    kernel says it is done. Raises OSError on the kernel's error or a malformed reply
    (TimeoutError past `timeout` per reply)."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC,
                       protocol) as s:
        s.settimeout(timeout)
        s.bind((0, 0))
        s.send(_NLMSGHDR.pack(_NLMSGHDR.size + len(body), kind, NLM_F_REQUEST | NLM_F_DUMP,
                              os.getpid() & 0xFFFF, 0) + body)
        while True:
            data = s.recv(MAX_REPLY)
            off = 0
            while off + _NLMSGHDR.size <= len(data):
                length, got, _, _, _ = _NLMSGHDR.unpack_from(data, off)
                if length < _NLMSGHDR.size:
                    raise OSError("netlink: a malformed reply")
                if got == NLMSG_DONE:
                    return
                if got == NLMSG_ERROR:
                    err = -struct.unpack_from("=i", data, off + _NLMSGHDR.size)[0]
                    if err == 0:
                        return
                    raise OSError(err, f"netlink: {os.strerror(err)}")
                yield got, data[off + _NLMSGHDR.size: off + length]
                off += _align(length)


def attributes(msg: bytes, start: int):
    """(type, payload) of each attribute of `msg` from `start` (its fixed header's size)."""
    off = _align(start)
    while off + _RTATTR.size <= len(msg):
        length, kind = _RTATTR.unpack_from(msg, off)
        if length < _RTATTR.size:
            return
        yield kind, msg[off + _RTATTR.size: off + length]
        off += _align(length)


def interface_addresses(timeout: float = 1.0) -> frozenset:
    """Every address configured on this machine's interfaces (IPv4 and IPv6)."""
    found = set()
    try:
        for kind, msg in dump(NETLINK_ROUTE, RTM_GETADDR,
                              _IFADDRMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0), timeout):
            if kind == RTM_NEWADDR:
                found.update(_addresses(msg))
    except TimeoutError:
        raise
    except OSError:
        pass  # the kernel's error, or a malformed reply: what was read before it
    return frozenset(found)


def _addresses(msg: bytes):
    width = {socket.AF_INET: 4, socket.AF_INET6: 16}.get(msg[0])
    if width is None:
        return
    for kind, value in attributes(msg, _IFADDRMSG.size):
        if kind in (IFA_ADDRESS, IFA_LOCAL) and len(value) >= width:
            yield ipaddress.ip_address(value[:width])
