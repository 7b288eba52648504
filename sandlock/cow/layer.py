"""The copy-on-write layer of one sandbox: the real workdir (lower) seen through a private
upper tree, without mounts, root or FUSE. Runs in the supervisor; the sandbox never
touches the upper tree except through fds the supervisor opened for it.

The upper tree is the sandbox's whole view of the workdir, built lazily one directory at
a time. A directory is *materialized* the first time a path goes through it: each entry
of its lower counterpart gets an upper entry of the same name — subdirectories (pending,
materialized later), symlinks (copied), and for files an empty *placeholder* that stands
for the lower file named by its `user.sandlock.origin` xattr. So once materialized, the
upper directory alone says what exists: a deletion is just the entry's absence (no
whiteouts to merge), a listing is the kernel's getdents on the upper directory, and a
rename moves the placeholder (its origin goes with its inode).

Invariants:
- Lower is only ever read. A placeholder's content is its origin's, read-only: any change
  to the file (a write open, truncate, chmod, chown, utimes, xattrs, link) first replaces
  the placeholder with a private copy ("copy-up").
- Every call runs under `lock`: the upper tree changes only inside these methods, so a path
  resolved here names the same entries when the operation is performed. Paths are acted on
  with RESOLVE_NO_SYMLINKS or *at calls on their resolved parent, never re-resolved.
- A path whose resolution leaves the workdir is returned as OUTSIDE with its real path;
  callers apply the sandbox's own filesystem policy to it (supervisor.cow_calls).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import threading
from dataclasses import dataclass

from .._kernel.fileops import open_no_symlinks

ORIGIN = "user.sandlock.origin"    # on placeholders and pending directories: lower relpath
PENDING = "user.sandlock.pending"  # on directories not yet materialized
XATTR_PREFIX = "user.sandlock."
MAX_LINKS = 40

UPPER, LOWER, MISSING, OUTSIDE = "upper", "lower", "missing", "outside"
# UPPER: `real` is an upper entry; LOWER: `real` is in the workdir (a placeholder's origin,
# or anything below a directory the sandbox never changed); `upper` is where the entry is
# or will be in the upper tree; `rel` is the symlink-free path below the workdir.


@dataclass(frozen=True)
class Loc:
    """Where a sandbox path lives. UPPER: `real` is an upper entry (directory, private file,
    symlink, fifo); LOWER: `real` is in the workdir (a placeholder's origin, or an entry
    below a directory never changed: files, directories, symlinks) and `upper` is where its
    upper entry is or will be; MISSING: nothing there yet, `real` is the upper path it
    would get (after concrete()); OUTSIDE: the path left the workdir, `real` is where."""
    kind: str
    real: str
    upper: str = ""
    rel: str = ""   # the path relative to the workdir (UPPER, LOWER, MISSING)


def _xattr(path: str, name: str) -> str | None:
    try:
        return os.getxattr(path, name, follow_symlinks=False).decode()
    except OSError as e:
        if e.errno in (errno.ENODATA, errno.ENOENT, errno.ENOTSUP, errno.EPERM):
            return None
        raise


def _safe_rel(rel: str) -> str:
    """An origin read back from disk: must be a plain relative path inside the workdir."""
    if rel.startswith("/") or any(c in ("..",) for c in rel.split("/")) or "\0" in rel:
        raise OSError(errno.EIO, f"corrupt copy-on-write origin {rel!r}")
    return rel


class CowLayer:
    def __init__(self, lower: str, root: str, create: bool = True):
        self.lower = os.path.realpath(lower)
        self.root = root                      # the storage directory of this layer
        self.upper = os.path.join(root, "upper")
        self.lock = threading.RLock()
        # What the upper directories' xattrs say, cached by inode: materialized ones, and
        # pending ones with their origin. Every pending directory is made here (create,
        # _materialize), and only _materialize ends one; inodes survive renames.
        self._complete: set[int] = set()
        self._pending: dict[int, str] = {}
        self._root_ino: int | None = None
        if create:
            os.makedirs(self.upper, mode=0o700)
            try:
                os.setxattr(self.upper, ORIGIN, b".")
                os.setxattr(self.upper, PENDING, b"1")
            except OSError as e:
                shutil.rmtree(root, ignore_errors=True)
                raise OSError(e.errno, f"copy-on-write storage {root} does not support user "
                                       f"xattrs ({e.strerror}); choose another fs_storage")
            st = os.stat(self.lower)
            os.chmod(self.upper, stat.S_IMODE(st.st_mode))
            with open(os.path.join(root, "layer.json"), "w") as f:
                json.dump({"version": 1, "lower": self.lower}, f)

    @classmethod
    def open(cls, root: str) -> "CowLayer":
        """A layer kept on disk (KEEP, DEFER, or a commit to finish after a crash)."""
        with open(os.path.join(root, "layer.json")) as f:
            meta = json.load(f)
        if meta.get("version") != 1:
            raise OSError(errno.EINVAL, f"{root}: unknown copy-on-write layer format")
        return cls(meta["lower"], root, create=False)

    # --- naming ----------------------------------------------------------------------------

    def relative(self, path: str) -> str | None:
        """`path` (absolute, unresolved) relative to the workdir when it is spelled under
        the workdir or under the upper tree; None otherwise. '..' is left for resolve()."""
        for top in (self.lower, self.upper):
            if path == top:
                return ""
            if path.startswith(top + "/"):
                return path[len(top) + 1:]
        return None

    def to_sandbox_path(self, real: str) -> str:
        """An upper path as the sandbox should see it (its workdir spelling)."""
        rel = self.relative(real)
        return real if rel is None else (self.lower + "/" + rel if rel else self.lower)

    # --- materialization -------------------------------------------------------------------

    def _materialize(self, udir: str, ino: int | None = None) -> None:
        """Give a pending upper directory one entry per entry of its lower origin."""
        if ino is not None and ino in self._complete:
            return
        if _xattr(udir, PENDING) is None:
            if ino is not None:
                self._complete.add(ino)
            return
        ino = os.lstat(udir).st_ino
        self._pending.pop(ino, None)
        origin = _safe_rel(_xattr(udir, ORIGIN) or ".")
        ldir = os.path.join(self.lower, origin) if origin != "." else self.lower
        try:
            entries = list(os.scandir(ldir))
        except (FileNotFoundError, NotADirectoryError):
            entries = []
        for e in entries:
            up = os.path.join(udir, e.name)
            rel = e.name if origin == "." else f"{origin}/{e.name}"
            try:
                st = e.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if os.path.lexists(up):
                continue  # a retry after an interrupted materialization
            if stat.S_ISDIR(st.st_mode):
                os.mkdir(up, 0o700)
                os.setxattr(up, ORIGIN, rel.encode())
                os.setxattr(up, PENDING, b"1")
                sub_ino = os.lstat(up).st_ino
                self._complete.discard(sub_ino)
                self._pending[sub_ino] = rel
                os.chmod(up, stat.S_IMODE(st.st_mode))
                os.utime(up, ns=(st.st_atime_ns, st.st_mtime_ns))
            elif stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(e.path), up)
                os.utime(up, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
            elif stat.S_ISFIFO(st.st_mode):
                os.mkfifo(up, stat.S_IMODE(st.st_mode))
            else:
                fd = os.open(up, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
                try:
                    os.setxattr(fd, ORIGIN, rel.encode())
                finally:
                    os.close(fd)
        os.removexattr(udir, PENDING)
        self._complete.add(ino)
        try:
            lst = os.stat(ldir)
            os.utime(udir, ns=(lst.st_atime_ns, lst.st_mtime_ns))
        except OSError:
            pass

    def materialize_all(self, udir: str | None = None) -> None:
        """Materialize a whole subtree (before diffing or committing)."""
        udir = udir or self.upper
        self._materialize(udir)
        for e in os.scandir(udir):
            if e.is_dir(follow_symlinks=False):
                self.materialize_all(e.path)

    def placeholder_origin(self, upath: str) -> str | None:
        """The lower relpath a placeholder stands for, or None for a private entry."""
        origin = _xattr(upath, ORIGIN)
        if origin is None:
            return None
        try:
            if stat.S_ISDIR(os.lstat(upath).st_mode):
                return None
        except FileNotFoundError:
            return None
        return _safe_rel(origin)

    # --- resolution ------------------------------------------------------------------------

    def _pending_origin(self, udir: str, ino: int) -> str | None:
        """The lower relpath a pending upper directory stands for; None once materialized."""
        if ino in self._complete:
            return None
        origin = self._pending.get(ino)
        if origin is not None:
            return origin
        if _xattr(udir, PENDING) is None:
            self._complete.add(ino)
            return None
        origin = self._pending[ino] = _safe_rel(_xattr(udir, ORIGIN) or ".")
        return origin

    def _lower_of(self, origin: str) -> str:
        return self.lower if origin == "." else os.path.join(self.lower, origin)

    def resolve(self, rel: str, follow_last: bool) -> Loc:
        """Resolve a workdir-relative path the way the kernel would in the sandbox's view.
        Raises OSError (ENOENT, ENOTDIR, ELOOP) as the kernel would.

        Reading changes nothing: below a directory never changed (pending, or not in the
        upper tree at all) the walk continues in the workdir itself, so untouched regions
        cost no upper entries; a LOWER location may then be a directory, read from the
        workdir. Callers that change something call concrete() first."""
        if self._root_ino is None:
            self._root_ino = os.lstat(self.upper).st_ino
        root_origin = self._pending_origin(self.upper, self._root_ino)
        # One frame per directory below the root: (name, lower dir when its content is
        # the workdir's, else None).
        frames: list[tuple[str, str | None]] = []
        base_lower = self._lower_of(root_origin) if root_origin is not None else None
        parts = [c for c in rel.split("/") if c]
        links = 0

        def here():
            return frames[-1][1] if frames else base_lower

        def upath(extra=None):
            names = [f[0] for f in frames] + ([extra] if extra else [])
            return os.path.join(self.upper, *names) if names else self.upper

        while parts:
            comp = parts.pop(0)
            last = not parts
            if comp == ".":
                continue
            if comp == "..":
                if not frames:  # above the workdir: the rest is outside
                    return self._outside(os.path.dirname(self.lower), parts)
                frames.pop()
                continue
            lower_dir = here()
            path = os.path.join(lower_dir, comp) if lower_dir is not None else upath(comp)
            try:
                st = os.lstat(path)
            except (FileNotFoundError, NotADirectoryError):
                if last:
                    names = "/".join([f[0] for f in frames] + [comp])
                    return Loc(MISSING, upath(comp), upath(comp), names)
                raise OSError(errno.ENOENT, "No such file or directory") from None
            if stat.S_ISLNK(st.st_mode) and (follow_last or not last):
                links += 1
                if links > MAX_LINKS:
                    raise OSError(errno.ELOOP, "Too many levels of symbolic links")
                target = os.readlink(path)
                if target.startswith("/"):
                    inner = self.relative(target)
                    if inner is None:
                        return self._outside(target, parts)
                    frames = []
                    parts = [c for c in inner.split("/") if c] + parts
                else:
                    parts = [c for c in target.split("/") if c] + parts
                continue
            if stat.S_ISDIR(st.st_mode):
                if lower_dir is not None:
                    frames.append((comp, path))
                else:
                    origin = self._pending_origin(path, st.st_ino)
                    frames.append((comp, None if origin is None else self._lower_of(origin)))
                continue
            if not last:
                raise OSError(errno.ENOTDIR, "Not a directory")
            names = "/".join([f[0] for f in frames] + [comp])
            if lower_dir is not None:
                return Loc(LOWER, path, upath(comp), names)
            origin = self.placeholder_origin(path)
            if origin is not None:
                return Loc(LOWER, self._lower_of(origin), path, names)
            return Loc(UPPER, path, path, names)
        names = "/".join(f[0] for f in frames)
        if here() is not None:
            return Loc(LOWER, here(), upath(), names)  # an unchanged directory
        return Loc(UPPER, upath(), upath(), names)

    def concrete(self, loc: Loc, itself: bool = False) -> Loc:
        """Make the upper tree hold `loc`'s ancestors as materialized directories (so its
        upper entry exists, or can be created), and `loc` itself too when `itself` and it
        is a directory. Returns the location with its upper path."""
        parts = loc.rel.split("/") if loc.rel else []
        cur = self.upper
        self._materialize(cur)
        for comp in parts[:-1]:
            cur = os.path.join(cur, comp)
            self._materialize(cur)
        up = os.path.join(self.upper, loc.rel) if loc.rel else self.upper
        if itself and os.path.isdir(up) and not os.path.islink(up):
            self._materialize(up)
        if loc.kind == LOWER and self.placeholder_origin(up) is None and os.path.lexists(up):
            return Loc(UPPER, up, up, loc.rel)  # a directory or symlink: now in the upper tree
        return Loc(loc.kind, loc.real if loc.kind != MISSING else up, up, loc.rel)

    def _outside(self, base: str, rest: list[str]) -> Loc:
        path = os.path.normpath(os.path.join(base, *rest)) if rest else os.path.normpath(base)
        inner = self.relative(path)
        if inner is not None:  # came back in (e.g. workdir/../workdir/x)
            return self.resolve(inner, follow_last=True)
        return Loc(OUTSIDE, path)

    # --- changing the upper tree -----------------------------------------------------------

    def copy_up(self, loc: Loc) -> Loc:
        """Replace a placeholder by a private copy of its origin (same mode, owner, times)."""
        if loc.kind not in (LOWER, UPPER):
            return loc
        loc = self.concrete(loc)
        if loc.kind != LOWER:
            return loc
        src, dst = loc.real, loc.upper
        tmp = dst + ".sandlock-copyup"
        st = os.stat(src)
        with open(src, "rb") as fin:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                with os.fdopen(fd, "wb", closefd=False) as fout:
                    shutil.copyfileobj(fin, fout, 1 << 20)
                try:
                    os.fchown(fd, st.st_uid, st.st_gid)
                except PermissionError:
                    pass
                os.fchmod(fd, stat.S_IMODE(st.st_mode))
                os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))
            finally:
                os.close(fd)
        os.rename(tmp, dst)  # the placeholder (and its origin xattr) goes in one step
        return Loc(UPPER, dst, dst, loc.rel)

    def stat_path(self, loc: Loc) -> str:
        """The real path whose stat is the sandbox path's."""
        return loc.real

    def usage(self) -> int:
        """Bytes of private data in the upper tree (placeholders count nothing)."""
        total = 0
        for dirpath, dirnames, filenames in os.walk(self.upper):
            for name in filenames:
                try:
                    total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
                except OSError:
                    pass
        return total

    def open_real(self, path: str, flags: int, mode: int = 0) -> int:
        return open_no_symlinks(path, flags | os.O_CLOEXEC, mode)

    def discard(self) -> None:
        """Remove the layer from disk (ABORT, or after a completed commit). The layer leaves
        its name in one step (rename), so an interrupted removal never leaves a half layer
        that looks like one; the remains are swept by the next create() in this storage."""
        trash = self.root + DISCARDING
        try:
            os.rename(self.root, trash)
        except FileNotFoundError:
            if not os.path.exists(trash):
                return
        remove_tree(trash)


DISCARDING = ".discarding"


def remove_tree(path: str) -> None:
    def onerror(func, p, exc):
        try:
            os.chmod(os.path.dirname(p), 0o700)
            func(p)
        except OSError:
            pass
    shutil.rmtree(path, onerror=onerror)
