"""The overlay backend's layer: overlayfs' upper and work directories for one run, and what
they say changed.

The sandbox writes through an overlayfs mount over the workdir (made by the trampoline in
the sandbox's own mount namespace: sandlock/_libexec/sandlock-exec.c), so the kernel
keeps the upper directory in overlayfs' own format (with `userxattr`):
- an entry in upper replaces the workdir's entry of that name (a copy-up holds the whole
  file);
- a whiteout (a character device 0/0, or a file with `user.overlay.whiteout`) says the
  workdir's entry is deleted;
- a directory with `user.overlay.opaque` = "y" replaces the workdir's directory entirely
  (nothing beneath it is merged);
- without `redirect_dir`, a directory of the workdir is never renamed in place (rename
  gives EXDEV and `mv` copies), so a path in upper always names the same path below.

`diff` reads that into the same Change list the seccomp backend produces, so commit
(committing.py: crash-safe, replayable), dry-run, KEEP and DEFER are shared. Only the
upper directory is read: no lower path is followed through a symlink or into a
non-directory.

Invariant: the upper and work directories are used by the kernel only while the sandbox's
mount namespace exists; the supervisor reads or changes them only after every sandboxed
task is gone (sandbox._Workspace.finish waits for it).
"""

from __future__ import annotations

import errno
import json
import os
import stat
import threading

from .changes import Change, entry

OPAQUE = "user.overlay.opaque"
WHITEOUT = "user.overlay.whiteout"


def _xattr(path: str, name: str) -> str | None:
    try:
        return os.getxattr(path, name, follow_symlinks=False).decode(errors="replace")
    except OSError:
        return None


def _is_whiteout(path: str, st) -> bool:
    if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
        return True
    return stat.S_ISREG(st.st_mode) and st.st_size == 0 and _xattr(path, WHITEOUT) is not None


class OverlayLayer:
    backend = "overlay"

    def __init__(self, lower: str, root: str, create: bool = True):
        self.lower = os.path.realpath(lower)
        self.root = root
        self.upper = os.path.join(root, "upper")
        self.work = os.path.join(root, "work")
        self.lock = threading.RLock()
        self.on_first_change = None  # the seccomp backend's; unused here
        # (device, inode) of the workdir when the layer was made: the commit applies it
        # to that directory only (layer.json; None for a layer of before it was kept).
        self.lower_identity: tuple[int, int] | None = None
        if create:
            os.makedirs(self.upper, mode=0o700)
            os.mkdir(self.work, 0o700)
            # The merged root directory takes the upper one's attributes.
            st = os.stat(self.lower)
            self.lower_identity = (st.st_dev, st.st_ino)
            os.chmod(self.upper, stat.S_IMODE(st.st_mode))
            with open(os.path.join(root, "layer.json"), "w") as f:
                json.dump({"version": 1, "lower": self.lower, "backend": "overlay",
                           "identity": [st.st_dev, st.st_ino]}, f)

    @classmethod
    def open(cls, root: str) -> "OverlayLayer":
        with open(os.path.join(root, "layer.json")) as f:
            meta = json.load(f)
        if meta.get("version") != 1 or meta.get("backend") != "overlay":
            raise OSError(errno.EINVAL, f"{root}: not an overlay layer")
        layer = cls(meta["lower"], root, create=False)
        if "identity" in meta:  # layers of before it was recorded: none
            layer.lower_identity = tuple(meta["identity"])
        return layer

    # --- what changed -------------------------------------------------------------------------

    def diff(self) -> list[Change]:
        out: list[Change] = []
        with self.lock:
            self._compare(self.upper, "", True, out)
        return sorted(out, key=lambda c: c.path)

    def _lower(self, rel: str, lower_dir: bool):
        """The workdir's entry at `rel` (its parent is a real directory when `lower_dir`)."""
        if not lower_dir:
            return None
        try:
            return entry(os.path.join(self.lower, rel))
        except (FileNotFoundError, NotADirectoryError):
            return None

    def _compare(self, udir: str, rel: str, lower_dir: bool, out: list) -> None:
        """Entries of upper directory `udir` (the sandbox's `rel`), merged with the
        workdir's directory there when `lower_dir`."""
        for name in sorted(os.listdir(udir)):
            upath = os.path.join(udir, name)
            r = f"{rel}/{name}" if rel else name
            st = os.lstat(upath)
            before = self._lower(r, lower_dir)
            if _is_whiteout(upath, st):
                if before is not None:
                    out.append(Change(r, "deleted", before, None))
                    if before.kind == "dir":
                        self._all_lower(r, out)
                continue
            after = entry(upath, own=True)
            if before is None:
                out.append(Change(r, "added", None, after))
                if after.kind == "dir":
                    self._all_upper(upath, r, out)
                continue
            if before.kind == "dir" and after.kind == "dir":
                if _xattr(upath, OPAQUE) == "y":  # replaced: nothing beneath is merged
                    if before.mode != after.mode:
                        out.append(Change(r, "modified", before, after))
                    self._replaced(upath, r, out)
                    continue
                if before.mode != after.mode:
                    out.append(Change(r, "modified", before, after))
                self._compare(upath, r, True, out)
                continue
            if before == after:
                continue  # copied up, unchanged (opened for writing, say)
            out.append(Change(r, "modified", before, after))
            if before.kind == "dir":
                self._all_lower(r, out)
            if after.kind == "dir":
                self._all_upper(upath, r, out)

    def _replaced(self, udir: str, rel: str, out: list) -> None:
        """An opaque directory: compare its entries with the workdir's as whole trees."""
        ldir = os.path.join(self.lower, rel)
        lower_names = set(os.listdir(ldir))
        upper_names = set(os.listdir(udir))
        for name in sorted(lower_names - upper_names):
            r = f"{rel}/{name}"
            before = entry(os.path.join(ldir, name))
            out.append(Change(r, "deleted", before, None))
            if before.kind == "dir":
                self._all_lower(r, out)
        for name in sorted(upper_names):
            r = f"{rel}/{name}"
            upath = os.path.join(udir, name)
            after = entry(upath, own=True)
            before = entry(os.path.join(ldir, name)) if name in lower_names else None
            if before is None:
                out.append(Change(r, "added", None, after))
                if after.kind == "dir":
                    self._all_upper(upath, r, out)
            elif before.kind == "dir" and after.kind == "dir":
                if before.mode != after.mode:
                    out.append(Change(r, "modified", before, after))
                self._replaced(upath, r, out)
            elif before != after:
                out.append(Change(r, "modified", before, after))
                if before.kind == "dir":
                    self._all_lower(r, out)
                if after.kind == "dir":
                    self._all_upper(upath, r, out)

    def _all_upper(self, udir: str, rel: str, out: list) -> None:
        for name in sorted(os.listdir(udir)):
            upath, r = os.path.join(udir, name), f"{rel}/{name}"
            st = os.lstat(upath)
            if _is_whiteout(upath, st):
                continue  # nothing below to delete
            after = entry(upath, own=True)
            out.append(Change(r, "added", None, after))
            if after.kind == "dir":
                self._all_upper(upath, r, out)

    def _all_lower(self, rel: str, out: list) -> None:
        ldir = os.path.join(self.lower, rel)
        for name in sorted(os.listdir(ldir)):
            r = f"{rel}/{name}"
            before = entry(os.path.join(ldir, name))
            out.append(Change(r, "deleted", before, None))
            if before.kind == "dir":
                self._all_lower(r, out)

    # --- storage --------------------------------------------------------------------------------

    def usage(self) -> int:
        from .ownfiles import tree_usage
        return tree_usage(self.upper)

    def discard(self) -> None:
        """Remove the layer (overlayfs leaves a mode-000 directory in its work dir: remove_tree
        opens it up)."""
        from .layer import DISCARDING
        from .ownfiles import remove_tree
        trash = self.root + DISCARDING
        try:
            os.rename(self.root, trash)
        except FileNotFoundError:
            if not os.path.exists(trash):
                return
        remove_tree(trash)
