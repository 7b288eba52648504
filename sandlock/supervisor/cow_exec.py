"""exec, execveat and chdir of a sandbox with a copy-on-write workdir (seccomp backend),
and what an O_PATH open shares with them (supervisor.cow_calls).

They cannot be performed on another process's behalf. When the kernel, resolving the
path the sandbox spelled, reaches exactly the object the sandbox sees, the call continues
in the kernel; otherwise it is re-issued (supervisor.reissue) with the real path of that
object: a file or directory of the layer (which Landlock lets this sandbox read and
execute), the workdir's own (renamed in the layer), or one outside the workdir reached
through a symlink created in the layer. A re-issued call names its object directly, so
the second pass continues. Rewriting a path argument is sound here because the kernel
still decides the outcome: Landlock judges the object finally reached, and the layer's
storage is readable and executable for this sandbox only.
"""

from __future__ import annotations

import errno
import os
import stat

from .._kernel.fileops import AT_EMPTY_PATH, AT_FDCWD, AT_SYMLINK_NOFOLLOW, open_no_symlinks
from ..cow.location import LOWER, MISSING, OUTSIDE, UPPER
from ..fs_rules import is_beneath
from .cow_paths import lookup_follows, may_execute, spelled
from .network import CONTINUE

_REGISTERS = ("rdi", "rsi", "rdx", "r10", "r8", "r9")


def _object(session, req, dirfd, path: bytes, follow: bool) -> tuple[bool, str | None]:
    """(the kernel reaches it as spelled, the real path of what the sandbox sees there);
    (True, None) for paths spelled outside the workdir and its layer."""
    layer = session.cow
    text = spelled(req, dirfd, path, layer)
    rel = layer.relative(text)
    if rel is None:
        return True, None
    own_upper = text == layer.upper or text.startswith(layer.upper + "/")
    with layer.lock:
        loc = layer.resolve(rel, follow_last=lookup_follows(rel, follow))
        if loc.kind == MISSING:
            raise OSError(errno.ENOENT, "No such file or directory")
        if loc.kind == OUTSIDE:
            return False, loc.real
        target = loc.upper if loc.kind == UPPER else loc.real
        if loc.kind == UPPER and stat.S_ISDIR(os.lstat(loc.upper).st_mode):
            layer._materialize(loc.upper)  # what the kernel lists there is the sandbox's view
        if own_upper:
            return os.path.normpath(text) == target and loc.kind == UPPER, target
        lower = os.path.join(layer.lower, loc.rel) if loc.rel else layer.lower
        normal = os.path.normpath(rel) if rel else ""
        normal = "" if normal == "." else normal
        same = (loc.kind == LOWER and loc.real == lower and normal == loc.rel
                and spelled(req, dirfd, path) == text
                and (not os.path.isdir(lower) or layer.lower_dir_now(loc.rel) == loc.rel))
        return same, target


def _in_upper(layer, path: str) -> bool:
    return path.startswith(layer.upper + "/")


def _kernel_path(layer, target: str) -> bytes:
    """How a re-issued exec, chdir or O_PATH open names `target` so that its second pass
    continues: the layer's files and outside ones by their real path; an object of the
    workdir itself (reached through a directory renamed in the layer) through
    /proc/self/root, a spelling the layer leaves to the kernel (its real path would be looked up again in the sandbox's
    view, where that name no longer exists)."""
    if is_beneath(target, layer.lower):
        return os.fsencode("/proc/self/root" + target)
    return os.fsencode(target)


def _shebang(path: str) -> tuple[bytes, list[bytes]] | None:
    """(interpreter, its optional argument) of a `#!` script of the layer, as binfmt_script
    reads them; None for anything else. Opened with no symlink on the way, the last one
    included: a symlink of the layer (exec with AT_SYMLINK_NOFOLLOW, or one swapped in) is
    never followed out of the layer with the supervisor's rights."""
    try:
        fd = open_no_symlinks(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
                              | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        head = os.read(fd, 256)
    finally:
        os.close(fd)
    if not head.startswith(b"#!"):
        return None
    line = head[2:].split(b"\n", 1)[0].strip(b" \t")
    interp, _, arg = line.partition(b" ")
    if not interp:
        return None
    arg = arg.strip(b" \t")
    return interp, ([arg] if arg else [])


def execve_check(req, session, dirfd, path_arg, argv_arg, at_flags):
    """None to go on (the kernel reaches what the sandbox sees), else a Reissue."""
    from .execve import read_argv
    from .reissue import Reissue
    path = req.read_path(path_arg)
    if not path and at_flags & AT_EMPTY_PATH:
        return None
    same, target = _object(session, req, dirfd, path, not at_flags & AT_SYMLINK_NOFOLLOW)
    if target is None or (same and not _in_upper(session.cow, target)):
        return None
    if os.path.isdir(target):
        if same:
            return None  # the kernel's EACCES
        raise OSError(errno.EACCES, "Permission denied")
    # Only the layer's own files are read here: anything else (outside the workdir, or the
    # workdir's own) the kernel opens itself, as the sandbox, under Landlock, `#!` line
    # included (read with the supervisor's rights, a file the policy refuses would leak
    # its first line and have its interpreter run).
    script = _shebang(target) if _in_upper(session.cow, target) else None
    if script is not None and not may_execute(req, os.stat(target, follow_symlinks=False)):
        raise OSError(errno.EACCES, "Permission denied")  # read here, run by the kernel
    if script is None:
        return None if same else Reissue({_REGISTERS[path_arg]: _kernel_path(session.cow,
                                                                             target)},
                                         f"execute {os.fsdecode(path)} from the workspace")
    # A script of the layer: even named directly (a working directory in the layer), its
    # interpreter may be the layer's too, which the kernel would look for in the workdir.
    argv = [os.fsencode(a) for a in read_argv(req, req.args[argv_arg])]
    program, new_argv = _interpreted(session, req, path, script, argv)
    if same and program == script[0]:
        return None  # the interpreter is reached as spelled: the kernel does it all
    return Reissue({_REGISTERS[path_arg]: program, _REGISTERS[argv_arg]: new_argv},
                   f"execute {os.fsdecode(path)} from the workspace")


def _interpreted(session, req, path: bytes, script, argv: list[bytes]):
    """(what to execute, its argv) for the script the sandbox spelled `path`, as
    binfmt_script builds them: [interpreter, (argument), path, argv[1:]], the path as the
    sandbox spelled it (the interpreter opens it through the layer). An interpreter spelled
    inside the workdir is resolved here too, through the layer (a venv's bin/pip names the
    venv's python), and so is one that is a script in turn: the call is re-issued once,
    naming the real object, never twice (a second re-issue would write over the first's
    argv). argv[0] stays the interpreter as written (a venv's python finds its pyvenv.cfg
    by it)."""
    from .execve import MAX_INTERPRETERS
    for _ in range(MAX_INTERPRETERS):
        interp, extra = script
        argv = [interp, *extra, path, *argv[1:]]
        same, target = _object(session, req, AT_FDCWD, interp, True)
        if same or target is None:
            return interp, argv  # the kernel reaches it as spelled (and runs what follows)
        if os.path.isdir(target):
            raise OSError(errno.EACCES, "Permission denied")
        script = _shebang(target) if _in_upper(session.cow, target) else None
        if script is None:  # a program, or a file the kernel reads itself (see above)
            return _kernel_path(session.cow, target), argv
        if not may_execute(req, os.stat(target, follow_symlinks=False)):
            raise OSError(errno.EACCES, "Permission denied")
        path = interp
    raise OSError(errno.ELOOP, "Too many levels of symbolic links")


def chdir(req, session):
    from .reissue import Reissue
    path = req.read_path(0)
    same, target = _object(session, req, AT_FDCWD, path, True)
    if same or target is None:
        return CONTINUE
    if not os.path.isdir(target):
        raise OSError(errno.ENOTDIR, "Not a directory")
    return Reissue({"rdi": _kernel_path(session.cow, target)}, f"chdir to {os.fsdecode(path)}")
