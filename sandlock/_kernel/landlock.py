"""Landlock: filesystem, TCP port and IPC-scope rules enforced by the kernel.

A `LandlockRuleset` is built in the parent (paths opened, rules added) and only
`restrict_self()` runs in the sandboxed child, so the child makes a single syscall.
Landlock is allowlist-only: every right the ABI knows is *handled*, and a right is usable
only where a rule grants it.
"""

import ctypes
import os

from .syscall import (
    NR_LANDLOCK_ADD_RULE,
    NR_LANDLOCK_CREATE_RULESET,
    NR_LANDLOCK_RESTRICT_SELF,
    syscall,
    syscall_errno,
)

# Filesystem rights (linux/landlock.h), with the ABI that introduced each.
FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13  # ABI 2
FS_TRUNCATE = 1 << 14  # ABI 3
FS_IOCTL_DEV = 1 << 15  # ABI 5

NET_BIND_TCP = 1 << 0  # ABI 4
NET_CONNECT_TCP = 1 << 1  # ABI 4

SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1  # ABI 6

# Rights that make sense on a non-directory; the kernel rejects directory rights there.
FS_FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV

_RULE_PATH_BENEATH = 1
_RULE_NET_PORT = 2
_CREATE_RULESET_VERSION = 1 << 0


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _NetPortAttr(ctypes.Structure):
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


def abi_version() -> int:
    """The Landlock ABI the running kernel offers; 0 when Landlock is absent or disabled."""
    try:
        return syscall(NR_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                       ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except OSError:
        return 0


def fs_rights_for_abi(abi: int) -> int:
    """Every filesystem right the given ABI knows (all of them are handled)."""
    if abi <= 0:
        return 0
    rights = (1 << 13) - 1
    if abi >= 2:
        rights |= FS_REFER
    if abi >= 3:
        rights |= FS_TRUNCATE
    if abi >= 5:
        rights |= FS_IOCTL_DEV
    return rights


def net_rights_for_abi(abi: int) -> int:
    return NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0


def scopes_for_abi(abi: int) -> int:
    return SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0


def restrict_self_errno(ruleset_fd: int) -> int:
    """Enforce the ruleset at `ruleset_fd` on the calling *thread* (no thread-sync flag);
    returns 0 or -errno."""
    return syscall_errno(NR_LANDLOCK_RESTRICT_SELF, ruleset_fd, ctypes.c_uint32(0))


class LandlockRuleset:
    """An open ruleset fd. Rules are added in the parent; the child only restricts itself.

    The fd is O_CLOEXEC (the kernel creates it so), so an exec'd sandbox never holds it.
    """

    def __init__(self, abi: int, handled_fs: int, handled_net: int, scoped: int):
        attr = _RulesetAttr(handled_fs, handled_net, scoped)
        # The struct grew with the ABI; pass only the fields this kernel knows.
        size = 24 if abi >= 6 else 16 if abi >= 4 else 8
        self.handled_fs = handled_fs
        self.fd = syscall(NR_LANDLOCK_CREATE_RULESET, ctypes.byref(attr),
                          ctypes.c_size_t(size), ctypes.c_uint32(0))

    def allow_path_fd(self, path_fd: int, access: int) -> None:
        """Grant `access` beneath the file or directory open at `path_fd` (O_PATH is fine)."""
        attr = _PathBeneathAttr(access & self.handled_fs, path_fd)
        if attr.allowed_access:
            syscall(NR_LANDLOCK_ADD_RULE, self.fd, _RULE_PATH_BENEATH, ctypes.byref(attr),
                    ctypes.c_uint32(0))

    def allow_port(self, port: int, access: int) -> None:
        attr = _NetPortAttr(access, port)
        syscall(NR_LANDLOCK_ADD_RULE, self.fd, _RULE_NET_PORT, ctypes.byref(attr),
                ctypes.c_uint32(0))

    def restrict_self_errno(self) -> int:
        """Enforce the ruleset on the calling thread; returns 0 or -errno (child-safe)."""
        return restrict_self_errno(self.fd)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self):
        try:
            self.close()
        except OSError:
            pass
