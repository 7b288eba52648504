"""Error types. Each is raised where the bad input or failed step is first seen."""


class SandlockError(RuntimeError):
    """Base class; a RuntimeError subclass, as upstream Sandlock raises RuntimeError."""


class PolicyError(SandlockError, ValueError):
    """The policy is invalid: the message names the field and the offending value."""


class KernelFeatureError(SandlockError):
    """The kernel lacks a feature the policy needs (and allow_degraded was not given)."""


class SandboxError(SandlockError):
    """Setting up the sandboxed process failed: the message names the step and errno."""
