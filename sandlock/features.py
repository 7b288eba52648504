"""What the running kernel supports, and what a sandbox loses without it.

Detection asks the kernel directly (a syscall per feature), never securityfs or version
strings. Missing features are an error unless the policy sets allow_degraded, in which
case `degradations()` names every protection that is lost; nothing degrades silently.

SANDLOCK_TEST_LANDLOCK_ABI=N caps the detected Landlock ABI at N (it can only lower it):
this is how the test suite exercises the old-kernel paths on a new kernel.
"""

from __future__ import annotations

import errno
import functools
import os
from dataclasses import dataclass

from ._kernel import landlock, pidfd, seccomp
from ._kernel.fileops import AT_EMPTY_PATH
from ._kernel.syscall import NR_FCHMODAT2, syscall

# The full protection set: Landlock ABI 6 (Linux 6.12) for IPC scopes, plus TCP rules (6.7).
FULL_LANDLOCK_ABI = 6


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
            ("pidfd_getfd", self.pidfd_getfd, "on-behalf operations on the child's fds"),
            ("SECCOMP_IOCTL_NOTIF_ADDFD", self.notif_addfd, "injecting fds into the child"),
            ("fchmodat2", self.fchmodat2, "metadata changes on behalf (Linux 6.6)"),
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
    # An invalid flag: EINVAL means the syscall exists, ENOSYS that it does not.
    try:
        syscall(NR_FCHMODAT2, -1, b"", 0, 0x80000000 | AT_EMPTY_PATH)
    except OSError as e:
        return e.errno != errno.ENOSYS
    return True


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
        # ADDFD (5.9) predates fchmodat2 (6.6) and pidfd_getfd (5.6) is older still; a kernel
        # with user notification and fchmodat2 has ADDFD.
        notif_addfd=notif and _probe_fchmodat2(),
        fchmodat2=_probe_fchmodat2(),
    )


def degradations(f: KernelFeatures) -> list[str]:
    """Every protection a sandbox on this kernel lacks, as sentences for the user."""
    lost = []
    abi = f.landlock_abi
    if abi < 1:
        lost.append("no Landlock: the filesystem is not confined at all")
    else:
        if abi < 3:
            lost.append(f"Landlock ABI {abi}: truncate() is not restricted")
        if abi < 4:
            lost.append(f"Landlock ABI {abi}: no TCP port rules, so all TCP sockets are denied")
        if abi < 5:
            lost.append(f"Landlock ABI {abi}: ioctl on devices is not restricted")
        if abi < 6:
            lost.append(f"Landlock ABI {abi}: signals and abstract unix sockets can reach "
                        f"processes outside the sandbox")
    if not (f.seccomp_user_notif and f.pidfd_getfd and f.fchmodat2):
        lost.append("no supervisor: chmod/chown/utimes/xattr changes are denied everywhere, "
                    "and connects to pathname unix sockets are not checked")
    return lost


def check(allow_degraded: bool) -> list[str]:
    """Raise KernelFeatureError unless the kernel has everything or degrading is allowed;
    returns the list of degradations accepted."""
    from .errors import KernelFeatureError
    f = detect()
    lost = degradations(f)
    if lost and not allow_degraded:
        raise KernelFeatureError(
            f"kernel lacks {', '.join(f.missing())} (Landlock ABI {f.landlock_abi}, "
            f"need {FULL_LANDLOCK_ABI}: Linux 6.12+); pass allow_degraded=True "
            f"(--allow-degraded) to run with less protection")
    return lost


def supervisor_available(f: KernelFeatures) -> bool:
    return f.seccomp_user_notif and f.pidfd_getfd and f.fchmodat2
