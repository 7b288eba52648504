"""The user's secrets and persistence vectors under writable grants (home_policy): the calls
the kernel alone cannot refuse.

Existing protected paths are the kernel's to keep: in the sandbox's own mount namespace a
secret is covered (an empty tmpfs of mode 0, or an empty file) and a persistence vector is
a read-only bind of itself (the trampoline makes both), so a write is EROFS and an unlink
or rename of it EBUSY. What no mount can refuse is a *new name*: ~/.zshrc where there was
none, `.envrc` or `.vscode/` in a project, a hook in a new .git/hooks, a rename or link
giving one of those names to a file, or a move of a directory holding a protected path (so
that another takes its place). So while a sandbox has a writable grant, every call that
creates a name reaches the supervisor: open/openat/creat with O_CREAT, mkdir, mknod,
symlink, link, rename (the filter tests the open flags: other opens stay in the kernel).

Where no mount namespace can be made (a container's seccomp profile, a distribution that
restricts user namespaces: the "landlock" mode), secrets are Landlock-denied paths instead
and persistence vectors are kept here as well: opens that may write (O_WRONLY, O_RDWR,
O_TRUNC), truncate, unlink and rmdir are trapped too, and an open's fd is checked after
the call (the object reached, by identity and by path) before it is installed.

Each call, on the sandbox's behalf:
  parse   paths are copied once and resolved as the caller's call would resolve them, in
          its own mount view (supervisor.paths);
  decide  the new name (and for a rename or link, the old one) must not be protected, and
          a rename may not move a directory that holds a protected path;
  act     the directories involved are opened here (O_PATH, no symlink on the way: a swap
          since the resolution fails with ELOOP), then the call is made relative to them
          by a thread confined by the sandbox's own Landlock ruleset (supervisor.confined):
          the kernel judges it as it would the sandbox's call, and an fd it opens carries
          the sandbox's rights. The fd is installed in the caller (ADDFD).
Nothing the caller rewrites after the copy is read again. Names the user wrote in a grant
themselves were left out of the plan: they are theirs.
"""

from __future__ import annotations

import errno
import os
import stat
import time

from .._kernel.fileops import (AT_FDCWD, RESOLVE_BENEATH, RESOLVE_IN_ROOT,
                               RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS, birth_ns, openat2,
                               renameat2)
from ..fs_rules import is_beneath
from ..home_policy import PROJECT_FILES, REPO_FILES
from .confined import confined
from .cow_paths import umask_of
from .network import Defer, Guard as CallFds, Inject
from .paths import Unresolvable, directory_of, resolve, view
from .request import Denied, Request

AT_SYMLINK_FOLLOW = 0x400
AT_EMPTY_PATH = 0x1000
AT_REMOVEDIR = 0x200
O_TMPFILE = 0o20000000 | os.O_DIRECTORY
RENAME_EXCHANGE = 2
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_CREAT


_CLOCK_REALTIME_COARSE = getattr(time, "CLOCK_REALTIME_COARSE", 5)  # Linux's number


class Protection:
    """One sandbox's protection plan, as the supervisor checks it. `mode` is "mounts"
    (existing paths kept by the kernel) or "landlock" (no namespace: kept here too)."""

    CACHE = 4096  # directory identities remembered as inside (or not) a full write grant

    def __init__(self, plan, mode: str, confined_threads, write_roots=frozenset()):
        # Git directories born before are the user's. Read on the clock the filesystem
        # stamps inodes with (the coarse one, a tick behind at most: ~10 ms here): by the
        # precise clock, a .git the run made within a tick of its start was born "before"
        # it, and `git init`/`git clone` were refused their own hooks directory.
        self.started = time.clock_gettime_ns(_CLOCK_REALTIME_COARSE)
        self.write_roots = write_roots  # (dev, ino) of the Landlock rules with every write right
        self._inside: dict[tuple[int, int], bool] = {}
        self.hidden = tuple(plan.hidden)
        self.readonly = tuple(plan.readonly)
        self.guarded = tuple(plan.guarded)
        self.repos = tuple(plan.repos)
        self.roots = tuple(plan.roots)
        self.homes = tuple(plan.homes)
        self.mode = mode
        self.threads = confined_threads
        self.hidden_identities = frozenset(_identities(self.hidden))
        self.identities = self.hidden_identities | frozenset(_identities(self.readonly))
        # Protected paths the user named in a writable grant themselves (-w .git/config):
        # theirs to change, with what lies beneath them.
        self.exempt = ()
        self.exempt = tuple(n for n in plan.named_write if self.refusal(n) is not None)

    def refusal(self, real: str) -> str | None:
        """Why the sandbox may not create, replace or write the name `real`, or None."""
        if any(is_beneath(real, e) for e in self.exempt):
            return None
        for p in self.hidden:
            if is_beneath(real, p):
                return f"{real} is a secret (hidden from sandboxes)"
        for p in self.readonly + self.guarded:
            if is_beneath(real, p):
                return f"{real} is a persistence vector (never changed from a sandbox)"
        parent, name = os.path.split(real)
        if name in PROJECT_FILES and any(is_beneath(parent, r) for r in self.roots):
            return f"{real} is a persistence vector (never created from a sandbox)"
        if os.path.basename(parent) == "hooks" and \
                os.path.basename(os.path.dirname(parent)) == ".git" and \
                not name.endswith(".sample"):
            return f"{real} would be a repository hook (never created from a sandbox)"
        for g in self.repos:
            if any(is_beneath(real, os.path.join(g, f)) for f in REPO_FILES):
                return f"{real} is a repository's hooks or config (never changed from a sandbox)"
        why = self._git_dir_file(real)
        if why is None and any(is_beneath(real, os.path.join(h, ".local/lib"))
                               for h in self.homes):
            if "/site-packages/" in real and (name.endswith(".pth") or name in (
                    "usercustomize.py", "sitecustomize.py")):
                why = f"{real} would run at every start of Python (never created from a sandbox)"
        return why

    def _git_dir_file(self, real: str) -> str | None:
        """Any repository, found by the plan's scan or not: a REPO_FILES entry of a git
        directory (.git, or a submodule's or worktree's within it) that existed before
        this run (its birth time). Repositories the run itself creates are its own."""
        parts = real.split("/")
        if ".git" not in parts:
            return None
        i = len(parts) - 1 - parts[::-1].index(".git")
        gitdir, rest = parts[:i + 1], parts[i + 1:]
        while len(rest) >= 3 and rest[0] in ("modules", "worktrees"):
            gitdir, rest = gitdir + rest[:2], rest[2:]
        if not rest or rest[0] not in REPO_FILES:
            return None
        path = "/".join(gitdir)
        try:
            born = birth_ns(AT_FDCWD, path)
        except OSError:
            return None  # not in the user's tree: the run's own
        if born is not None and born >= self.started:
            return None
        return f"{real} is a repository's hooks or config (never changed from a sandbox)"

    def moves(self, real: str) -> str | None:
        """Why the name `real` may not be moved away or replaced: it holds something
        protected (another directory could then take its place)."""
        for p in self.hidden + self.readonly + self.guarded:
            if is_beneath(p, real) and p != real:
                return f"moving {real} would move {p}, which is protected"
        for g in self.repos:
            if is_beneath(g, real):
                return f"moving {real} would move the repository {g}"
        for root in self.roots:
            if is_beneath(root, real) and root != real:
                return f"moving {real} would move the writable grant {root}"
        return None

    def fully_writable(self, dir_fd: int) -> bool:
        """Whether the directory open at `dir_fd` lies beneath a Landlock rule granting
        every write right (by object: its ancestors are walked with ".."): there, the
        sandbox's own call would be allowed whatever it does, so acting unconfined grants
        nothing (fs_rules never puts such a rule above a denied path). Remembered per
        directory; forgotten at every rename the guard makes."""
        st = os.fstat(dir_fd)
        key = (st.st_dev, st.st_ino)
        known = self._inside.get(key)
        if known is not None:
            return known
        inside = False
        fd = os.dup(dir_fd)
        try:
            for _ in range(256):
                if (st.st_dev, st.st_ino) in self.write_roots:
                    inside = True
                    break
                up = os.open("..", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
                os.close(fd)
                fd = up
                parent = os.fstat(fd)
                if (parent.st_dev, parent.st_ino) == (st.st_dev, st.st_ino):
                    break  # the root
                st = parent
        finally:
            os.close(fd)
        if len(self._inside) >= self.CACHE:
            self._inside.clear()
        self._inside[key] = inside
        return inside

    def forget(self) -> None:
        self._inside.clear()

    def protected_object(self, fd: int, real: str) -> str | None:
        """Landlock mode: why an fd opened for writing may not be given to the sandbox (it
        reached a protected object, under any name), or None."""
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) in self.identities:
            return f"{real} is a persistence vector or secret (another name of it)"
        return self.refusal(real)


def _identities(paths) -> set[tuple[int, int]]:
    """(device, inode) of each protected file, and of every file beneath a protected
    directory (bounded): what a hard link made before the run would still reach."""
    out = set()
    budget = 20000
    for p in paths:
        try:
            st = os.lstat(p)
        except OSError:
            continue
        out.add((st.st_dev, st.st_ino))
        if stat.S_ISDIR(st.st_mode):
            for dirpath, dirnames, filenames in os.walk(p):
                for n in filenames:
                    budget -= 1
                    if budget < 0:
                        return out
                    try:
                        s = os.lstat(os.path.join(dirpath, n))
                    except OSError:
                        continue
                    out.add((s.st_dev, s.st_ino))
    return out


# --- parse ---------------------------------------------------------------------------

def _resolved(req: Request, session, dirfd: int, path: bytes, follow: bool) -> str:
    """The absolute path (in the caller's view) the call names, or a /proc link path for
    an object without a name (a pipe reached through /proc/PID/fd)."""
    if not path:
        raise Denied(errno.ENOENT, "empty path")
    text = os.fsdecode(path)
    tgid = req.process_ids()[0]
    try:
        base = "/" if text.startswith("/") else directory_of(req.pid, dirfd, AT_FDCWD)
        real = resolve(tgid, req.pid, base, text, follow_last=follow,
                       root=view(session, tgid), magic=True)
    except Unresolvable as e:
        raise Denied(errno.EACCES, str(e)) from None
    if real is None:
        raise OSError(errno.ENOENT, "No such file or directory")
    return real


def _open_dir(session, req: Request, path: str) -> int:
    """O_PATH fd on directory `path` of the caller's view, with no symlink on the way."""
    flags = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
    how = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
    if session.own_mounts:
        root = os.open(f"/proc/{req.pid}/root", os.O_PATH | os.O_CLOEXEC)
        try:
            return openat2(root, path, flags, 0, RESOLVE_IN_ROOT | how)
        finally:
            os.close(root)
    return openat2(AT_FDCWD, path, flags, 0, how)


def _parent(session, req: Request, real: str) -> tuple[int, str]:
    parent, name = os.path.split(real)
    return _open_dir(session, req, parent or "/"), name


def _takes_place(session, real: str, syscall: str) -> None:
    """A new name that is not a directory of ours (a symlink, a link, a file) may not be
    the name of a directory protected paths lie in (~/.config after the sandbox removed
    an empty one): through it they would lead elsewhere."""
    why = session.protection.moves(real)
    if why is not None:
        raise Denied(errno.EACCES, f"{syscall}: {real} would stand where protected paths "
                                   f"lie ({why.split(' would move ', 1)[-1]})")


def _check(session, real: str, syscall: str) -> None:
    refusal = session.protection.refusal(real)
    rt = session.runtime
    if refusal is None and rt is not None and rt.denied_paths:
        refusal = rt.path_refusal(real)
    if refusal is not None:
        raise Denied(errno.EACCES, f"{syscall}: {refusal}")


def _act(session, act, fds, opens: bool = False):
    """Perform `act`: here when it only names things (mkdir, symlink, link, rename) in
    directories fully writable to the sandbox (Protection.fully_writable); an open there
    on a shared worker (an open can wait: a FIFO's other end, a lease's break), unconfined,
    as Landlock would allow it anyway; everything else on the sandbox's confined threads.
    `fds` are closed after it ran (or if it never runs)."""
    try:
        writable = all(session.protection.fully_writable(d) for d in fds)
    except OSError:
        writable = False
    if writable and not opens:
        try:
            return act()
        finally:
            for fd in fds:
                os.close(fd)
    return _deferred(session, act, fds, None if writable else
                     session.protection.threads.pool)


def _deferred(session, act, fds, pool, guard=None) -> Defer:
    """Hand `act` to `pool` (the sandbox's confined threads), or to the shared workers
    (None); `fds` are closed after it ran (or if it never runs). A caller that dies
    interrupts it (_kernel.interrupt: one attempt per syscall, never retried on EINTR)."""
    guard = guard or CallFds(-1)
    guard.others.extend(fds)

    def run():
        try:
            if pool is not None and not confined():
                raise Denied(errno.EPERM, "the supervisor could not confine the thread "
                                          "acting for this sandbox")
            if guard.cancelled:
                raise OSError(errno.EINTR, "the caller is gone")
            return act()
        finally:
            guard.close()
    return Defer(run, guard, pool=pool)


def _confined_call(session, act, fds) -> Defer:
    return _deferred(session, act, fds, session.protection.threads.pool)


class _FifoFds(CallFds):
    """A FIFO's open waits for the other end: aborting it (the caller is gone) opens that
    end itself, which ends the wait whatever the thread is doing."""

    def __init__(self, dir_fd: int, name: str):
        super().__init__(-1, [])
        self.dir_fd, self.name = os.dup(dir_fd), name
        self.others.append(self.dir_fd)

    def abort(self) -> None:
        super().abort()
        try:
            os.close(_open_once(self.dir_fd, self.name, os.O_RDWR | os.O_NONBLOCK, 0))
        except OSError:
            pass


def _open_once(dir_fd: int, name: str, flags: int, mode: int) -> int:
    """Open the entry `name` of `dir_fd` itself, never through a symlink (one swapped in
    since the check fails with ELOOP), one attempt (EINTR is an answer, not retried)."""
    return openat2(dir_fd, name, flags | os.O_CLOEXEC, mode,
                   RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)


def _opened(fd: int, flags: int, real: str, protection) -> None:
    """After the open, before anything is written: the object reached must not be a
    protected one under another name (an identity check: hard links), then the O_TRUNC
    the caller asked for is applied. Raises (and closes fd) if refused."""
    try:
        st = os.fstat(fd)
        if flags & (os.O_ACCMODE | os.O_TRUNC) and (st.st_dev, st.st_ino) in \
                protection.identities:
            raise Denied(errno.EACCES, f"open: {real} is a protected file under another name")
        if flags & os.O_TRUNC and flags & os.O_ACCMODE and stat.S_ISREG(st.st_mode):
            os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise


# --- act -------------------------------------------------------------------------------

def _open(req: Request, session, dirfd: int, path: bytes, flags: int, mode: int):
    follow = not flags & os.O_NOFOLLOW and not (flags & os.O_CREAT and flags & os.O_EXCL)
    real = _resolved(req, session, dirfd, path, follow)
    writes = bool(flags & (os.O_ACCMODE | os.O_TRUNC))
    if real.startswith("/proc/"):
        return _reopen_proc(req, session, real, flags)
    try:
        kind = stat.S_IFMT(os.lstat(view(session, req.pid) + real).st_mode)
    except OSError:
        kind = 0
    if (not kind and flags & os.O_CREAT) or writes:
        _check(session, real, "open")
    pfd, name = _parent(session, req, real)
    umask = umask_of(req)
    cloexec = bool(flags & os.O_CLOEXEC)
    protection = session.protection
    # The entry itself, never a symlink swapped in since the check; O_TRUNC only once the
    # object reached has been checked (_opened).
    oflags = (flags | os.O_NOFOLLOW) & ~(os.O_NOCTTY | os.O_TRUNC | os.O_CLOEXEC)

    def act():
        fd = _open_once(pfd, name, oflags, mode & ~umask & 0o7777)
        _opened(fd, flags, real, protection)
        return Inject(fd, cloexec)
    if kind == stat.S_IFIFO:
        try:
            fifo = _FifoFds(pfd, name)
        except BaseException:
            os.close(pfd)
            raise
        pool = None
        try:
            if not protection.fully_writable(pfd):
                pool = protection.threads.pool
        except OSError:
            pool = protection.threads.pool
        return _deferred(session, act, [pfd], pool, fifo)
    return _act(session, act, [pfd], opens=True)


def _reopen_proc(req, session, real: str, flags: int):
    """An open through one of the caller's /proc links (/dev/stdout is /proc/self/fd/1):
    the object it leads to exists, so nothing is created; it is reopened by the confined
    thread through our own fd on it (the thread may not look into the caller's /proc)."""
    if not real.startswith(f"/proc/{req.pid}/") and not real.startswith(
            f"/proc/{req.process_ids()[0]}/"):
        raise Denied(errno.EACCES, f"open: {real}: another process's /proc entry")
    try:
        target = os.open(real, os.O_PATH | os.O_CLOEXEC)
    except OSError as e:
        raise OSError(e.errno, e.strerror) from None
    cloexec = bool(flags & os.O_CLOEXEC)
    protection = session.protection
    oflags = flags & ~(os.O_NOCTTY | os.O_CREAT | os.O_EXCL | os.O_TRUNC | os.O_CLOEXEC)

    def act():
        fd = openat2(AT_FDCWD, f"/proc/self/fd/{target}", oflags | os.O_CLOEXEC, 0, 0)
        _opened(fd, flags, real, protection)
        return Inject(fd, cloexec)
    return _confined_call(session, act, [target])


def _make(req, session, dirfd, path_arg, syscall, act_on):
    real = _resolved(req, session, dirfd, req.read_path(path_arg), False)
    if real.startswith("/proc/"):
        raise Denied(errno.EACCES, f"{syscall}: {real}: nothing is created in /proc")
    _check(session, real, syscall)
    if syscall != "mkdir":  # a directory of ours: what is created in it is checked
        _takes_place(session, real, syscall)
    pfd, name = _parent(session, req, real)
    return _act(session, lambda: act_on(pfd, name) or 0, [pfd])


def _mkdir(req, session, dirfd, path_arg, mode):
    umask = umask_of(req)
    return _make(req, session, dirfd, path_arg, "mkdir",
                 lambda p, n: os.mkdir(n, mode & ~umask & 0o7777, dir_fd=p))


def _mknod(req, session, dirfd, path_arg, mode, dev):
    kind = stat.S_IFMT(mode) or stat.S_IFREG
    if kind not in (stat.S_IFREG, stat.S_IFIFO, stat.S_IFSOCK):
        raise OSError(errno.EPERM, "Operation not permitted")  # devices: CAP_MKNOD
    umask = umask_of(req)
    return _make(req, session, dirfd, path_arg, "mknod",
                 lambda p, n: os.mknod(n, kind | (mode & ~umask & 0o7777), dev, dir_fd=p))


def _symlink(req, session, target_arg, dirfd, path_arg):
    target = req.read_path(target_arg)
    return _make(req, session, dirfd, path_arg, "symlink",
                 lambda p, n: os.symlink(target, n, dir_fd=p))


def _old_object(session, real: str, syscall: str) -> None:
    """A link or rename source: a protected object may not get another name."""
    prot = session.protection
    for p in prot.hidden + prot.readonly:
        if is_beneath(real, p):
            raise Denied(errno.EACCES, f"{syscall}: {real} is protected")
    rt = session.runtime
    if rt is not None and rt.denied_paths:
        refusal = rt.path_refusal(real)
        if refusal is not None:
            raise Denied(errno.EACCES, f"{syscall}: {refusal}")


def _link(req, session, odirfd, oarg, ndirfd, narg, flags):
    new = _resolved(req, session, ndirfd, req.read_path(narg), False)
    _check(session, new, "link")
    _takes_place(session, new, "link")
    npfd, nname = _parent(session, req, new)
    fds = [npfd]
    try:
        if flags & AT_EMPTY_PATH and not req.read_path(oarg):
            # The caller's fd itself (an O_TMPFILE file being named): linked through our
            # own /proc link to it, as `linkat(AT_SYMLINK_FOLLOW)` of /proc/self/fd/N does.
            link_text = os.readlink(f"/proc/{req.pid}/fd/{odirfd}")
            src = os.open(f"/proc/{req.pid}/fd/{odirfd}", os.O_PATH | os.O_CLOEXEC)
            fds.append(src)
            if landlock_or_identity(session, src, link_text):
                raise Denied(errno.EACCES, f"link: {link_text} is protected")

            def act():
                os.link(f"/proc/self/fd/{src}", nname, dst_dir_fd=npfd, follow_symlinks=True)
                return 0
            return _confined_call(session, act, fds)  # the source is no directory here
        follow = bool(flags & AT_SYMLINK_FOLLOW)
        old = _resolved(req, session, odirfd, req.read_path(oarg), follow)
        if old.startswith("/proc/"):
            raise Denied(errno.EACCES, f"link: {old}: not linked from /proc")
        _old_object(session, old, "link")
        opfd, oname = _parent(session, req, old)
        fds.append(opfd)

        def act():
            os.link(oname, nname, src_dir_fd=opfd, dst_dir_fd=npfd, follow_symlinks=follow)
            return 0
        return _act(session, act, fds)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def landlock_or_identity(session, fd: int, real: str) -> bool:
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino) in session.protection.identities or \
        session.protection.refusal(real) is not None


def _rename(req, session, odirfd, oarg, ndirfd, narg, flags):
    old = _resolved(req, session, odirfd, req.read_path(oarg), False)
    new = _resolved(req, session, ndirfd, req.read_path(narg), False)
    if old.startswith("/proc/") or new.startswith("/proc/"):
        raise Denied(errno.EACCES, "rename: nothing is renamed in /proc")
    prot = session.protection
    for real in (old, new):
        why = prot.moves(real)
        if why is not None:
            raise Denied(errno.EACCES, f"rename: {why}")
    _old_object(session, old, "rename")
    _check(session, new, "rename")
    if flags & RENAME_EXCHANGE:
        _check(session, old, "rename")
        _old_object(session, new, "rename")
    opfd, oname = _parent(session, req, old)
    try:
        npfd, nname = _parent(session, req, new)
    except BaseException:
        os.close(opfd)
        raise

    def act():
        prot.forget()  # a directory may move: what lies beneath a grant is asked again
        renameat2(oname, nname, flags, opfd, npfd)
        return 0
    return _act(session, act, [opfd, npfd])


def _remove(req, session, dirfd, path_arg, at_flags, syscall):
    """Landlock mode: unlink/rmdir of a protected name is refused."""
    real = _resolved(req, session, dirfd, req.read_path(path_arg), False)
    if real.startswith("/proc/"):
        raise Denied(errno.EACCES, f"{syscall}: nothing is removed in /proc")
    why = session.protection.moves(real)
    if why is not None:
        raise Denied(errno.EACCES, f"{syscall}: {why}")
    _check(session, real, syscall)
    pfd, name = _parent(session, req, real)

    def act():
        if at_flags & AT_REMOVEDIR:
            os.rmdir(name, dir_fd=pfd)
        else:
            os.unlink(name, dir_fd=pfd)
        return 0
    return _act(session, act, [pfd])


def _truncate(req, session, length: int):
    real = _resolved(req, session, AT_FDCWD, req.read_path(0), True)
    if real.startswith("/proc/"):
        raise Denied(errno.EACCES, "truncate: not through /proc")
    _check(session, real, "truncate")
    pfd, name = _parent(session, req, real)
    protection = session.protection

    def act():
        fd = os.open(name, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=pfd)
        try:
            why = protection.protected_object(fd, real)
            if why is not None:
                raise Denied(errno.EACCES, f"truncate: {why}")
            os.ftruncate(fd, length)
        finally:
            os.close(fd)
        return 0
    return _act(session, act, [pfd])


def _open_call(r, s, dirfd_arg, path_arg, flags_arg, mode_arg):
    dirfd = r.arg_int(dirfd_arg) if dirfd_arg is not None else AT_FDCWD
    flags = r.arg_int(flags_arg) if flags_arg is not None else \
        os.O_CREAT | os.O_WRONLY | os.O_TRUNC
    return _open(r, s, dirfd, r.read_path(path_arg), flags, r.args[mode_arg])


HANDLERS = {
    "open": lambda r, s: _open_call(r, s, None, 0, 1, 2),
    "openat": lambda r, s: _open_call(r, s, 0, 1, 2, 3),
    "creat": lambda r, s: _open_call(r, s, None, 0, None, 1),
    "mkdir": lambda r, s: _mkdir(r, s, AT_FDCWD, 0, r.args[1]),
    "mkdirat": lambda r, s: _mkdir(r, s, r.arg_int(0), 1, r.args[2]),
    "mknod": lambda r, s: _mknod(r, s, AT_FDCWD, 0, r.args[1], r.args[2]),
    "mknodat": lambda r, s: _mknod(r, s, r.arg_int(0), 1, r.args[2], r.args[3]),
    "symlink": lambda r, s: _symlink(r, s, 0, AT_FDCWD, 1),
    "symlinkat": lambda r, s: _symlink(r, s, 0, r.arg_int(1), 2),
    "link": lambda r, s: _link(r, s, AT_FDCWD, 0, AT_FDCWD, 1, 0),
    "linkat": lambda r, s: _link(r, s, r.arg_int(0), 1, r.arg_int(2), 3, r.arg_int(4)),
    "rename": lambda r, s: _rename(r, s, AT_FDCWD, 0, AT_FDCWD, 1, 0),
    "renameat": lambda r, s: _rename(r, s, r.arg_int(0), 1, r.arg_int(2), 3, 0),
    "renameat2": lambda r, s: _rename(r, s, r.arg_int(0), 1, r.arg_int(2), 3,
                                      r.args[4] & 0xFFFFFFFF),
    # Landlock mode only (the filter traps them only then):
    "unlink": lambda r, s: _remove(r, s, AT_FDCWD, 0, 0, "unlink"),
    "unlinkat": lambda r, s: _remove(r, s, r.arg_int(0), 1, r.arg_int(2), "unlinkat"),
    "rmdir": lambda r, s: _remove(r, s, AT_FDCWD, 0, AT_REMOVEDIR, "rmdir"),
    "truncate": lambda r, s: _truncate(r, s, r.args[1]),
}
OPEN_CALLS = {"open": 1, "openat": 2, "creat": None}  # name -> flags argument
NAME_CALLS = ("mkdir", "mkdirat", "mknod", "mknodat", "symlink", "symlinkat", "link",
              "linkat", "rename", "renameat", "renameat2")
LANDLOCK_MODE_CALLS = ("unlink", "unlinkat", "rmdir", "truncate")
