"""Sandlock: a lightweight, unprivileged process sandbox built on Landlock and seccomp.

    from sandlock import Sandbox
    result = Sandbox(fs_readable=["/usr", "/lib", "/etc"], fs_writable=["/tmp"]).run(["ls", "/"])
"""

from .errors import (BranchConflictError, BranchError, ChildError, ConfinementError, ForkError,
                     KernelFeatureError, LandlockUnavailableError, MemoryProtectError,
                     NotifError, PolicyError, SandboxError, SandlockError, SeccompError)

__version__ = "0.1.0"

# The rest is imported on first use, so that `sandlock check`, `sandlock audit` and programs
# that only need the errors do not pay for the whole package at start-up.
_LAZY = {
    "Sandbox": "sandbox", "Process": "process", "StdioMode": "sandbox",
    "BranchAction": "sandbox", "confine": "sandbox", "landlock_abi_version": "sandbox",
    "Result": "result", "ExitReason": "result",
    "system_readable": "policy", "system_devices": "policy", "system_denied": "policy",
    "Stage": "pipeline", "Pipeline": "pipeline",
    "secret_paths": "home_policy", "persistence_paths": "home_policy",
    "toolchain_grants": "toolchain",
    "SyscallEvent": "supervisor.runtime", "PolicyContext": "supervisor.runtime",
    "Protection": "features", "min_landlock_abi": "features", "parse_ports": "policy",
    "load_profile": "profiles", "list_profiles": "profiles",
    "NamedStage": "pipeline", "Gather": "pipeline", "GatherPipeline": "pipeline",
    "inputs": "_inputs",
    "Change": "cow.changes", "Entry": "cow.changes", "renames": "cow.changes",
    "DryRunResult": "result",
}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sandlock' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "Sandbox", "Process", "Result", "ExitReason", "StdioMode", "BranchAction", "Stage",
    "Pipeline", "SyscallEvent", "PolicyContext", "Protection", "confine",
    "landlock_abi_version", "min_landlock_abi", "parse_ports", "system_readable",
    "system_devices", "system_denied", "secret_paths", "persistence_paths",
    "toolchain_grants", "load_profile", "list_profiles", "NamedStage", "Gather",
    "GatherPipeline", "inputs", "Change", "Entry", "renames", "DryRunResult",
    "SandlockError", "PolicyError", "SandboxError", "ForkError", "ConfinementError",
    "KernelFeatureError", "LandlockUnavailableError", "SeccompError", "NotifError",
    "ChildError", "BranchError", "BranchConflictError", "MemoryProtectError",
    "__version__",
]
