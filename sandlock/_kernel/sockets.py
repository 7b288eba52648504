"""Socket operations on raw fds and raw sockaddr bytes, for on-behalf calls.

The supervisor holds duplicates of the sandbox's sockets (pidfd_getfd). These wrappers use
libc directly: Python socket objects may change a socket's blocking mode, which is shared
with the sandbox through the open file description.
"""

import ctypes
import os

from .syscall import libc

SOL_SOCKET = 1
SO_TYPE = 3
SO_PROTOCOL = 38
SO_DOMAIN = 39


libc.sendmsg.restype = ctypes.c_ssize_t


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class _Msghdr(ctypes.Structure):
    _fields_ = [("name", ctypes.c_void_p), ("namelen", ctypes.c_uint32),
                ("iov", ctypes.POINTER(_Iovec)), ("iovlen", ctypes.c_size_t),
                ("control", ctypes.c_void_p), ("controllen", ctypes.c_size_t),
                ("flags", ctypes.c_int)]


def _check(ret: int) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ret


def getsockopt_int(fd: int, level: int, opt: int) -> int:
    value = ctypes.c_int(0)
    size = ctypes.c_uint32(ctypes.sizeof(value))
    _check(libc.getsockopt(fd, level, opt, ctypes.byref(value), ctypes.byref(size)))
    return value.value


def getsockopt_bytes(fd: int, level: int, opt: int, size: int) -> bytes:
    buf = ctypes.create_string_buffer(size)
    length = ctypes.c_uint32(size)
    _check(libc.getsockopt(fd, level, opt, buf, ctypes.byref(length)))
    return buf.raw[:length.value]


def socket_info(fd: int) -> tuple[int, int, int]:
    """(domain, type, protocol) of the socket behind `fd`; OSError(ENOTSOCK) otherwise.
    The protocol is read only for datagram sockets (UDP vs ICMP); streams report 0."""
    domain = getsockopt_int(fd, SOL_SOCKET, SO_DOMAIN)
    stype = getsockopt_int(fd, SOL_SOCKET, SO_TYPE)
    proto = getsockopt_int(fd, SOL_SOCKET, SO_PROTOCOL) if stype == 2 else 0
    return domain, stype, proto


def connect(fd: int, addr: bytes) -> None:
    buf = ctypes.create_string_buffer(addr, len(addr))
    _check(libc.connect(fd, buf, ctypes.c_uint32(len(addr))))


def bind(fd: int, addr: bytes) -> None:
    buf = ctypes.create_string_buffer(addr, len(addr))
    _check(libc.bind(fd, buf, ctypes.c_uint32(len(addr))))


def listen(fd: int, backlog: int) -> None:
    _check(libc.listen(fd, backlog))


def shutdown(fd: int) -> None:
    """shutdown(SHUT_RDWR); errors ignored (the socket may already be closed by its peer)."""
    libc.shutdown(fd, 2)


def getsockname(fd: int) -> bytes:
    buf = ctypes.create_string_buffer(128)
    size = ctypes.c_uint32(128)
    _check(libc.getsockname(fd, buf, ctypes.byref(size)))
    return buf.raw[:size.value]


def sendmsg(fd: int, name: bytes | None, buffers: list[bytes], control: bytes,
            flags: int) -> int:
    """sendmsg(2) with copies: `name` None for a connected socket."""
    iovs = (_Iovec * max(1, len(buffers)))()
    keep = []
    for i, data in enumerate(buffers):
        b = ctypes.create_string_buffer(data, len(data))
        keep.append(b)
        iovs[i] = _Iovec(ctypes.cast(b, ctypes.c_void_p), len(data))
    msg = _Msghdr()
    if name:
        nb = ctypes.create_string_buffer(name, len(name))
        keep.append(nb)
        msg.name, msg.namelen = ctypes.cast(nb, ctypes.c_void_p), len(name)
    msg.iov, msg.iovlen = iovs, len(buffers)
    if control:
        cb = ctypes.create_string_buffer(control, len(control))
        keep.append(cb)
        msg.control, msg.controllen = ctypes.cast(cb, ctypes.c_void_p), len(control)
    return _check(libc.sendmsg(fd, ctypes.byref(msg), flags))
