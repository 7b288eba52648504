"""Applying a copy-on-write layer to the real workdir, crash-safely.

Invariants:
- Nothing in the workdir is touched before the plan is on disk (commit.json, written to a
  temporary name, fsynced and renamed): a commit interrupted at any point is finished by
  running it again (`CowLayer.open(root)` then `commit(layer)`, or `sandlock cow commit`),
  which replays the same plan.
- Every step is idempotent, and a file's content reaches its path by rename(2) from a
  fully written, fsynced temporary file in the same directory: at every instant each path
  holds either the old file or the new one, never a mix.
- The plan reads only the upper tree: placeholders that will be copied somewhere are
  copied up first, so replacing a workdir file can never change the source of another step.
- The upper tree is removed only after the last step (commit.json is renamed to
  commit.done first, so a retry knows only the removal is left).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat

from .changes import Change, diff, sha256_file
from .layer import CowLayer

PLAN, DONE = "commit.json", "commit.done"


def _target(layer: CowLayer, rel: str) -> str:
    parts = rel.split("/")
    if rel.startswith("/") or ".." in parts or "" in parts:
        raise ValueError(f"refusing to commit the path {rel!r}")
    return os.path.join(layer.lower, rel)


def _plan(layer: CowLayer, changes: list[Change]) -> dict:
    ops = []
    for c in changes:  # sorted by path: parents before children
        if c.after is not None and c.after.kind == "dir":
            ops.append({"op": "dir", "path": c.path, "mode": c.after.mode})
    linked: dict[tuple, str] = {}  # hard links made inside stay links: inode -> first path
    for c in changes:
        a = c.after
        if a is None or a.kind == "dir":
            continue
        source = a.source
        if not (source == layer.upper or source.startswith(layer.upper + "/")):
            source = _copy_up_source(layer, c.path)
        op = {"op": "place", "path": c.path, "kind": a.kind, "mode": a.mode,
              "digest": a.digest, "source": source}
        st = os.lstat(source)
        if a.kind == "file" and st.st_nlink > 1:
            first = linked.setdefault((st.st_dev, st.st_ino), c.path)
            if first != c.path:
                op["link_to"] = first
        ops.append(op)
    for c in sorted((c for c in changes if c.after is None), key=lambda c: c.path,
                    reverse=True):
        ops.append({"op": "remove", "path": c.path})
    for c in sorted((c for c in changes if c.after is not None and c.after.kind == "dir"),
                    key=lambda c: c.path, reverse=True):
        ops.append({"op": "dirmeta", "path": c.path, "mode": c.after.mode,
                    "source": os.path.join(layer.upper, c.path)})
    return {"id": secrets.token_hex(6), "ops": ops}


def _copy_up_source(layer: CowLayer, rel: str) -> str:
    """Make the upper entry for `rel` a private copy (its placeholder named a lower file)."""
    loc = layer.resolve(rel, follow_last=False)
    return layer.copy_up(loc).upper


def _write_json(path: str, data: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)


def _already(target: str, op: dict) -> bool:
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return False
    if op["kind"] == "file":
        return (stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == op["mode"]
                and sha256_file(target) == op["digest"])
    if op["kind"] == "symlink":
        return stat.S_ISLNK(st.st_mode) and os.readlink(target) == op["digest"]
    return False


def _clear_dir(path: str, plan_id: str) -> None:
    """Move a directory out of the way in one step, then delete it."""
    trash = os.path.join(os.path.dirname(path), f".sandlock-trash-{plan_id}")
    shutil.rmtree(trash, ignore_errors=True)
    os.rename(path, trash)
    shutil.rmtree(trash)


def _place(layer: CowLayer, op: dict, plan_id: str) -> None:
    target = _target(layer, op["path"])
    if _already(target, op):
        return
    tmp = os.path.join(os.path.dirname(target),
                       f".{os.path.basename(target)}.sandlock-{plan_id}")
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    src = op["source"]
    if op.get("link_to"):
        os.link(_target(layer, op["link_to"]), tmp)  # placed before this step
    elif op["kind"] == "symlink":
        os.symlink(op["digest"], tmp)
    elif op["kind"] == "file":
        with open(src, "rb") as fin, open(tmp, "wb") as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
            fout.flush()
            os.fchmod(fout.fileno(), op["mode"])
            st = os.stat(src)
            os.utime(fout.fileno(), ns=(st.st_atime_ns, st.st_mtime_ns))
            os.fsync(fout.fileno())
    elif op["kind"] == "fifo":
        os.mkfifo(tmp, op["mode"])
    else:
        return  # sockets and the like have no content to commit
    if os.path.isdir(target) and not os.path.islink(target):
        _clear_dir(target, plan_id)
    os.rename(tmp, target)


def _make_dir(layer: CowLayer, op: dict, plan_id: str) -> None:
    target = _target(layer, op["path"])
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode):
        return
    if st is not None:
        os.unlink(target)  # a file becomes a directory
    os.mkdir(target, 0o700)


def _remove(layer: CowLayer, op: dict, plan_id: str) -> None:
    target = _target(layer, op["path"])
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        _clear_dir(target, plan_id)
    else:
        os.unlink(target)


def _dir_meta(layer: CowLayer, op: dict, plan_id: str) -> None:
    target = _target(layer, op["path"])
    os.chmod(target, op["mode"])
    try:
        st = os.stat(op["source"])
        os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    except FileNotFoundError:
        pass


_STEPS = {"dir": _make_dir, "place": _place, "remove": _remove, "dirmeta": _dir_meta}


def commit(layer: CowLayer, changes: list[Change] | None = None) -> None:
    """Apply the layer to the workdir and remove it. Safe to call again after a crash."""
    plan_path, done_path = (os.path.join(layer.root, n) for n in (PLAN, DONE))
    if os.path.exists(done_path):
        layer.discard()
        return
    with layer.lock:
        if os.path.exists(plan_path):
            with open(plan_path) as f:
                plan = json.load(f)
        else:
            plan = _plan(layer, diff(layer) if changes is None else changes)
            _write_json(plan_path, plan)
        for op in plan["ops"]:
            _STEPS[op["op"]](layer, op, plan["id"])
        os.rename(plan_path, done_path)
    layer.discard()


def interrupted(root: str) -> bool:
    """True when a commit of the layer at `root` started and did not finish."""
    return any(os.path.exists(os.path.join(root, n)) for n in (PLAN, DONE))
