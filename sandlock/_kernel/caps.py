"""Capabilities: capget/capset (per thread), prctl, and the capability names.

The sandbox drops its capabilities in the exec trampoline (sandlock/_libexec); this module
serves the parent: detecting what it holds, and giving each supervisor thread the
sandbox's effective set, so that what it does on the sandbox's behalf is no more privileged
than the sandbox itself.
"""

import ctypes

from .syscall import NR_CAPGET, NR_CAPSET, NR_PRCTL, syscall, syscall_errno

PR_SET_NO_NEW_PRIVS = 38

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
    """effective/permitted/inheritable as 64-bit masks, in capset's layout."""

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
