"""The C pieces `make helper` builds into sandlock/_libexec/: where they are, and loading a
shared library that must speak this version's interface (a pull without a rebuild leaves
a stale one: it is refused, with a warning saying what runs instead)."""

from __future__ import annotations

import ctypes
import os

DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_libexec")


def path(name: str) -> str:
    return os.path.join(DIR, name)


def load(library: str, version_fn: str, version: int, without: str) -> ctypes.CDLL | None:
    """ctypes.CDLL of `library` if it is built and its `version_fn()` returns `version`;
    None if it is not built; None and a warning ("...; `without`") if it is stale."""
    if not os.path.exists(library):
        return None
    try:
        lib = ctypes.CDLL(library, use_errno=True)
        if getattr(lib, version_fn)() == version:
            return lib
    except (OSError, AttributeError):
        pass
    import warnings
    warnings.warn(f"{library} is from another version of sandlock (run `make helper`); "
                  f"{without}")
    return None
