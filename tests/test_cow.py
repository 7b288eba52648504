"""The copy-on-write workspace: real programs in real sandboxes write to a private layer
over their workdir; the run's outcome commits, discards, keeps or defers the layer."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import time
import zipfile

import pytest

from sandlock import BranchAction, PolicyError, StdioMode
from sandlock.cow import CowLayer, commit, interrupted, open_layer

from conftest import PY, run_py, sandbox

HELPERS = os.path.join(os.path.dirname(__file__), "helpers")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def snapshot(root, mtimes: bool = True) -> dict:
    """Every entry under root: kind, mode, content digest or link target (and the mtimes
    of files, which commit preserves)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            rel = os.path.relpath(p, root)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                with open(p, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
                out[rel] = ("file", stat.S_IMODE(st.st_mode), digest) + (
                    (st.st_mtime_ns,) if mtimes else ())
    return out


def make_tree(root):
    os.makedirs(os.path.join(root, "notes"))
    os.makedirs(os.path.join(root, "data"))
    os.makedirs(os.path.join(root, "lib"))
    files = {"readme.txt": "hello\n", "notes/todo.txt": "todo\n", "data/old.csv": "a,b\n",
             "data/keep.csv": "c,d\n", "lib/mod.py": "x = 1\n",
             "script.sh": "#!/bin/sh\necho hi\n",
             "big.txt": "".join(f"{i}\n" for i in range(1, 1001))}
    for rel, text in files.items():
        with open(os.path.join(root, rel), "w") as f:
            f.write(text)
    for dirpath, dirnames, filenames in os.walk(root):
        os.chmod(dirpath, 0o755)
        for n in filenames:
            os.chmod(os.path.join(dirpath, n), 0o644)


def cow_box(workdir, storage, backend="seccomp", **kw):
    """A workspace sandbox. This module is the seccomp backend's behaviour specification
    (its limits included); the guarantees every backend keeps (the workdir untouched until
    commit, the fence, crash-safe commit) are run against each backend available here."""
    kw.setdefault("fs_readable", [HELPERS])
    return sandbox(workdir=str(workdir), fs_storage=str(storage), cwd=str(workdir),
                   workspace_backend=backend, **kw)


def _overlay_available():
    import tempfile
    from sandlock.workspace_policy import overlay_refusal
    d = tempfile.mkdtemp()
    try:
        os.mkdir(os.path.join(d, "w"))
        os.mkdir(os.path.join(d, "s"))
        return overlay_refusal(os.path.join(d, "w"), os.path.join(d, "s"), None) is None
    finally:
        shutil.rmtree(d)


BACKENDS = ["seccomp"] + (["overlay"] if _overlay_available() else [])


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


@pytest.fixture
def tree(tmp_path):
    src = tmp_path / "src"
    make_tree(str(src))
    return src


def _copy(src, dst):
    shutil.copytree(src, dst, symlinks=True)
    return dst


def run_ops_outside(src, tmp_path):
    out = _copy(src, tmp_path / "outside")
    proc = subprocess.run([PY, os.path.join(HELPERS, "fs_ops.py")], cwd=out,
                          capture_output=True, check=True)
    return out, proc.stdout


# --- behaves as a real filesystem --------------------------------------------------------------

def test_every_operation_behaves_as_on_the_real_filesystem_and_commit_gives_that_tree(
        tree, tmp_path, backend):
    outside, expected = run_ops_outside(tree, tmp_path)
    work = _copy(tree, tmp_path / "work")
    r = cow_box(work, tmp_path / "store", backend).run(
        [PY, os.path.join(HELPERS, "fs_ops.py")], timeout=60)
    assert r.success, (r.stderr.decode()[-2000:], r.denials)
    assert r.stdout.decode() == expected.decode()
    assert snapshot(work, mtimes=False) == snapshot(outside, mtimes=False)
    assert os.stat(work / "readme.txt").st_mtime == 1_000_000_000  # utime, committed
    assert os.stat(work / "data/hard.csv").st_ino == os.stat(work / "data/renamed.csv").st_ino
    assert os.listdir(tmp_path / "store") == []  # the layer is gone after the commit
    paths = {c.path: c.action for c in r.changes}
    assert paths["data/old.csv"] == "deleted" and paths["new.txt"] == "added"
    assert paths["readme.txt"] == "modified" and paths["lib2/mod.py"] == "added"
    assert "notes" not in paths  # untouched directory: no record


def test_abort_leaves_the_workdir_byte_identical(tree, tmp_path, backend):
    work = _copy(tree, tmp_path / "work")
    before = snapshot(work)
    r = cow_box(work, tmp_path / "store", backend, on_exit=BranchAction.ABORT).run(
        [PY, os.path.join(HELPERS, "fs_ops.py")], timeout=60)
    assert r.success, r.stderr.decode()[-2000:]
    assert len(r.changes) > 10  # it did change its view...
    assert snapshot(work) == before  # ...and none of it reached the workdir
    assert os.listdir(tmp_path / "store") == []


def test_a_commit_carries_the_user_s_xattrs_never_the_layer_s(tmp_path, backend):
    """(hunt) An overlay run's commit gave every changed workdir file overlayfs' own
    user.overlay.origin, which tools and later runs then saw. The control: the file's own
    user xattr is carried."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "f").write_text("one\n")
    os.setxattr(work / "f", "user.mine", b"kept")
    r = cow_box(work, tmp_path / "store", backend, on_exit=BranchAction.COMMIT).run(
        ["sh", "-c", "echo two >> f && echo new > g"], timeout=60)
    assert r.success, r.stderr.decode()
    assert (work / "f").read_text() == "one\ntwo\n"
    assert os.listxattr(work / "f") == ["user.mine"]
    assert os.getxattr(work / "f", "user.mine") == b"kept"
    assert [n for n in os.listxattr(work / "g") if not n.startswith("security.")] == []


def test_a_change_of_xattrs_alone_is_committed(tmp_path, backend):
    """(hunt) A user xattr set, changed or removed on a file whose content and mode stay
    was no change: the commit dropped it. The control: an untouched file stays as it
    was."""
    work = tmp_path / "work"
    work.mkdir()
    for name in ("set", "changed", "removed", "untouched"):
        (work / name).write_text(name)
    os.setxattr(work / "changed", "user.k", b"old")
    os.setxattr(work / "removed", "user.k", b"old")
    os.setxattr(work / "untouched", "user.k", b"same")
    script = ("import os\nos.setxattr('set', 'user.k', b'new')\n"
              "os.setxattr('changed', 'user.k', b'new')\nos.removexattr('removed', 'user.k')")
    r = cow_box(work, tmp_path / "store", backend, on_exit=BranchAction.COMMIT).run(
        [PY, "-c", script], timeout=60)
    assert r.success, r.stderr.decode()
    assert {c.path for c in r.changes} == {"set", "changed", "removed"}, r.changes
    assert os.getxattr(work / "set", "user.k") == b"new"
    assert os.getxattr(work / "changed", "user.k") == b"new"
    assert "user.k" not in os.listxattr(work / "removed")
    assert os.getxattr(work / "untouched", "user.k") == b"same"
    assert all((work / n).read_text() == n for n in ("set", "changed", "removed"))


def test_runs_of_one_sandbox_are_confined_alike(tmp_path, backend):
    """An overlay run builds the next run's ruleset while it goes on (Confinement.
    build_next): each run of one Sandbox is confined as the first — its workdir writable
    through the layer, a path outside refused and left alone."""
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    sb = cow_box(work, tmp_path / "store", backend, on_exit=BranchAction.COMMIT,
                 on_error=BranchAction.COMMIT)
    for i in range(4):
        r = sb.run(["sh", "-c", f"echo {i} > in{i}; echo {i} > {outside}/out{i}"],
                   timeout=60)
        assert r.exit_code != 0 and b"Permission denied" in r.stderr, r
        assert (work / f"in{i}").read_text() == f"{i}\n"
    assert list(outside.iterdir()) == []


@pytest.mark.skipif("overlay" not in BACKENDS, reason="overlay backend unavailable")
def test_the_overlay_is_told_by_its_mount_not_by_the_workdir_s_path(tmp_path):
    """(review) A sandbox that may write above the workdir can rename the workdir's
    parent and make a plain directory at the workdir's path. The supervisor told overlay
    objects by whatever that path named in the sandbox's view, so metadata changes there
    were taken for the overlay's, skipping the checks of everything else. It records the
    overlay's mount when the program starts now. The control: a chmod in the overlay,
    before the move, is served."""
    base = tmp_path / "base"
    wd, other = base / "a" / "wd", base / "other"
    wd.mkdir(parents=True)
    other.mkdir()
    (wd / "f").write_text("x")
    (other / "g").write_text("y")
    os.chmod(other / "g", 0o644)
    script = (f"chmod 700 f || exit 9; mv {base}/a {base}/b && mkdir -p {base}/a/wd && "
              f"ln {other}/g {base}/a/wd/g && chmod 777 {base}/a/wd/g; echo rc=$?")
    sb = sandbox(fs_writable=[str(base)], workdir=str(wd), cwd=str(wd),
                 workspace_backend="overlay", fs_storage=str(tmp_path / "store"),
                 on_exit=BranchAction.ABORT)
    r = sb.run(["sh", "-c", script], timeout=60)
    assert r.stdout == b"rc=1\n", (r.stdout, r.stderr)
    assert b"Operation not permitted" in r.stderr
    assert stat.S_IMODE(os.stat(other / "g").st_mode) == 0o644


@pytest.mark.parametrize("replace", ["directory", "symlink"])
def test_a_commit_never_writes_where_the_sandbox_moved_the_workdir(tmp_path, backend,
                                                                   replace):
    """(review) A sandbox that may write above the workdir renames the workdir's parent
    and leaves, at its path, a directory of its own — or a symlink to another directory
    that happens to hold one of the workdir's name, outside every grant. The commit
    opened the workdir by path and wrote the run's files there. It is refused now (the
    workdir's identity is kept with the layer), and the layer kept. The control: the same
    run that does not move it commits."""
    base, victim = tmp_path / "base", tmp_path / "victim"
    wd = base / "a" / "wd"
    wd.mkdir(parents=True)
    (victim / "wd").mkdir(parents=True)
    leave = (f"mkdir -p {base}/a/wd" if replace == "directory" else
             f"ln -s {victim} {base}/a")

    def run(move: bool):
        sb = sandbox(fs_writable=[str(base)], workdir=str(wd), cwd=str(base),
                     workspace_backend=backend, fs_storage=str(tmp_path / "store"),
                     on_exit=BranchAction.COMMIT)
        script = f"echo new > {wd}/planted" + (
            f" && mv {base}/a {base}/b && {leave}" if move else "")
        return sb.run(["sh", "-c", script], timeout=60)
    r = run(move=False)
    assert r.success and (wd / "planted").read_text() == "new\n", r
    (wd / "planted").unlink()
    r = run(move=True)
    if b"mv: cannot move" in r.stderr:  # the seccomp backend's workdir stays put: its
        assert backend == "seccomp" and not r.success  # ancestors are not the sandbox's
    else:  # to rename
        assert r.error is not None and ("no longer the directory" in r.error
                                        or "cannot be reached" in r.error), (r, r.stderr)
    assert not (victim / "wd" / "planted").exists()
    assert not (base / "a" / "wd" / "planted").exists()
    assert not (base / "b" / "wd" / "planted").exists()  # the moved workdir: not applied


def _paused_run(sb, sig, script: str, outside):
    """sb.run() of `script`, held once it is done until outside() has run (someone else
    changing the workdir during the run): the run says it is there with sig/ready and
    waits for sig/go (sig: a directory made before the sandbox, which it may write)."""
    import threading
    held = (f"{script} && touch {sig}/ready && "
            f"while [ ! -e {sig}/go ]; do sleep 0.05; done")
    out = []
    t = threading.Thread(target=lambda: out.append(sb.run(["sh", "-c", held], timeout=60)))
    t.start()
    deadline = time.monotonic() + 30
    while not (sig / "ready").exists():
        assert time.monotonic() < deadline and t.is_alive(), out
        time.sleep(0.02)
    outside()
    (sig / "go").touch()
    t.join(60)
    return out[0]


def test_names_made_outside_during_a_run_survive_its_commit(tmp_path, backend):
    """(hunt) The seccomp backend's commit deleted every name made in the workdir by
    someone else during the run, in each directory the run changed (a file, a tree, a
    symlink; another sandbox's output on the same workdir). They stay now; what the run
    removed is still removed (the control). An untouched file removed outside meanwhile
    stays removed (its commit failed with ENOENT, every time)."""
    work, sig = tmp_path / "work", tmp_path / "sig"
    (work / "sub").mkdir(parents=True)
    (work / "a").write_text("a")
    (work / "gone").write_text("g")
    (work / "u").write_text("u")  # untouched by the run, removed outside during it
    sig.mkdir()
    sb = cow_box(work, tmp_path / "store", backend, on_exit=BranchAction.COMMIT,
                 fs_writable=[str(sig)])

    def outside():
        (work / "new.txt").write_text("mine")
        (work / "od" / "deep").mkdir(parents=True)
        (work / "od" / "deep" / "z").write_text("z")
        os.symlink("a", work / "ln")
        (work / "sub" / "new2").write_text("mine too")
        (work / "u").unlink()
    r = _paused_run(sb, sig, "touch h sub/h2 && rm gone", outside)
    assert r.success, (r, r.stderr)
    assert sorted(os.listdir(work)) == ["a", "h", "ln", "new.txt", "od", "sub"]
    assert (work / "new.txt").read_text() == "mine"
    assert (work / "od" / "deep" / "z").read_text() == "z"
    assert os.readlink(work / "ln") == "a"
    assert sorted(os.listdir(work / "sub")) == ["h2", "new2"]


def test_a_directory_removed_outside_during_a_run_keeps_only_the_run_s_changes(tmp_path,
                                                                              backend):
    """(found 2026-12-06, pre-existing) On the seccomp backend, a directory the run only
    listed and someone else removed during the run came back, empty, at commit; one the
    run wrote a file into made the whole commit fail (ENOENT on the directory's untouched
    files, the layer kept). Now both backends agree: what the run made beneath it is
    committed, with the directory made again for it; the workdir's files it held stay
    removed, and a directory the run only read stays gone. The control: a change the run
    made elsewhere is committed alongside."""
    work, sig = tmp_path / "work", tmp_path / "sig"
    for d in ("listed", "written", "deep"):
        (work / d / "sub").mkdir(parents=True)
        (work / d / "f").write_text("f")
        (work / d / "sub" / "g").write_text("g")
    (work / "top").write_text("old")
    script = ("ls listed listed/sub >/dev/null && cat listed/f >/dev/null && "
              "echo run > written/new && ls deep/sub >/dev/null && "
              "echo run > deep/sub/new && echo new > top")
    sig.mkdir()
    sb = cow_box(work, tmp_path / "store", backend, on_exit=BranchAction.COMMIT,
                 fs_writable=[str(sig)])
    r = _paused_run(sb, sig, script, lambda: [shutil.rmtree(work / d)
                                              for d in ("listed", "written", "deep")])
    assert r.success and r.error is None, (r, r.stderr)
    assert (work / "top").read_text() == "new\n"  # the control
    assert sorted(os.listdir(work)) == ["deep", "top", "written"]
    assert os.listdir(work / "written") == ["new"]
    assert (work / "written" / "new").read_text() == "run\n"
    assert os.listdir(work / "deep") == ["sub"] and os.listdir(work / "deep" / "sub") == ["new"]
    assert sorted(c.path for c in r.changes) == ["deep", "deep/sub", "deep/sub/new", "top",
                                                 "written", "written/new"]


def test_a_renamed_directory_whose_original_is_removed_outside_is_never_committed_empty(
        tmp_path, backend):
    """(review) The seccomp layer records a directory the run renames, and reads its
    entries from the workdir's original when first needed. Removed outside before that,
    the original's entries are in neither place: the commit reported success with the
    renamed directory empty (h lost). It is refused now, the layer kept (as a renamed
    file's commit already was); the overlay backend copied it at the rename and commits
    it whole. The control: the same run with nothing removed outside commits it whole."""
    for removed in (False, True):
        work, sig = tmp_path / f"work{removed}", tmp_path / f"sig{removed}"
        (work / "d" / "sub").mkdir(parents=True)
        (work / "d" / "sub" / "h").write_text("h")
        (work / "d" / "f").write_text("f")
        sig.mkdir()
        sb = cow_box(work, tmp_path / f"store{removed}", backend,
                     on_exit=BranchAction.COMMIT, fs_writable=[str(sig)])
        r = _paused_run(sb, sig, "mv d/sub d/sub2",
                        lambda: shutil.rmtree(work / "d") if removed else None)
        if not removed or backend == "overlay":
            assert r.success and r.error is None, (r, r.stderr)
            assert (work / "d" / "sub2" / "h").read_text() == "h"
        else:
            assert r.error is not None and "was removed during the run" in r.error, r
            assert "layer kept" in r.error and not (work / "d").exists()


def test_a_failing_run_is_discarded_by_default(tree, tmp_path, backend):
    work = _copy(tree, tmp_path / "work")
    before = snapshot(work)
    r = cow_box(work, tmp_path / "store", backend).run(
        ["sh", "-c", "echo changed > readme.txt; rm data/old.csv; exit 3"])
    assert r.exit_code == 3
    assert {c.path for c in r.changes} == {"readme.txt", "data/old.csv"}
    assert snapshot(work) == before


def test_keep_leaves_the_layer_and_it_can_be_committed_later(tree, tmp_path, backend):
    work = _copy(tree, tmp_path / "work")
    before = snapshot(work)
    r = cow_box(work, tmp_path / "store", backend, on_exit=BranchAction.KEEP).run(
        ["sh", "-c", "echo kept > readme.txt && mkdir out && echo 1 > out/a"])
    assert r.success and r.kept and os.path.isdir(r.kept)
    assert snapshot(work) == before
    assert open(os.path.join(r.kept, "upper", "readme.txt")).read() == "kept\n"
    commit(open_layer(r.kept))
    assert open(work / "readme.txt").read() == "kept\n"
    assert open(work / "out" / "a").read() == "1\n"
    assert not os.path.exists(r.kept)


def test_defer_waits_for_commit_or_abort(tree, tmp_path, backend):
    work = _copy(tree, tmp_path / "work")
    before = snapshot(work)
    sb = cow_box(work, tmp_path / "store", backend, on_exit=BranchAction.DEFER)
    r = sb.run(["sh", "-c", "echo deferred > readme.txt"])
    assert r.pending and snapshot(work) == before
    r.commit()
    assert not r.pending and open(work / "readme.txt").read() == "deferred\n"
    r2 = sb.run(["sh", "-c", "echo again > readme.txt"])
    assert r2.pending
    r2.abort()
    assert open(work / "readme.txt").read() == "deferred\n"
    assert os.listdir(tmp_path / "store") == []
    with pytest.raises(Exception, match="nothing to commit"):
        r2.commit()


def test_untouched_files_are_read_from_the_workdir_and_listings_merge(tree, tmp_path, backend):
    work = _copy(tree, tmp_path / "work")
    r = cow_box(work, tmp_path / "store", backend, on_exit=BranchAction.ABORT).run(
        ["sh", "-c", "touch notes/new && ls notes && cat notes/todo.txt && ls -a lib"])
    assert r.success, r.stderr
    assert r.stdout.decode().split() == ["new", "todo.txt", "todo", ".", "..", "mod.py"]


# --- the fence: nothing reaches the workdir, nothing outside the policy is reached -----------

def test_writes_cannot_reach_the_workdir_through_a_path_outside_it(tree, tmp_path, backend):
    work = _copy(tree, tmp_path / "work")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    os.chmod(scratch, 0o777)
    os.symlink(work, scratch / "into-work")
    before = snapshot(work)
    r = cow_box(work, tmp_path / "store", backend, fs_writable=[str(scratch)],
                on_exit=BranchAction.KEEP).run(
        ["sh", "-c", f"echo pwned > {scratch}/into-work/readme.txt; echo rc=$?; "
                     f"echo fine > {scratch}/ok; echo rc=$?"])
    out = r.stdout.decode()
    assert out.splitlines()[1] == "rc=0"  # control: the grant outside works
    assert snapshot(work) == before      # nothing reached the workdir itself...
    if backend == "overlay":
        # ...the workdir's path, however reached, is the overlay: the write is the layer's
        assert out.splitlines()[0] == "rc=0"
        assert [c.path for c in r.changes] == ["readme.txt"]
    else:
        assert out.splitlines()[0] != "rc=0"  # the seccomp backend refuses it (a limit)
    assert open(scratch / "ok").read() == "fine\n"
    open_layer(r.kept).discard()


@pytest.mark.parametrize("changed", [False, True])
def test_a_symlink_in_the_workdir_does_not_extend_the_policy(tree, tmp_path, changed, backend):
    """Before the layer's first change the kernel resolves reads itself (Landlock refuses
    the secret); after it, the supervisor does, with the sandbox's rules (and says so)."""
    work = _copy(tree, tmp_path / "work")
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET\n")
    public = tmp_path / "public"
    public.mkdir()
    (public / "ok.txt").write_text("public\n")
    os.symlink(secret, work / "to-secret")
    os.symlink(public / "ok.txt", work / "to-public")
    first = "echo > changed.txt; " if changed else ""
    r = cow_box(work, tmp_path / "store", backend, fs_readable=[str(public), HELPERS]).run(
        ["sh", "-c", first + "cat to-public; cat to-secret; echo rc=$?; echo x >> to-public; "
                     "echo rc=$?"])
    out = r.stdout.decode()
    assert out.startswith("public\n") and "TOPSECRET" not in out
    assert out.splitlines()[1] == "rc=1"  # reading the secret failed
    assert out.splitlines()[-1] != "rc=0"  # public is readable, not writable
    assert (public / "ok.txt").read_text() == "public\n"
    # the seccomp backend's supervisor refuses it (and says so); overlay: Landlock does
    assert any("not readable by the policy" in d["reason"] for d in r.denials) == (
        changed and backend == "seccomp")


def test_the_layer_storage_is_not_reachable_from_the_sandbox(tree, tmp_path, backend):
    work = _copy(tree, tmp_path / "work")
    store = tmp_path / "store"
    r = cow_box(work, store, backend, fs_readable=[str(tmp_path)], on_exit=BranchAction.KEEP).run(
        ["sh", "-c", f"echo x > new.txt; ls {store}; echo rc=$?; "
                     f"cat {store}/*/layer.json; echo rc=$?; "
                     f"echo '{{}}' > {store}/*/commit.json; echo rc=$?"])
    assert r.stdout.decode().split() == ["rc=2", "rc=1", "rc=2"], r.stdout
    root = r.kept
    assert sorted(os.listdir(root)) in (["kept.json", "layer.json", "seen", "upper"],
                                        ["kept.json", "layer.json", "upper", "work"])
    assert open(os.path.join(root, "upper", "new.txt")).read() == "x\n"  # control
    open_layer(root).discard()


def _victim(tmp_path):
    victim = tmp_path / "victim"
    (victim / "sub").mkdir(parents=True)
    (victim / "target").write_text("VICTIM\n")
    (victim / "sub" / "precious").write_text("PRECIOUS\n")
    os.chmod(victim / "target", 0o600)
    return victim


def test_planted_symlinks_never_redirect_a_copy_up_or_the_commit(tree, tmp_path, backend):
    """Symlinks to a file outside every grant, under every name the layer or the commit
    might use for a temporary file: modifying and committing follow none of them."""
    work = _copy(tree, tmp_path / "work")
    victim = _victim(tmp_path)
    target = victim / "target"
    names = ["readme.txt.sandlock-copyup", ".readme.txt.sandlock-x", "moved.sandlock-copyup",
             ".sl-new-0-0", ".sl-old-0-0"]
    script = "".join(f"ln -s {target} {n}; " for n in names) +         "echo more >> readme.txt; mv data/keep.csv moved; echo z >> moved; truncate -s 1 big.txt"
    r = cow_box(work, tmp_path / "store", backend).run(["sh", "-c", script])
    assert r.success, (r.stderr, r.denials)
    assert target.read_text() == "VICTIM\n" and stat.S_IMODE(os.stat(target).st_mode) == 0o600
    assert (work / "readme.txt").read_text() == "hello\nmore\n"  # control: committed
    assert (work / "moved").read_text() == "c,d\nz\n" and (work / "big.txt").read_text() == "1"
    assert os.readlink(work / names[0]) == str(target)  # the links themselves, as made


def test_commit_never_follows_a_directory_the_sandbox_replaced_by_a_symlink(tree, tmp_path, backend):
    work = _copy(tree, tmp_path / "work")
    victim = _victim(tmp_path)
    os.makedirs(work / "d" / "sub")
    (work / "d" / "target").write_text("old\n")
    (work / "d" / "sub" / "precious").write_text("old\n")
    r = cow_box(work, tmp_path / "store", backend).run(
        ["sh", "-c", f"mv d d2 && ln -s {victim} d && echo new > notes/todo.txt"])
    assert r.success, r.stderr
    assert (victim / "target").read_text() == "VICTIM\n"
    assert (victim / "sub" / "precious").read_text() == "PRECIOUS\n"
    assert os.readlink(work / "d") == str(victim)  # what the sandbox made, as a link
    assert (work / "d2" / "target").read_text() == "old\n"
    assert (work / "notes" / "todo.txt").read_text() == "new\n"  # control


def test_racing_path_rewrites_never_open_a_denied_file(tree, tmp_path):
    """A thread flips the path between a workdir file and a denied one while the main
    thread opens it: the supervisor acts on its one copy; the kernel never re-reads a path
    under the workdir. The secret is never read; the workdir file is (both outcomes)."""
    work = _copy(tree, tmp_path / "work")
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET\n")
    code = r"""
import ctypes, threading, os, sys
libc = ctypes.CDLL(None, use_errno=True)
a = (os.getcwd() + "/readme.txt").encode()
b = sys.argv[1].encode()
n = max(len(a), len(b)) + 1
buf = ctypes.create_string_buffer(n)
stop = False
def flip():
    while not stop:
        ctypes.memmove(buf, a + b"\0", len(a) + 1)
        ctypes.memmove(buf, b + b"\0", len(b) + 1)
t = threading.Thread(target=flip); t.start()
import time
seen = {"hello": 0, "secret": 0, "fail": 0}
end = time.monotonic() + 20  # until both paths were tried often (scheduling varies)
for k in range(100000):
    if k >= 400 and min(seen["hello"], seen["fail"]) >= 20 or time.monotonic() > end:
        break
    fd = libc.open(buf, os.O_RDONLY)
    if fd < 0:
        seen["fail"] += 1; continue
    data = os.read(fd, 64); os.close(fd)
    seen["secret" if b"TOPSECRET" in data else "hello"] += 1
stop = True; t.join()
print(seen)
"""
    r = run_py(cow_box(work, tmp_path / "store", fs_denied=[str(secret)],
                       on_exit=BranchAction.ABORT), code, str(secret), timeout=60)
    seen = eval(r.stdout.decode())
    assert seen["secret"] == 0
    assert seen["hello"] > 0 and seen["fail"] > 0  # both paths were really tried


# --- exec and chdir ------------------------------------------------------------------------

def test_programs_in_the_workdir_and_ones_built_inside_run_by_path(tree, tmp_path, backend):
    """A program of the workdir and one created or changed inside the workspace run by path
    (the seccomp backend re-issues the exec with the layer's file: supervisor.reissue)."""
    work = _copy(tree, tmp_path / "work")
    os.chmod(work / "script.sh", 0o755)
    r = cow_box(work, tmp_path / "store", backend, on_exit=BranchAction.ABORT).run(
        ["sh", "-c", "./script.sh; printf '#!/bin/sh\\necho new $0 $1\\n' > tool.sh; "
                     "chmod +x tool.sh; ./tool.sh arg; echo rc=$?; mkdir -p sub && "
                     "mv tool.sh sub/t && cd sub && ./t two; echo 'echo changed' >> ../script.sh"
                     " && ../script.sh"])
    assert r.stdout.decode().splitlines() == ["hi", "new ./tool.sh arg", "rc=0",
                                              "new ./t two", "hi", "changed"], r.stderr

def test_chdir_into_existing_directories_works(tree, tmp_path):
    work = _copy(tree, tmp_path / "work")
    r = cow_box(work, tmp_path / "store", on_exit=BranchAction.ABORT).run(
        ["sh", "-c", "cd notes && cat todo.txt && pwd"])
    assert r.success, r.stderr
    assert r.stdout.decode() == f"todo\n{work}/notes\n"


LISTINGS = """\
import os
fd = os.open("notes", os.O_RDONLY)  # before any change: the kernel's, on the workdir's
open("notes/new.txt", "w").close()
print(sorted(os.listdir(fd)))
os.rename("notes", "moved")  # the fd follows the directory, as on a real filesystem
open("moved/late.txt", "w").close()
print(sorted(os.listdir(fd)))
it = os.scandir(fd)
first = next(it).name
open("moved/later.txt", "w").close()  # a listing under way goes on with what it had
print(first in os.listdir("moved"), len(list(it)))
"""


FD_FORMS = """\
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
path_fd = os.open("notes", os.O_PATH | os.O_DIRECTORY)
file_fd = os.open("notes/todo.txt", os.O_RDONLY)
def statx_null():  # Linux 6.11: a NULL path with AT_EMPTY_PATH is the fd itself
    buf = ctypes.create_string_buffer(256)
    return libc.syscall(332, file_fd, None, 0x1000, 0x7ff, buf)
before = statx_null()
open("notes/new.txt", "w").close()  # a change, in that directory
buf = ctypes.create_string_buffer(4096)
n = libc.syscall(217, path_fd, buf, 4096)  # getdents64 on an O_PATH fd
print(before, statx_null(), n, ctypes.get_errno())
"""


def test_fd_forms_keep_their_kernel_answers_after_a_change(tree, tmp_path):
    """statx(fd, NULL, AT_EMPTY_PATH) (Linux 6.11) answers after the layer's first change
    as before it (not EFAULT); a listing of an O_PATH directory fd fails with EBADF, as
    in the kernel (it is never turned into a readable fd on the layer's directory)."""
    if tuple(int(x) for x in os.uname().release.split(".")[:2]) < (6, 11):
        pytest.skip("a NULL path with AT_EMPTY_PATH needs Linux 6.11")
    work = _copy(tree, tmp_path / "work")
    r = cow_box(work, tmp_path / "store", on_exit=BranchAction.ABORT).run(
        [PY, "-S", "-c", FD_FORMS])
    assert r.success, r.stderr
    assert r.stdout.decode() == f"0 0 -1 {errno.EBADF}\n"


def test_a_directory_fd_opened_before_a_change_lists_the_change(tree, tmp_path):
    """getdents on a directory fd the kernel opened while the directory was untouched:
    read from the start (opened, or rewound) after the directory changed, it lists the
    layer's entries, wherever the directory was renamed; a listing under way is left as
    it began."""
    work = _copy(tree, tmp_path / "work")
    r = cow_box(work, tmp_path / "store", on_exit=BranchAction.ABORT).run(
        [PY, "-S", "-c", LISTINGS])
    assert r.success, r.stderr
    assert r.stdout.decode().splitlines() == [
        "['new.txt', 'todo.txt']", "['late.txt', 'new.txt', 'todo.txt']", "True 2"]
    assert sorted(os.listdir(work / "notes")) == ["todo.txt"]  # aborted


def test_a_workdir_spelled_through_a_symlink_is_the_workdir(tmp_path, backend):
    """A workdir named through a symlink outside it (a home under a symlinked /home), and
    a shell's logical $PWD: paths spelled that way reach the workspace, as on the real
    filesystem; the real workdir is untouched until commit."""
    real = tmp_path / "real" / "proj"
    real.mkdir(parents=True)
    (real / "f").write_text("1\n")
    (tmp_path / "real").chmod(0o755)
    os.symlink(tmp_path / "real", tmp_path / "lnk")
    spelled = str(tmp_path / "lnk" / "proj")
    script = ('echo new > a && cat "$PWD/a" && mkdir "$PWD/d" && cd "$PWD/d" && pwd && '
              f'echo 2 >> {spelled}/f && cat {spelled}/f && ls {spelled}')
    r = sandbox(workdir=spelled, cwd=spelled, fs_storage=str(tmp_path / "store"),
                env={"PWD": spelled}, workspace_backend=backend,
                on_exit=BranchAction.COMMIT).run(["sh", "-c", script])
    assert r.success, r.stderr
    assert r.stdout.decode() == f"new\n{spelled}/d\n1\n2\na\nd\nf\n"
    assert (real / "f").read_text() == "1\n2\n" and (real / "a").read_text() == "new\n"


def test_the_caller_s_working_directory_inside_the_workdir_is_the_workspace(
        tree, tmp_path, backend, monkeypatch):
    """No cwd given, the program starts in the caller's working directory: inside the
    workdir, that is the workspace (`sandlock run --workdir .` from the project). The
    overlay backend inherited the workdir's own directory beneath its mount before: new
    files were written but never seen."""
    work = _copy(tree, tmp_path / "work")
    (work / "sub").mkdir()
    monkeypatch.chdir(work / "sub")
    r = sandbox(workdir=str(work), fs_storage=str(tmp_path / "store"),
                workspace_backend=backend, on_exit=BranchAction.COMMIT).run(
        ["sh", "-c", "echo y > m && cat m && ls && pwd"])
    assert r.success, r.stderr
    assert r.stdout.decode() == f"y\nm\n{work}/sub\n"
    assert (work / "sub" / "m").read_text() == "y\n"


def test_exec_through_a_layer_symlink_never_reads_a_refused_script(tmp_path):
    """A symlink made in the layer to a script outside the policy, executed directly or
    named as another script's interpreter: the kernel refuses it (Landlock), and nothing
    of it is read for the sandbox (the supervisor read its `#!` line with its own rights,
    and ran that interpreter with the line's argument: the first line leaked). A script
    the policy lets it read and execute runs the same way (positive control)."""
    secret, public = tmp_path / "secret", tmp_path / "public"
    secret.mkdir()
    public.mkdir()
    (secret / "s.sh").write_text("#!/bin/echo SECRET-LINE\n")
    (public / "p.sh").write_text("#!/bin/echo public-line\n")
    for f in (secret / "s.sh", public / "p.sh"):
        f.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    tmp_path.chmod(0o755)
    script = (f"ln -s {secret}/s.sh lnk && ln -s {public}/p.sh pub && "
              f"printf '#!{work}/lnk\\n' > s2 && printf '#!{work}/pub\\n' > p2 && "
              "chmod +x s2 p2; ./lnk; echo rc=$?; ./s2; echo rc=$?; ./pub; ./p2")
    r = cow_box(work, tmp_path / "store", fs_readable=[HELPERS, str(public)],
                on_exit=BranchAction.ABORT).run(["sh", "-c", script])
    out = r.stdout.decode() + r.stderr.decode()
    assert "SECRET" not in out
    assert r.stdout.decode().splitlines()[:2] == ["rc=126", "rc=126"]
    ran = r.stdout.decode().splitlines()[2:]  # (the script's path: where the link leads)
    assert len(ran) == 2 and all(line.startswith("public-line ") for line in ran)
    assert ran[1].endswith(" ./p2")


def test_a_workdir_program_runs_after_its_directory_is_renamed(tmp_path):
    """A program of the workdir, its directory renamed in the layer, run by its new name
    and as a script's interpreter (the re-issued exec named the workdir's path, looked up
    again in the sandbox's view where it no longer was: ENOENT)."""
    work = tmp_path / "work"
    (work / "tools").mkdir(parents=True)
    shutil.copy("/bin/echo", work / "tools" / "say")
    tmp_path.chmod(0o755)
    script = (f"mv tools tools2 && ./tools2/say direct && "
              f"printf '#!{work}/tools2/say via\\n' > s && chmod +x s && ./s")
    r = cow_box(work, tmp_path / "store", on_exit=BranchAction.ABORT).run(
        ["sh", "-c", script])
    assert r.success, r.stderr
    assert r.stdout.decode() == "direct\nvia ./s\n"
    assert os.path.exists(work / "tools" / "say")  # aborted


NOFOLLOW_EXEC = """\
import ctypes, os, sys
os.symlink(sys.argv[1], "link")
libc = ctypes.CDLL(None, use_errno=True)
argv = (ctypes.c_char_p * 2)(b"link", None)
envp = (ctypes.c_char_p * 1)(None)
r = libc.syscall(322, -100, b"link", argv, envp, 0x100)  # execveat, AT_SYMLINK_NOFOLLOW
print(r, ctypes.get_errno())
"""


def test_exec_nofollow_of_a_layer_symlink_never_reads_where_it_leads(tmp_path):
    """execveat(AT_SYMLINK_NOFOLLOW) of a symlink made in the layer to a refused script:
    ELOOP, as the kernel answers; the supervisor never opens the link's target (it read
    its `#!` line with its own rights and ran that interpreter: the line leaked)."""
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "s.sh").write_text("#!/bin/echo SECRET-LINE\n")
    (secret / "s.sh").chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    tmp_path.chmod(0o755)
    r = cow_box(work, tmp_path / "store", on_exit=BranchAction.ABORT).run(
        [PY, "-S", "-c", NOFOLLOW_EXEC, str(secret / "s.sh")])
    assert b"SECRET" not in r.stdout + r.stderr
    assert r.stdout.decode() == f"-1 {errno.ELOOP}\n"


META_ELSEWHERE = """\
import os, sys
w = sys.argv[1]
os.symlink(w, os.path.dirname(w) + "/other/L")  # a spelling the layer does not map
for p in ("/proc/self/root" + w + "/f", os.path.dirname(w) + "/other/L/f", "f"):
    for act in (lambda: os.chmod(p, 0o777), lambda: os.utime(p, (1, 1)),
                lambda: os.setxattr(p, "user.pwned", b"1")):
        try:
            act()
            print("ok", end=" ")
        except OSError as e:
            print(e.errno, end=" ")
print()
"""


def test_metadata_of_the_real_workdir_is_never_changed_around_the_layer(tmp_path):
    """A workdir inside a writable grant (kept read-only by Landlock through
    write_excluded): chmod/utime/setxattr by a spelling the layer does not map
    (/proc/self/root, a symlink made in the grant) are refused, never applied to the real
    workdir (they were: its file became 0777 with mtime 1 and a planted xattr); by its
    own name they change the layer's copy (positive control)."""
    work = tmp_path / "grant" / "work"
    work.mkdir(parents=True)
    (tmp_path / "grant" / "other").mkdir()
    (work / "f").write_text("orig\n")
    (work / "f").chmod(0o644)
    before = os.stat(work / "f")
    tmp_path.chmod(0o755)
    r = cow_box(work, tmp_path / "store", fs_writable=[str(tmp_path / "grant")],
                on_exit=BranchAction.ABORT).run([PY, "-S", "-c", META_ELSEWHERE, str(work)])
    assert r.success, r.stderr
    eperm = str(errno.EPERM)
    assert r.stdout.decode().split() == [eperm] * 6 + ["ok"] * 3
    after = os.stat(work / "f")
    assert (after.st_mode, after.st_mtime_ns) == (before.st_mode, before.st_mtime_ns)
    assert os.listxattr(work / "f") == []


def test_a_logical_pwd_through_a_symlink_half_way_never_aliases_another_directory(
        tmp_path, monkeypatch):
    """$PWD naming the working directory through a symlink half-way down (~/src -> the
    project's src): no alias is taken from it (cutting its tail gave ~ itself, and every
    path under $HOME then went to the workdir's layer); files written to $HOME land there."""
    work, home = tmp_path / "work", tmp_path / "home"
    (work / "src" / "b").mkdir(parents=True)
    home.mkdir()
    os.symlink(work / "src", home / "src")
    tmp_path.chmod(0o755)
    monkeypatch.chdir(work / "src" / "b")
    r = sandbox(workdir=str(work), fs_storage=str(tmp_path / "store"),
                workspace_backend="seccomp", fs_writable=[str(home)],
                env={"PWD": str(home / "src" / "b")}, on_exit=BranchAction.COMMIT).run(
        ["sh", "-c", f"echo note > {home}/note && echo here > x"])
    assert r.success, r.stderr
    assert (home / "note").read_text() == "note\n" and not (work / "note").exists()
    assert (work / "src" / "b" / "x").read_text() == "here\n"


def test_a_run_started_in_a_removed_directory_runs(tree, tmp_path, monkeypatch, backend):
    """The caller's working directory removed, no cwd given: the run goes on (the seccomp
    backend's alias lookup raised FileNotFoundError after making the layer)."""
    work = _copy(tree, tmp_path / "work")
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    r = sandbox(workdir=str(work), fs_storage=str(tmp_path / "store"),
                workspace_backend=backend, on_exit=BranchAction.ABORT).run(
        ["sh", "-c", "echo x"])
    assert r.success and r.stdout == b"x\n", r


# --- outcomes and limits -----------------------------------------------------------------------

def test_max_disk_stops_writes_and_discards_an_oversized_commit(tree, tmp_path):
    work = _copy(tree, tmp_path / "work")
    before = snapshot(work)
    r = cow_box(work, tmp_path / "store", max_disk="64K").run(
        ["sh", "-c", "head -c 200000 /dev/zero > a.bin; echo x > b.txt; echo rc=$?"])
    assert r.stdout.decode() == "rc=2\n"  # b.txt: no space left in the layer
    assert "No space left" in r.stderr.decode()
    assert snapshot(work) == before
    assert "max_disk" in (r.error or "")


def test_small_writes_under_max_disk_commit(tree, tmp_path):
    work = _copy(tree, tmp_path / "work")
    r = cow_box(work, tmp_path / "store", max_disk="1M").run(["sh", "-c", "echo ok > c.txt"])
    assert r.success and open(work / "c.txt").read() == "ok\n"


@pytest.mark.parametrize("fields, message", [
    ({"workdir": "/nonexistent/dir"}, "workdir: /nonexistent/dir is not a directory"),
    ({"fs_storage": "/tmp"}, "fs_storage: set without a workdir"),
    ({"max_disk": "lots"}, "max_disk: expected a size"),
    ({"on_exit": "explode"}, "on_exit: expected one of commit, abort, keep, defer"),
])
def test_bad_workspace_fields_are_clear_errors(tmp_path, fields, message):
    fields = dict(fields)
    if "workdir" not in fields and "fs_storage" not in fields:
        fields["workdir"] = str(tmp_path)
        fields["fs_storage"] = str(tmp_path.parent / "store")
    with pytest.raises(PolicyError, match=message):
        sandbox(**fields)


def test_a_workdir_inside_a_writable_grant_goes_to_the_layer(tmp_path, backend):
    """Upstream's own usage (`fs_writable=["."], workdir="."`) and a workdir beneath a
    writable grant: the workdir's subtree goes to the layer (nothing reaches it on ABORT),
    the rest of the grant stays writable (positive control)."""
    parent = tmp_path / "p"
    (parent / "w").mkdir(parents=True)
    (parent / "w" / "f").write_text("old\n")
    (parent / "sib").mkdir()
    for p in (tmp_path, parent, parent / "w", parent / "sib", parent / "w" / "f"):
        os.chmod(p, 0o777 if p.is_dir() else 0o666)
    store = tmp_path.parent / f"store-{tmp_path.name}"
    sb = sandbox(workdir=str(parent / "w"), cwd=str(parent / "w"), fs_writable=[str(parent)],
                 fs_storage=str(store), on_exit=BranchAction.ABORT, workspace_backend=backend)
    r = sb.run(["sh", "-c", f"echo new > f && cat f && echo s > {parent}/sib/x"])
    assert r.success and r.stdout == b"new\n", r.stderr
    assert (parent / "w" / "f").read_text() == "old\n"  # aborted: the workdir untouched
    assert (parent / "sib" / "x").read_text() == "s\n"   # the rest of the grant: direct
    same = sandbox(workdir=str(parent / "w"), cwd=str(parent / "w"),
                   fs_writable=[str(parent / "w")], fs_storage=str(store),
                   workspace_backend=backend)
    r = same.run(["sh", "-c", "echo committed > f"])
    assert r.success and (parent / "w" / "f").read_text() == "committed\n"
    assert [c.path for c in r.changes] == ["f"]


def test_cli_workdir_dot_from_the_project(tree, tmp_path, backend):
    """`sandlock run --workdir . -- ...` from the project, as a user types it (no --cwd):
    the program sees its own changes, and they are committed."""
    work = _copy(tree, tmp_path / "work")
    r = subprocess.run([sys.executable, "-m", "sandlock", "run", "--workdir", ".",
                        "--fs-storage", str(tmp_path / "store"), "--workspace-backend",
                        backend, "--", "sh", "-c", "echo x > n && cat n && ls n"],
                       cwd=work, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "x\nn\n" and (work / "n").read_text() == "x\n"


def test_cli_keep_then_workspace_diff_and_commit(tree, tmp_path):
    work = _copy(tree, tmp_path / "work")
    before = snapshot(work)
    sl = [sys.executable, "-m", "sandlock"]
    r = subprocess.run(sl + ["run", "--workdir", str(work), "--cwd", str(work),
                             "--fs-storage", str(tmp_path / "store"), "--on-exit", "keep",
                             "--", "sh", "-c", "echo v2 > readme.txt; rm -r lib"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert snapshot(work) == before
    layer = r.stderr.split("(layer: ")[1].split(";")[0]
    d = subprocess.run(sl + ["workspace", "diff", layer], capture_output=True, text=True)
    rows = [line.split()[:2] for line in d.stdout.splitlines()]
    assert ["modified", "readme.txt"] in rows and ["deleted", "lib/mod.py"] in rows
    c = subprocess.run(sl + ["workspace", "commit", layer], capture_output=True, text=True)
    assert c.returncode == 0, c.stderr
    assert (work / "readme.txt").read_text() == "v2\n" and not (work / "lib").exists()
    gone = subprocess.run(sl + ["workspace", "commit", layer], capture_output=True, text=True)
    assert gone.returncode == 125 and "layer.json" in gone.stderr


@pytest.mark.parametrize("backend_", BACKENDS)
def test_a_kept_layer_commits_what_its_run_was_granted_and_nothing_changed_since(
        tmp_path, backend_):
    """(hunt, review) `--on-exit keep`, then `sandlock workspace commit`: the commit read
    the layer again, so it applied what the run had been refused (a git hook: a
    persistence vector) and put the run's version back over an edit made outside since.
    It applies the changes recorded when the run ended now, and is refused where the
    workdir changed since (a DEFER did so already). The control: a second kept run with
    no edit outside commits."""
    work = tmp_path / "work"
    (work / ".git" / "hooks").mkdir(parents=True)
    (work / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (work / "f").write_text("orig\n")
    sl = [sys.executable, "-m", "sandlock"]

    def keep(script):
        r = subprocess.run(sl + ["run", "--workdir", str(work), "--cwd", str(work),
                                 "--fs-storage", str(tmp_path / "store"),
                                 "--workspace-backend", backend_, "--on-exit", "keep",
                                 "--", "sh", "-c", script],
                           capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, SANDLOCK_SERVICE="0"))
        assert r.returncode == 0, r.stderr
        return r.stderr.split("(layer: ")[1].split(";")[0]
    layer = keep("echo run >> f; echo 'echo evil' > .git/hooks/pre-commit 2>/dev/null; :")
    (work / "f").write_text("edited outside\n")
    c = subprocess.run(sl + ["workspace", "commit", layer], capture_output=True, text=True)
    assert c.returncode == 125 and "changed in the workdir since the run" in c.stderr, \
        c.stderr
    assert (work / "f").read_text() == "edited outside\n"
    assert os.path.isdir(layer)  # kept, for the user to decide
    subprocess.run(sl + ["workspace", "abort", layer], check=True, capture_output=True)
    layer = keep("echo run >> f; echo 'echo evil' > .git/hooks/pre-commit 2>/dev/null; :")
    c = subprocess.run(sl + ["workspace", "commit", layer], capture_output=True, text=True)
    assert c.returncode == 0, c.stderr
    assert (work / "f").read_text() == "edited outside\nrun\n"
    assert not (work / ".git" / "hooks" / "pre-commit").exists()


def test_policy_fn_sees_workspace_opens_and_its_deny_path_holds(tree, tmp_path):
    work = _copy(tree, tmp_path / "work")
    seen = []

    def policy(event, ctx):
        if event.syscall in ("open", "openat") and not seen:
            ctx.deny_path(str(work / "notes"))
        seen.append(event.category)
        return None
    r = cow_box(work, tmp_path / "store", policy_fn=policy, policy_fn_events=["file"],
                on_exit=BranchAction.ABORT).run(
        ["sh", "-c", "cat readme.txt; cat notes/todo.txt; echo rc=$?; echo x > new.txt; "
                     "echo rc=$?"], timeout=30)
    out = r.stdout.decode().splitlines()
    assert out[0] == "hello" and out[1] == "rc=1" and out[2] == "rc=0", out
    assert "file" in seen
    assert any("deny_path" in d["reason"] for d in r.denials)
    assert {c.path for c in r.changes} == {"new.txt"}


# --- real tools ------------------------------------------------------------------------------

def _git_env():
    return {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
            "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com",
            "HOME": "/nonexistent", "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}


def test_git_init_add_commit_in_a_workspace_and_dry_run_lists_it(tree, tmp_path):
    work = _copy(tree, tmp_path / "work")
    before = snapshot(work)
    script = "git init -q && git add -A && git commit -q -m first && git log --oneline"
    r = cow_box(work, tmp_path / "store", env=_git_env(), on_exit=BranchAction.ABORT).run(
        ["sh", "-c", script], timeout=60)
    assert r.success, r.stderr.decode()
    assert "first" in r.stdout.decode()
    assert snapshot(work) == before
    changed = {c.path for c in r.changes}
    assert ".git/HEAD" in changed and ".git/index" in changed
    assert all(p == ".git" or p.startswith(".git/") for p in changed)
    # The CLI's dry run prints the same list and leaves the directory alone.
    cli = subprocess.run(
        [sys.executable, "-m", "sandlock", "run", "--workdir", str(work), "--cwd", str(work),
         "--fs-storage", str(tmp_path / "store2"), "--dry-run",
         *sum((["--env", f"{k}={v}"] for k, v in _git_env().items()), []),
         "--", "sh", "-c", script], capture_output=True, timeout=60)
    assert cli.returncode == 0, cli.stderr.decode()
    listed = {line.split()[1] for line in cli.stdout.decode().splitlines()
              if line.split()[:1] and line.split()[0] in ("added", "modified", "deleted")}
    assert listed == changed
    assert "left untouched" in cli.stderr.decode()
    assert snapshot(work) == before
    # Committed, git outside sees the repository the sandbox made.
    r = cow_box(work, tmp_path / "store", env=_git_env()).run(["sh", "-c", script],
                                                                timeout=60)
    assert r.success
    log = subprocess.run(["git", "-C", str(work), "log", "--format=%s"],
                         capture_output=True, env={**os.environ, **_git_env()})
    assert log.stdout.decode().strip() == "first"


def _wheel(path):
    name = "cowdemo-1.0-py3-none-any.whl"
    whl = os.path.join(path, name)
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("cowdemo/__init__.py", "VALUE = 42\n")
        z.writestr("cowdemo-1.0.dist-info/METADATA",
                   "Metadata-Version: 2.1\nName: cowdemo\nVersion: 1.0\n")
        z.writestr("cowdemo-1.0.dist-info/WHEEL",
                   "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                   "Tag: py3-none-any\n")
        z.writestr("cowdemo-1.0.dist-info/RECORD",
                   "cowdemo/__init__.py,,\ncowdemo-1.0.dist-info/METADATA,,\n"
                   "cowdemo-1.0.dist-info/WHEEL,,\ncowdemo-1.0.dist-info/RECORD,,\n")
    return whl


def test_pip_install_of_a_local_wheel_into_a_workspace(tree, tmp_path):
    work = _copy(tree, tmp_path / "work")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    whl = _wheel(str(wheels))
    py = sys.executable
    readable = [str(wheels), sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(py))]
    # pip lists every sys.path entry, including an editable install's source tree
    readable += [p for p in sys.path if p.startswith("/") and os.path.isdir(p)
                 and not str(tmp_path).startswith(p)]
    r = cow_box(work, tmp_path / "store", fs_readable=readable, on_exit=BranchAction.KEEP,
                env={"PIP_DISABLE_PIP_VERSION_CHECK": "1", "HOME": str(work),
                     "PYTHONPATH": "", "PYTHONNOUSERSITE": "1",
                     "PIP_NO_CACHE_DIR": "1"}).run(
        [py, "-m", "pip", "install", "-q", "--no-index", "--target", "site", whl],
        timeout=120)
    assert r.success, r.stderr.decode()[-3000:]
    changed = {c.path for c in r.changes}
    assert "site/cowdemo/__init__.py" in changed
    assert not os.path.exists(work / "site")
    commit(CowLayer.open(r.kept))
    check = subprocess.run([py, "-c", "import cowdemo; print(cowdemo.VALUE)"],
                           cwd=work / "site", capture_output=True)
    assert check.stdout == b"42\n"


# --- crash-safe commit -----------------------------------------------------------------------

def _prepare_layer(tmp_path, trial, backend="seccomp"):
    work = tmp_path / f"w{trial}"
    os.makedirs(work / "d")
    old, new = {}, {}
    for i in range(60):
        old[f"d/f{i}"] = (b"old %d " % i) * 2000
        (work / "d" / f"f{i}").write_bytes(old[f"d/f{i}"])
    script = "i=0; while [ $i -lt 60 ]; do printf '%30000s' \"new $i\" > d/f$i; " \
             "i=$((i+1)); done; " \
             "rm d/f0; mkdir -p n/m && echo added > n/m/x"
    r = cow_box(work, tmp_path / "store", backend, on_exit=BranchAction.KEEP).run(
        ["sh", "-c", script])
    assert r.success, r.stderr
    upper = os.path.join(r.kept, "upper")
    for i in range(1, 60):
        new[f"d/f{i}"] = open(os.path.join(upper, "d", f"f{i}"), "rb").read()
    return work, r.kept, old, new


def test_commit_killed_at_random_points_never_leaves_a_half_written_file(tmp_path, backend):
    rng = random.Random(1234)
    code = "import sys; from sandlock.cow import commit, open_layer; " \
           "layer = open_layer(sys.argv[1]); print('go', flush=True); commit(layer)"
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    # How long an uninterrupted commit takes here (process start included): kills are
    # spread over that span.
    def start(root):
        proc = subprocess.Popen([sys.executable, "-c", code, root], env=env,
                                stdout=subprocess.PIPE)
        assert proc.stdout.readline() == b"go\n"  # from here on, only the commit runs
        return proc
    work, root, old, new = _prepare_layer(tmp_path, "calibration", backend)
    proc = start(root)
    t0 = time.monotonic()
    proc.wait()
    span = time.monotonic() - t0
    killed_mid = 0
    for trial in range(20):
        work, root, old, new = _prepare_layer(tmp_path, trial, backend)
        proc = start(root)
        time.sleep(rng.uniform(0.0, span))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        state = []
        for rel in old:
            p = work / rel
            if not p.exists():
                state.append("gone")
                assert rel == "d/f0", f"{rel} vanished"
                continue
            data = p.read_bytes()
            assert data == old[rel] or data == new.get(rel), f"trial {trial}: {rel} is torn"
            state.append("new" if data == new.get(rel) else "old")
        if "old" in state and "new" in state:
            killed_mid += 1
        if os.path.exists(root):
            commit(open_layer(root))  # finishing is always possible
        for rel, data in new.items():
            assert (work / rel).read_bytes() == data
        assert not (work / "d" / "f0").exists()
        assert (work / "n" / "m" / "x").read_text() == "added\n"
        assert not [n for n in os.listdir(work / "d") if "sandlock" in n]
        assert not os.path.exists(root) and not interrupted(root)
    print("killed mid-commit:", killed_mid)
    assert killed_mid >= 4, f"only {killed_mid} kills landed mid-commit: the test is blind"


def test_fifos_in_the_workspace_block_only_their_caller(tree, tmp_path):
    work = _copy(tree, tmp_path / "work")
    os.mkfifo(work / "lower-fifo")
    r = cow_box(work, tmp_path / "store", on_exit=BranchAction.ABORT).run(
        ["sh", "-c", "mkfifo p; (sleep 0.3; echo through-upper > p) & cat p; "
                     "(sleep 0.3; echo through-lower > lower-fifo) & cat lower-fifo; wait"],
        timeout=20)
    assert r.stdout.decode().split() == ["through-upper", "through-lower"], (r.stderr,
                                                                            r.denials)


def test_spellings_and_edge_paths_behave_as_on_the_real_filesystem(tree, tmp_path):
    """The same script inside (on the layer) and outside (on a copy): odd spellings of
    workdir paths, a trailing slash on a file, a symlink leading out and `..` after it,
    touch -d (a metadata-only change, committed), and /proc/self behind a symlink."""
    script = ("echo one > a.txt; cat ./a.txt .//a.txt; cat a.txt/ 2>/dev/null; echo rc=$?; "
              "rm a.txt/ 2>/dev/null; echo rc=$?; mkdir -p x/y; ln -s x/y ly; "
              "echo z > ly/../z.txt; cat x/z.txt; touch -d 2001-01-01 readme.txt; "
              "stat -c %Y readme.txt")
    outside = _copy(tree, tmp_path / "outside")
    expected = subprocess.run(["sh", "-c", script], cwd=outside, capture_output=True).stdout
    work = _copy(tree, tmp_path / "work")
    r = cow_box(work, tmp_path / "store").run(["sh", "-c", script])
    assert r.stdout == expected, (r.stdout, expected, r.stderr, r.denials)
    assert snapshot(work, mtimes=False) == snapshot(outside, mtimes=False)
    assert os.stat(work / "readme.txt").st_mtime == os.stat(outside / "readme.txt").st_mtime
    assert "readme.txt" in {c.path for c in r.changes}  # touch -d alone is a change


@pytest.mark.parametrize("changed", [False, True])
def test_proc_self_behind_a_workdir_symlink_is_never_the_supervisors(tree, tmp_path,
                                                                     changed):
    """Before the first change the kernel resolves the link as the sandbox (its own
    environment, clean); after it the supervisor refuses to follow /proc at all."""
    work = _copy(tree, tmp_path / "work")
    os.symlink("/proc/self/environ", work / "env")
    os.environ["SANDLOCK_TEST_SUPERVISOR_SECRET"] = "SUPERSECRET"
    first = "echo > changed.txt; " if changed else ""
    try:
        r = cow_box(work, tmp_path / "store", clean_env=True, env={"MINE": "own-env"},
                    on_exit=BranchAction.ABORT).run(["sh", "-c", first + "cat env; echo rc=$?"])
    finally:
        del os.environ["SANDLOCK_TEST_SUPERVISOR_SECRET"]
    assert b"SUPERSECRET" not in r.stdout
    if changed:
        assert r.stdout.decode().splitlines()[-1] == "rc=1"
    else:
        assert b"MINE=own-env" in r.stdout and r.stdout.endswith(b"rc=0\n")


def test_the_shipped_agent_workspace_policy_commits_only_on_success(tree, tmp_path):
    work = _copy(tree, tmp_path / "work")
    policy = os.path.join(REPO, "policies", "agent-workspace.yaml")
    sl = [sys.executable, "-m", "sandlock", "run", "--policy", policy, "--fs-storage",
          str(tmp_path / "store"), "--"]
    bad = subprocess.run(sl + ["sh", "-c", "echo broken > readme.txt; exit 1"], cwd=work,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "discarded" in bad.stderr
    assert (work / "readme.txt").read_text() == "hello\n"
    good = subprocess.run(sl + ["sh", "-c", "echo fixed > readme.txt"], cwd=work,
                          capture_output=True, text=True, timeout=60)
    assert good.returncode == 0 and "applied" in good.stderr, good.stderr
    assert (work / "readme.txt").read_text() == "fixed\n"


def test_the_layer_cannot_be_changed_through_a_path_into_its_storage(tree, tmp_path):
    """chmod/xattr calls the supervisor performs must not reach the upper tree by a path
    spelled into the storage that the layer does not map (here with a `..`): refused, the
    mode unchanged; the same chmod through the workdir works (positive control)."""
    work = _copy(tree, tmp_path / "work")
    store = tmp_path / "store"
    code = ("import os, sys\n"
            "open('mine.txt', 'w').close()\n"  # the layer's first change: upper/mine.txt
            "os.chmod('mine.txt', 0o600)\n"
            "print('ready', flush=True)\n"
            "path = sys.stdin.readline().strip()\n"
            "try:\n    os.chmod(path, 0o777)\n    print('changed')\n"
            "except OSError as e:\n    print('refused', e.errno)\n")
    with cow_box(work, store, on_exit=BranchAction.ABORT).popen(
            [PY, "-c", code], stdin=StdioMode.PIPED, stdout=StdioMode.PIPED) as p:
        reader = io.BufferedReader(p.stdout)
        assert reader.readline() == b"ready\n"
        (layer,) = os.listdir(store)
        upper = store / layer / "upper"
        assert stat.S_IMODE(os.stat(upper / "mine.txt").st_mode) == 0o600
        p.stdin.write(f"{store}/{layer}/../{layer}/upper/mine.txt\n".encode())
        p.stdin.flush()
        assert reader.readline() == b"refused 13\n"
        assert stat.S_IMODE(os.stat(upper / "mine.txt").st_mode) == 0o600
        p.wait(10)


def test_calls_on_an_fd_of_a_private_copy_work(tree, tmp_path):
    """fchmod(fd) and fchmodat/fchownat(fd, "", AT_EMPTY_PATH) on a file the layer
    handed out change the private copy (the storage check is for spelled paths only)."""
    work = _copy(tree, tmp_path / "work")
    code = ("import ctypes, os, stat\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "fd = os.open('made.txt', os.O_CREAT | os.O_WRONLY, 0o644)\n"
            "os.fchmod(fd, 0o600)\n"
            "r = libc.fchownat(fd, b'', -1, -1, 0x1000)\n"  # AT_EMPTY_PATH
            "print(r, ctypes.get_errno() if r else 0, oct(stat.S_IMODE(os.fstat(fd).st_mode)))\n")
    r = cow_box(work, tmp_path / "store", on_exit=BranchAction.ABORT).run([PY, "-c", code])
    assert r.stdout == b"0 0 0o600\n", (r.stdout, r.stderr)


@pytest.mark.parametrize("changed", [False, True])
def test_directory_fds_and_the_cwd_follow_renamed_directories(tree, tmp_path, changed):
    """As on a real filesystem: a directory fd or working directory taken on a workdir
    directory keeps naming that directory after it (or a parent) is renamed, also when a
    new directory takes the old name, and resolves nothing once it is removed. The fds are
    taken before the layer's first change (the workdir's own directories, opened by the
    kernel) or after it."""
    arg = ["changed"] if changed else []
    outside = _copy(tree, tmp_path / "outside")
    expected = subprocess.run([PY, os.path.join(HELPERS, "dirfd_ops.py")] + arg,
                              cwd=outside, capture_output=True, check=True).stdout
    assert b"notes fd, after a new notes/ b'todo\\n'" in expected  # the script's premise
    work = _copy(tree, tmp_path / "work")
    r = cow_box(work, tmp_path / "store").run(
        [PY, os.path.join(HELPERS, "dirfd_ops.py")] + arg, timeout=60)
    assert r.success, (r.stderr.decode()[-2000:], r.denials)
    assert r.stdout.decode() == expected.decode()
    assert snapshot(work, mtimes=False) == snapshot(outside, mtimes=False)


def test_cd_into_a_directory_made_again_under_its_name(tree, tmp_path):
    """`rm -rf d && mkdir d && cd d` (build scripts) lands in the new d, as on a real
    filesystem; the removed one is not followed anywhere."""
    script = ("rm -rf lib && mkdir lib && cd lib && echo made > made.txt && pwd && ls && "
              "cd .. && ls lib")
    outside = _copy(tree, tmp_path / "outside")
    expected = subprocess.run(["sh", "-c", script], cwd=outside, capture_output=True)
    work = _copy(tree, tmp_path / "work")
    r = cow_box(work, tmp_path / "store").run(["sh", "-c", script])
    assert r.success, (r.stderr, r.denials)
    assert r.stdout == expected.stdout.replace(str(outside).encode(), str(work).encode())
    assert snapshot(work, mtimes=False) == snapshot(outside, mtimes=False)


def test_cd_by_a_name_whose_workdir_directory_moved_enters_the_right_one(tree, tmp_path,
                                                                         backend):
    """`mv notes old && mv data notes && cd notes`: the kernel alone would enter the
    workdir's notes (the sandbox's old/); the sandbox enters what it calls notes, as on a
    real filesystem, and writes there."""
    script = ("mv notes old && mv data notes && touch notes/x && cd notes && "
              "echo x > new.txt; echo rc=$?; ls ../old .")
    outside = _copy(tree, tmp_path / "outside")
    bare = subprocess.run(["sh", "-c", script], cwd=outside, capture_output=True)
    work = _copy(tree, tmp_path / "work")
    r = cow_box(work, tmp_path / "store", backend).run(["sh", "-c", script])
    assert r.stdout == bare.stdout and r.exit_code == bare.returncode, (r.stdout, r.stderr)
    assert snapshot(work, mtimes=False) == snapshot(outside, mtimes=False)


IDENTITY_SCRIPT = """
import os, subprocess
before = os.lstat("old.txt")
with open("old.txt", "a") as f:   # copied up into the layer
    f.write("more\\n")
after = os.lstat("old.txt")
os.link("keep.txt", "linked.txt")  # a hard link to an untouched workdir file
fresh = open("new.txt", "w"); fresh.close()
print((before.st_dev, before.st_ino) == (after.st_dev, after.st_ino),
      os.lstat("linked.txt").st_ino == KEEP_INO == os.stat("keep.txt").st_ino,
      os.lstat("new.txt").st_ino not in (KEEP_INO, before.st_ino),
      # coreutils' stat asks with statx
      subprocess.run(["stat", "-c", "%i", "old.txt"], capture_output=True,
                     text=True).stdout.strip() == str(before.st_ino))
"""


def test_a_copied_up_file_keeps_the_identity_stat_reported(tmp_path):
    """A file copied into the layer (on its first write, or to give it a hard link) is still
    the same file to stat: (st_dev, st_ino) of its workdir origin, as overlayfs keeps them.
    `git clone` of a repository inside the workdir checks each hard link it makes against
    its earlier lstat of the source, and died ("hardlink different from source"). A file the
    layer made has its own; nothing of this reaches the workdir at commit."""
    work, store = tmp_path / "w", tmp_path / "s"
    work.mkdir()
    (work / "old.txt").write_text("old\n")
    (work / "keep.txt").write_text("keep\n")
    for p in (tmp_path, work):
        p.chmod(0o755)
    keep_ino = os.lstat(work / "keep.txt").st_ino
    sb = cow_box(work, store, on_exit=BranchAction.COMMIT)
    r = run_py(sb, IDENTITY_SCRIPT.replace("KEEP_INO", str(keep_ino)), timeout=60)
    assert r.success, r.stderr
    assert r.stdout == b"True True True True\n", r.stdout
    assert (work / "old.txt").read_text() == "old\nmore\n"  # committed
    for name in ("old.txt", "keep.txt", "linked.txt", "new.txt"):
        assert not [x for x in os.listxattr(work / name) if x.startswith("user.sandlock.")]


def test_without_the_c_fast_path_a_pristine_workspace_is_the_kernel_s_too():
    """Python decides as the C fast path replays (fastcow.c cow_read_only): while the
    layer holds no change, the calls that only look are the kernel's, as the sandbox (a
    workdir symlink to /proc/self/environ shows the sandbox's own environment, and a
    refused file is Landlock's refusal, not the supervisor's); from the first change on
    the layer answers. The same tests, run with the fast path switched off."""
    tests = ["test_a_symlink_in_the_workdir_does_not_extend_the_policy",
             "test_proc_self_behind_a_workdir_symlink_is_never_the_supervisors"]
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        __file__, "-k", " or ".join(tests)],
                       env=dict(os.environ, SANDLOCK_NO_FASTPATH="1"), capture_output=True,
                       text=True, timeout=300, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert r.returncode == 0 and " passed" in r.stdout and "deselected" in r.stdout, \
        r.stdout[-3000:]


@pytest.mark.skipif(os.geteuid() != 0 or "overlay" not in BACKENDS, reason="a bind mount")
def test_a_workdir_reachable_through_another_mount_is_never_overlaid(tree, tmp_path):
    """The overlay covers the workdir's path only: through another mount point of the same
    directory the real workdir would be written. The check read the mount table with the
    root mount's "/" doubled (//path) and never found one (review 2026-12-05): the
    overlay is refused, and auto takes the seccomp backend, saying why."""
    work = _copy(tree, tmp_path / "work")
    alias = tmp_path / "alias"
    alias.mkdir()
    subprocess.run(["mount", "--bind", str(work), str(alias)], check=True)
    try:
        with pytest.raises(PolicyError, match="also reachable through the mount point"):
            cow_box(work, tmp_path / "store", "overlay").run(["true"])
        sb = cow_box(work, tmp_path / "store", "auto", on_exit=BranchAction.ABORT)
        assert any("also reachable" in n for n in sb.notices), sb.notices
        r = sb.run(["sh", "-c", "echo new > fresh.txt; cat fresh.txt"])
        assert r.stdout == b"new\n" and not (work / "fresh.txt").exists()
    finally:
        subprocess.run(["umount", str(alias)], check=True)
    r = cow_box(work, tmp_path / "store", "auto").policy.workspace  # the control
    assert r.backend == "overlay", r


_WITHOUT_DAC = r"""
import sys
from sandlock import BranchAction, Sandbox, system_devices, system_readable
work, storage = sys.argv[1:3]
for cmd in ("rm -f theirs", "mv moved there"):
    r = Sandbox(fs_readable=system_readable(), fs_writable=system_devices(), workdir=work,
                cwd=work, workspace_backend="seccomp", fs_storage=storage,
                on_exit=BranchAction.COMMIT).run(["sh", "-c", cmd])
    print(cmd, "|", r.exit_code, "|", r.error, "|", sorted(c.path for c in r.changes))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="makes another user's file")
def test_another_user_s_unreadable_file_is_removed_and_committed(tmp_path):
    """A workdir file the user may not read (another user's, mode 0400) can be removed or
    renamed, as on the real filesystem: the diff hashed it and failed, so the whole commit
    failed (found by a workflow hunt). Run by root without the capabilities that read
    anything (an unprivileged user's case); the file's content is never read."""
    work, storage = tmp_path / "work", tmp_path / "storage"
    work.mkdir()
    storage.mkdir()
    for name in ("theirs", "moved"):
        (work / name).write_text("not yours\n")
        os.chown(work / name, 65534, 65534)
        os.chmod(work / name, 0o400)
    (work / "mine").write_text("mine\n")  # the control: untouched
    drop = "-dac_override,-dac_read_search"
    r = subprocess.run(["setpriv", f"--inh-caps={drop}", f"--bounding-set={drop}", "--",
                        sys.executable, "-c", _WITHOUT_DAC, str(work), str(storage)],
                       capture_output=True, text=True, timeout=120,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "rm -f theirs | 0 | None | ['theirs']", r.stdout
    assert not (work / "theirs").exists() and (work / "mine").read_text() == "mine\n"
    # A rename commits as a copy, which needs the content: refused, said, nothing applied.
    assert lines[1].startswith("mv moved there | 0 | copy-on-write commit failed"), r.stdout
    assert (work / "moved").exists() and not (work / "there").exists()


_PERMISSIONS = r"""
import subprocess, sys
from sandlock import BranchAction, Sandbox, system_devices, system_readable
work, storage = sys.argv[1:3]
for cmd in sys.argv[3:]:  # the sandbox first: ABORT leaves the workdir as it was
    r = Sandbox(fs_readable=system_readable(), fs_writable=system_devices(), workdir=work,
                cwd=work, workspace_backend="seccomp", fs_storage=storage,
                on_exit=BranchAction.ABORT).run(["sh", "-c", cmd])
    bare = subprocess.run(["sh", "-c", cmd], cwd=work, capture_output=True)
    print(cmd, "|", bare.returncode, r.exit_code, "|", bare.stdout == r.stdout)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="makes another user's files")
def test_the_workdir_s_permissions_hold_for_changes_made_in_the_layer(tmp_path):
    """Changing a workdir file the user does not own, or may not write, fails as on the
    real filesystem: before, the seccomp backend copied it into the layer (where the copy
    is the user's) and let the write, chmod or explicit times through, and the commit then
    replaced the other user's file with the user's. Run by root without the capabilities
    that pass permissions (an unprivileged user's case: the seccomp backend; the overlay
    one leaves it to the kernel), against the same commands run bare the same way; what
    the kernel allows (a write to a file others may write, times
    set to now on it) still works."""
    work, storage = tmp_path / "work", tmp_path / "storage"
    work.mkdir()
    storage.mkdir()
    for name, mode in (("theirs", 0o644), ("shared", 0o666)):
        (work / name).write_text("theirs\n")
        os.chown(work / name, 65534, 65534)
        os.chmod(work / name, mode)
    cmds = ["echo x >> theirs; echo $?", "chmod 600 theirs; echo $?", "touch theirs; echo $?",
            "touch -d 2001-01-01 theirs; echo $?", "chmod 600 shared; echo $?",
            "echo x >> shared && touch shared && cat shared",
            "python3 -c \"import os; os.truncate('theirs', 0)\"; echo $?"]
    drop = "-dac_override,-dac_read_search,-fowner"
    r = subprocess.run(["setpriv", f"--inh-caps={drop}", f"--bounding-set={drop}", "--",
                        sys.executable, "-c", _PERMISSIONS, str(work), str(storage), *cmds],
                       capture_output=True, text=True, timeout=120,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == len(cmds), r.stdout
    for line in lines:
        assert line.endswith("| True"), r.stdout  # the same output as bare
    assert (work / "theirs").read_text() == "theirs\n"  # the bare runs could not change it
    assert (work / "shared").read_text().startswith("theirs\nx\n")  # the control: bare did


def test_sparse_files_stay_sparse_through_the_layer_and_the_commit(backend, tmp_path):
    """A copy-up and a commit keep a sparse file's holes (found by a workflow hunt: both
    wrote every zero, so `truncate -s 50G disk.img` in a workspace was 50 GB written at
    commit). Contents are the same; blocks stay few."""
    work = tmp_path / "work"
    work.mkdir()
    with open(work / "old.img", "wb") as f:  # the workdir's: copied up by the append
        f.write(b"head")
        f.seek(64 << 20)
        f.write(b"tail")
    r = cow_box(work, tmp_path / "store", backend, on_exit=BranchAction.COMMIT).run(
        ["sh", "-c", "echo more >> old.img && truncate -s 256M new.img && "
                     "printf end >> new.img && du -k old.img new.img"])
    assert r.exit_code == 0 and r.error is None, (r.stderr, r.error)
    for line in r.stdout.decode().splitlines():
        assert int(line.split()[0]) < 2048, r.stdout  # in the run: KiB used
    for name, size, last in (("old.img", (64 << 20) + 9, b"tailmore\n"),
                             ("new.img", (256 << 20) + 3, b"end")):
        st = os.stat(work / name)
        assert st.st_size == size and st.st_blocks * 512 < (2 << 20), (name, st)
        with open(work / name, "rb") as f:
            f.seek(size - len(last))
            assert f.read() == last
    with open(work / "old.img", "rb") as f:
        assert f.read(4) == b"head" and f.read(1 << 20) == bytes(1 << 20)  # a hole reads 0


def test_a_deferred_commit_never_undoes_what_changed_in_the_workdir_since(backend, tmp_path):
    """A DEFER run's changes committed later are refused, with nothing applied, where the
    workdir changed since the run (found by a workflow hunt: a directory the run removed
    took with it a file made outside meanwhile): a name made in a directory the run
    removes, a file the run changed edited outside. The run stays pending (abort works);
    the control, unchanged outside, commits."""
    from sandlock.cow.committing import CommitRefused
    for outside in ("new-in-removed-dir", "edited", None):
        work = tmp_path / f"work-{outside}"
        (work / "d").mkdir(parents=True)
        (work / "d" / "old").write_text("old\n")
        (work / "f").write_text("f\n")
        r = cow_box(work, tmp_path / "store", backend, on_exit=BranchAction.DEFER).run(
            ["sh", "-c", "rm -r d && echo run >> f && echo new > added"])
        assert r.exit_code == 0 and r.pending, (r.stderr, r.error)
        if outside == "new-in-removed-dir":
            (work / "d" / "precious").write_text("made outside\n")
        elif outside == "edited":
            (work / "f").write_text("edited outside\n")
        if outside is None:
            r.commit()
            assert not (work / "d").exists() and (work / "f").read_text() == "f\nrun\n"
            assert (work / "added").read_text() == "new\n"
            continue
        with pytest.raises(CommitRefused, match="since the run"):
            r.commit()
        assert not (work / "added").exists()  # nothing applied
        assert (work / "d" / "old").exists() and r.pending
        r.abort()
        assert not r.pending and (work / "d" / "old").read_text() == "old\n"


_ONE_RUN = r"""
import os, sys
from sandlock import BranchAction, Sandbox, system_devices, system_readable
work, storage, cmd = sys.argv[1:4]
r = Sandbox(fs_readable=system_readable(), fs_writable=system_devices(), workdir=work,
            cwd=work, workspace_backend="seccomp", fs_storage=storage,
            on_exit=BranchAction.DEFER).run(["sh", "-c", cmd])
print(r.exit_code, r.stdout.decode().strip(), flush=True)
sys.stdin.readline()  # the directory is changed outside, while the run's changes wait
try:
    r.commit()
    print("committed")
except Exception as e:
    print(type(e).__name__, e)
    r.abort()
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="makes another user's directory")
def test_a_commit_that_cannot_be_applied_whole_applies_nothing(tmp_path):
    """A change in a directory this user may not write (another user's, made read-only
    outside after the run) is refused at commit with every other change of the run,
    before anything is touched; before, the commit applied what came first and stopped
    there (found by a workflow hunt: a moved directory of another user's was left under
    both names). In the run, the directory was writable to all and the names made there
    worked, as on the real filesystem; a name in another user's 0755 directory is refused
    in the run (the control). Root without the DAC capabilities stands for an unprivileged
    user."""
    work, storage = tmp_path / "work", tmp_path / "storage"
    (work / "rd").mkdir(parents=True)
    storage.mkdir()
    os.chown(work / "rd", 65534, 65534)
    os.chmod(work / "rd", 0o777)
    drop = "-dac_override,-dac_read_search,-fowner"

    def run(cmd):
        p = subprocess.Popen(["setpriv", f"--inh-caps={drop}", f"--bounding-set={drop}",
                              "--", sys.executable, "-c", _ONE_RUN, str(work), str(storage),
                              cmd], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True,
                             cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        first = p.stdout.readline()
        os.chmod(work / "rd", 0o755)
        out, err = p.communicate("\n", timeout=120)
        return subprocess.CompletedProcess(p.args, p.returncode, first + out, err)
    r = run("echo mine > a-first && touch rd/x && echo made")
    assert r.returncode == 0, r.stderr
    made, outcome = r.stdout.splitlines()
    assert made == "0 made", r.stdout
    assert outcome.startswith("CommitRefused refused, nothing applied: rd/x: its directory "
                              "is not writable"), r.stdout
    assert not (work / "a-first").exists() and not (work / "rd" / "x").exists()
    r = run("echo mine > a-first; touch rd/y; echo $?")  # rd is 0755 now: refused in the run
    assert r.stdout.splitlines() == ["0 1", "committed"], r.stdout
    assert (work / "a-first").read_text() == "mine\n" and not (work / "rd" / "y").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="makes another user's directory and file")
def test_root_s_sandbox_gets_no_more_than_root_without_capabilities(backend, tmp_path):
    """Started by root, the sandbox runs as uid 0 without capabilities; the supervisor
    keeps root's. A name made in or removed from another user's directory (0755) and a
    hard link to another user's file (fs.protected_hardlinks) are refused in the run, as
    for that root bare. Before (review), the seccomp backend let them through and root's
    commit applied them. The control: the same in root's own directory."""
    work = tmp_path / "work"
    (work / "alice").mkdir(parents=True)
    (work / "alice" / "f").write_text("alice\n")
    for p in (work / "alice", work / "alice" / "f"):
        os.chown(p, 65534, 65534)
    r = cow_box(work, tmp_path / "store", backend, on_exit=BranchAction.COMMIT).run(
        ["sh", "-c", "ln alice/f l; echo $?; rm -f alice/f; echo $?; "
                     "(echo new > alice/new) 2>/dev/null; echo $?; echo mine > mine"])
    assert r.stdout.split() == [b"1", b"1", b"2"], r.stdout  # as root without them, bare
    assert r.exit_code == 0 and r.error is None, (r.stderr, r.error)
    assert not (work / "l").exists() and not (work / "alice" / "new").exists()
    assert (work / "alice" / "f").exists() and (work / "mine").read_text() == "mine\n"
    r = cow_box(work, tmp_path / "store", backend, on_exit=BranchAction.COMMIT).run(
        ["sh", "-c", "echo mine > mine && ln mine l"])
    assert r.exit_code == 0 and r.error is None, (r.stderr, r.error)
    assert (work / "mine").read_text() == "mine\n" and (work / "l").exists()


def test_a_deferred_commit_sees_a_directory_replaced_or_redirected_outside(backend,
                                                                           tmp_path):
    """(review) A run that replaced a directory by a file, committed later while a file
    was made in that directory outside, and a run whose changes lie in a directory
    replaced by a symlink outside meanwhile: both refused, nothing applied."""
    from sandlock.cow.committing import CommitRefused
    for case in ("made-in-replaced-dir", "dir-became-symlink"):
        work = tmp_path / case
        (work / "d").mkdir(parents=True)
        (work / "d" / "old").write_text("old\n")
        cmd = "rm -r d && echo file > d" if case == "made-in-replaced-dir" else \
            "echo a > a-first && rm d/old"
        r = cow_box(work, tmp_path / "store", backend, on_exit=BranchAction.DEFER).run(
            ["sh", "-c", cmd])
        assert r.exit_code == 0 and r.pending, (r.stderr, r.error)
        if case == "made-in-replaced-dir":
            (work / "d" / "precious").write_text("made outside\n")
        else:
            os.rename(work / "d", work / "d.real")
            os.symlink("d.real", work / "d")
        with pytest.raises(CommitRefused, match="since the run"):
            r.commit()
        assert not (work / "a-first").exists()
        assert (work / "d" / "old").read_text() == "old\n"
        r.abort()
