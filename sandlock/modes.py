"""The outcome of a workspace run (BranchAction) and what a standard stream of a
sandboxed program is (StdioMode): upstream's names."""

from __future__ import annotations

import enum

from .errors import PolicyError


class BranchAction(enum.Enum):
    COMMIT = "commit"
    ABORT = "abort"
    KEEP = "keep"
    DEFER = "defer"


class StdioMode(enum.Enum):
    INHERIT = "inherit"
    PIPED = "piped"
    NULL = "null"


def _action(value, field_name: str) -> BranchAction:
    if isinstance(value, BranchAction):
        return value
    try:
        return BranchAction(value)
    except ValueError:
        raise PolicyError(f"{field_name}: expected one of commit, abort, keep, defer, got "
                          f"{value!r}") from None
