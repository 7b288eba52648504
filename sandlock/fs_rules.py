"""Turning fs_readable / fs_writable / fs_denied into Landlock path rules.

Landlock only grants, and a grant on a directory covers everything beneath it, so a denied
path under a granted directory cannot be carved out with a single rule. Instead the grant is
*expanded*: along the way from the granted directory down to the denied path, each
directory on that way keeps only the rights that cannot reach the denied path, and every
sibling entry off that way gets the full grant.

Invariant: no rule produced here is attached to a denied path or to a directory above one
with a right that is inherited by the denied path (READ_DIR is kept on such a directory only
when every denied path below it is a non-directory, since it never applies to files).
Consequences, documented for users: entries created later directly inside such a directory
get no rights (they match no rule), and the directory itself cannot be written to.
"""

from __future__ import annotations

import os
import stat

from ._kernel import landlock as ll

READ_RIGHTS = ll.FS_READ_FILE | ll.FS_READ_DIR | ll.FS_EXECUTE
WRITE_RIGHTS = (READ_RIGHTS | ll.FS_WRITE_FILE | ll.FS_REMOVE_DIR | ll.FS_REMOVE_FILE
                | ll.FS_MAKE_CHAR | ll.FS_MAKE_DIR | ll.FS_MAKE_REG | ll.FS_MAKE_SOCK
                | ll.FS_MAKE_FIFO | ll.FS_MAKE_BLOCK | ll.FS_MAKE_SYM | ll.FS_REFER
                | ll.FS_TRUNCATE | ll.FS_IOCTL_DEV)


def is_beneath(path: str, ancestor: str) -> bool:
    """True when `path` equals `ancestor` or lies below it (canonical absolute paths)."""
    if ancestor.endswith("/"):
        return path == ancestor or path.startswith(ancestor.rstrip("/") + "/")
    # The common case, without building a string (a policy's plan asks thousands of times).
    return path.startswith(ancestor) and (len(path) == len(ancestor)
                                          or path[len(ancestor)] == "/")


def _expand(grant: str, rights: int, denied: list[str], out: dict[str, int]) -> None:
    """Add rules equivalent to `rights` on `grant` minus every path in `denied` below it."""
    below = [d for d in denied if d != grant and is_beneath(d, grant)]
    if not below:
        out[grant] = out.get(grant, 0) | rights
        return
    # A directory on the way to a denied path: READ_DIR only if no denied directory is below.
    if not any(os.path.isdir(d) for d in below):
        out[grant] = out.get(grant, 0) | (rights & ll.FS_READ_DIR)
    try:
        entries = list(os.scandir(grant))
    except OSError:
        return
    for entry in entries:
        child = entry.path
        if child in below:
            continue  # the denied path itself: no rule at all
        if entry.is_symlink():
            continue  # access through a symlink is checked where it points
        _expand(child, rights, below, out)


def _expand_writes(grant: str, excluded: list[str], denied: list[str],
                   out: dict[str, int]) -> None:
    """Write rights on `grant` except beneath `excluded` (a seccomp-backend workdir inside
    a writable grant): the directories on the way keep read rights only, every entry off
    the way gets the full grant, the excluded path itself no write right."""
    below = [e for e in excluded if e != grant and is_beneath(e, grant)]
    if grant in excluded or grant in denied:
        return  # no rule at all (as _expand gives a denied entry none)
    if not below:
        _expand(grant, WRITE_RIGHTS, denied, out)
        return
    _expand(grant, READ_RIGHTS, denied, out)
    try:
        entries = list(os.scandir(grant))
    except OSError:
        return
    for entry in entries:
        if entry.is_symlink():
            continue
        _expand_writes(entry.path, below, denied, out)


def plan_path_rules(readable, writable, denied, write_excluded=()) -> dict[str, int]:
    """Path -> rights. Rights on non-directories are narrowed when the ruleset is built."""
    out: dict[str, int] = {}
    denied = list(denied)
    for path in readable:
        _expand(path, READ_RIGHTS, denied, out)
    for path in writable:
        _expand_writes(path, list(write_excluded), denied, out)
    return out


def add_path_rules(ruleset: ll.LandlockRuleset, rules: dict[str, int]) -> None:
    """Open each path O_PATH and add its rule. Paths that vanished since planning are skipped
    (they can only lose access, never gain it)."""
    for path, rights in rules.items():
        try:
            # O_NOFOLLOW: the policy's own paths are canonical, and an expanded sibling
            # swapped for a symlink since the scan must not carry its grant elsewhere.
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            continue
        try:
            if not stat.S_ISDIR(os.fstat(fd).st_mode):
                rights &= ll.FS_FILE_RIGHTS
            ruleset.allow_path_fd(fd, rights)
        finally:
            os.close(fd)
