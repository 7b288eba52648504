"""No file is ever created with setuid/setgid bits from a sandbox, by any creating call,
for any uid, with or without the supervisor in the path (review finding 3).

Each attack creates a file in a writable directory with S_ISUID or S_ISGID in the mode
register; the call must fail with EPERM and leave nothing behind. The same calls without
those bits succeed (positive control). Run as root, the sandbox is uid 0 without
capabilities, in the file's group: the kernel alone would keep S_ISGID.
"""

from __future__ import annotations

import json
import os
import stat
import struct

import pytest

from conftest import run_py, sandbox
from sandlock import BranchAction

# Each attempt prints [name, errno or 0, mode of what exists afterwards or null].
ATTEMPTS = r"""
import ctypes, json, os, stat, sys
d = sys.argv[1]
libc = ctypes.CDLL(None, use_errno=True)
out = []
def attempt(name, fn, path):
    try:
        fn()
        err = 0
    except OSError as e:
        err = e.errno
    try:
        mode = os.lstat(path).st_mode
        if name == "tmpfile":
            mode = int(open(path).read(), 8)
    except FileNotFoundError:
        mode = None
    out.append([name, err, mode])
def creat(path, mode):
    if libc.creat(path.encode(), mode) < 0:
        e = ctypes.get_errno(); raise OSError(e, os.strerror(e))
def tmpfile(mode):  # an unnamed file: its mode is what the fd reports
    fd = os.open(d, os.O_TMPFILE | os.O_WRONLY, mode)
    open(os.path.join(d, "tmpfile"), "w").write(oct(os.fstat(fd).st_mode))
bits = int(sys.argv[2], 8)
p = lambda n: os.path.join(d, n)
attempt("open", lambda: os.close(os.open(p("open"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o745 | bits)), p("open"))
dfd = os.open(d, os.O_DIRECTORY)
attempt("openat", lambda: os.close(os.open("openat", os.O_CREAT | os.O_WRONLY, 0o755 | bits, dir_fd=dfd)), p("openat"))
attempt("creat", lambda: creat(p("creat"), 0o755 | bits), p("creat"))
attempt("mknod", lambda: os.mknod(p("mknod"), stat.S_IFREG | 0o755 | bits), p("mknod"))
attempt("mknodat", lambda: os.mknod("mknodat", stat.S_IFREG | 0o755 | bits, dir_fd=dfd), p("mknodat"))
attempt("mkdir", lambda: os.mkdir(p("mkdir"), 0o755 | bits), p("mkdir"))
attempt("tmpfile", lambda: tmpfile(0o755 | bits), p("tmpfile"))
print(json.dumps(out))
"""

CONFIGS = ["plain", "policy_fn", "workspace"]


def _run(tmp_path, config, bits):
    work = tmp_path / f"w-{config}-{bits}"
    work.mkdir()
    os.chmod(tmp_path, 0o777)
    os.chmod(work, 0o777)
    if config == "workspace":
        sb = sandbox(workdir=str(work), on_exit=BranchAction.COMMIT,
                     workspace_backend="seccomp")
    elif config == "policy_fn":
        sb = sandbox(fs_writable=[str(work)], policy_fn=lambda e, c: None,
                     policy_fn_events=["file"])
    else:
        sb = sandbox(fs_writable=[str(work)])
    r = run_py(sb, ATTEMPTS, str(work), oct(bits))
    assert r.success, r.stderr
    return work, {name: (err, mode) for name, err, mode in json.loads(r.stdout)}, r


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("bits", [0o4000, 0o2000, 0o6000])
def test_setid_bits_are_refused_at_creation(tmp_path, config, bits):
    work, seen, r = _run(tmp_path, config, bits)
    for name, (err, mode) in seen.items():
        assert err == 1, (name, seen)           # EPERM
        assert mode is None, (name, oct(mode))  # nothing was created
    # Nothing with a set-id bit reached the real directory either (after a commit).
    for entry in work.rglob("*"):
        assert not entry.lstat().st_mode & 0o6000, entry
    if config != "workspace":  # the supervisor records what it refused in its path
        return
    assert any("setuid/setgid" in d["reason"] for d in r.denials), r.denials


@pytest.mark.parametrize("config", CONFIGS)
def test_creation_without_setid_bits_works(tmp_path, config):
    work, seen, _ = _run(tmp_path, config, 0)
    for name, (err, mode) in seen.items():
        assert err == 0, (name, seen)
        assert mode is not None and not mode & 0o6000, (name, mode)
    # committed (workspace) or written directly: the files are really there
    assert (work / "open").exists() and (work / "mkdir").is_dir()


def _acl(group_perm: int) -> bytes:
    entry = struct.Struct("<HHI")
    return (struct.pack("<I", 2) + entry.pack(1, 7, 0xFFFFFFFF)
            + entry.pack(4, group_perm, 0xFFFFFFFF) + entry.pack(0x20, group_perm, 0xFFFFFFFF))


SET_ACL = r"""
import os, sys
try:
    os.setxattr(sys.argv[1], "system.posix_acl_access", bytes.fromhex(sys.argv[2]))
    print(0)
except OSError as e:
    print(e.errno)
"""


def test_access_acl_never_on_setid_files(tmp_path):
    """A set-id file that already exists (made outside) cannot gain exec bits for others
    through an access ACL; an ordinary file's ACL still changes (positive control)."""
    work = tmp_path / "w"
    work.mkdir()
    setgid, plain = work / "setgid-tool", work / "plain"
    for f in (setgid, plain):
        f.write_bytes(b"#!/bin/sh\nid\n")
    os.chmod(setgid, 0o2740)
    os.chmod(plain, 0o740)
    for p in (tmp_path, work):
        os.chmod(p, 0o777)
    os.chown(setgid, os.getuid(), os.getgid())
    sb = sandbox(fs_writable=[str(work)])
    acl = _acl(5).hex()
    r = run_py(sb, SET_ACL, str(setgid), acl)
    assert r.stdout.strip() == b"1", r
    assert stat.S_IMODE(setgid.stat().st_mode) == 0o2740  # unchanged
    r = run_py(sb, SET_ACL, str(plain), acl)
    assert r.stdout.strip() == b"0", r
    assert stat.S_IMODE(plain.stat().st_mode) == 0o755
