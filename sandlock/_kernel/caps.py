"""Capabilities and privilege bits: capget/capset and the prctl() calls that bound them.

A sandbox started by root must hold no capability in any set (effective, permitted,
inheritable, ambient, bounding) unless the policy keeps it by name. NO_NEW_PRIVS makes
sure setuid binaries and file capabilities cannot add any back at exec.
"""

import ctypes

from .syscall import NR_CAPGET, NR_CAPSET, NR_PRCTL, syscall, syscall_errno

PR_SET_NO_NEW_PRIVS = 38
PR_CAPBSET_DROP = 24
PR_SET_SECUREBITS = 28
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_RAISE = 2
PR_CAP_AMBIENT_CLEAR_ALL = 4

# Securebits: root gets no capabilities at exec and uid changes do not restore them; locked.
SECBIT_NOROOT = 1 << 0
SECBIT_NOROOT_LOCKED = 1 << 1
SECBIT_NO_SETUID_FIXUP = 1 << 2
SECBIT_NO_SETUID_FIXUP_LOCKED = 1 << 3
SECBIT_KEEP_CAPS_LOCKED = 1 << 5
SANDBOX_SECUREBITS = (SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP
                      | SECBIT_NO_SETUID_FIXUP_LOCKED | SECBIT_KEEP_CAPS_LOCKED)

_CAP_VERSION_3 = 0x20080522

CAP_NAMES = [
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
    "CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW",
    "CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE",
    "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ",
    "CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE",
]


def cap_last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except OSError:
        return len(CAP_NAMES) - 1


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


class CapSets:
    """effective/permitted/inheritable as 64-bit masks, ready for capset in a child."""

    def __init__(self, effective: int, permitted: int, inheritable: int):
        self.header = _CapHeader(_CAP_VERSION_3, 0)
        self.data = (_CapData * 2)()
        for i, shift in enumerate((0, 32)):
            self.data[i].effective = (effective >> shift) & 0xFFFFFFFF
            self.data[i].permitted = (permitted >> shift) & 0xFFFFFFFF
            self.data[i].inheritable = (inheritable >> shift) & 0xFFFFFFFF

    def mask(self, field: str) -> int:
        return getattr(self.data[0], field) | (getattr(self.data[1], field) << 32)


def capget() -> CapSets:
    """The calling thread's capability sets."""
    sets = CapSets(0, 0, 0)
    syscall(NR_CAPGET, ctypes.byref(sets.header), ctypes.byref(sets.data))
    return sets


def capset_errno(sets: CapSets) -> int:
    """Set the calling *thread's* capability sets (the kernel's capset is per thread)."""
    return syscall_errno(NR_CAPSET, ctypes.byref(sets.header), ctypes.byref(sets.data))


def prctl_errno(option: int, arg2: int = 0, arg3: int = 0) -> int:
    return syscall_errno(NR_PRCTL, option, ctypes.c_ulong(arg2), ctypes.c_ulong(arg3),
                         ctypes.c_ulong(0), ctypes.c_ulong(0))
