"""Which unix sockets are bound at a filesystem object (sock_diag: NETLINK_SOCK_DIAG,
AF_UNIX, UDIAG_SHOW_VFS).

A pathname unix socket is reached through the inode its bind() made; the kernel reports,
for every unix socket of this network namespace, the device and inode number of that
object. The supervisor asks which socket is bound at the inode a sandbox's path reached
(supervisor/network.own_socket), never at a spelling of the path.

The kernel's record holds 32 bits of the object's inode number and its device in the
kernel's own encoding (major << 20 | minor): an object whose inode number needs more bits
matches nothing here, so a caller refuses it rather than guess. The other way round, a
socket bound on the same filesystem at an inode whose number agrees with the object's in
its low 32 bits would be taken for one bound there: inode numbers 2**32 apart, on a
filesystem with 64-bit ones (tmpfs inode64, btrfs), which a sandbox would have to make
four billion inodes to reach.
"""

from __future__ import annotations

import os
import socket
import struct

from .netlink import attributes, dump

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
UDIAG_SHOW_VFS = 0x2
UNIX_DIAG_VFS = 1
TCP_ESTABLISHED, TCP_CLOSE, TCP_LISTEN = 1, 7, 10  # a unix socket's states, as TCP's
SERVING = 1 << TCP_LISTEN | 1 << TCP_CLOSE  # listening; datagram, bound, unconnected

_REQUEST = struct.Struct("=BBHIIIII")  # family, protocol, pad, states, ino, show, cookie[2]
_MESSAGE = struct.Struct("=BBBBIII")   # family, type, state, pad, ino, cookie[2]
_VFS = struct.Struct("=II")            # inode, device


def _kernel_dev(st_dev: int) -> int:
    return (os.major(st_dev) << 20) | os.minor(st_dev)


def bound_at(st_dev: int, st_ino: int, states: int = SERVING,
             timeout: float = 1.0) -> set[int]:
    """The socket inode numbers (as /proc/PID/fd shows them: socket:[N]) of the unix
    sockets of this network namespace in `states` (a mask of 1 << state) bound at the
    object (st_dev, st_ino). By default the sockets that serve the address: listening
    ones, and unconnected datagram ones; not the connections a listener accepted (the
    kernel gives each the listener's address). Raises OSError when the kernel cannot be
    asked (and TimeoutError past `timeout` per reply)."""
    if st_ino >> 32:
        return set()
    want = (st_ino, _kernel_dev(st_dev))
    body = _REQUEST.pack(socket.AF_UNIX, 0, 0, states, 0, UDIAG_SHOW_VFS,
                         0xFFFFFFFF, 0xFFFFFFFF)
    found: set[int] = set()
    for kind, msg in dump(NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY, body, timeout):
        if kind != SOCK_DIAG_BY_FAMILY or len(msg) < _MESSAGE.size:
            continue
        for attr, value in attributes(msg, _MESSAGE.size):
            if attr == UNIX_DIAG_VFS and len(value) >= _VFS.size:
                if _VFS.unpack_from(value) == want:
                    found.add(_MESSAGE.unpack_from(msg)[4])
                break
    return found
