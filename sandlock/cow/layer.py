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
import secrets
import shutil
import stat
import threading

from .._kernel.fileops import open_no_symlinks
from ..fs_rules import is_beneath

from .location import (IDENTITY, LOWER, MAX_LINKS, MISSING, ORIGIN, OUTSIDE,  # noqa: F401
                       PENDING, SEEN, UPPER, Loc)
from .ownfiles import (copy_data, copy_metadata, in_own_dir, read_unreadable, remove_tree,
                       tree_usage)


def _identity(value: str | None) -> tuple[int, int] | None:
    """An IDENTITY xattr's "dev:ino", or None (absent or malformed)."""
    dev, _, ino = (value or "").partition(":")
    try:
        return int(dev), int(ino)
    except ValueError:
        return None


def _xattr(path: str, name: str) -> str | None:
    try:
        try:
            return os.fsdecode(os.getxattr(path, name, follow_symlinks=False))
        except PermissionError as e:
            if e.errno != errno.EACCES:
                raise
            return os.fsdecode(read_unreadable(path, lambda p: os.getxattr(p, name)))
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
        # Other spellings of the workdir, through symlinks outside it (alias()).
        self.aliases: tuple[str, ...] = ()
        self.lock = threading.RLock()
        # What the upper directories' xattrs say, cached by inode: materialized ones, and
        # pending ones with their origin. Every pending directory is made here (create,
        # _materialize), and only _materialize ends one; inodes survive renames.
        self._complete: set[int] = set()
        self._pending: dict[int, str] = {}
        self._root_ino: int | None = None
        self._upper_dev: int | None = None
        # True until the first change (False for a layer opened from disk): while there is
        # none, the workspace is the workdir itself, read-only under Landlock, and the
        # calls that only look are the kernel's to do (dispatch._with_workspace; the C fast
        # path's cow_read_only does the same). on_first_change is called once, before it.
        self.pristine = create
        self.on_first_change = None
        # Bumped whenever an upper directory standing for a workdir one moves or goes: the
        # origin index lower_dir_now() uses is rebuilt only then (_materialize adds to it).
        # While 0, every directory of the workdir is where its name says.
        self._generation = 0
        self._origin_index: tuple[int, dict[str, str]] = (-1, {})
        # (device, inode) of the workdir when the layer was made: the commit applies it
        # to that directory only (layer.json; None for a layer of before it was kept).
        self.lower_identity: tuple[int, int] | None = None
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
            self.lower_identity = (st.st_dev, st.st_ino)
            os.chmod(self.upper, stat.S_IMODE(st.st_mode))
            with open(os.path.join(root, "layer.json"), "w") as f:
                json.dump({"version": 1, "lower": self.lower,
                           "identity": [st.st_dev, st.st_ino]}, f)

    @classmethod
    def open(cls, root: str) -> "CowLayer":
        """A layer kept on disk (KEEP, DEFER, or a commit to finish after a crash)."""
        with open(os.path.join(root, "layer.json")) as f:
            meta = json.load(f)
        if meta.get("version") != 1:
            raise OSError(errno.EINVAL, f"{root}: unknown copy-on-write layer format")
        layer = cls(meta["lower"], root, create=False)
        if "identity" in meta:  # layers of before it was recorded: none
            layer.lower_identity = tuple(meta["identity"])
        return layer

    # --- naming ----------------------------------------------------------------------------

    def relative(self, path: str) -> str | None:
        """`path` (absolute, unresolved) relative to the workdir when it is spelled under
        the workdir or under the upper tree; None otherwise. Empty and '.' components are
        dropped first ('a//b/./c' is 'a/b/c' for the kernel too); '..' is left for
        resolve(), and a trailing '/' is kept (it requires a directory). A path spelled under
        one of the workdir's aliases (the policy's spelling of it, a shell's logical $PWD:
        symlinks outside the workdir that lead to it) is the workdir's too: the name only
        ever maps to the sandbox's own view of the workdir, so a symlink re-pointed since
        can make it see the workdir there, never reach anything else."""
        if "//" in path or "/./" in path or path.endswith("/."):
            trail = "/" if path.endswith(("/", "/.")) else ""
            path = "/" + "/".join(c for c in path.split("/") if c not in ("", ".")) + trail
        for top in (self.lower, self.upper):
            if path == top:
                return ""
            if path.startswith(top + "/"):
                return path[len(top) + 1:]
        for top in self.aliases:  # the alias itself is the symlink's name (rm, readlink)
            if path.startswith(top + "/"):
                return path[len(top) + 1:]
        return None

    def alias(self, spelled: str | None, cwd: str | None, pwd: str | None) -> None:
        """Take the workdir's other spellings: `spelled` (as the policy named it, made
        absolute) and the logical working directory `pwd` (a shell's $PWD) when it names
        `cwd` through symlinks, `cwd` being the workdir or beneath it."""
        found = [spelled] if spelled else []
        if pwd and cwd and os.path.isabs(pwd):
            logical, real = os.path.normpath(pwd), os.path.realpath(cwd)
            if is_beneath(real, self.lower) and os.path.realpath(logical) == real:
                tail = os.path.relpath(real, self.lower)
                if tail == ".":
                    found.append(logical)
                elif logical.endswith("/" + tail):
                    found.append(logical[:-len(tail) - 1])
        # Only a spelling that leads to the workdir itself: a symlink half-way down a
        # logical path, or a '..' after one, would otherwise make another directory (a
        # home) stand for the workdir.
        self.aliases = tuple(dict.fromkeys(
            a for a in found if os.path.isabs(a) and a != "/" and a != self.lower
            and not is_beneath(a, self.lower) and not is_beneath(self.lower, a)
            and os.path.realpath(a) == self.lower))

    def to_sandbox_path(self, real: str) -> str:
        """An upper path as the sandbox should see it (its workdir spelling)."""
        rel = self.relative(real)
        return real if rel is None else (self.lower + "/" + rel if rel else self.lower)

    # --- materialization -------------------------------------------------------------------

    def _materialize(self, udir: str, ino: int | None = None, *, at_commit: bool = False
                     ) -> None:
        """Give a pending upper directory one entry per entry of its lower origin. Its
        origin removed meanwhile (outside: the run never changes the workdir) leaves it
        empty, which is what the run sees then; `at_commit` (the diff) refuses that
        instead (FileNotFoundError): what it held is in neither the layer nor the workdir."""
        if ino is not None and ino in self._complete:
            return
        if _xattr(udir, PENDING) is None:
            if ino is not None:
                self._complete.add(ino)
            return
        if udir == self.upper:
            # Every change starts here: concrete() materializes the root before anything.
            self.pristine = False
            if self.on_first_change is not None:
                self.on_first_change()
                self.on_first_change = None
        ino = os.lstat(udir).st_ino
        self._pending.pop(ino, None)
        origin = _safe_rel(_xattr(udir, ORIGIN) or ".")
        ldir = os.path.join(self.lower, origin) if origin != "." else self.lower
        try:
            entries = list(os.scandir(ldir))
        except (FileNotFoundError, NotADirectoryError):
            if at_commit:
                raise FileNotFoundError(
                    errno.ENOENT, f"{self.relative(udir) or '.'}: the workdir directory it "
                    f"stands for ({origin}) was removed during the run; what it held is "
                    f"not in the layer", ldir) from None
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
                os.setxattr(up, ORIGIN, os.fsencode(rel))
                os.setxattr(up, PENDING, b"1")
                sub_ino = os.lstat(up).st_ino
                self._complete.discard(sub_ino)
                self._pending[sub_ino] = rel
                if self._origin_index[0] == self._generation:  # kept current, not rebuilt
                    self._origin_index[1].setdefault(rel, up)
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
                    os.setxattr(fd, ORIGIN, os.fsencode(rel))
                finally:
                    os.close(fd)
        self._note_seen(udir, ino, [e.name for e in entries])
        os.removexattr(udir, PENDING)
        self._complete.add(ino)
        try:
            lst = os.stat(ldir)
            os.utime(udir, ns=(lst.st_atime_ns, lst.st_mtime_ns))
        except OSError:
            pass

    def _note_seen(self, udir: str, ino: int, names: list[str]) -> None:
        """The names the workdir's directory held when `udir` was materialized, kept in the
        layer's storage (named by the SEEN xattr, so a directory made later on a reused
        inode has none): a name missing from `udir` is one the run removed only if it was
        seen; one made in the workdir since, by someone else, is not the run's to remove
        (hunt: the commit deleted files made outside during a run)."""
        seen_dir = os.path.join(self.root, "seen")
        os.makedirs(seen_dir, mode=0o700, exist_ok=True)
        token = f"{ino}-{secrets.token_hex(4)}"
        tmp = os.path.join(seen_dir, token + ".tmp")
        with open(tmp, "wb") as f:
            f.write(b"\0".join(os.fsencode(n) for n in names))
        os.rename(tmp, os.path.join(seen_dir, token))
        os.setxattr(udir, SEEN, token.encode())

    def seen_names(self, udir: str) -> set[str] | None:
        """The workdir names `udir` was materialized from (_note_seen), or None: a directory
        the run made, or a layer of before they were kept."""
        token = _xattr(udir, SEEN)
        if token is None or "/" in token or token.startswith("."):
            return None
        try:
            with open(os.path.join(self.root, "seen", token), "rb") as f:
                data = f.read()
        except OSError:
            return None
        return {os.fsdecode(n) for n in data.split(b"\0") if n}

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

    # --- directories the sandbox holds open ----------------------------------------------------

    def note_dirs_changed(self) -> None:
        """A directory was renamed or removed (by the supervisor's handlers)."""
        self._generation += 1

    def lower_dir_now(self, rel: str) -> str:
        """Where the workdir's directory `rel` is in the sandbox's view now. A directory fd
        or working directory the sandbox took on an untouched directory is the workdir's
        own (the kernel's), and the kernel names it by its old path after the sandbox
        renamed it or a parent: such a directory follows the directory, as on a real
        filesystem, to the upper directory standing for it (its ORIGIN is `rel`, or a
        parent's is a prefix of `rel`). Once it was removed it goes by its name again, so
        that `rm -rf d; mkdir d; cd d` lands in the new d (a real filesystem would give
        ENOENT to an fd on the removed one)."""
        if not rel or not self._generation:
            return rel
        with self.lock:
            if self._stands_for(rel, rel):
                return rel
            moved = self._upper_dirs_by_origin()
            parts = rel.split("/")
            for k in range(len(parts), 0, -1):  # the longest moved prefix
                up = moved.get("/".join(parts[:k]))
                if up is None:
                    continue
                now = "/".join([os.path.relpath(up, self.upper)] + parts[k:])
                if self._stands_for(now, rel):
                    return now
                break
            return rel

    def lower_path_now(self, path: str) -> str:
        """A real path in the workdir, the kernel's name for a directory the sandbox holds
        (a directory fd, its cwd), as the sandbox's view names that directory now
        (lower_dir_now); any other path as it is."""
        if not self._generation or not (path == self.lower
                                        or path.startswith(self.lower + "/")):
            return path
        now = self.lower_dir_now(path[len(self.lower) + 1:])
        return self.lower + "/" + now if now else self.lower

    def gone(self, path: str) -> bool:
        """Is the directory the kernel names `path` (a directory the sandbox holds: its cwd,
        a directory fd; after lower_path_now) no longer in the sandbox's view?"""
        if path == self.upper or path.startswith(self.upper + "/"):
            return not os.path.isdir(path)
        if not path.startswith(self.lower + "/"):
            return False
        with self.lock:
            try:
                return self.resolve(path[len(self.lower) + 1:],
                                    follow_last=False).kind == MISSING
            except OSError:
                return True

    def owner(self, upath: str) -> tuple[int, int]:
        """(uid, gid) of the sandbox's object at upper path `upath`: the workdir object's it
        stands for (a directory's or a placeholder's ORIGIN), which the layer's own entry
        does not keep; else the upper object's (made in the run, or a copy)."""
        st = os.lstat(upath)
        origin = _xattr(upath, ORIGIN) if stat.S_ISDIR(st.st_mode) or \
            stat.S_ISREG(st.st_mode) else None
        if origin is not None:
            try:
                rel = _safe_rel(origin)
                o = os.lstat(self.lower if rel == "." else os.path.join(self.lower, rel))
                return o.st_uid, o.st_gid
            except OSError:
                pass
        return st.st_uid, st.st_gid

    def _stands_for(self, now: str, rel: str) -> bool:
        """Is the directory at `now` in the sandbox's view the workdir's directory `rel`?"""
        try:
            loc = self.resolve(now, follow_last=False)
        except OSError:
            return False
        if loc.kind == LOWER:
            return loc.real == os.path.join(self.lower, rel)
        if loc.kind != UPPER or not os.path.isdir(loc.upper) or os.path.islink(loc.upper):
            return False
        return _xattr(loc.upper, ORIGIN) == (rel or ".")

    def listing_dir(self, rel: str) -> str | None:
        """The upper directory whose entries are what the sandbox sees now in the workdir's
        directory `rel` (followed through renames), once the layer holds them; None while
        the workdir's own listing is that view (untouched, or pending), and once the
        directory was removed."""
        with self.lock:
            now = self.lower_dir_now(rel)
            if not self._stands_for(now, rel):
                return None
            loc = self.resolve(now, follow_last=False)
            return loc.upper if loc.kind == UPPER else None

    def _upper_dirs_by_origin(self) -> dict[str, str]:
        """Upper directory for each workdir directory that has one (its ORIGIN xattr).
        Only after a directory moved, and only the upper tree (what changed) is walked,
        once per change of it (see _generation)."""
        gen, index = self._origin_index
        if gen == self._generation:
            return index
        out = {}
        for top, dirs, _ in os.walk(self.upper):
            for name in dirs:
                path = os.path.join(top, name)
                origin = _xattr(path, ORIGIN)
                if origin is not None:
                    out.setdefault(origin, path)
        self._origin_index = (self._generation, out)
        return out

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
        must_be_dir = rel.endswith("/")  # "file/" is ENOTDIR, as for the kernel

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
            if not last or must_be_dir:
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
        """The path left the workdir at `base`: the rest is for the caller to resolve as
        the sandbox's kernel would (never lexically: `..` after a symlink is not `..`)."""
        return Loc(OUTSIDE, base.rstrip("/") + "/" + "/".join(rest) if rest else base)

    # --- changing the upper tree -----------------------------------------------------------

    def copy_up(self, loc: Loc) -> Loc:
        """Replace a placeholder by a private copy of its origin (content, mode, owner,
        times, xattrs). The copy is made in the layer's private scratch directory, which the
        sandbox cannot name, and renamed over the placeholder in one step."""
        if loc.kind not in (LOWER, UPPER):
            return loc
        loc = self.concrete(loc)
        if loc.kind != LOWER:
            return loc
        src, dst = loc.real, loc.upper
        tmp = self.scratch_name()
        fin = open_no_symlinks(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            st = os.fstat(fin)
            if not stat.S_ISREG(st.st_mode):
                raise OSError(errno.EPERM, "only regular files are copied up")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600)
            try:
                copy_data(fin, fd)
                # The identity stat reported for it until now (see identity()); before its
                # mode, which may take away the owner's write right that a user xattr needs.
                os.setxattr(fd, IDENTITY, f"{st.st_dev}:{st.st_ino}".encode())
                copy_metadata(fin, fd, st)
            finally:
                os.close(fd)
        finally:
            os.close(fin)
        # The placeholder (and its origin xattr) goes in one step, even in a directory the
        # sandbox made read-only (a write to a file there needs no right on it).
        in_own_dir(os.path.dirname(dst), lambda: os.rename(tmp, dst))
        return Loc(UPPER, dst, dst, loc.rel)

    @staticmethod
    def identity(real: str) -> tuple[int, int] | None:
        """(st_dev, st_ino) a stat of the upper file `real` reports: its workdir origin's
        if it is a copy-up (as overlayfs keeps a copied-up file's inode number), so that
        what a program stat'ed before its first write, or before a hard link to it (git
        clone checks the link against the source's earlier lstat), is the same file after.
        None for a file the layer made."""
        try:
            return _identity(_xattr(real, IDENTITY))
        except OSError:
            return None

    def fd_identity(self, fd: int) -> tuple[int, int] | None:
        """identity() of the file open at `fd` (ours), if it is a file of this layer's
        upper tree; None for any other file."""
        st = os.fstat(fd)
        if self._upper_dev is None:
            self._upper_dev = os.stat(self.upper).st_dev
        if st.st_dev != self._upper_dev or not stat.S_ISREG(st.st_mode):
            return None
        try:  # by the fd's /proc link: an O_PATH fd as well (fgetxattr refuses those)
            return _identity(os.getxattr(f"/proc/self/fd/{fd}", IDENTITY).decode())
        except OSError:
            return None  # no identity (a file the layer made), or unreadable (mode 000)

    def scratch_name(self) -> str:
        """A fresh path in the layer's scratch directory (same filesystem as the upper tree,
        outside it: nothing the sandbox names can collide with it)."""
        scratch = os.path.join(self.root, "scratch")
        os.makedirs(scratch, mode=0o700, exist_ok=True)
        return os.path.join(scratch, secrets.token_hex(8))

    def usage(self) -> int:
        """Bytes of private data in the upper tree (placeholders count nothing)."""
        return tree_usage(self.upper)

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
