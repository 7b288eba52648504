"""The addresses of this machine's own interfaces, from the kernel (rtnetlink RTM_GETADDR).

A host rule must not reach a service listening on this machine through a name that
resolves to one of its interface addresses, whatever range that address is in (a public
or documentation address on eth0 is as local as 127.0.0.1): the network policy treats
these addresses as special (netpolicy.decision).
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
_NLMSGHDR = struct.Struct("=IHHII")
_IFADDRMSG = struct.Struct("=BBBBI")
_RTATTR = struct.Struct("=HH")


def _align(n: int) -> int:
    return (n + 3) & ~3


def interface_addresses(timeout: float = 1.0) -> frozenset:
    """Every address configured on this machine's interfaces (IPv4 and IPv6)."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE) as s:
        s.settimeout(timeout)
        s.bind((0, 0))
        seq = os.getpid() & 0xFFFF
        body = _IFADDRMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
        s.send(_NLMSGHDR.pack(_NLMSGHDR.size + len(body), RTM_GETADDR,
                              NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body)
        found = set()
        while True:
            data = s.recv(65536)
            off = 0
            while off + _NLMSGHDR.size <= len(data):
                length, kind, _, _, _ = _NLMSGHDR.unpack_from(data, off)
                if length < _NLMSGHDR.size:
                    return frozenset(found)
                if kind in (NLMSG_DONE, NLMSG_ERROR):
                    return frozenset(found)
                if kind == RTM_NEWADDR:
                    found.update(_addresses(data[off + _NLMSGHDR.size: off + length]))
                off += _align(length)


def _addresses(msg: bytes):
    family = msg[0]
    width = {socket.AF_INET: 4, socket.AF_INET6: 16}.get(family)
    if width is None:
        return
    off = _align(_IFADDRMSG.size)
    while off + _RTATTR.size <= len(msg):
        length, kind = _RTATTR.unpack_from(msg, off)
        if length < _RTATTR.size:
            return
        if kind in (IFA_ADDRESS, IFA_LOCAL) and length - _RTATTR.size >= width:
            raw = msg[off + _RTATTR.size: off + _RTATTR.size + width]
            yield ipaddress.ip_address(raw)
        off += _align(length)
