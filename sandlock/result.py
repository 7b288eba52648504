"""What a finished sandbox run reports."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class ExitReason(enum.IntEnum):
    EXITED = 0
    SIGNALED = 1
    KILLED = 2
    TIMEOUT = 3
    MEMORY = 4  # the sandbox's processes together went past max_memory: all were killed


@dataclass
class Result:
    success: bool
    exit_code: int
    stdout: bytes = b""
    stderr: bytes = b""
    error: str | None = None
    reason: ExitReason = ExitReason.EXITED
    signal: int = -1
    changes: list = field(default_factory=list)
    denials: list = field(default_factory=list)
    flagged: list = field(default_factory=list)  # events a policy_fn flagged ("audit")
    stages: list = field(default_factory=list)  # a pipeline's per-stage Results
    pending: bool = False     # DEFER: the workdir's changes wait for commit() or abort()
    kept: str | None = None   # KEEP: where the copy-on-write layer was left
    workspace: object = field(default=None, repr=False, compare=False)

    def commit(self) -> None:
        """Apply a deferred run's workdir changes (on_exit/on_error=BranchAction.DEFER)."""
        self._deferred().commit()
        self.pending = False

    def abort(self) -> None:
        """Discard a deferred run's workdir changes."""
        self._deferred().abort()
        self.pending = False

    def _deferred(self):
        if self.workspace is None:
            from .errors import SandlockError
            raise SandlockError("this run had no copy-on-write workdir")
        return self.workspace

    def __repr__(self) -> str:
        return (f"Result(success={self.success}, exit_code={self.exit_code}, "
                f"error={self.error!r}, reason={self.reason!r}, signal={self.signal})")


# What Sandbox.dry_run returns: a Result whose `changes` are what the run would have
# changed (upstream's name for it).
DryRunResult = Result
