"""seccomp(2) and the user-notification listener's ioctls, for the supervisor.

The filter is compiled in the parent (sandlock.syscall_filter) and loaded by the exec
trampoline (sandlock/_libexec); the parent drives the listener with raw ioctls through
ctypes, which release the GIL while the kernel works.
"""

import ctypes
import errno
import os

from .syscall import NR_SECCOMP, libc, syscall, syscall_errno

GET_ACTION_AVAIL = 2

RET_USER_NOTIF = 0x7FC00000

USER_NOTIF_FLAG_CONTINUE = 1

# x86-64 ioctl codes: _IOWR('!', 0, 80), _IOWR('!', 1, 24), _IOW('!', 2, 8).
IOCTL_NOTIF_RECV = 0xC0502100
IOCTL_NOTIF_SEND = 0xC0182101
IOCTL_NOTIF_ID_VALID = 0x40082102
IOCTL_NOTIF_ADDFD = 0x40182103  # _IOW('!', 3, struct seccomp_notif_addfd)
IOCTL_NOTIF_SET_FLAGS = 0x40082104  # _IOW('!', 4, __u64), Linux 6.6
USER_NOTIF_FD_SYNC_WAKE_UP = 1
ADDFD_FLAG_SETFD = 1  # install at the given fd number (dup2)
ADDFD_FLAG_SEND = 2  # install the fd and answer the notification with its number, atomically


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


assert ctypes.sizeof(NotifAddfd) == 24
assert ctypes.sizeof(Notif) == 80 and ctypes.sizeof(NotifResp) == 24

_ioctl = libc.ioctl
_ioctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p)
_ioctl.restype = ctypes.c_int


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


def notif_addfd_send(listener: int, notif_id: int, srcfd: int, cloexec: bool) -> bool:
    """Install a copy of our `srcfd` in the notifying process and answer the call with its
    number (SECCOMP_ADDFD_FLAG_SEND: one step, so the child never sees an fd it was not
    answered with). False when the target is gone."""
    return _addfd(listener, notif_id, ADDFD_FLAG_SEND, srcfd, 0, cloexec)


def notif_addfd_at(listener: int, notif_id: int, srcfd: int, newfd: int, cloexec: bool) -> bool:
    """Install a copy of our `srcfd` as the notifying process's fd `newfd`, in place of
    whatever it held (SECCOMP_ADDFD_FLAG_SETFD, as dup2); the call is still to be answered.
    False when the target is gone."""
    return _addfd(listener, notif_id, ADDFD_FLAG_SETFD, srcfd, newfd, cloexec)


def _addfd(listener: int, notif_id: int, flags: int, srcfd: int, newfd: int,
           cloexec: bool) -> bool:
    req = NotifAddfd(notif_id, flags, srcfd, newfd, os.O_CLOEXEC if cloexec else 0)
    try:
        _ioctl_checked(listener, IOCTL_NOTIF_ADDFD, ctypes.byref(req))
        return True
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ESRCH):
            return False
        raise


def notif_sync_wake_up(listener: int) -> bool:
    """Ask the kernel to wake the notifying task and its supervisor on the waker's CPU
    (SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP): a trapped call then costs a switch between two
    tasks rather than a wake-up on another CPU. Only speed depends on it; False where the
    kernel lacks it (before 6.6)."""
    # The flags are the ioctl's argument itself, not a pointer to them.
    return _ioctl(listener, IOCTL_NOTIF_SET_FLAGS, USER_NOTIF_FD_SYNC_WAKE_UP) == 0


SET_MODE_FILTER = 1


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def load_filter(bpf: bytes) -> int:
    """Install a BPF program (struct sock_filter[]) on the calling thread, without a
    listener (COW clones run without the supervisor). 0 or -errno."""
    buf = ctypes.create_string_buffer(bpf, len(bpf))
    prog = _SockFprog(len(bpf) // 8, ctypes.cast(buf, ctypes.c_void_p))
    return syscall_errno(NR_SECCOMP, SET_MODE_FILTER, 0, ctypes.byref(prog))
