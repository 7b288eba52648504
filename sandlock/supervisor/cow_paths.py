"""What the copy-on-write handlers share (supervisor.cow_calls, supervisor.cow_reads):
the path as the child spelled it, its resolution in the sandbox's view, the sandbox's own
rules for a path that leads out of the workdir, max_disk, and writing results back.

Invariant: a path is read from the child once (Request.read_path) and everything after
works on that copy and on what the layer resolved from it.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import struct

from .._kernel import memory
from .._kernel.fileops import AT_EMPTY_PATH, AT_FDCWD, AT_SYMLINK_NOFOLLOW
from .._kernel.syscall import syscall
from ..cow.location import OUTSIDE, Loc
from ..cow.ownfiles import permits
from ..fs_rules import is_beneath
from .paths import Unresolvable, directory_of, resolve
from .request import Denied, Request, thread_group

NR_NEWFSTATAT = 262
NR_STATX = 332
STAT_SIZE = 144
STATX_SIZE = 256


# --- parse -----------------------------------------------------------------------------------

def umask_of(req: Request) -> int:
    try:
        with open(f"/proc/{req.pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    return 0o022


def credentials(req: Request) -> tuple[int, int, set, int] | None:
    """(fsuid, fsgid, groups, effective capabilities) of the calling task, what the
    kernel's permission tests use (the filesystem ids follow the effective ones unless set
    apart); None if unreadable. Read once for the tests of one call (may, owns)."""
    fields = {}
    try:
        with open(f"/proc/{req.pid}/status", "rb") as f:
            for line in f:
                key, _, value = line.partition(b":")
                if key in (b"Uid", b"Gid", b"Groups", b"CapEff"):
                    fields[key] = value.split()
        return (int(fields[b"Uid"][3]), int(fields[b"Gid"][3]),
                {int(g) for g in fields.get(b"Groups", [])}, int(fields[b"CapEff"][0], 16))
    except (OSError, KeyError, IndexError, ValueError):
        return None


CAP_DAC_OVERRIDE, CAP_FOWNER = 1 << 1, 1 << 3


def may(req: Request, st: os.stat_result, want: int, creds=None) -> bool:
    """The kernel's permission test (want: 4 read, 2 write, 1 execute, as in a mode's
    bits) of the sandboxed task on an object the supervisor acts on for it: the workdir's
    own (whose owner the layer's copy would lose), or a file of the layer it reads for the
    kernel. The class the task is in (owner, group, others) decides; with
    CAP_DAC_OVERRIDE (kept by the policy) only execution needs a bit (any). No ACLs."""
    creds = creds or credentials(req)
    if creds is None:
        return False  # gone, or unreadable: refused
    fsuid, fsgid, groups, cap_eff = creds
    if cap_eff & CAP_DAC_OVERRIDE:
        return not want & 1 or bool(st.st_mode & 0o111) or stat.S_ISDIR(st.st_mode)
    return permits(st, fsuid, fsgid, groups, want)


def owns(req: Request, st: os.stat_result, creds=None) -> bool:
    """The task owns the object, or may act as if (CAP_FOWNER): chmod, chown, explicit
    times."""
    creds = creds or credentials(req)
    return creds is not None and (st.st_uid == creds[0] or bool(creds[3] & CAP_FOWNER))


def may_execute(req: Request, st: os.stat_result) -> bool:
    """exec's test on a file of the layer the supervisor reads for the kernel (a `#!`
    script): a regular file the task may execute."""
    return stat.S_ISREG(st.st_mode) and may(req, st, 1)


def spelled(req: Request, dirfd: int, path: bytes, layer=None) -> str:
    """The absolute path as spelled by the child (not resolved). With the workspace's
    layer, a relative path's base (the directory fd or the cwd) that is an untouched
    directory of the workdir is where that directory is now (CowLayer.lower_dir_now)."""
    text = os.fsdecode(path)
    if text.startswith("/"):
        return text
    try:
        base = directory_of(req.pid, dirfd, AT_FDCWD)
    except Unresolvable as e:
        raise Denied(errno.EBADF, str(e)) from None
    removed = base.endswith(" (deleted)")
    if removed:
        base = base[:-len(" (deleted)")]
    if layer is not None:
        base = layer.lower_path_now(base)
        if not removed and text.partition("/")[0] == "..":  # else it goes by its name
            removed = layer.gone(base)
    # A removed directory (the layer's, or the workdir's as the sandbox sees it): nothing
    # can be found or made in it, but `..` still leads to the directory it was removed
    # from, as on a real filesystem (`rmdir ../d`), and on through parents removed with it
    # (`rm -rf ../../d` from d/s).
    while removed:
        first, _, rest = text.partition("/")
        if first != "..":
            raise OSError(errno.ENOENT, "No such file or directory")
        base, text = os.path.dirname(base), rest
        removed = bool(text) and (not os.path.isdir(base) if layer is None
                                  else layer.gone(base))
    return base.rstrip("/") + "/" + text if text else base


def rel_of(session, req: Request, dirfd: int, path: bytes) -> str | None:
    """The path relative to the workdir, or None when it is spelled outside it."""
    if not path:
        return None
    return session.cow.relative(spelled(req, dirfd, path, session.cow))


# --- decide on a path that left the workdir ------------------------------------------------

def _outside_real(req: Request, path: str, follow: bool) -> str:
    """Resolve a path that left the workdir the way the child's kernel would (symlinks and
    `..` component by component, /proc/self as the child's own; supervisor.paths)."""
    tgid = thread_group(req.pid)
    try:
        real = resolve(tgid, req.pid, "/", path, follow_last=follow)
    except Unresolvable as e:
        raise Denied(errno.EACCES, str(e)) from None
    if real is None:
        raise OSError(errno.ENOENT, "No such file or directory")
    if not real.startswith("/"):
        raise Denied(errno.EACCES, f"{path} leads to {real}")
    if real == "/proc" or real.startswith("/proc/"):
        # The supervisor is outside the sandbox's Landlock domain: its view of /proc is not
        # the sandbox's (other processes' entries), so /proc is never reached this way.
        raise Denied(errno.EACCES, f"{path}: /proc is not followed through a symlink in "
                                   f"the workdir")
    return real


def _hidden(session, real: str) -> None:
    """A secret the protection of the user's files hides (reached from the workdir)."""
    prot = session.protection
    if prot is not None and any(is_beneath(real, h) for h in prot.hidden):
        raise Denied(errno.EACCES, f"{real} is a secret (hidden from sandboxes)")


def _outside(session, real: str, write: bool) -> str:
    """`real` (resolved, outside the workdir) if the sandbox's own rules let it be reached:
    the test Landlock applies to the sandbox itself, and the protection of the user's files
    (what the sandbox's mounts or the guard keep: the supervisor acts in its own mount
    namespace, where no cover hides a secret and no read-only bind keeps a startup file)."""
    policy = session.policy
    if any(is_beneath(real, d) for d in policy.fs_denied):
        raise Denied(errno.EACCES, f"{real} is in fs_denied")
    _hidden(session, real)
    prot = session.protection
    if write and prot is not None:
        why = prot.refusal(real)
        if why is not None:
            raise Denied(errno.EACCES, why)
    grants = policy.fs_writable if write else policy.fs_writable + policy.fs_readable
    if not any(is_beneath(real, g) for g in grants):
        raise Denied(errno.EACCES, f"{real} (reached through a symlink in the workdir) is "
                                   f"not {'writable' if write else 'readable'} by the policy")
    return real


def lookup_follows(rel: str, follow: bool) -> bool:
    """Whether a lookup (stat, open, chdir, exec, chmod...) follows the last component: a
    trailing '/' makes the kernel follow a symlink there even under AT_SYMLINK_NOFOLLOW or
    O_NOFOLLOW ("link/" is the directory it names). Not for unlink, rmdir, rename: there a
    trailing '/' on a symlink is ENOTDIR (CowLayer.resolve)."""
    return follow or rel.endswith("/")


def located(session, req: Request, rel: str, follow: bool, write: bool,
            inspect: bool = False) -> Loc:
    """Resolve in the sandbox's view. A path that leaves the workdir is resolved further as
    the child's kernel would; if it comes back into the workdir it is resolved in the layer
    again; otherwise it must pass the sandbox's rules, except for `inspect` calls (stat,
    access, readlink, getxattr), which Landlock does not govern either."""
    layer = session.cow
    for _ in range(8):
        loc = layer.resolve(rel, follow_last=follow)
        if loc.kind != OUTSIDE:
            return loc
        real = _outside_real(req, loc.real, follow)
        back = layer.relative(real)
        if back is None:
            if inspect:  # Landlock does not govern looks; a secret's cover does (mounts)
                _hidden(session, real)
                return Loc(OUTSIDE, real)
            return Loc(OUTSIDE, _outside(session, real, write))
        rel = back
    raise OSError(errno.ELOOP, "Too many levels of symbolic links")


def quota(session) -> None:
    """max_disk, checked whenever something in the layer is created or opened for writing
    (a measurement of the upper tree each time: the layer's writes go through fds the
    supervisor cannot count). What an open fd writes past the limit is caught at the next
    check and at the end of the run, where an oversized layer is never committed."""
    limit = session.cow_max_disk
    if limit is None:
        return
    if session.cow.usage() >= limit:
        raise Denied(errno.ENOSPC, f"the workspace's upper layer reached max_disk "
                                   f"({limit} bytes)")


# --- act: results written into the child -----------------------------------------------------

def write_child(req: Request, session, addr: int, data: bytes) -> None:
    if addr == 0:
        raise Denied(errno.EFAULT, "NULL buffer")
    with session.memory_lock:  # never while a freeze inspects the sandbox's memory
        try:
            memory.write_memory(req.pid, addr, data)
        except OSError:
            raise Denied(errno.EFAULT, "result buffer not writable") from None


def raw_stat(real: str, size: int, statx_args=None) -> bytes:
    """The kernel's stat answer (struct stat, or struct statx with statx_args = (flags,
    mask)) for the path `real`, its last symlink not followed."""
    return _raw_stat(AT_FDCWD, os.fsencode(real), AT_SYMLINK_NOFOLLOW, size, statx_args)


def raw_stat_fd(fd: int, size: int, statx_args=None) -> bytes:
    """The same for the inode open at `fd`."""
    return _raw_stat(fd, b"", AT_EMPTY_PATH, size, statx_args)


def _raw_stat(dirfd: int, path: bytes, at_flags: int, size: int, statx_args) -> bytes:
    buf = ctypes.create_string_buffer(size)
    if statx_args is None:
        syscall(NR_NEWFSTATAT, dirfd, path, buf, at_flags)
    else:
        flags, mask = statx_args  # the caller's sync flags kept
        flags = flags & ~(AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) | at_flags
        syscall(NR_STATX, dirfd, path, flags, ctypes.c_uint(mask), buf)
    return buf.raw


def with_identity(raw: bytes, identity: tuple[int, int], statx: bool) -> bytes:
    """A stat answer (struct stat, or struct statx) with (st_dev, st_ino) replaced."""
    dev, ino = identity
    out = bytearray(raw)
    if statx:  # stx_ino at 32, stx_dev_major/minor at 136/140
        struct.pack_into("=Q", out, 32, ino)
        struct.pack_into("=II", out, 136, os.major(dev), os.minor(dev))
    else:  # st_dev, st_ino first (x86-64 and the generic layout alike)
        struct.pack_into("=QQ", out, 0, dev, ino)
    return bytes(out)


def runtime_path_check(session, loc: Loc) -> None:
    """A policy_fn's deny_path, on the path as the sandbox sees it (resolved above from the
    one copy of the argument, so there is nothing to freeze)."""
    rt = session.runtime
    if rt is None or not rt.denied_paths:
        return
    path = loc.real if loc.kind == OUTSIDE else (
        os.path.join(session.cow.lower, loc.rel) if loc.rel else session.cow.lower)
    refusal = rt.path_refusal(path)
    if refusal is not None:
        raise Denied(errno.EACCES, refusal)


