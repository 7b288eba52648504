"""Filesystem confinement: Landlock grants, and fs_denied carved out of granted trees."""

import json
import os

from conftest import run_py, sandbox

READ = """
import json, sys
out = {}
for p in sys.argv[1:]:
    try:
        with open(p) as f:
            out[p] = ["ok", f.read()]
    except OSError as e:
        out[p] = ["err", e.errno]
print(json.dumps(out))
"""


def read_in(sb, *paths):
    r = run_py(sb, READ, *map(str, paths))
    assert r.success, r.stderr
    return json.loads(r.stdout)


def test_read_outside_grants_is_refused_and_returns_nothing(secret_tree):
    sb = sandbox(fs_readable=[secret_tree / "pub"])
    res = read_in(sb, secret_tree / "pub/hello.txt", secret_tree / "secret/key")
    assert res[str(secret_tree / "pub/hello.txt")] == ["ok", "hello\n"]  # positive control
    assert res[str(secret_tree / "secret/key")] == ["err", 13]  # EACCES, no content
    r = sb.run(["cat", str(secret_tree / "secret/key")])
    assert r.exit_code != 0 and r.stdout == b"" and b"Permission denied" in r.stderr


def test_write_outside_writable_leaves_target_untouched(secret_tree):
    sb = sandbox(fs_readable=[secret_tree], fs_writable=[secret_tree / "work"])
    code = """
import os, sys, json
res = {}
for path, mode in [(sys.argv[1], "w"), (sys.argv[2], "w"), (sys.argv[3], "w")]:
    try:
        with open(path, mode) as f:
            f.write("PWNED")
        res[path] = "ok"
    except OSError as e:
        res[path] = e.errno
try:
    os.truncate(sys.argv[1], 0); res["truncate"] = "ok"
except OSError as e:
    res["truncate"] = e.errno
try:
    os.unlink(sys.argv[1]); res["unlink"] = "ok"
except OSError as e:
    res["unlink"] = e.errno
print(json.dumps(res))
"""
    pub, new, inside = (secret_tree / "pub/hello.txt", secret_tree / "pub/new.txt",
                        secret_tree / "work/out.txt")
    r = run_py(sb, code, str(pub), str(new), str(inside))
    res = json.loads(r.stdout)
    assert res[str(pub)] == 13 and res[str(new)] == 13
    assert res["truncate"] == 13 and res["unlink"] == 13
    assert pub.read_text() == "hello\n" and not new.exists()
    assert res[str(inside)] == "ok" and inside.read_text() == "PWNED"  # positive control


def test_symlink_hardlink_rename_and_proc_root_routes_fail(secret_tree):
    work = secret_tree / "work"
    os.symlink(secret_tree / "secret/key", secret_tree / "pub/link-to-key")
    sb = sandbox(fs_readable=[secret_tree / "pub"], fs_writable=[work])
    code = """
import os, sys, json
secret, work, prelink = sys.argv[1], sys.argv[2], sys.argv[3]
res = {}
def attempt(name, fn):
    try:
        v = fn(); res[name] = ["ok", v]
    except OSError as e:
        res[name] = ["err", e.errno]
def read(p):
    with open(p) as f:
        return f.read()
os.symlink(secret, work + "/sym")
attempt("symlink_made_inside", lambda: read(work + "/sym"))
attempt("symlink_preexisting", lambda: read(prelink))
attempt("hardlink", lambda: os.link(secret, work + "/hard"))
attempt("rename", lambda: os.rename(secret, work + "/moved"))
attempt("proc_root", lambda: read("/proc/self/root" + secret))
dfd = os.open(os.path.dirname(secret), os.O_PATH)  # O_PATH needs no Landlock right
attempt("openat_opath_dir", lambda: os.open("key", os.O_RDONLY, dir_fd=dfd))
attempt("proc_fd_path", lambda: read(f"/proc/self/fd/{dfd}/key"))
attempt("positive", lambda: read(work + "/../pub/hello.txt"))
print(json.dumps(res))
"""
    r = run_py(sb, code, str(secret_tree / "secret/key"), str(work),
               str(secret_tree / "pub/link-to-key"))
    res = json.loads(r.stdout)
    for route in ("symlink_made_inside", "symlink_preexisting", "proc_root",
                  "openat_opath_dir", "proc_fd_path"):
        assert res[route] == ["err", 13], route
    assert res["hardlink"][0] == "err" and res["rename"][0] == "err"
    assert res["positive"] == ["ok", "hello\n"]
    assert not (work / "hard").exists() and not (work / "moved").exists()
    assert (secret_tree / "secret/key").read_text() == "TOPSECRET\n"


def test_fs_denied_directory_under_readable_prefix(secret_tree):
    sb = sandbox(fs_readable=[secret_tree], fs_denied=[secret_tree / "secret"])
    res = read_in(sb, secret_tree / "pub/hello.txt", secret_tree / "secret/key")
    assert res[str(secret_tree / "pub/hello.txt")] == ["ok", "hello\n"]
    assert res[str(secret_tree / "secret/key")] == ["err", 13]
    r = sb.run(["ls", str(secret_tree / "secret")])
    assert r.exit_code != 0 and b"key" not in r.stdout


def test_fs_denied_file_keeps_its_directory_listable(secret_tree):
    key = secret_tree / "secret/key"
    (secret_tree / "secret/other").write_text("fine\n")
    sb = sandbox(fs_readable=[secret_tree], fs_denied=[key])
    res = read_in(sb, key, secret_tree / "secret/other")
    assert res[str(key)] == ["err", 13]
    assert res[str(secret_tree / "secret/other")] == ["ok", "fine\n"]
    r = sb.run(["ls", str(secret_tree / "secret")])
    assert r.success and b"other" in r.stdout


def test_fs_denied_under_writable_prefix(secret_tree):
    sb = sandbox(fs_writable=[secret_tree], fs_denied=[secret_tree / "secret"])
    code = """
import os, sys, json
root = sys.argv[1]
res = {}
def attempt(name, fn):
    try:
        fn(); res[name] = "ok"
    except OSError as e:
        res[name] = e.errno
attempt("overwrite", lambda: open(root + "/secret/key", "w").write("x"))
attempt("unlink", lambda: os.unlink(root + "/secret/key"))
attempt("rename_dir", lambda: os.rename(root + "/secret", root + "/work/s"))
attempt("rmdir_tree", lambda: os.rename(root + "/secret", root + "/gone"))
attempt("write_sibling", lambda: open(root + "/work/a.txt", "w").write("y"))
print(json.dumps(res))
"""
    r = run_py(sb, code, str(secret_tree))
    res = json.loads(r.stdout)
    assert res["overwrite"] == 13 and res["unlink"] == 13
    assert res["rename_dir"] != "ok" and res["rmdir_tree"] != "ok"
    assert res["write_sibling"] == "ok"
    assert (secret_tree / "secret/key").read_text() == "TOPSECRET\n"


def test_nonexistent_denied_path_cannot_be_created(secret_tree):
    sb = sandbox(fs_writable=[secret_tree / "work"], fs_denied=[secret_tree / "work/.env"])
    r = sb.run(["sh", "-c", f"echo SECRET > {secret_tree}/work/.env"])
    assert r.exit_code != 0 and not (secret_tree / "work/.env").exists()
    r = sb.run(["sh", "-c", f"echo ok > {secret_tree}/work/sub.txt; cat {secret_tree}/work/sub.txt"])
    # A denied path directly in `work` freezes `work` itself: new top-level entries are
    # refused too (documented); existing entries stay fully usable.
    assert r.exit_code != 0
    (secret_tree / "work/existing").mkdir()
    os.chmod(secret_tree / "work/existing", 0o777)
    sb = sandbox(fs_writable=[secret_tree / "work"], fs_denied=[secret_tree / "work/.env"])
    r = sb.run(["sh", "-c", f"echo ok > {secret_tree}/work/existing/f; cat {secret_tree}/work/existing/f"])
    assert r.success and r.stdout == b"ok\n"
