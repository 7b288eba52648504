"""Error types. Each is raised where the bad input or failed step is first seen.

The hierarchy is upstream Sandlock's (sandlock.exceptions in its 0.9.0 SDK), so that code
catching its errors catches ours; KernelFeatureError, ours, is a ConfinementError:

    SandlockError
    ├── PolicyError                      (also a ValueError)
    ├── SandboxError
    │   ├── ForkError                    the sandbox's process could not be started
    │   ├── ConfinementError             a confinement step failed
    │   │   ├── KernelFeatureError       the kernel lacks what the policy needs
    │   │   │   └── LandlockUnavailableError
    │   │   └── SeccompError             the filter could not be installed
    │   │       └── NotifError           ... or its listener handed over
    │   ├── ChildError                   the child failed during setup
    │   └── BranchError                  a workspace commit or abort failed
    │       └── BranchConflictError
    └── MemoryProtectError               (upstream's; nothing here raises it)
"""


class SandlockError(RuntimeError):
    """Base class; a RuntimeError subclass, as upstream Sandlock raises RuntimeError."""


class PolicyError(SandlockError, ValueError):
    """The policy is invalid: the message names the field and the offending value."""


class SandboxError(SandlockError):
    """Setting up the sandboxed process failed: the message names the step and errno."""


class ForkError(SandboxError):
    """The sandbox's first process could not be started."""


class ConfinementError(SandboxError):
    """A confinement step (Landlock, seccomp, capabilities, namespaces) failed."""


class KernelFeatureError(ConfinementError):
    """The kernel lacks a feature the policy needs (and allow_degraded was not given)."""


class LandlockUnavailableError(KernelFeatureError):
    """Landlock is not available on this kernel (or not at the ABI the policy needs)."""


class SeccompError(ConfinementError):
    """The seccomp filter could not be installed."""


class NotifError(SeccompError):
    """The seccomp user-notification listener could not be set up or handed over."""


class ChildError(SandboxError):
    """The sandboxed child failed before running the program."""


class BranchError(SandboxError):
    """A copy-on-write workspace operation (commit, abort) failed."""


class BranchConflictError(BranchError):
    """A commit was refused: what it would replace changed since the run started."""


class MemoryProtectError(SandlockError):
    """mprotect(2) failed (upstream's name; nothing here raises it)."""


# The setup steps of sandlock-exec (launch.STEPS) whose failure is a confinement failure,
# by the error class that names it.
STEP_ERRORS = {
    "landlock_restrict_self": ConfinementError, "overlay Landlock rule": ConfinementError,
    "seccomp": SeccompError, "reading the seccomp program": SeccompError,
    "listener": NotifError, "handshake": NotifError,
    "securebits": ConfinementError, "capability bounding set": ConfinementError,
    "capset": ConfinementError, "ambient capabilities": ConfinementError,
    "no_new_privs": ConfinementError, "user namespace": ConfinementError,
    "uid/gid map": ConfinementError, "mount propagation": ConfinementError,
    "overlay mount": ConfinementError, "protecting the user's files": ConfinementError,
    "private /dev/shm": ConfinementError,
    "fork": ForkError, "child": ChildError,
}
