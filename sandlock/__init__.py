"""Sandlock: a lightweight, unprivileged process sandbox built on Landlock and seccomp.

    from sandlock import Sandbox
    result = Sandbox(fs_readable=["/usr", "/lib", "/etc"], fs_writable=["/tmp"]).run(["ls", "/"])
"""

from .errors import KernelFeatureError, PolicyError, SandboxError, SandlockError
from .policy import system_denied, system_devices, system_readable
from .result import ExitReason, Result
from .sandbox import (BranchAction, Process, Sandbox, StdioMode, confine,
                      landlock_abi_version)

__version__ = "0.1.0"

__all__ = [
    "Sandbox", "Process", "Result", "ExitReason", "StdioMode", "BranchAction",
    "confine", "landlock_abi_version", "system_readable", "system_devices", "system_denied",
    "SandlockError", "PolicyError", "KernelFeatureError", "SandboxError", "__version__",
]
