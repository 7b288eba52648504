"""One seccomp notification: its arguments, and copies of what they point to in the child.

Invariant: every pointer argument is read from child memory at most once, and handlers
decide and act only on those copies or on fds duplicated from the child, never on the
child's memory again. `still_valid()` is checked after reading and before acting, so a pid
reused by an unrelated process is never acted upon.
"""

from __future__ import annotations

import errno
import os

from .._kernel import memory, pidfd, seccomp
from .._kernel.fileops import AT_EMPTY_PATH, AT_FDCWD

PATH_MAX = 4096


class Denied(Exception):
    """A handler's refusal: the syscall fails with `errno` and the event is recorded."""

    def __init__(self, err: int, reason: str):
        super().__init__(reason)
        self.errno = err
        self.reason = reason


def thread_group(tid: int) -> int:
    with open(f"/proc/{tid}/status", "rb") as f:
        for line in f:
            if line.startswith(b"Tgid:"):
                return int(line.split()[1])
    raise OSError(errno.ESRCH, "no such task")


class Request:
    __slots__ = ("listener", "id", "pid", "nr", "args", "_pidfd", "own_mounts")

    def __init__(self, listener: int, notif: seccomp.Notif, own_mounts: bool = False):
        self.listener = listener
        self.id = notif.id
        self.pid = notif.pid
        self.nr = notif.data.nr
        self.args = tuple(notif.data.args)
        self._pidfd = -1
        self.own_mounts = own_mounts  # the caller has a mount namespace of its own

    def arg_int(self, i: int) -> int:
        """A C `int` argument (sign-extended from the low 32 bits, as the kernel reads it)."""
        v = self.args[i] & 0xFFFFFFFF
        return v - (1 << 32) if v & 0x80000000 else v

    def read_bytes(self, addr: int, length: int) -> bytes:
        if addr == 0:
            raise Denied(errno.EFAULT, "NULL pointer")
        data = memory.read_memory(self.pid, addr, length)
        if len(data) != length:
            raise Denied(errno.EFAULT, "argument crosses unmapped memory")
        return data

    def read_path(self, i: int) -> bytes:
        addr = self.args[i]
        if addr == 0:
            raise Denied(errno.EFAULT, "NULL path")
        try:
            return memory.read_cstring(self.pid, addr, PATH_MAX)
        except OSError as e:
            raise Denied(e.errno or errno.EFAULT, "unreadable path argument") from None

    def _get_pidfd(self) -> int:
        """A pidfd on the calling thread itself (PIDFD_THREAD), so that pidfd_getfd reads
        the caller's own fd table even after its group leader exited; on kernels without
        thread pidfds, on its process (the filter makes every thread of a process share
        one fd table)."""
        if self._pidfd < 0:
            try:
                self._pidfd = pidfd.pidfd_open(self.pid, pidfd.PIDFD_THREAD)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                try:
                    self._pidfd = pidfd.pidfd_open(self.pid)
                except OSError as e:
                    if e.errno not in (errno.EINVAL, errno.ENOENT):  # ENOENT: not a leader
                        raise
                    self._pidfd = pidfd.pidfd_open(thread_group(self.pid))
            # The pid was a number until now: if the caller died and the number was reused,
            # the notification is no longer valid. Checked after opening, the pidfd then
            # pins the right process for every later use.
            if not self.still_valid():
                os.close(self._pidfd)
                self._pidfd = -1
                raise Denied(errno.ESRCH, "the calling task is gone")
        return self._pidfd

    def dup_fd(self, child_fd: int) -> int:
        """Our own duplicate of the child's fd (the caller closes it). Where pidfd_getfd
        is refused (a container's seccomp profile), an O_PATH fd on the same object
        through /proc/TID/fd: enough for what a path names (a directory to start from, an
        inode to chmod or exec); a socket operation on it fails (EBADF), and the policies
        that need those are refused before anything runs (features.costs)."""
        if child_fd < 0:
            raise Denied(errno.EBADF, "bad file descriptor")
        from ..features import detect
        if not detect().pidfd_getfd:
            try:
                fd = os.open(f"/proc/{self.pid}/fd/{child_fd}", os.O_PATH | os.O_CLOEXEC)
            except OSError as e:
                raise Denied(errno.EBADF if e.errno == errno.ENOENT else e.errno,
                             "cannot reach the child's fd") from None
            if not self.still_valid():
                os.close(fd)
                raise Denied(errno.ESRCH, "the calling task is gone")
            return fd
        try:
            return pidfd.pidfd_getfd(self._get_pidfd(), child_fd)
        except OSError as e:
            raise Denied(errno.EBADF if e.errno == errno.EBADF else e.errno,
                         "cannot duplicate the child's fd") from None

    def open_target(self, dirfd_arg: int, path: bytes, at_flags: int, follow: bool) -> int:
        """Resolve (dirfd, path) as the child would and return an O_PATH fd on the result.

        The child's root is the supervisor's root (chroot is denied to sandboxes), so
        absolute paths resolve identically, except in a mount namespace of the sandbox's
        own (the overlay backend's): there they are resolved from its root with
        RESOLVE_IN_ROOT, so that an absolute symlink is followed in its view, not ours.
        /proc is the same in both (no pid namespace), and its magic links lead where
        the child's would.
        """
        oflags = os.O_PATH | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
        for own in (b"/proc/self/", b"/proc/thread-self/"):  # the caller's, not ours
            if path.startswith(own):
                path = b"/proc/%d/" % self.pid + path[len(own):]
        if not path:
            if not at_flags & AT_EMPTY_PATH:
                raise Denied(errno.ENOENT, "empty path")
            return self._dir_base(dirfd_arg)
        if self.own_mounts:
            full = path if path.startswith(b"/") else self._base_path(dirfd_arg) + b"/" + path
            if not os.path.normpath(full).startswith(b"/proc/"):
                from .._kernel.fileops import RESOLVE_IN_ROOT, openat2
                root = os.open(f"/proc/{self.pid}/root", os.O_PATH | os.O_CLOEXEC)
                try:
                    return openat2(root, os.fsdecode(full), oflags, 0, RESOLVE_IN_ROOT)
                finally:
                    os.close(root)
        if path.startswith(b"/"):
            return os.open(path, oflags)
        base = self._dir_base(dirfd_arg)
        try:
            return os.open(path, oflags, dir_fd=base)
        finally:
            os.close(base)

    def _base_path(self, dirfd_arg: int) -> bytes:
        """The path, in the caller's view, of the directory a relative path starts from."""
        link = (f"/proc/{self.pid}/cwd" if dirfd_arg == AT_FDCWD
                else f"/proc/{self.pid}/fd/{dirfd_arg}")
        try:
            base = os.readlink(os.fsencode(link))
        except OSError as e:
            raise Denied(errno.EBADF if dirfd_arg != AT_FDCWD else errno.ENOENT,
                         f"no directory to start from ({e.strerror})") from None
        if not base.startswith(b"/") or base.endswith(b" (deleted)"):
            raise Denied(errno.ENOENT, "the directory to start from is gone")
        return base

    def _dir_base(self, dirfd_arg: int) -> int:
        if dirfd_arg == AT_FDCWD:
            return os.open(f"/proc/{self.pid}/cwd", os.O_PATH | os.O_CLOEXEC)
        return self.dup_fd(dirfd_arg)

    def process_ids(self) -> tuple[int, int]:
        """(process id, parent process id) of the calling thread. Raises Denied if gone."""
        tgid = ppid = None
        try:
            with open(f"/proc/{self.pid}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"Tgid:"):
                        tgid = int(line.split()[1])
                    elif line.startswith(b"PPid:"):
                        ppid = int(line.split()[1])
                        break
        except OSError:
            pass
        if tgid is None or ppid is None:
            raise Denied(errno.ESRCH, "the calling task is gone")
        return tgid, ppid

    def still_valid(self) -> bool:
        return seccomp.notif_id_valid(self.listener, self.id)

    def close(self) -> None:
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1
