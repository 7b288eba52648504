"""Copying arguments out of another process's memory with process_vm_readv.

Callers read each argument once and act only on the copy; the child can change its
memory afterwards without effect on a decision already taken.
"""

import ctypes
import os

from .syscall import NR_PROCESS_VM_READV, NR_PROCESS_VM_WRITEV, syscall

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def read_memory(pid: int, addr: int, length: int) -> bytes:
    """Copy up to `length` bytes at `addr` in `pid`; may return fewer at an unmapped page."""
    buf = ctypes.create_string_buffer(length)
    local = _Iovec(ctypes.cast(buf, ctypes.c_void_p), length)
    remote = _Iovec(addr, length)
    n = syscall(NR_PROCESS_VM_READV, ctypes.c_int(pid), ctypes.byref(local), ctypes.c_ulong(1),
                ctypes.byref(remote), ctypes.c_ulong(1), ctypes.c_ulong(0))
    return buf.raw[:n]


def read_cstring(pid: int, addr: int, limit: int = 4096) -> bytes:
    """Copy a NUL-terminated string (without the NUL). OSError(ENAMETOOLONG) past `limit`."""
    out = b""
    while len(out) < limit:
        # Read to the end of the current page so a string ending near an unmapped page works.
        chunk_len = min(PAGE_SIZE - (addr % PAGE_SIZE), limit - len(out))
        chunk = read_memory(pid, addr, chunk_len)
        if not chunk:
            raise OSError(14, "Bad address")  # EFAULT
        nul = chunk.find(b"\0")
        if nul >= 0:
            return out + chunk[:nul]
        out += chunk
        addr += len(chunk)
    raise OSError(36, "File name too long")  # ENAMETOOLONG


def write_memory(pid: int, addr: int, data: bytes) -> None:
    """Write `data` at `addr` in `pid` (results the kernel would have stored, e.g. msg_len)."""
    buf = ctypes.create_string_buffer(data, len(data))
    local = _Iovec(ctypes.cast(buf, ctypes.c_void_p), len(data))
    remote = _Iovec(addr, len(data))
    n = syscall(NR_PROCESS_VM_WRITEV, ctypes.c_int(pid), ctypes.byref(local), ctypes.c_ulong(1),
                ctypes.byref(remote), ctypes.c_ulong(1), ctypes.c_ulong(0))
    if n != len(data):
        raise OSError(14, "Bad address")
