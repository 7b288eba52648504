"""The scan for files only root may read (sandlock/root_only.py) is reused only while the
kernel reports no change: a file that becomes root-only is seen by the next call, in the
process that scanned and in one forked from it, without waiting for the scan to expire."""

import os
import shutil
import subprocess
import uuid

import pytest

from sandlock import root_only

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the scan is for root only")


@pytest.fixture
def etc_file():
    path = f"/etc/sandlock-test-{uuid.uuid4().hex[:8]}"
    with open(path, "w") as f:
        f.write("x\n")
    os.chmod(path, 0o644)
    yield path
    os.unlink(path)


def _in_child(fn) -> bytes:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(w, b"1" if fn() else b"0")
        finally:
            os._exit(0)
    os.close(w)
    out = os.read(r, 1)
    os.close(r)
    os.waitpid(pid, 0)
    return out


def test_a_file_made_root_only_is_seen_at_once(etc_file):
    root_only.forget()
    assert etc_file not in root_only.files()  # readable by others: not listed
    assert root_only.files() is root_only.files()  # nothing changed: the scan reused
    os.chmod(etc_file, 0o600)
    assert etc_file in root_only.files()
    os.chmod(etc_file, 0o644)
    # A process forked before the change sees it too (it shares the watches, not the
    # queue: it must not drain, and it must not trust its inherited scan).
    before = root_only.files()
    assert etc_file not in before
    r, w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.read(go_r, 1)  # the change is made, and the parent has drained it
            os.write(w, b"1" if etc_file in root_only.files() else b"0")
        finally:
            os._exit(0)
    os.chmod(etc_file, 0o600)
    assert etc_file in root_only.files()  # the parent drains the event here
    os.write(go_w, b"g")
    assert os.read(r, 1) == b"1", "a forked process kept its stale scan"
    os.waitpid(pid, 0)
    for fd in (r, w, go_r, go_w):
        os.close(fd)
    # The control: with nothing changed, a forked process reuses the scan it inherited.
    assert _in_child(lambda: root_only.files() is root_only._cached) == b"1"


def test_a_new_directory_is_watched(etc_file):
    d = etc_file + ".d"
    os.mkdir(d)
    try:
        root_only.files()
        f = os.path.join(d, "secret")
        with open(f, "w") as fh:
            fh.write("s\n")
        os.chmod(f, 0o600)
        assert f in root_only.files()
        os.chmod(f, 0o644)
        assert f not in root_only.files()
    finally:
        shutil.rmtree(d)


def test_a_mount_under_etc_is_seen_at_once(etc_file, tmp_path):
    """A mount raises no inotify event: the mount table is compared as well."""
    d = etc_file + ".mnt"
    os.mkdir(d)
    src = tmp_path / "src"
    src.mkdir()
    (src / "key").write_text("secret\n")
    os.chmod(src / "key", 0o600)
    try:
        assert os.path.join(d, "key") not in root_only.files()  # nothing there yet
        subprocess.run(["mount", "--bind", str(src), d], check=True)
        try:
            assert os.path.join(d, "key") in root_only.files()
        finally:
            subprocess.run(["umount", d], check=True)
        assert os.path.join(d, "key") not in root_only.files()
    finally:
        os.rmdir(d)


def test_a_scanned_root_made_later_is_seen_at_once(tmp_path, monkeypatch):
    """A root that does not exist yet (/usr/local/etc on most systems) is watched through
    its nearest ancestor: made later, with a root-only file in it, it is scanned."""
    late = tmp_path / "usr" / "local" / "etc"
    monkeypatch.setattr(root_only, "SCAN", (str(late),))
    (tmp_path / "usr").mkdir()
    root_only.forget()
    assert root_only.files() == ()
    assert root_only.files() is root_only._cached  # reused while nothing changed
    late.mkdir(parents=True)
    (late / "key").write_text("secret\n")
    os.chmod(late / "key", 0o600)
    assert root_only.files() == (str(late / "key"),)
    monkeypatch.undo()
    root_only.forget()


def test_the_in_process_cli_scans_without_watching(etc_file):
    """`python -m sandlock run` builds one sandbox and ends: it scans at each call and sets
    no inotify watch (their teardown cost its exit ~9 ms), and the root-only file is still
    denied; the control, the same file readable by others, is read."""
    import sys
    env = dict(os.environ, SANDLOCK_SERVICE="0")
    cmd = [sys.executable, "-m", "sandlock", "run", "--", "cat", etc_file]
    os.chmod(etc_file, 0o600)
    strace = shutil.which("strace")
    if strace:
        r = subprocess.run([strace, "-f", "-qq", "-e", "trace=inotify_add_watch", *cmd],
                           env=env, capture_output=True, text=True, timeout=60)
        assert "inotify_add_watch" not in r.stderr, r.stderr[-500:]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and r.stdout == "", (r.stdout, r.stderr)
    os.chmod(etc_file, 0o644)
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == "x\n", r.stderr


def test_a_chmod_through_another_hard_link_is_seen_at_once(etc_file, tmp_path):
    """A file of /etc with another link elsewhere made root-only through that link: no
    watch on /etc hears it, so the scan's files of several links are stat'ed again
    before it is reused (review: readable for up to a minute). The control: a scan with
    nothing changed is reused."""
    other = f"/root/sandlock-test-link-{uuid.uuid4().hex[:8]}"
    if os.stat("/root").st_dev != os.stat("/etc").st_dev:
        pytest.skip("/root and /etc are on different filesystems")
    os.link(etc_file, other)
    try:
        root_only.forget()
        assert etc_file not in root_only.files()
        assert root_only.files() is root_only.files()  # the control: reused
        os.chmod(other, 0o600)
        assert etc_file in root_only.files()
    finally:
        os.unlink(other)
