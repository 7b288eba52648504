"""What a finished sandbox run reports."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class ExitReason(enum.IntEnum):
    EXITED = 0
    SIGNALED = 1
    KILLED = 2
    TIMEOUT = 3


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

    def __repr__(self) -> str:
        return (f"Result(success={self.success}, exit_code={self.exit_code}, "
                f"error={self.error!r}, reason={self.reason!r}, signal={self.signal})")
