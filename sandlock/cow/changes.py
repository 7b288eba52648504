"""What a copy-on-write run changed: the upper tree compared with the workdir.

Pure reading: nothing here writes the workdir. A pending directory whose origin is its own
path was never looked into, so nothing beneath it changed; everything else is compared
entry by entry (kind, mode, size, SHA-256 of the content, symlink target).
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field

from .layer import ORIGIN, PENDING, CowLayer, _safe_rel, _xattr
from .ownfiles import LAYER_XATTRS, LEFT, open_read


@dataclass(frozen=True)
class Entry:
    kind: str            # "file", "dir", "symlink", "fifo", "socket", "other"
    mode: int            # permission bits
    size: int
    hash: str = ""       # sha256 (hex) of a file's content; a symlink's target
    mtime_ns: int = 0    # files: a touch is a change too
    source: str = field(default="", repr=False, compare=False)  # real path of the content
    xattrs: str = field(default="", repr=False)  # files: their user xattrs (xattr_digest)

    # Upstream's names: the raw SHA-256 of a file, the target of a symlink.
    @property
    def digest(self) -> bytes | None:
        return bytes.fromhex(self.hash) if self.kind == "file" and self.readable else None

    @property
    def readable(self) -> bool:
        """False for a workdir file we may not read (its hash is then its identity)."""
        return not self.hash.startswith(UNREADABLE)

    @property
    def target(self) -> str | None:
        return self.hash if self.kind == "symlink" else None

    def _same_content(self, other: "Entry") -> bool:
        return self.kind == other.kind and self.hash == other.hash


@dataclass(frozen=True)
class Change:
    path: str            # relative to the workdir
    action: str          # "added", "modified", "deleted"
    before: Entry | None
    after: Entry | None

    # Upstream's view of the same change.
    @property
    def kind(self) -> str:
        """"A" added, "M" modified (both sides present), "D" deleted."""
        if self.after is None:
            return "D"
        return "A" if self.before is None else "M"

    @property
    def content_unchanged(self) -> bool:
        """Both sides present, the same kind and bytes or target (a touch, a mode change,
        an identical rewrite)."""
        return (self.before is not None and self.after is not None
                and self.before._same_content(self.after))

    @property
    def type_changed(self) -> bool:
        return (self.before is not None and self.after is not None
                and self.before.kind != self.after.kind)

    def __str__(self) -> str:
        return f"{self.kind}  {self.path}"

    def describe(self) -> str:
        """One line for a person; the sandbox chose the names, so they are escaped."""
        from netpolicy.text import printable

        def side(e):
            if e is None:
                return "-"
            text = f"{e.kind} {e.mode:04o}"
            if e.kind == "file":
                text += f" {e.size}B {e.hash[:12] if e.readable else 'unreadable'}"
            elif e.kind == "symlink":
                text += f" -> {printable(e.hash)}"
            return text
        return (f"{self.action:<9} {printable(self.path):<40} {side(self.before)}  =>  "
                f"{side(self.after)}")


UNREADABLE = "unreadable:"  # an Entry.hash standing for content we may not read


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISREG, "file"), (stat.S_ISDIR, "dir"), (stat.S_ISLNK, "symlink"),
                       (stat.S_ISFIFO, "fifo"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "other"


def sha256_fd(fd: int) -> str:
    h = hashlib.sha256()
    while chunk := os.read(fd, 1 << 20):
        h.update(chunk)
    return h.hexdigest()


def sha256_file(path: str, own: bool = False) -> str:
    """The content digest of a regular file (its last component is never followed). `own`:
    a file of the upper layer, read even if its owner made it unreadable."""
    fd = open_read(path, os.O_NONBLOCK) if own else \
        os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        return sha256_fd(fd)
    finally:
        os.close(fd)


def xattr_digest(file) -> str:
    """A file's user xattrs, never the layers' own (ownfiles.LAYER_XATTRS), as one digest;
    "" for none, or where they cannot be read. `file`: a path (its last component not
    followed) or an fd. A change of xattrs alone is a change (hunt: it was not committed)."""
    kw = {} if isinstance(file, int) else {"follow_symlinks": False}
    try:
        names = sorted(n for n in os.listxattr(file, **kw)
                       if n.startswith("user.") and not n.startswith(LAYER_XATTRS))
        if not names:
            return ""
        h = hashlib.sha256()
        for n in names:
            value = os.getxattr(file, n, **kw)
            h.update(b"%d:%s%d:%s" % (len(n), n.encode(), len(value), value))
        return h.hexdigest()
    except OSError:
        return ""


def entry(path: str, content_from: str | None = None, own: bool = False) -> Entry:
    """The entry at `path`; a placeholder passes its origin as `content_from`. `own`: `path`
    is in the upper layer (ownfiles.open_read)."""
    real = content_from or path
    st = os.lstat(real)
    kind = _kind(st.st_mode)
    mode = stat.S_IMODE(st.st_mode)
    if kind == "dir":
        mode = LEFT.get(real, mode)  # opened up for the diff (ownfiles.searchable)
    digest = ""
    if kind == "file":
        try:
            digest = sha256_file(real, own and content_from is None)
        except PermissionError:
            if own and content_from is None:
                raise
            # A file of the workdir we may not read (another user's, mode 0400): removing
            # or renaming it needs no read right; it is told apart by what stat says.
            digest = (f"{UNREADABLE}{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:"
                      f"{st.st_ctime_ns}")
    elif kind == "symlink":
        digest = os.readlink(real)
    return Entry(kind, mode, st.st_size if kind == "file" else 0, digest,
                 st.st_mtime_ns if kind == "file" else 0, real,
                 xattr_digest(real) if kind == "file" else "")


def _upper_entry(layer: CowLayer, upath: str) -> Entry:
    origin = layer.placeholder_origin(upath)
    if origin is not None:
        return entry(upath, os.path.join(layer.lower, origin))
    return entry(upath, own=True)


def _names(path: str) -> list[str]:
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            return os.listdir(path)
    except FileNotFoundError:
        pass
    return []


def _all_below(root: str, rel: str, action: str, out: list, layer: CowLayer | None) -> None:
    """Every entry beneath `root` (a lower or an upper directory) as added or deleted."""
    if layer is not None:
        layer._materialize(root, at_commit=True)
    for name in sorted(os.listdir(root)):
        path, r = os.path.join(root, name), f"{rel}/{name}"
        e = _upper_entry(layer, path) if layer is not None else entry(path)
        out.append(Change(r, action, None if action == "added" else e,
                          e if action == "added" else None))
        if e.kind == "dir":
            _all_below(path, r, action, out, layer)


def _only_the_runs(layer: CowLayer, udir: str, rel: str, out: list) -> bool:
    """A directory of the workdir that the run looked into (materialized: its entries
    stand for the workdir's) and that someone else removed during the run: what the run
    made or changed beneath it, as added (the directory too, made again for it), and
    nothing if the run changed nothing there. The workdir's entries it held, untouched,
    went with it, as they would have on the real filesystem (and as overlayfs' upper
    directory, which holds only the run's own entries, has it). True if anything was."""
    if _xattr(udir, PENDING) is not None:
        return False  # never looked into: nothing of the run's beneath
    found: list = []
    for name in sorted(os.listdir(udir)):
        upath, r = os.path.join(udir, name), f"{rel}/{name}"
        if layer.placeholder_origin(upath) == r:
            continue  # the workdir's file, untouched, removed with its directory
        if stat.S_ISDIR(os.lstat(upath).st_mode) and _xattr(upath, ORIGIN) == r:
            _only_the_runs(layer, upath, r, found)
            continue
        e = _upper_entry(layer, upath)
        found.append(Change(r, "added", None, e))
        if e.kind == "dir":
            _all_below(upath, r, "added", found, layer)
    if found:
        out.append(Change(rel, "added", None, entry(udir, own=True)))
        out.extend(found)
    return bool(found)


def diff(layer) -> list[Change]:
    """Every change the layer holds, sorted by path (parents first)."""
    from .ownfiles import searchable
    with layer.lock, searchable(layer.upper):
        if getattr(layer, "backend", None) == "overlay":
            out = layer.diff()  # overlay.OverlayLayer reads overlayfs' upper format
        else:
            out = []
            _compare(layer, layer.upper, "", out)
    return sorted(out, key=lambda c: c.path)


def _compare(layer: CowLayer, udir: str, rel: str, out: list) -> None:
    if _xattr(udir, PENDING) is not None:
        origin = _safe_rel(_xattr(udir, ORIGIN) or ".")
        if origin == (rel or "."):
            return  # never looked into: unchanged beneath
        layer._materialize(udir, at_commit=True)
    ldir = os.path.join(layer.lower, rel) if rel else layer.lower
    upper_names, lower_names = set(os.listdir(udir)), set(_names(ldir))
    # What the run could have removed (None: all of it) — when udir stands for this very
    # directory of the workdir; one moved here replaced it, and with it all it held.
    seen = layer.seen_names(udir) if _xattr(udir, ORIGIN) == (rel or ".") else None
    for name in sorted(upper_names | lower_names):
        r = f"{rel}/{name}" if rel else name
        upath, lpath = os.path.join(udir, name), os.path.join(ldir, name)
        if name in upper_names and layer.placeholder_origin(upath) == r:
            continue  # the lower file itself, untouched (never hashed), or removed outside
        if name not in upper_names and seen is not None and name not in seen:
            continue  # made in the workdir during the run, by someone else: not a change
        before = entry(lpath) if name in lower_names else None
        if name not in upper_names:
            out.append(Change(r, "deleted", before, None))
            if before.kind == "dir":
                _all_below(lpath, r, "deleted", out, None)
            continue
        after = _upper_entry(layer, upath)
        if before is None:
            if after.kind == "dir" and _xattr(upath, ORIGIN) == r:
                _only_the_runs(layer, upath, r, out)  # this very directory, removed outside
                continue
            out.append(Change(r, "added", None, after))
            if after.kind == "dir":
                _all_below(upath, r, "added", out, layer)
            continue
        if before.kind == "dir" and after.kind == "dir":
            if before.mode != after.mode:
                out.append(Change(r, "modified", before, after))
            _compare(layer, upath, r, out)
            continue
        if before == after:
            continue
        out.append(Change(r, "modified", before, after))
        if before.kind == "dir":
            _all_below(lpath, r, "deleted", out, None)
        if after.kind == "dir":
            _all_below(upath, r, "added", out, layer)


def table(changes: list[Change]) -> str:
    """A readable table of changes (sandlock run --dry-run)."""
    if not changes:
        return "no changes"
    counts = {a: sum(1 for c in changes if c.action == a) for a in ("added", "modified",
                                                                     "deleted")}
    lines = [c.describe() for c in changes]
    lines.append(f"{len(changes)} changes: {counts['added']} added, {counts['modified']} "
                 f"modified, {counts['deleted']} deleted")
    return "\n".join(lines)


def renames(changes) -> list[tuple[str, str]]:
    """(old, new) for each deleted file paired with the one added file of the same
    content; a content seen more than once on either side is ambiguous and left out."""
    def unique(side: str) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        for c in changes:
            e, other = (c.before, c.after) if side == "before" else (c.after, c.before)
            if e is None or other is not None or e.kind != "file" or not e.readable:
                continue
            out[e.hash] = None if e.hash in out else c.path
        return out
    deleted, added = unique("before"), unique("after")
    return sorted((old, added[h]) for h, old in deleted.items()
                  if old is not None and added.get(h) is not None)
