"""chmod / chown / utime / xattr: Landlock does not cover them; the supervisor allows them
only under fs_writable, and acts on the inode it checked (no TOCTOU)."""

import json
import os

import pytest

from conftest import run_py, sandbox

META = """
import json, os, sys
target, fd_target = sys.argv[1], sys.argv[2]
res = {}
def attempt(name, fn):
    try:
        fn(); res[name] = "ok"
    except OSError as e:
        res[name] = e.errno
uid, gid = os.getuid(), os.getgid()
attempt("chmod", lambda: os.chmod(target, 0o777))
attempt("chown", lambda: os.chown(target, uid, gid))
attempt("lchown", lambda: os.lchown(target, uid, gid))
attempt("utime", lambda: os.utime(target, (1, 1)))
attempt("utime_now", lambda: os.utime(target))
attempt("setxattr", lambda: os.setxattr(target, "user.sandlock", b"x"))
attempt("removexattr", lambda: os.removexattr(target, "user.keep"))
def by_fd(fn):
    fd = os.open(fd_target, os.O_RDONLY)
    try:
        fn(fd)
    finally:
        os.close(fd)
def by_opath(fn):
    fd = os.open(fd_target, os.O_PATH)
    try:
        fn(fd)
    finally:
        os.close(fd)
if fd_target != "-":
    attempt("fchmod", lambda: by_fd(lambda fd: os.fchmod(fd, 0o777)))
    attempt("fchown", lambda: by_fd(lambda fd: os.fchown(fd, uid, gid)))
    attempt("futimens", lambda: by_fd(lambda fd: os.utime(fd, (2, 2))))
    attempt("fsetxattr", lambda: by_fd(lambda fd: os.setxattr(fd, "user.fd", b"y")))
    attempt("fchmodat_dirfd", lambda: os.chmod(os.path.basename(fd_target), 0o707,
            dir_fd=os.open(os.path.dirname(fd_target), os.O_PATH)))
print(json.dumps(res))
"""


def snapshot(path):
    st = os.stat(path, follow_symlinks=False)
    return (st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns, st.st_atime_ns,
            sorted((k, os.getxattr(path, k)) for k in os.listxattr(path)))


@pytest.fixture
def files(tmp_path):
    hidden = tmp_path / "hidden"       # not readable by the sandbox at all
    ro = tmp_path / "ro"               # readable, not writable
    rw = tmp_path / "rw"               # writable
    for d in (hidden, ro, rw):
        d.mkdir()
        os.chmod(d, 0o777)
    out = {}
    for d in (hidden, ro, rw):
        f = d / "f"
        f.write_text("data")
        os.chmod(f, 0o644)
        os.setxattr(f, "user.keep", b"1")
        os.utime(f, (1000, 1000))
        out[d.name] = f
    os.chmod(tmp_path, 0o777)
    return out


def test_metadata_changes_outside_writable_fail_and_change_nothing(files):
    sb = sandbox(fs_readable=[files["ro"].parent], fs_writable=[files["rw"].parent])
    for target, fd_target in ((files["hidden"], "-"), (files["ro"], files["ro"])):
        before = snapshot(target)
        r = run_py(sb, META, str(target), str(fd_target))
        res = json.loads(r.stdout)
        assert set(res.values()) == {1}, res  # every call: EPERM
        assert snapshot(target) == before


def test_metadata_changes_inside_writable_work(files):
    sb = sandbox(fs_writable=[files["rw"].parent])
    target = files["rw"]
    r = run_py(sb, META, str(target), str(target))
    res = json.loads(r.stdout)
    assert set(res.values()) == {"ok"}, res
    st = os.stat(target)
    assert st.st_mode & 0o777 == 0o707  # the last chmod (through a dirfd) took effect
    assert os.getxattr(target, "user.sandlock") == b"x"
    assert os.getxattr(target, "user.fd") == b"y"
    assert "user.keep" not in os.listxattr(target)
    assert st.st_mtime == 2


def test_symlink_inside_writable_to_outside_target(files):
    link = files["rw"].parent / "link"
    os.symlink(files["hidden"], link)
    before = snapshot(files["hidden"])
    sb = sandbox(fs_writable=[files["rw"].parent])
    code = """
import os, sys, json
res = {}
for name, fn in [("chmod_follows", lambda: os.chmod(sys.argv[1], 0o777)),
                 ("lchown_link_itself", lambda: os.lchown(sys.argv[1], os.getuid(), os.getgid())),
                 ("utime_nofollow", lambda: os.utime(sys.argv[1], (5, 5), follow_symlinks=False))]:
    try:
        fn(); res[name] = "ok"
    except OSError as e:
        res[name] = e.errno
print(json.dumps(res))
"""
    res = json.loads(run_py(sb, code, str(link)).stdout)
    assert res == {"chmod_follows": 1, "lchown_link_itself": "ok", "utime_nofollow": "ok"}
    assert snapshot(files["hidden"]) == before
    assert os.lstat(link).st_mtime == 5


def test_racing_path_rewrite_cannot_redirect_chmod(files):
    """A thread flips a path buffer between an allowed and a forbidden target while the
    main thread calls chmod on it: the forbidden file's mode never changes."""
    allowed, forbidden = files["rw"], files["hidden"]
    before = snapshot(forbidden)
    sb = sandbox(fs_writable=[allowed.parent])
    code = """
import ctypes, sys, threading
libc = ctypes.CDLL(None, use_errno=True)
a, b = sys.argv[1].encode(), sys.argv[2].encode()
size = max(len(a), len(b)) + 1
buf = ctypes.create_string_buffer(a, size)
stop = False
def flip():
    while not stop:
        ctypes.memmove(buf, b + b"\\0", len(b) + 1)
        ctypes.memmove(buf, a + b"\\0", len(a) + 1)
t = threading.Thread(target=flip); t.start()
ok = 0
for i in range(2000):
    if libc.chmod(buf, 0o600) == 0:
        ok += 1
stop = True; t.join()
print(ok)
"""
    r = run_py(sb, code, str(allowed), str(forbidden), timeout=120)
    assert r.success, r.stderr
    assert int(r.stdout) > 0  # the allowed target was changed at least sometimes
    assert snapshot(forbidden) == before
    assert os.stat(allowed).st_mode & 0o777 == 0o600


def test_device_node_metadata_never_changes(tmp_path):
    before = os.stat("/dev/null")
    sb = sandbox(fs_writable=["/dev/null"])
    r = sb.run(["chmod", "666", "/dev/null"])
    assert r.exit_code != 0 and b"Operation not permitted" in r.stderr
    after = os.stat("/dev/null")
    assert (after.st_mode, after.st_ctime_ns) == (before.st_mode, before.st_ctime_ns)
    assert sb.run(["sh", "-c", "echo x > /dev/null"]).success  # writing it still works
