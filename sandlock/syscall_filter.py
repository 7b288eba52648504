"""The seccomp-bpf program: unconditional denials, plus the syscalls the supervisor owns.

Compiled once per policy with pyseccomp (libseccomp) in the parent and exported as BPF
bytes; the child loads the bytes with one syscall. Rules:
- Syscalls from other ABIs (i386 `int 0x80`, x32) kill the process: otherwise every rule
  below could be sidestepped by calling the same operation under another number.
- Denied calls fail with EPERM; clone3 fails with ENOSYS so that libc falls back to clone,
  whose flags are visible to BPF (namespace flags denied), and openat2 fails with ENOSYS so
  that callers fall back to openat (its flags, mode and RESOLVE_* rules live in memory the
  filter cannot see, and a check read from there could change before the kernel reads it).
- No file is ever created with S_ISUID or S_ISGID, by any uid: the mode is a register of
  every creating call (open/openat/creat with O_CREAT or O_TMPFILE, mknod, mknodat, mkdir,
  mkdirat), so the filter refuses those bits there (EPERM) with nothing to re-read.
  `creation_refusal` applies the same rule where a call also reaches the supervisor.
- Integer arguments that the kernel reads as 32-bit (ioctl cmd, socket domain/type,
  personality) are compared on their low 32 bits only, so garbage in the high bits cannot
  dodge a rule.
- The syscalls in NOTIFY_SYSCALLS reach the supervisor, which decides and acts on behalf.
"""

from __future__ import annotations

import errno
import os
import socket

# Kernel-numbered syscalls that libseccomp 2.5.4 does not know by name (x86-64).
_NEWER_SYSCALLS = {
    "mount_setattr": 442, "quotactl_fd": 443, "fchmodat2": 452, "setxattrat": 463,
    "removexattrat": 466, "open_tree_attr": 467, "file_setattr": 469,
}

DEFAULT_DENY = (
    # io_uring bypasses seccomp and the supervisor entirely.
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    # Reaching into other processes.
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp",
    # Kernel attack surface and global state.
    "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "reboot", "swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "syslog",
    "open_by_handle_at", "name_to_handle_at", "lookup_dcookie", "uselib",
    "iopl", "ioperm", "vhangup", "fanotify_init",
    # Inode attributes (FS_IOC_SETFLAGS & co. are refused below as ioctls): not in Landlock.
    "file_setattr",
    # Mounts, roots and namespaces.
    "mount", "umount2", "fsopen", "fsconfig", "fsmount", "fspick", "move_mount",
    "open_tree", "open_tree_attr", "mount_setattr", "pivot_root", "chroot", "unshare", "setns",
)

SYSCALL_GROUPS = {
    "sysv_ipc": ("shmget", "shmat", "shmdt", "shmctl", "semget", "semop", "semtimedop",
                 "semctl", "msgget", "msgsnd", "msgrcv", "msgctl"),
    "io_uring": ("io_uring_setup", "io_uring_enter", "io_uring_register"),
    "mount": ("mount", "umount2", "fsopen", "fsconfig", "fsmount", "fspick", "move_mount",
              "open_tree", "open_tree_attr", "mount_setattr", "pivot_root", "chroot"),
    "namespaces": ("unshare", "setns"),
    "process_group": ("setsid", "setpgid"),
}
# Denied by default, and can be allowed back with extra_allow_syscalls=[group].
DEFAULT_DENY_GROUPS = ("sysv_ipc",)
ALLOWABLE_GROUPS = ("sysv_ipc", "process_group")

# Metadata calls: Landlock does not cover them, so the supervisor lets them through only
# for paths under fs_writable (sandlock.supervisor.metadata).
NOTIFY_SYSCALLS = (
    "chmod", "fchmod", "fchmodat", "fchmodat2",
    "chown", "fchown", "lchown", "fchownat",
    "utime", "utimes", "futimesat", "utimensat",
    "setxattr", "lsetxattr", "fsetxattr", "setxattrat",
    "removexattr", "lremovexattr", "fremovexattr", "removexattrat",
)

_CLONE_NAMESPACE_FLAGS = (0x00000080, 0x00020000, 0x02000000, 0x04000000, 0x08000000,
                          0x10000000, 0x20000000, 0x40000000)
_MSG_FASTOPEN = 0x20000000
# FS_IOC_SETFLAGS (and its 32-bit twin), FS_IOC_FSSETXATTR, FS_IOC_ENABLE_VERITY.
_INODE_FLAG_IOCTLS = (0x40086602, 0x40046602, 0x401C5820, 0x40806685)
# (level, optname): IP_OPTIONS; IPV6_2292HOPOPTS/DSTOPTS/RTHDR/PKTOPTIONS, IPV6_NEXTHOP,
# IPV6_HOPOPTS, IPV6_RTHDRDSTOPTS, IPV6_RTHDR, IPV6_DSTOPTS.
_ROUTING_SOCKOPTS = ((0, 4), (41, 3), (41, 4), (41, 5), (41, 6), (41, 9), (41, 54), (41, 55),
                     (41, 57), (41, 59))
_CLONE_FILES = 0x00000400
_CLONE_PARENT = 0x00008000
_PR_SET_CHILD_SUBREAPER = 36
_CLONE_THREAD = 0x00010000
_TIOCSTI = 0x5412
_TIOCLINUX = 0x541C
# ADDR_NO_RANDOMIZE, MMAP_PAGE_ZERO, ADDR_COMPAT_LAYOUT, READ_IMPLIES_EXEC, ADDR_LIMIT_32BIT,
# ADDR_LIMIT_3GB: each weakens memory-safety defences of the process and its exec'd children.
_PERSONALITY_FLAGS = (0x0040000, 0x0100000, 0x0200000, 0x0400000, 0x0800000, 0x8000000)
_LOW32 = 0xFFFFFFFF
# Socket families a sandbox may create. AF_INET/AF_INET6 only as TCP (Landlock governs TCP
# ports; UDP, raw and ICMP need the network supervisor's rules).
_ALLOWED_FAMILIES = (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK)
_AF_MAX = 46
_NETLINK_MAX = 32
_ALLOWED_NETLINK = (0, 4)  # NETLINK_ROUTE, NETLINK_SOCK_DIAG
_IPPROTO_SCTP = 132
_IPPROTO_MPTCP = 262


_SONAMES = {"c": "libc.so.6", "seccomp": "libseccomp.so.2"}


def _seccomp():
    """pyseccomp, imported on first use. At import it locates libc and libseccomp with
    ctypes.util.find_library, which runs ldconfig in a subprocess (~30 ms of every CLI
    start); the sonames are fixed on Linux, so they are answered directly."""
    import sys
    if "pyseccomp" not in sys.modules:
        import ctypes.util
        real = ctypes.util.find_library
        ctypes.util.find_library = lambda name: _SONAMES.get(name) or real(name)
        try:
            import pyseccomp  # noqa: F401
        finally:
            ctypes.util.find_library = real
    return sys.modules["pyseccomp"]


def syscall_number(name: str) -> int:
    """The x86-64 number of syscall `name`; ValueError if unknown."""
    if name in _NEWER_SYSCALLS:
        return _NEWER_SYSCALLS[name]
    sc = _seccomp()
    nr = sc.resolve_syscall(sc.Arch.NATIVE, name)
    if nr < 0:
        raise ValueError(name)
    return nr


def resolve_deny_list(extra_deny, extra_allow) -> frozenset[str]:
    """Default deny list + extra_deny_syscalls (names or groups) - extra_allow_syscalls groups.

    Raises PolicyError naming the unknown syscall or group.
    """
    from .errors import PolicyError
    names = set(DEFAULT_DENY)
    for group in DEFAULT_DENY_GROUPS:
        names.update(SYSCALL_GROUPS[group])
    for item in extra_allow or ():
        if item not in ALLOWABLE_GROUPS:
            raise PolicyError(f"extra_allow_syscalls: {item!r} is not an allowable group "
                              f"(choose from {', '.join(ALLOWABLE_GROUPS)})")
        names.difference_update(SYSCALL_GROUPS[item])
    if isinstance(extra_deny, str):
        raise PolicyError(f"extra_deny_syscalls: expected a list, got {extra_deny!r}")
    for item in extra_deny or ():
        if item in SYSCALL_GROUPS:
            names.update(SYSCALL_GROUPS[item])
            continue
        if not isinstance(item, str):
            raise PolicyError(f"extra_deny_syscalls: {item!r} is not a syscall name")
        try:
            syscall_number(item)
        except ValueError:
            raise PolicyError(f"extra_deny_syscalls: unknown syscall {item!r}") from None
        if item in NOTIFY_SYSCALLS:
            raise PolicyError(f"extra_deny_syscalls: {item!r} is handled by the supervisor "
                              f"(allowed only under fs_writable) and cannot also be denied")
        names.add(item)
    return frozenset(names)


_compiled: dict[tuple, bytes] = {}


# What a policy_fn observes, by event kind (sandlock.supervisor.runtime.EVENT_KINDS).
RUNTIME_SYSCALLS = {
    "exec": ("execve", "execveat"),
    "file": ("execve", "execveat", "open", "openat", "creat", "link", "linkat", "rename",
             "renameat", "renameat2", "symlink", "symlinkat"),
    "process": ("clone", "fork", "vfork", "exit_group"),
    "network": ("bind",),
}
# Linux AIO completes reads into user memory after the call returned: it could rewrite an
# argv the supervisor is inspecting under a freeze. Refused to sandboxes with a policy_fn.
RUNTIME_DENY = ("io_setup", "io_submit")
# Path calls a copy-on-write workdir serves (sandlock.supervisor.cow_calls), and the calls
# that must find in the real tree what the sandbox sees (execve, chdir).
COW_SYSCALLS = (
    "open", "creat", "openat", "stat", "lstat", "fstat", "newfstatat", "statx",
    "access", "faccessat", "faccessat2", "readlink", "readlinkat",
    "getxattr", "lgetxattr", "listxattr", "llistxattr", "getcwd", "chdir",
    "mkdir", "mkdirat", "mknod", "mknodat", "symlink", "symlinkat",
    "unlink", "unlinkat", "rmdir", "rename", "renameat", "renameat2",
    "link", "linkat", "truncate", "execve", "execveat", "getdents64", "getdents",
)


# Calls that create an inode from a mode register: name -> (flags argument that must contain
# O_CREAT or O_TMPFILE for the mode to count, or None when the call always creates; mode
# argument).
CREATING_CALLS = {"open": (1, 2), "openat": (2, 3), "creat": (None, 1), "mknod": (None, 1),
                  "mknodat": (None, 2), "mkdir": (None, 1), "mkdirat": (None, 2)}
_O_CREAT = 0o100
_O_TMPFILE = 0o20000000  # __O_TMPFILE
_SETID_BITS = (0o4000, 0o2000)  # S_ISUID, S_ISGID


def creation_refusal(name: str, args) -> str | None:
    """Why a creating call is refused (a set-id bit in its mode), or None. The same rule as
    the BPF program's: where a call also goes to the supervisor (a copy-on-write workdir, a
    policy_fn's file events), libseccomp lets the unconditional NOTIFY rule replace the
    conditional ones, so the loop applies this before any handler (registers: nothing to
    re-read)."""
    spec = CREATING_CALLS.get(name)
    if spec is None:
        return None
    flags_arg, mode_arg = spec
    if flags_arg is not None and not args[flags_arg] & (_O_CREAT | _O_TMPFILE):
        return None
    if args[mode_arg] & (_SETID_BITS[0] | _SETID_BITS[1]):
        return "setuid/setgid bits are never set from a sandbox (creation mode)"
    return None


# An overlay-backend workspace: directory renames the overlay refuses (supervisor.overlay_calls).
OVERLAY_SYSCALLS = ("rename", "renameat", "renameat2")
# The user's files under writable grants (supervisor.guard): calls that create a name, and
# opens that create (their flags are a register); in "landlock" mode (no mount namespace)
# also opens that may write, and the calls that remove or truncate by name.
GUARD_NAME_CALLS = ("creat", "mkdir", "mkdirat", "mknod", "mknodat", "symlink", "symlinkat",
                    "link", "linkat", "rename", "renameat", "renameat2")
GUARD_OPEN_FLAGS = {"open": 1, "openat": 2}
GUARD_LANDLOCK_CALLS = ("unlink", "unlinkat", "rmdir", "truncate")
_O_WRONLY, _O_RDWR, _O_TRUNC = 0o1, 0o2, 0o1000


def guard_wants(name: str, args, mode: str) -> bool:
    """Whether the guard serves this call (the same test as the filter's rules)."""
    if name in GUARD_OPEN_FLAGS:
        flags = args[GUARD_OPEN_FLAGS[name]]
        mask = _O_CREAT if mode == "mounts" else _O_CREAT | _O_WRONLY | _O_RDWR | _O_TRUNC
        return bool(flags & mask)
    if name in GUARD_NAME_CALLS:
        return bool(mode)
    return mode == "landlock" and name in GUARD_LANDLOCK_CALLS


def clone_refusal(flags: int, runtime: bool) -> str | None:
    """Why clone(flags) is refused, or None. The same checks as the BPF rules below: when
    clone is also sent to the supervisor (a policy_fn's process events), libseccomp lets
    the unconditional NOTIFY rule replace the conditional ones, so the handler applies
    them (the flags are a register: nothing to re-read)."""
    flags &= 0xFFFFFFFFFFFFFFFF
    for flag in _CLONE_NAMESPACE_FLAGS:
        if flags & flag:
            return "clone with a namespace flag"
    if flags & (_CLONE_FILES | _CLONE_THREAD) == _CLONE_FILES:
        return "CLONE_FILES outside a thread group"
    if flags & (_CLONE_FILES | _CLONE_THREAD) == _CLONE_THREAD:
        return "a thread with an fd table of its own (CLONE_THREAD without CLONE_FILES)"
    if runtime and flags & _CLONE_PARENT:
        return "CLONE_PARENT (a sibling outside the program's process tree)"
    return None


def compile_filter(deny: frozenset[str], supervised: bool = True,
                   deny_inet: bool = False, net_supervised: bool = False,
                   udp: bool = False, icmp: bool = False,
                   runtime_events: frozenset = frozenset(), cow: bool = False,
                   deny_unix: bool = False, deny_listen: bool = False,
                   overlay: bool = False, guard: str = "", unix_pairs_only: bool = False,
                   listen: str = "notify", count_forks: bool = False,
                   pin_cpus: bool = False) -> bytes:
    """The BPF program as bytes (struct sock_filter array); cached per argument set.

    supervised=False (a kernel without the supervisor's features, allowed as degraded)
    denies the metadata calls outright instead of notifying; deny_inet=True (no Landlock
    TCP rules) denies every AF_INET/AF_INET6 socket. net_supervised sends connect() and
    every send that can carry a destination to the supervisor; udp / icmp allow creating
    UDP and ICMP-ping sockets (their destinations are then the supervisor's to decide).
    runtime_events (a policy_fn's event kinds) sends the calls it observes to the
    supervisor; cow sends the path calls a copy-on-write workdir serves. For COW clones,
    which run without a supervisor: deny_unix refuses AF_UNIX sockets and socketpair (no
    pathname-socket connect or send can be checked), deny_listen refuses listen() (on an
    unbound socket it binds a port Landlock never sees). guard ("mounts" or "landlock")
    sends the calls the protection of the user's files needs (guard_wants).
    unix_pairs_only (a supervisor that cannot act on sockets: no pidfd_getfd) refuses
    AF_UNIX sockets but connected stream/seqpacket pairs (socketpair), so that no pathname
    socket is ever reached unchecked. listen: "notify" (the supervisor checks the socket is
    bound), "allow" (any port may be bound anyway) or "deny" (no port may be bound, and a
    listen() would bind one). count_forks (max_processes) sends clone/fork/vfork to the
    supervisor (supervisor.forks); pin_cpus (cpu_cores) refuses sched_setaffinity.
    """
    key = (deny, supervised, deny_inet, net_supervised, udp, icmp, runtime_events, cow,
           deny_unix, deny_listen, overlay, guard, unix_pairs_only, listen, count_forks,
           pin_cpus)
    bpf = _compiled.get(key)
    if bpf is None:
        bpf = _compiled[key] = _compile(*key)
    return bpf


def _compile(deny: frozenset[str], supervised: bool, deny_inet: bool, net_supervised: bool,
             udp: bool, icmp: bool, runtime_events: frozenset, cow: bool,
             deny_unix: bool, deny_listen: bool, overlay: bool, guard: str,
             unix_pairs_only: bool, listen: str, count_forks: bool,
             pin_cpus: bool) -> bytes:
    sc = _seccomp()
    f = sc.SyscallFilter(sc.ALLOW)
    f.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    # A binary tree over syscall numbers: every syscall of the sandbox pays O(log n)
    # comparisons instead of walking the whole rule list (libseccomp >= 2.5).
    f.set_attr(sc.Attr.CTL_OPTIMIZE, 2)
    eperm = sc.ERRNO(errno.EPERM)
    if runtime_events:
        deny = deny | frozenset(RUNTIME_DENY)
    for name in sorted(deny):
        f.add_rule(eperm, syscall_number(name))
    if runtime_events:
        # CLONE_PARENT would make a sibling of the program, outside its process tree, and
        # the program must stay a child subreaper (orphans stay in its tree): freeze.py.
        f.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, _CLONE_PARENT, _CLONE_PARENT))
        f.add_rule(eperm, "prctl", sc.Arg(0, sc.MASKED_EQ, _LOW32, _PR_SET_CHILD_SUBREAPER))
    observed = sorted({n for kind in runtime_events for n in RUNTIME_SYSCALLS[kind]}
                      | (set(COW_SYSCALLS) if cow else set())
                      | (set(OVERLAY_SYSCALLS) if overlay else set())
                      | (set(GUARD_NAME_CALLS) if guard else set())
                      | (set(GUARD_LANDLOCK_CALLS) if guard == "landlock" else set())
                      | ({"clone", "fork", "vfork"} if count_forks else set()))
    if guard:
        bits = (_O_CREAT,) if guard == "mounts" else (_O_CREAT, _O_WRONLY, _O_RDWR, _O_TRUNC)
        for name, arg in GUARD_OPEN_FLAGS.items():
            if name in observed:
                continue  # sent whatever its flags
            for bit in bits:
                f.add_rule(sc.NOTIFY, syscall_number(name), sc.Arg(arg, sc.MASKED_EQ, bit, bit))
    # fstat() (newfstatat/statx(fd, "", AT_EMPTY_PATH), or fstat) is sent as well: on a
    # file the layer copied, it must report the identity a stat by path reports (cp and
    # install compare the two). The C fast path continues every other one (fastpath.py).
    for name in observed:  # only reachable with the supervisor (build() checks)
        f.add_rule(sc.NOTIFY, syscall_number(name))
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    f.add_rule(sc.ERRNO(errno.ENOSYS), "openat2")
    for name, (flags_arg, mode_arg) in CREATING_CALLS.items():
        for bit in _SETID_BITS:
            mode = sc.Arg(mode_arg, sc.MASKED_EQ, bit, bit)
            if flags_arg is None:
                f.add_rule(eperm, name, mode)
                continue
            for flag in (_O_CREAT, _O_TMPFILE):
                f.add_rule(eperm, name, sc.Arg(flags_arg, sc.MASKED_EQ, flag, flag), mode)
    for flag in _CLONE_NAMESPACE_FLAGS:
        f.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    for cmd in (_TIOCSTI, _TIOCLINUX) + _INODE_FLAG_IOCTLS:
        f.add_rule(eperm, "ioctl", sc.Arg(1, sc.MASKED_EQ, _LOW32, cmd))
    # Calls that take another process's pid and need no ptrace right (so neither Landlock
    # nor the scopes see them): only the caller itself (0) may be named. prlimit on the
    # parent could otherwise kill the supervisor (RLIMIT_CPU) and orphan the sandbox.
    f.add_rule(eperm, "prlimit64", sc.Arg(0, sc.NE, 0))
    if pin_cpus:  # cpu_cores: the affinity set before the start is the sandbox's for good
        f.add_rule(eperm, "sched_setaffinity")
    for name, arg in (("setpriority", 1), ("ioprio_set", 1),
                      *((("sched_setaffinity", 0),) if not pin_cpus else ()),
                      ("sched_setscheduler", 0), ("sched_setparam", 0), ("sched_setattr", 0)):
        f.add_rule(eperm, name, sc.Arg(arg, sc.NE, 0))
    # ... and never "every process of this user" (PRIO_USER, IOPRIO_WHO_USER).
    f.add_rule(eperm, "setpriority", sc.Arg(0, sc.MASKED_EQ, _LOW32, 2))
    f.add_rule(eperm, "ioprio_set", sc.Arg(0, sc.MASKED_EQ, _LOW32, 3))
    # Source routing: an IPv6 routing header (or IPv4 options) would carry checked traffic
    # on to an address nobody checked.
    for level, opt in _ROUTING_SOCKOPTS:
        f.add_rule(eperm, "setsockopt", sc.Arg(1, sc.MASKED_EQ, _LOW32, level),
                   sc.Arg(2, sc.MASKED_EQ, _LOW32, opt))
    # personality: a dangerous flag set and bit 31 clear (bit 31 set = the 0xffffffff query).
    for flag in _PERSONALITY_FLAGS:
        f.add_rule(eperm, "personality", sc.Arg(0, sc.MASKED_EQ, flag | 1 << 31, flag))
    for name in NOTIFY_SYSCALLS:
        f.add_rule(sc.NOTIFY if supervised else eperm, syscall_number(name))
    # fd tables are shared exactly by the threads of a process: the supervisor relies on
    # it (see supervisor.network) to know when the kernel's re-read of an fd cannot
    # differ, and that the process's fds are the caller's.
    f.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, _CLONE_FILES | _CLONE_THREAD,
                                      _CLONE_FILES))
    # ... and a thread group has one fd table: a thread of its own table would make the
    # process's fds (which the supervisor duplicates and checks) not the caller's.
    f.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, _CLONE_FILES | _CLONE_THREAD,
                                      _CLONE_THREAD))
    if supervised and listen == "notify":
        f.add_rule(sc.NOTIFY, "listen")  # listen() on an unbound socket binds a port
    elif deny_listen or (supervised and listen == "deny"):
        f.add_rule(eperm, "listen")
    if deny_unix:
        f.add_rule(eperm, "socketpair")
    elif unix_pairs_only:
        # A datagram socket of a pair can still send to any pathname socket (sendto).
        f.add_rule(eperm, "socketpair", sc.Arg(1, sc.MASKED_EQ, 0xF, socket.SOCK_DGRAM))
    if supervised and net_supervised:
        f.add_rule(sc.NOTIFY, "connect")
        f.add_rule(sc.NOTIFY, "sendto", sc.Arg(4, sc.NE, 0))  # NULL address: stays in kernel
        f.add_rule(sc.NOTIFY, "sendmsg")
        f.add_rule(sc.NOTIFY, "sendmmsg")
    else:
        # TCP Fast Open connects inside sendto/sendmsg, past Landlock's connect hook.
        for name, arg in (("sendto", 3), ("sendmsg", 2), ("sendmmsg", 3)):
            f.add_rule(eperm, name, sc.Arg(arg, sc.MASKED_EQ, _MSG_FASTOPEN, _MSG_FASTOPEN))
    _add_socket_rules(f, sc, eperm, deny_inet, udp and supervised and net_supervised,
                      icmp and supervised and net_supervised, deny_unix or unix_pairs_only)
    with os.fdopen(os.memfd_create("sandlock-bpf", os.MFD_CLOEXEC), "w+b") as tmp:
        f.export_bpf(tmp)
        tmp.seek(0)
        return tmp.read()


def _add_socket_rules(f, sc, eperm, deny_inet: bool, udp: bool, icmp: bool,
                      deny_unix: bool = False) -> None:
    """socket(): only _ALLOWED_FAMILIES; AF_INET/AF_INET6 as TCP, and as UDP or ICMP-ping
    datagram sockets only when the policy has such rules (never raw or packet).

    Families are compared on the low 32 bits (the kernel's `int domain`); any value above
    the last family number is denied outright.
    """
    allowed = _ALLOWED_FAMILIES
    if deny_inet:
        allowed = (socket.AF_UNIX, socket.AF_NETLINK)
    if deny_unix:
        allowed = tuple(a for a in allowed if a != socket.AF_UNIX)
    for family in range(_AF_MAX):
        if family not in allowed:
            f.add_rule(eperm, "socket", sc.Arg(0, sc.MASKED_EQ, _LOW32, family))
    f.add_rule(eperm, "socket", sc.Arg(0, sc.GT, _AF_MAX - 1))
    # Netlink: routing (read-only without CAP_NET_ADMIN, which sandboxes never hold) and
    # socket diagnostics only; not audit, uevents, netfilter, xfrm, generic families.
    for proto in range(_NETLINK_MAX):
        if proto not in _ALLOWED_NETLINK:
            f.add_rule(eperm, "socket", sc.Arg(0, sc.MASKED_EQ, _LOW32, socket.AF_NETLINK),
                       sc.Arg(2, sc.MASKED_EQ, _LOW32, proto))
    f.add_rule(eperm, "socket", sc.Arg(0, sc.MASKED_EQ, _LOW32, socket.AF_NETLINK),
               sc.Arg(2, sc.GT, _NETLINK_MAX - 1))
    for family, ping in ((socket.AF_INET, socket.IPPROTO_ICMP),
                         (socket.AF_INET6, socket.IPPROTO_ICMPV6)):
        for sock_type in range(16):  # the type's low 4 bits; the rest are SOCK_* flags
            if sock_type == socket.SOCK_STREAM or (sock_type == socket.SOCK_DGRAM
                                                    and (udp or icmp)):
                continue
            f.add_rule(eperm, "socket", sc.Arg(0, sc.MASKED_EQ, _LOW32, family),
                       sc.Arg(1, sc.MASKED_EQ, 0xF, sock_type))
        if udp or icmp:  # datagram sockets: only the allowed protocols
            allowed = ([0, socket.IPPROTO_UDP] if udp else []) + ([ping] if icmp else [])
            for proto in (0, socket.IPPROTO_UDP, ping, socket.IPPROTO_UDPLITE):
                if proto not in allowed:
                    f.add_rule(eperm, "socket", sc.Arg(0, sc.MASKED_EQ, _LOW32, family),
                               sc.Arg(1, sc.MASKED_EQ, 0xF, socket.SOCK_DGRAM),
                               sc.Arg(2, sc.MASKED_EQ, _LOW32, proto))
        for proto in (_IPPROTO_SCTP, _IPPROTO_MPTCP):  # stream protocols Landlock may not see
            f.add_rule(eperm, "socket", sc.Arg(0, sc.MASKED_EQ, _LOW32, family),
                       sc.Arg(2, sc.MASKED_EQ, _LOW32, proto))
