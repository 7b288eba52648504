"""Validating a copy-on-write workdir, and choosing its backend.

Two backends keep the workdir untouched until the run's outcome decides:
- "overlay": kernel overlayfs mounted over the workdir, with the run's layer as its upper
  directory, in a mount namespace of the sandbox's own (and a user namespace unless it
  starts as root), made by the exec trampoline before it confines the program. Every call
  is native: exec, mmap, chdir, getdents, locks. Landlock grants writes beneath the
  overlay's root (a rule the trampoline adds to a ruleset made for that run); the writes
  reach the upper layer.
- "seccomp": the supervisor serves the workdir's path calls in a private tree
  (sandlock.cow.layer, supervisor.cow_calls); Landlock keeps the workdir read-only.

"auto" (the default) takes overlay where it is possible and says once why it is not.

Rules enforced here:
- The overlay backend is used only if nothing else exposes the workdir: a Landlock grant
  attaches to the directory itself, so another mount of the same filesystem that reaches
  it (a bind mount) would let writes bypass the overlay. Such a mount is named.
- A workdir inside a writable grant is accepted (upstream's `fs_writable=["."],
  workdir="."`): its subtree goes to the layer. With the seccomp backend the writable
  grant is expanded around it (fs_rules), so Landlock keeps the workdir read-only.
- Nothing is half-applied: an explicit backend that cannot be used is a PolicyError with
  its reason; max_disk needs the seccomp backend (the overlay's upper layer grows
  natively, with nothing to stop it at the cap).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .errors import PolicyError
from .fs_rules import is_beneath

BACKENDS = ("auto", "overlay", "seccomp")


@dataclass(frozen=True)
class Workspace:
    workdir: str                     # the real directory (lower), only read during the run
    storage: str                     # where the run's upper layer is created
    max_disk: int | None             # bytes the upper layer may hold
    backend: str = "seccomp"         # "overlay" or "seccomp"
    notice: str | None = None        # why "auto" did not take the overlay backend
    spelled: str | None = None       # the workdir as the policy named it (absolute)


_probed: dict[tuple, str | None] = {}


def _exposing_mount(workdir: str) -> str | None:
    """Another mount point through which the workdir's directory (or something beneath
    it) is reachable, or None (home_policy.exposures: from /proc/self/mountinfo)."""
    from .home_policy import exposures
    found = exposures(workdir)
    return found[0][0] if found else None


def overlay_refusal(workdir: str, storage: str, max_disk) -> str | None:
    """Why the overlay backend cannot serve this workdir here, or None."""
    if max_disk is not None:
        return "max_disk is enforced by the seccomp backend only"
    for what, path in (("workdir", workdir), ("fs_storage", storage)):
        if any(c in path for c in ",:\\\n"):
            return f"the {what} path {path!r} contains ',', ':', '\\\\' or a newline"
    other = _exposing_mount(workdir)
    if other is not None:
        return (f"the workdir is also reachable through the mount point {other} (writes "
                f"there would bypass the overlay)")
    key = (os.stat(workdir).st_dev, os.stat(storage).st_dev, os.getuid())
    if key not in _probed:
        _probed[key] = _probe(workdir, storage)
    return _probed[key]


def _probe(workdir: str, storage: str) -> str | None:
    """Mount the overlay once, in a throw-away namespace (the trampoline's probe mode)."""
    import shutil
    import subprocess
    import tempfile
    from . import libexec
    from .launch import STEPS
    helper = libexec.path("sandlock-exec")
    if not os.access(helper, os.X_OK):
        return f"the sandlock-exec helper is missing ({helper})"
    tmp = tempfile.mkdtemp(prefix=".probe-", dir=storage)
    try:
        os.mkdir(os.path.join(tmp, "upper"))
        os.mkdir(os.path.join(tmp, "work"))
        r = subprocess.run([helper, "--probe-overlay", workdir, os.path.join(tmp, "upper"),
                            os.path.join(tmp, "work")], capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as e:
        return f"the overlay probe could not run ({e})"
    finally:
        for dirpath, dirnames, _ in os.walk(tmp):
            for d in dirnames:
                try:
                    os.chmod(os.path.join(dirpath, d), 0o700)
                except OSError:
                    pass
        shutil.rmtree(tmp, ignore_errors=True)
    if r.returncode == 0:
        return None
    try:
        step, err = (int(x) for x in r.stderr.split()[:2])
        return f"{STEPS[step]} failed: {os.strerror(err)}"
    except (ValueError, IndexError):
        return f"the overlay probe failed ({r.stderr.decode(errors='replace').strip()})"


def parse_workspace(fields: dict, readable, writable, denied):
    """The copy-on-write workdir: (Workspace | None, readable, writable, denied,
    write_excluded). `write_excluded` are paths a writable grant must not cover (fs_rules
    expands the grant around them)."""
    from .cow import default_storage
    from .policy import WORKSPACE_FIELDS, parse_size
    workdir = fields.get("workdir")
    backend = fields.get("workspace_backend") or "auto"
    if workdir is None:
        for key in WORKSPACE_FIELDS[1:]:
            if fields.get(key) is not None:
                raise PolicyError(f"{key}: set without a workdir")
        return None, readable, writable, denied, ()
    if backend not in BACKENDS:
        raise PolicyError(f"workspace_backend: expected one of {', '.join(BACKENDS)}, got "
                          f"{backend!r}")
    wd = os.path.realpath(os.fsdecode(workdir))
    if not os.path.isdir(wd):
        raise PolicyError(f"workdir: {workdir} is not a directory")
    if wd == "/":
        raise PolicyError("workdir: / cannot be a copy-on-write workdir")
    for w in writable:
        if is_beneath(w, wd) and w != wd:
            raise PolicyError(f"fs_writable {w} is inside the workdir {wd}: the workdir is "
                              f"already writable through its copy-on-write layer")
    for d in denied:
        if is_beneath(d, wd):
            raise PolicyError(f"fs_denied {d} is inside the workdir {wd}: not supported with "
                              f"a copy-on-write workdir; deny the workdir's parent instead")
    max_disk = parse_size(fields.get("max_disk"), "max_disk")
    storage = os.path.realpath(os.fsdecode(fields.get("fs_storage") or default_storage()))
    if is_beneath(storage, wd) or is_beneath(wd, storage):
        raise PolicyError(f"fs_storage {storage} and workdir {wd} must not contain each other")
    if os.path.exists(storage) and not os.path.isdir(storage):
        raise PolicyError(f"fs_storage: {storage} is not a directory")
    try:
        os.makedirs(storage, mode=0o700, exist_ok=True)
    except OSError as e:
        raise PolicyError(f"fs_storage: cannot create {storage}: {e.strerror}") from None
    notice = None
    if backend != "seccomp":
        refusal = overlay_refusal(wd, storage, max_disk)
        if refusal is not None and backend == "overlay":
            raise PolicyError(f"workspace_backend='overlay': {refusal}")
        if refusal is not None:
            notice = f"copy-on-write workspace: the seccomp backend is used ({refusal})"
        backend = "seccomp" if refusal is not None else "overlay"
    if os.stat(storage).st_dev != os.stat(wd).st_dev:
        apart = (f"copy-on-write workspace: the layer's storage {storage} is on another "
                 f"filesystem than the workdir, so what the run makes or changes reports "
                 f"another device (find -xdev and du -x stop there; " + (
                     "git stops at a 'filesystem boundary' above a directory the run "
                     "changed" if backend == "seccomp" else
                     "renaming a file over another name of itself fails with ESTALE") +
                 "); fs_storage (or SANDLOCK_COW_DIR) on the workdir's filesystem avoids it")
        notice = apart if notice is None else f"{notice}; {apart}"
    # The workdir itself is a grant minus the storage: writable through the overlay, or
    # readable (execve and chdir continue in the kernel) beside the seccomp layer. The
    # layer's storage is never reachable from the sandbox.
    write_excluded: tuple = ()
    writable = tuple(w for w in writable if w != wd)
    if backend == "overlay":
        # The trampoline grants writes beneath its overlay mount (a rule on the workdir
        # itself would not reach it: Landlock skips mount points).
        if wd not in readable:
            readable += (wd,)
    else:
        if any(is_beneath(wd, w) for w in writable):
            write_excluded = (wd,)
        if wd not in readable:
            readable += (wd,)
    if any(is_beneath(storage, g) for g in readable + writable) and storage not in denied:
        denied += (storage,)
    spelled = os.path.normpath(os.path.abspath(os.fsdecode(workdir)))
    return (Workspace(wd, storage, max_disk, backend, notice, spelled), readable, writable,
            denied, write_excluded)
