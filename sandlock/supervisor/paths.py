"""Resolving a path as a sandboxed thread's open or exec would, from the supervisor.

The supervisor shares the sandbox's mount namespace and root (chroot and namespaces are
refused to sandboxes), so every component resolves the same way for both, except the
links whose target depends on who looks: /proc/self and /proc/thread-self (and what points
through them, such as /dev/fd and /dev/stdin). So the walk is done here, component by
component, with those two replaced by the caller's own /proc entries. Used only while the
sandbox is frozen (supervisor.freeze): nothing in it can change the tree meanwhile.
"""

from __future__ import annotations

import os
import stat

MAX_LINKS = 40  # as the kernel's ELOOP limit


class Unresolvable(Exception):
    """The path cannot be resolved the way the kernel would: the caller refuses."""


def _components(path: str) -> list[str]:
    return [c for c in path.split("/") if c]


def view(session, tgid: int) -> str:
    """The prefix under which the supervisor sees what process `tgid` sees: "" when the
    sandbox shares our mount namespace, else its root (an overlay-backend workspace gives
    the sandbox a mount namespace of its own)."""
    return f"/proc/{tgid}/root" if session.own_mounts else ""


def resolve(tgid: int, tid: int, base: str, path: str, follow_last: bool,
            root: str = "", magic: bool = False) -> str | None:
    """The absolute path `path` names for thread `tid` of process `tgid`, relative to the
    directory `base` (absolute) when it is relative, as the process sees it (`root`: see
    `view`; every prefix looked at is free of symlinks, so none is followed in our own
    namespace). None when a directory on the way does not exist (the kernel fails the
    call too); a missing last component is returned as the path it would have (a file
    about to be created). Objects that are not files (a pipe reached through /proc/PID/fd)
    resolve to their /proc link's description (with `magic`, to the /proc link's own
    path, which opens the object)."""
    cur = [] if path.startswith("/") else _components(base)
    todo = _components(path)
    links = 0
    while todo:
        comp = todo.pop(0)
        last = not todo
        if comp == ".":
            continue
        if comp == "..":
            if cur:
                cur.pop()
            continue
        if cur == ["proc"] and comp == "self":
            cur = ["proc", str(tgid)]
            continue
        if cur == ["proc"] and comp == "thread-self":
            cur = ["proc", str(tgid), "task", str(tid)]
            continue
        candidate = "/" + "/".join(cur + [comp])
        try:
            st = os.lstat(root + candidate)
        except (FileNotFoundError, NotADirectoryError):
            return candidate if last else None
        except OSError as e:
            raise Unresolvable(f"{candidate}: {e.strerror}") from None
        if stat.S_ISLNK(st.st_mode) and (follow_last or not last):
            links += 1
            if links > MAX_LINKS:
                return None  # ELOOP for the kernel as well
            try:
                target = os.readlink(root + candidate)
            except OSError as e:
                raise Unresolvable(f"{candidate}: {e.strerror}") from None
            if not target.startswith("/"):
                if cur[:1] == ["proc"] and ":" in target:
                    # a /proc magic link to a pipe, socket or anon inode
                    return candidate if magic else target
                todo = _components(target) + todo
                continue
            cur = []
            todo = _components(target) + todo
            continue
        if not last and not stat.S_ISDIR(st.st_mode):
            return None  # ENOTDIR
        cur.append(comp)
    return "/" + "/".join(cur)


def directory_of(pid: int, dirfd: int, at_fdcwd: int) -> str:
    """The absolute path of the directory a *at() call resolves from."""
    link = f"/proc/{pid}/cwd" if dirfd == at_fdcwd else f"/proc/{pid}/fd/{dirfd}"
    try:
        base = os.readlink(link)
    except OSError as e:
        raise Unresolvable(f"directory of fd {dirfd}: {e.strerror}") from None
    if not base.startswith("/"):
        raise Unresolvable(f"fd {dirfd} is not a directory ({base})")
    return base


def interpreter_of(path: str, root: str = "") -> str | None:
    """The interpreter a `#!` script names (the kernel opens it without a syscall)."""
    try:
        with open(root + path, "rb") as f:
            head = f.read(256)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    line = head[2:].split(b"\n", 1)[0].strip()
    interp = line.split(None, 1)[0] if line else b""
    return os.fsdecode(interp) if interp.startswith(b"/") else None
