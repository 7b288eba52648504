"""Applying a copy-on-write layer to the real workdir, crash-safely.

Invariants:
- Nothing in the workdir is touched before the plan is on disk (commit.json, written to a
  temporary name, fsynced and renamed): a commit interrupted at any point is finished by
  running it again (`CowLayer.open(root)` then `commit(layer)`, or `sandlock workspace
  commit`), which replays the same plan.
- Every step is idempotent, and a file's content reaches its path by rename(2) from a
  fully written, fsynced temporary file in the same directory: at every instant each path
  holds either the old file or the new one, never a mix.
- Every step acts through a directory fd opened beneath the workdir with no symlink on the
  way (openat2 RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS) and on the last component without
  following it: a symlink anywhere in the tree, whoever put it there, is never followed
  out of the workdir. A step whose parent is no longer a directory there has nothing
  left to do (the directory was replaced by an earlier step).
- The plan reads only the upper tree (no symlinks followed either): placeholders that
  will be copied somewhere are copied up first, so replacing a workdir file can never
  change the source of another step.
- The upper tree is removed only after the last step (commit.json is renamed to
  commit.done first, so a retry knows only the removal is left).
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import shutil
import stat

from .._kernel.fileops import open_beneath, open_no_symlinks
from ..errors import BranchError
from .changes import Change, Entry, _kind, diff, sha256_fd, xattr_digest
from .layer import CowLayer
from .ownfiles import copy_data, copy_metadata, open_read, permits, searchable

PLAN, DONE = "commit.json", "commit.done"
# A kept layer's record of its run's changes (keep()): what a later commit applies, and
# what it finds changed outside since; or the note that they were never checked.
KEPT, UNCHECKED = "kept.json", "kept.unchecked"


def _check_rel(rel: str) -> str:
    parts = rel.split("/")
    if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"refusing to commit the path {rel!r}")
    return rel


class _Parent:
    """The directory holding `rel`, opened safely beneath the workdir; None if gone."""

    def __init__(self, root_fd: int, rel: str):
        _check_rel(rel)
        head, self.name = os.path.split(rel)
        self.fd = -1
        try:
            self.fd = open_beneath(root_fd, head or ".", os.O_PATH | os.O_DIRECTORY)
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EXDEV):
                raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.fd >= 0:
            os.close(self.fd)

    def lstat(self):
        try:
            return os.stat(self.name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None


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
              "digest": a.hash, "source": source, "mtime_ns": a.mtime_ns,
              "xattrs": a.xattrs}
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
    for i, op in enumerate(ops):
        op["n"] = i  # names this step's temporary entries: short, unique, stable on replay
    return {"id": secrets.token_hex(4), "ops": ops}


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


def _tmp_name(plan_id: str, op: dict, what: str = "new") -> str:
    return f".sl-{what}-{plan_id}-{op['n']}"


def _already(parent: _Parent, op: dict) -> bool:
    st = parent.lstat()
    if st is None:
        return False
    if op["kind"] == "file":
        if not (stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == op["mode"]
                and st.st_mtime_ns == op.get("mtime_ns", st.st_mtime_ns)):
            return False
        fd = os.open(parent.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC,
                     dir_fd=parent.fd)
        try:
            return sha256_fd(fd) == op["digest"] and \
                xattr_digest(fd) == op.get("xattrs", xattr_digest(fd))
        finally:
            os.close(fd)
    if op["kind"] == "symlink":
        return stat.S_ISLNK(st.st_mode) and \
            os.readlink(parent.name, dir_fd=parent.fd) == op["digest"]
    return False


def _unlink_quiet(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


def _clear_dir(parent: _Parent, name: str, trash: str) -> None:
    """Move a directory out of the way in one step, then delete it (rmtree works on fds
    and never follows a symlink)."""
    shutil.rmtree(trash, ignore_errors=True, dir_fd=parent.fd)
    os.rename(name, trash, src_dir_fd=parent.fd, dst_dir_fd=parent.fd)
    shutil.rmtree(trash, dir_fd=parent.fd)


def _place(layer: CowLayer, root_fd: int, op: dict, plan_id: str) -> None:
    with _Parent(root_fd, op["path"]) as parent:
        if parent.fd < 0:
            raise OSError(errno.ENOENT, f"{op['path']}: its directory is missing")
        trash = _tmp_name(plan_id, op, "old")
        shutil.rmtree(trash, ignore_errors=True, dir_fd=parent.fd)  # a crashed earlier try
        if _already(parent, op):
            return
        tmp = _tmp_name(plan_id, op)
        _unlink_quiet(tmp, parent.fd)
        if op.get("link_to"):
            with _Parent(root_fd, op["link_to"]) as first:
                os.link(first.name, tmp, src_dir_fd=first.fd, dst_dir_fd=parent.fd,
                        follow_symlinks=False)
        elif op["kind"] == "symlink":
            os.symlink(op["digest"], tmp, dir_fd=parent.fd)
        elif op["kind"] == "file":
            src = open_read(op["source"])  # the layer's (never the workdir's) file
            try:
                st = os.fstat(src)
                if not stat.S_ISREG(st.st_mode):
                    raise OSError(errno.EINVAL, f"{op['path']}: its source changed kind")
                out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                              | os.O_CLOEXEC, 0o600, dir_fd=parent.fd)
                try:
                    copy_data(src, out)
                    copy_metadata(src, out, st)
                    os.fchmod(out, op["mode"])
                    os.fsync(out)
                finally:
                    os.close(out)
            finally:
                os.close(src)
        elif op["kind"] == "fifo":
            os.mkfifo(tmp, op["mode"], dir_fd=parent.fd)
        else:
            return  # sockets and the like have no content to commit
        st = parent.lstat()
        if st is not None and stat.S_ISDIR(st.st_mode):
            _clear_dir(parent, parent.name, trash)
        os.rename(tmp, parent.name, src_dir_fd=parent.fd, dst_dir_fd=parent.fd)


def _make_dir(layer: CowLayer, root_fd: int, op: dict, plan_id: str) -> None:
    with _Parent(root_fd, op["path"]) as parent:
        if parent.fd < 0:
            raise OSError(errno.ENOENT, f"{op['path']}: its directory is missing")
        st = parent.lstat()
        if st is not None and stat.S_ISDIR(st.st_mode):
            return
        if st is not None:
            os.unlink(parent.name, dir_fd=parent.fd)  # a file or link becomes a directory
        os.mkdir(parent.name, 0o700, dir_fd=parent.fd)


def _remove(layer: CowLayer, root_fd: int, op: dict, plan_id: str) -> None:
    with _Parent(root_fd, op["path"]) as parent:
        if parent.fd < 0:
            return  # its directory was replaced or removed: nothing left beneath it
        st = parent.lstat()
        if st is None:
            return
        if stat.S_ISDIR(st.st_mode):
            _clear_dir(parent, parent.name, _tmp_name(plan_id, op, "old"))
        else:
            os.unlink(parent.name, dir_fd=parent.fd)


def _dir_meta(layer: CowLayer, root_fd: int, op: dict, plan_id: str) -> None:
    with _Parent(root_fd, op["path"]) as parent:
        if parent.fd < 0:
            return
        try:
            fd = os.open(parent.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                         | os.O_CLOEXEC, dir_fd=parent.fd)
        except (FileNotFoundError, NotADirectoryError, OSError):
            return
        try:
            os.fchmod(fd, op["mode"])
            try:
                st = os.stat(op["source"], follow_symlinks=False)
                os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))
            except FileNotFoundError:
                pass
        finally:
            os.close(fd)


_STEPS = {"dir": _make_dir, "place": _place, "remove": _remove, "dirmeta": _dir_meta}


class CommitRefused(BranchError):
    """The commit was refused before anything in the workdir was touched."""


def _lstat(path: str):
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _preflight(layer: CowLayer, changes: list[Change]) -> None:
    """Refuse, before anything is touched, a commit that could not be applied whole, or
    that would undo what changed in the workdir since the changes were read (a DEFER
    committed later, an editor outside meanwhile): an entry the run changed that is no
    longer as it was (a file by size and mtime, a symlink by target, the kind), a name the
    run adds that exists now, a directory the run removes that holds a name the run never
    saw, a directory to change that this user may not write (or, sticky, an entry in it
    of another user's). Not a lock: what changes while the commit runs is the user's."""
    problems: list[str] = []
    known = {c.path for c in changes}
    were_links = {c.path for c in changes
                  if c.before is not None and c.before.kind == "symlink"}
    me = os.geteuid()
    plain: dict[str, bool] = {}  # directory -> reached with no symlink on the way
    for c in changes:
        real = os.path.join(layer.lower, c.path)
        parent = os.path.dirname(real)
        if parent not in plain:
            plain[parent] = os.path.realpath(parent) == parent
        if not plain[parent]:
            parts = c.path.split("/")
            if any("/".join(parts[:k]) in were_links for k in range(1, len(parts))):
                continue  # beneath a symlink the run replaced: the commit's steps decide
            problems.append(f"{c.path}: a directory above it was replaced by a symlink in "
                            f"the workdir since the run")
            continue
        try:
            st = _lstat(real)
        except OSError as e:
            problems.append(f"{c.path}: {e.strerror}")
            continue
        b = c.before
        if b is None and st is not None:
            problems.append(f"{c.path}: made in the workdir since the run")
        elif b is not None:
            if st is None:
                problems.append(f"{c.path}: removed from the workdir since the run")
            elif _kind(st.st_mode) != b.kind:
                problems.append(f"{c.path}: replaced in the workdir since the run")
            elif b.kind == "file" and (st.st_size, st.st_mtime_ns) != (b.size, b.mtime_ns):
                problems.append(f"{c.path}: changed in the workdir since the run")
            elif b.kind == "symlink" and os.readlink(real) != b.hash:
                problems.append(f"{c.path}: changed in the workdir since the run")
            elif b.kind == "dir" and (c.after is None or c.after.kind != "dir"):
                new = sorted(n for n in os.listdir(real) if f"{c.path}/{n}" not in known)
                if new:
                    problems.append(f"{c.path}/{new[0]}: made in the workdir since the run, "
                                     f"in a directory the run removes")
        pst = _lstat(parent)
        if pst is None or not stat.S_ISDIR(pst.st_mode):
            continue  # made (or replaced) by this commit
        # As the sandbox ran: this user without capabilities (root's supervisor keeps its
        # own, which would pass any directory).
        if not permits(pst, me, os.getegid(), os.getgroups(), 3):
            problems.append(f"{c.path}: its directory is not writable by this user")
        elif pst.st_mode & stat.S_ISVTX and st is not None and me not in (st.st_uid,
                                                                           pst.st_uid):
            problems.append(f"{c.path}: another user's, in a sticky directory")
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise CommitRefused("refused, nothing applied: " + "; ".join(problems[:3]) + more)


def commit(layer: CowLayer, changes: list[Change] | None = None) -> None:
    """Apply the layer to the workdir and remove it. Safe to call again after a crash."""
    plan_path, done_path = (os.path.join(layer.root, n) for n in (PLAN, DONE))
    if os.path.exists(done_path):
        layer.discard()
        return
    with layer.lock, searchable(layer.upper):  # a directory the sandbox left mode 000
        root_fd = _workdir(layer)
        try:
            if os.path.exists(plan_path):
                with open(plan_path) as f:
                    plan = json.load(f)
            else:
                if changes is None:
                    changes = kept_changes(layer)
                changes = diff(layer) if changes is None else changes
                _preflight(layer, changes)
                plan = _plan(layer, changes)
                _write_json(plan_path, plan)
            for op in plan["ops"]:
                _STEPS[op["op"]](layer, root_fd, op, plan["id"])
        finally:
            os.close(root_fd)
        os.rename(plan_path, done_path)
    layer.discard()


def keep(layer: CowLayer, changes: list[Change] | None) -> None:
    """Record, in a layer kept (KEEP), the run's changes as they were read when the run
    ended — the user's protected files already left out — or, with None, that they were
    never read (tasks of the sandbox still ran). A later commit applies only those, and
    is refused where the workdir changed since (review: `sandlock workspace commit`
    read the layer again, so it applied a git hook the run had been refused, and put
    the run's version back over an edit made outside meanwhile)."""
    if changes is None:
        with open(os.path.join(layer.root, UNCHECKED), "w") as f:
            f.write("tasks of the sandbox still ran when it was kept\n")
        return
    _write_json(os.path.join(layer.root, KEPT), {"version": 1, "changes": [
        {"path": c.path, "action": c.action,
         "before": None if c.before is None else _entry_fields(c.before),
         "after": None if c.after is None else _entry_fields(c.after)} for c in changes]})


def _entry_fields(e: Entry) -> dict:
    return {"kind": e.kind, "mode": e.mode, "size": e.size, "hash": e.hash,
            "mtime_ns": e.mtime_ns, "source": e.source, "xattrs": e.xattrs}


def kept_changes(layer: CowLayer) -> list[Change] | None:
    """The changes keep() recorded (None: a layer kept by an earlier version, read again);
    CommitRefused for a layer kept unchecked."""
    if os.path.exists(os.path.join(layer.root, UNCHECKED)):
        raise CommitRefused(f"{layer.root} was kept while tasks of its sandbox still ran: "
                            f"its changes were never checked (the user's protected files "
                            f"among them); `sandlock workspace diff` shows them, to copy "
                            f"by hand, or discard it")
    try:
        with open(os.path.join(layer.root, KEPT)) as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    return [Change(c["path"], c["action"],
                   None if c["before"] is None else Entry(**c["before"]),
                   None if c["after"] is None else Entry(**c["after"]))
            for c in data["changes"]]


def _workdir(layer: CowLayer) -> int:
    """The workdir the run started on (O_PATH), reached with no symlink on the way; else
    CommitRefused. A sandbox that may write above the workdir could have moved it and
    left a directory, or a symlink to another one, at its path (review): the commit
    would have written there."""
    try:
        fd = open_no_symlinks(layer.lower, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW
                              | os.O_CLOEXEC)
    except OSError as e:
        raise CommitRefused(f"{layer.lower}: the workdir cannot be reached as it was "
                            f"({e.strerror}); the layer is kept") from None
    st = os.fstat(fd)
    if layer.lower_identity is not None and \
            (st.st_dev, st.st_ino) != tuple(layer.lower_identity):
        os.close(fd)
        raise CommitRefused(f"{layer.lower} is no longer the directory the run started on "
                            f"(moved or replaced since); the layer is kept")
    return fd


def interrupted(root: str) -> bool:
    """True when a commit of the layer at `root` started and did not finish."""
    return any(os.path.exists(os.path.join(root, n)) for n in (PLAN, DONE))
