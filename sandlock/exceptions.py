"""Upstream's module name for the exception hierarchy (`from sandlock.exceptions import
PolicyError`); the classes live in sandlock.errors."""

from .errors import (BranchConflictError, BranchError, ChildError,  # noqa: F401
                     ConfinementError, ForkError, KernelFeatureError,
                     LandlockUnavailableError, MemoryProtectError, NotifError, PolicyError,
                     SandboxError, SandlockError, SeccompError)

__all__ = ["BranchConflictError", "BranchError", "ChildError", "ConfinementError", "ForkError", "KernelFeatureError", "LandlockUnavailableError", "MemoryProtectError", "NotifError", "PolicyError", "SandboxError", "SandlockError", "SeccompError"]
