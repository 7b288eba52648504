"""seccomp(2): loading a BPF filter with a user-notification listener, and the listener's ioctls.

The filter is compiled in the parent (see sandlock.syscall_filter); the child only calls
`load_filter_errno`. The parent drives the listener with raw ioctls through ctypes, which
release the GIL while the kernel works.
"""

import ctypes
import errno
import os

from .syscall import NR_SECCOMP, libc, syscall, syscall_errno

SET_MODE_FILTER = 1
GET_ACTION_AVAIL = 2

FLAG_NEW_LISTENER = 1 << 3
FLAG_WAIT_KILLABLE_RECV = 1 << 5  # 5.19: a received notification is not interrupted by signals

RET_USER_NOTIF = 0x7FC00000

USER_NOTIF_FLAG_CONTINUE = 1
ADDFD_FLAG_SETFD = 1 << 0
ADDFD_FLAG_SEND = 1 << 1

# x86-64 ioctl codes: _IOWR('!', 0, 80), _IOWR('!', 1, 24), _IOW('!', 2, 8), _IOW('!', 3, 24).
IOCTL_NOTIF_RECV = 0xC0502100
IOCTL_NOTIF_SEND = 0xC0182101
IOCTL_NOTIF_ID_VALID = 0x40082102
IOCTL_NOTIF_ADDFD = 0x40182103


class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                ("k", ctypes.c_uint32)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(SockFilter))]


class SeccompData(ctypes.Structure):
    _fields_ = [("nr", ctypes.c_int32), ("arch", ctypes.c_uint32),
                ("instruction_pointer", ctypes.c_uint64), ("args", ctypes.c_uint64 * 6)]


class Notif(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint64), ("pid", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("data", SeccompData)]


class NotifResp(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint64), ("val", ctypes.c_int64), ("error", ctypes.c_int32),
                ("flags", ctypes.c_uint32)]


class NotifAddfd(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint64), ("flags", ctypes.c_uint32), ("srcfd", ctypes.c_uint32),
                ("newfd", ctypes.c_uint32), ("newfd_flags", ctypes.c_uint32)]


assert ctypes.sizeof(Notif) == 80 and ctypes.sizeof(NotifResp) == 24
assert ctypes.sizeof(NotifAddfd) == 24

_ioctl = libc.ioctl
_ioctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p)
_ioctl.restype = ctypes.c_int


def program_from_bytes(bpf: bytes) -> SockFprog:
    """Wrap exported BPF bytes as a sock_fprog; the returned struct keeps its buffer alive."""
    count = len(bpf) // ctypes.sizeof(SockFilter)
    insns = (SockFilter * count).from_buffer_copy(bpf)
    prog = SockFprog(count, ctypes.cast(insns, ctypes.POINTER(SockFilter)))
    prog._insns = insns  # keep alive
    return prog


def load_filter_errno(prog: SockFprog, flags: int) -> int:
    """Install the filter on the calling thread. Returns the listener fd (when asked) or -errno.

    Requires PR_SET_NO_NEW_PRIVS (or CAP_SYS_ADMIN). The listener fd is O_CLOEXEC.
    """
    return syscall_errno(NR_SECCOMP, SET_MODE_FILTER, ctypes.c_uint(flags), ctypes.byref(prog))


def action_available(action: int) -> bool:
    value = ctypes.c_uint32(action)
    try:
        syscall(NR_SECCOMP, GET_ACTION_AVAIL, ctypes.c_uint(0), ctypes.byref(value))
        return True
    except OSError:
        return False


def _ioctl_checked(fd: int, code: int, arg) -> int:
    ret = _ioctl(fd, code, arg)
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ret


def notif_recv(listener: int, notif: Notif) -> None:
    """Receive one notification into `notif`. The buffer must be zeroed first (EINVAL otherwise)."""
    ctypes.memset(ctypes.byref(notif), 0, ctypes.sizeof(notif))
    _ioctl_checked(listener, IOCTL_NOTIF_RECV, ctypes.byref(notif))


def notif_send(listener: int, notif_id: int, val: int, error: int, flags: int = 0) -> bool:
    """Answer a notification. `error` is a negative errno or 0. False when the target is gone."""
    resp = NotifResp(notif_id, val, error, flags)
    try:
        _ioctl_checked(listener, IOCTL_NOTIF_SEND, ctypes.byref(resp))
        return True
    except OSError as e:
        if e.errno == errno.ENOENT:  # the task died or the notification was interrupted
            return False
        raise


def notif_id_valid(listener: int, notif_id: int) -> bool:
    """True while the notifying task still waits on `notif_id` (guards against pid reuse)."""
    value = ctypes.c_uint64(notif_id)
    return _ioctl(listener, IOCTL_NOTIF_ID_VALID, ctypes.byref(value)) == 0


def notif_addfd_send(listener: int, notif_id: int, srcfd: int, cloexec: bool) -> int:
    """Install `srcfd` in the target and complete its syscall with the new fd number, atomically."""
    addfd = NotifAddfd(notif_id, ADDFD_FLAG_SEND, srcfd, 0, os.O_CLOEXEC if cloexec else 0)
    return _ioctl_checked(listener, IOCTL_NOTIF_ADDFD, ctypes.byref(addfd))
