"""The copy-on-write workspace: a sandbox writes to a private layer over its workdir, and
the run's outcome decides what happens to the layer (commit, abort, keep, defer).

- layer.py    the seccomp backend's upper tree and how a sandbox path resolves in it
- overlay.py  the overlay backend's layer (overlayfs' upper directory) and its changes
- changes.py  what the layer changed, compared with the workdir
- committing.py  applying the layer to the workdir, crash-safely (both backends)

The syscalls that reach the layer are handled in sandlock.supervisor.cow_calls.
"""

from __future__ import annotations

import os

# Loaded on first use: the supervisor imports sandlock.cow.location at every start.
_LAZY = {"Change": "changes", "diff": "changes", "table": "changes", "commit": "committing",
         "interrupted": "committing", "keep": "committing", "kept_changes": "committing", "CowLayer": "layer", "OverlayLayer": "overlay"}

__all__ = ["Change", "CowLayer", "OverlayLayer", "commit", "create", "diff", "interrupted",
           "keep", "kept_changes",
           "table", "default_storage", "open_layer"]


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(name)
    import importlib
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def default_storage() -> str:
    """Where upper layers live unless fs_storage says otherwise."""
    env = os.environ.get("SANDLOCK_COW_DIR")
    if env:
        return env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "sandlock", "cow")


def open_layer(root: str):
    """A layer kept on disk (KEEP, DEFER, or a commit to finish after a crash), of either
    backend."""
    import json
    with open(os.path.join(root, "layer.json")) as f:
        backend = json.load(f).get("backend", "seccomp")
    if backend == "overlay":
        from .overlay import OverlayLayer
        return OverlayLayer.open(root)
    from .layer import CowLayer
    return CowLayer.open(root)


def create(workdir: str, storage: str, name: str | None, backend: str = "seccomp"):
    import secrets
    from .layer import DISCARDING, CowLayer
    from .ownfiles import remove_tree
    os.makedirs(storage, mode=0o700, exist_ok=True)
    for entry in os.listdir(storage):  # remains of removals that were interrupted
        if entry.endswith(DISCARDING):
            remove_tree(os.path.join(storage, entry))
    label = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in (name or "sandbox"))
    root = os.path.join(storage, f"{label[:40]}-{os.getpid()}-{secrets.token_hex(4)}")
    if backend == "overlay":
        from .overlay import OverlayLayer
        return OverlayLayer(workdir, root)
    return CowLayer(workdir, root)
