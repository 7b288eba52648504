"""What the running kernel supports, and what a sandbox loses without it.

Detection asks the kernel directly (a syscall per feature), never securityfs or version
strings. Missing features are an error unless the policy sets allow_degraded, in which
case `degradations()` names every protection that is lost; nothing degrades silently.

SANDLOCK_TEST_LANDLOCK_ABI=N caps the detected Landlock ABI at N (it can only lower it):
this is how the test suite exercises the old-kernel paths on a new kernel.
"""

from __future__ import annotations

import enum
import errno
import functools
import os
from dataclasses import dataclass

from ._kernel import landlock, pidfd, seccomp
from ._kernel.fileops import AT_EMPTY_PATH
from ._kernel.syscall import NR_FCHMODAT2, syscall

# The full protection set: Landlock ABI 6 (Linux 6.12) for IPC scopes, plus TCP rules (6.7).
FULL_LANDLOCK_ABI = 6


class Protection(enum.IntEnum):
    """A Landlock protection a sandbox may waive explicitly (Sandbox(disable=[...]), as in
    upstream Sandlock): it is then neither required of the kernel nor applied. Waiving one
    never loosens another mechanism's rule: with NET_TCP waived, every IPv4/IPv6 socket is
    refused as on a kernel without Landlock's TCP rules, and a policy with network rules
    is refused. FS_REFER waived makes moving or linking across directories fail (EXDEV)."""

    FS_REFER = 0
    FS_TRUNCATE = 1
    NET_TCP = 2
    FS_IOCTL_DEV = 3
    SIGNAL_SCOPE = 4
    ABSTRACT_UNIX_SOCKET_SCOPE = 5

    @property
    def min_abi(self) -> int:
        """The Landlock ABI that brings it."""
        return (2, 3, 4, 5, 6, 6)[self.value]


def min_landlock_abi() -> int:
    """The Landlock ABI a sandbox needs for every protection (less only with
    allow_degraded, or with the protections it lacks waived)."""
    return FULL_LANDLOCK_ABI


@dataclass(frozen=True)
class KernelFeatures:
    landlock_abi: int
    seccomp_user_notif: bool
    pidfd_getfd: bool
    notif_addfd: bool
    fchmodat2: bool

    def report(self) -> list[tuple[str, bool, str]]:
        """(feature, present, what it is for) rows for `sandlock check`."""
        abi = self.landlock_abi
        return [
            ("landlock (ABI >= 1)", abi >= 1, "filesystem confinement"),
            ("landlock ABI >= 4", abi >= 4, "TCP bind/connect port rules (Linux 6.7)"),
            ("landlock ABI >= 5", abi >= 5, "device ioctl restriction (Linux 6.10)"),
            ("landlock ABI >= 6", abi >= 6, "signal and abstract-unix-socket scopes (Linux 6.12)"),
            ("seccomp user notification", self.seccomp_user_notif, "the supervisor"),
            ("pidfd_getfd", self.pidfd_getfd, "on-behalf operations on the child's sockets"),
            ("SECCOMP_IOCTL_NOTIF_ADDFD", self.notif_addfd, "injecting fds into the child"),
            ("fchmodat2", self.fchmodat2, "chmod on behalf without /proc (Linux 6.6)"),
        ]

    def missing(self) -> list[str]:
        return [name for name, present, _ in self.report() if not present]


def _probe_pidfd_getfd() -> bool:
    try:
        fd = pidfd.pidfd_open(os.getpid())
    except OSError:
        return False
    try:
        os.close(pidfd.pidfd_getfd(fd, fd))
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _probe_fchmodat2() -> bool:
    # An invalid flag: EINVAL means the syscall exists, ENOSYS that it does not, EPERM
    # that a seccomp profile refuses it (a container's, which does not know it yet).
    try:
        syscall(NR_FCHMODAT2, -1, b"", 0, 0x80000000 | AT_EMPTY_PATH)
    except OSError as e:
        return e.errno not in (errno.ENOSYS, errno.EPERM)
    return True


def seccomp_filtered() -> bool:
    """Whether this process already runs under a seccomp filter (a container's profile)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Seccomp:"):
                    return line.split()[1] == "2"
    except OSError:
        pass
    return False


@functools.lru_cache(maxsize=1)
def detect() -> KernelFeatures:
    abi = landlock.abi_version()
    cap = os.environ.get("SANDLOCK_TEST_LANDLOCK_ABI")
    if cap is not None and cap.isdigit():
        abi = min(abi, int(cap))
    notif = seccomp.action_available(seccomp.RET_USER_NOTIF)
    return KernelFeatures(
        landlock_abi=abi,
        seccomp_user_notif=notif,
        pidfd_getfd=_probe_pidfd_getfd(),
        # ADDFD (5.9) predates Landlock (5.13) and fchmodat2 (6.6): a kernel with user
        # notification and either has it (an ioctl, which no container profile refuses).
        notif_addfd=notif and (abi >= 1 or _probe_fchmodat2()),
        fchmodat2=_probe_fchmodat2(),
    )


def degradations(f: KernelFeatures, waived=frozenset()) -> list[str]:
    """Every protection a sandbox on this kernel lacks, as sentences for the user; those in
    `waived` (Protection) are not lost but given up, and not listed."""
    lost = []
    abi = f.landlock_abi
    if abi < 1:
        lost.append("no Landlock: the filesystem is not confined at all")
    else:
        if abi < 3 and Protection.FS_TRUNCATE not in waived:
            lost.append(f"Landlock ABI {abi}: truncate() is not restricted")
        if abi < 4 and Protection.NET_TCP not in waived:
            lost.append(f"Landlock ABI {abi}: no TCP port rules, so all TCP sockets are denied")
        if abi < 5 and Protection.FS_IOCTL_DEV not in waived:
            lost.append(f"Landlock ABI {abi}: ioctl on devices is not restricted")
        if abi < 6 and not {Protection.SIGNAL_SCOPE,
                            Protection.ABSTRACT_UNIX_SOCKET_SCOPE} <= set(waived):
            lost.append(f"Landlock ABI {abi}: signals and abstract unix sockets can reach "
                        f"processes outside the sandbox (the sandbox's own root included: a "
                        f"program that kills it can leave processes running after the "
                        f"sandbox ends)")
    if not supervisor_available(f):
        lost.append("no supervisor: chmod/chown/utimes/xattr changes are denied everywhere, "
                    "and connects to pathname unix sockets are not checked")
    return lost


SOCKETS_REFUSED = (
    "network rules naming hosts, addresses, UDP or ICMP, HTTP rules, unix-socket rules, "
    "TCP bind rules for specific ports and policy_fn network events are refused")
SOCKETS_HOW = ("in a container, give it CAP_SYS_PTRACE (docker run --cap-add SYS_PTRACE) or a "
               "seccomp profile that allows pidfd_getfd")


def costs(f: KernelFeatures) -> list[tuple[str, str]]:
    """("refused" or "note", text): what this system refuses to run (features that need
    what it lacks) and what it does otherwise, without any protection being lost: `sandlock
    check` lists them, and policies needing a refused feature fail before anything runs."""
    out = []
    if supervisor_available(f) and not f.pidfd_getfd:
        out.append(("refused", f"pidfd_getfd is refused here{' (a seccomp profile)' if seccomp_filtered() else ''}: "
                   f"the supervisor cannot act on the sandbox's sockets, so {SOCKETS_REFUSED}; "
                   f"filesystem policies, Landlock port rules (--allow :PORT), workspaces "
                   f"and the protection of the user's files run; unix sockets other than "
                   f"connected pairs are refused. To lift it: {SOCKETS_HOW}"))
    if supervisor_available(f) and not f.fchmodat2:
        out.append(("note", "fchmodat2 is missing or refused: chmod on the sandbox's behalf "
                            "goes through /proc/self/fd (no protection lost)"))
    return out


def check(allow_degraded, waived=frozenset()) -> list[str]:
    """Raise KernelFeatureError unless the kernel has everything (but the protections
    `waived`) or degrading is allowed (True: anything; a set of Protection: those);
    returns the list of degradations accepted."""
    from .errors import KernelFeatureError, LandlockUnavailableError
    f = detect()
    lost = degradations(f, waived)
    if isinstance(allow_degraded, frozenset):
        unaccepted = degradations(f, frozenset(waived) | allow_degraded)
    else:
        unaccepted = [] if allow_degraded else lost
    if unaccepted:
        error = LandlockUnavailableError if f.landlock_abi < FULL_LANDLOCK_ABI else \
            KernelFeatureError
        raise error(
            f"kernel lacks {', '.join(f.missing())} (Landlock ABI {f.landlock_abi}, "
            f"need {FULL_LANDLOCK_ABI}: Linux 6.12+); pass allow_degraded=True "
            f"(--allow-degraded) to run with less protection")
    return lost


def supervisor_available(f: KernelFeatures) -> bool:
    return f.seccomp_user_notif and f.notif_addfd
