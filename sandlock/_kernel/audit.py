"""The kernel's audit subsystem over netlink (NETLINK_AUDIT): its status, and the records
it multicasts to readers (AUDIT_NLGRP_READLOG, which needs CAP_AUDIT_READ). Landlock
(ABI 7) reports its denials there when the audit subsystem is enabled and the domain
asked for it (restrict_self's LOG flags)."""

from __future__ import annotations

import re
import socket
import struct

NETLINK_AUDIT = 9
AUDIT_GET = 1000
AUDIT_NLGRP_READLOG = 1
AUDIT_SYSCALL = 1300
AUDIT_LANDLOCK_ACCESS = 1423
AUDIT_LANDLOCK_DOMAIN = 1424
_NLMSG = struct.Struct("=IHHII")
_FIELD = re.compile(r'(\w+)=("[^"]*"|\S*)')
_SERIAL = re.compile(r"audit\(\d+\.\d+:(\d+)\)")


def enabled() -> bool:
    """The audit subsystem is on (AUDIT_GET's `enabled`); False if it cannot be asked."""
    return enabled_answer(ask_enabled())


def ask_enabled() -> socket.socket | None:
    """AUDIT_GET sent, its answer read by enabled_answer(): the kernel's reply takes
    ~0.15 ms here, which a caller can spend on other work (service/reads.py)."""
    try:
        s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_AUDIT)
    except OSError:
        return None
    try:
        s.settimeout(1.0)
        s.bind((0, 0))
        s.send(_NLMSG.pack(_NLMSG.size, AUDIT_GET, 1, 1, 0))
    except OSError:
        s.close()
        return None
    return s


def enabled_answer(s: socket.socket | None) -> bool:
    """ask_enabled()'s answer (the socket closed)."""
    if s is None:
        return False
    try:
        for _ in range(4):
            data = s.recv(65536)
            _, typ, _, _, _ = _NLMSG.unpack_from(data)
            if typ == AUDIT_GET:
                return struct.unpack_from("=I", data, _NLMSG.size + 4)[0] != 0
            if typ == 2 and struct.unpack_from("=i", data, _NLMSG.size)[0] != 0:
                return False  # refused (no CAP_AUDIT_CONTROL: not ours to know)
        return False
    except (OSError, struct.error):
        return False
    finally:
        s.close()


def reader() -> socket.socket:
    """A socket receiving every audit record (OSError without CAP_AUDIT_READ)."""
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_AUDIT)
    try:
        s.bind((0, AUDIT_NLGRP_READLOG))
    except OSError:
        s.close()
        raise
    return s


def parse(data: bytes) -> list[tuple[int, int, dict]]:
    """(type, serial, fields) of each record in a netlink datagram. Quoted values lose
    their quotes; unquoted hex values (the kernel's encoding of names with odd bytes)
    are decoded for `path`."""
    out = []
    offset = 0
    while offset + _NLMSG.size <= len(data):
        length, typ, _, _, _ = _NLMSG.unpack_from(data, offset)
        if length < _NLMSG.size:
            break
        text = data[offset + _NLMSG.size:offset + length].decode("utf-8", "replace")
        offset += (length + 3) & ~3
        m = _SERIAL.search(text)
        fields = {}
        for key, value in _FIELD.findall(text):
            if value.startswith('"'):
                value = value[1:-1]
            elif key == "path" and value and all(c in "0123456789ABCDEF" for c in value):
                try:
                    value = bytes.fromhex(value).decode("utf-8", "surrogateescape")
                except ValueError:
                    pass
            fields[key] = value
        out.append((typ, int(m[1]) if m else -1, fields))
    return out
