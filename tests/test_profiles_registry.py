"""Named profiles (TOML in upstream's schema, or YAML) and running sandboxes by name
(`sandlock ps`, `inspect`, `kill`): real CLI processes, real sandboxes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from sandlock import PolicyError, list_profiles, load_profile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A HOME (profiles live in ~/.config/sandlock/profiles) and a runtime directory of
    our own."""
    monkeypatch.setenv("HOME", str(tmp_path))
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    d = tmp_path / ".config" / "sandlock" / "profiles"
    d.mkdir(parents=True)
    return d


def _cli(*args, **kw):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "sandlock", *args], env=env,
                          capture_output=True, text=True, timeout=60, **kw)


WEB = """\
[program]
exec = "/bin/sh"
args = ["-c", "echo $GREETING; echo x > /usr/out 2>/dev/null || echo no-write"]
env = { GREETING = "hello" }

[filesystem]
read = ["/usr", "/lib", "/lib64", "/bin", "/etc"]
write = ["/tmp"]

[limits]
memory = "256M"
processes = 32
"""


def test_toml_profile_loads_runs_and_lists(home, tmp_path):
    (home / "web.toml").write_text(WEB)
    (home / "pol.yaml").write_text("version: 1\nfilesystem: {write: [/tmp]}\n")
    assert list_profiles() == ["pol", "web"]
    sb = load_profile("web")
    assert sb.max_memory == "256M" and sb.max_processes == 32 and sb.env == {
        "GREETING": "hello"}
    r = sb.run(["/bin/sh", "-c", "echo $GREETING; touch /tmp/ok-$$ && echo wrote; "
                                 "touch /root/no 2>/dev/null || echo refused"], timeout=30)
    assert r.stdout.decode().split() == ["hello", "wrote", "refused"], r.stderr
    assert load_profile("pol").fs_writable[-1] == "/tmp"
    # The CLI runs the profile's [program] when no command is given; a command overrides.
    r = _cli("run", "-p", "web")
    assert r.returncode == 0 and r.stdout.split() == ["hello", "no-write"], r.stderr
    r = _cli("run", "-p", "web", "--", "echo", "mine")
    assert r.stdout == "mine\n"
    r = _cli("profile", "list")
    assert r.stdout.split() == ["pol", "web"]
    r = _cli("profile", "show", "web")
    assert r.returncode == 0 and "[limits]" in r.stdout and 'memory = "256M"' in r.stdout


def test_profile_errors_name_the_file_and_line(home):
    (home / "bad.toml").write_text('name = "x"\n[filesystem]\nread = ["/usr"]\nwrte = ["/t"]\n'
                                   '[gpu]\nx = 1\n[limits]\nmemory = "lots"\n')
    with pytest.raises(PolicyError) as e:
        load_profile("bad")
    text = str(e.value)
    path = home / "bad.toml"
    assert f"{path}:1: unknown field `name`: a key outside any section" in text
    assert f"{path}:4: [filesystem].wrte: unknown field `wrte`" in text
    assert f"{path}:5: unknown field `gpu`: not a section" in text
    with pytest.raises(PolicyError, match="max_memory"):  # the Sandbox's own check
        (home / "mem.toml").write_text('[limits]\nmemory = "lots"\n')
        load_profile("mem")
    with pytest.raises(PolicyError, match="needs a chroot view"):  # refused, not ignored
        (home / "ch.toml").write_text('[filesystem]\nchroot = "/srv"\n')
        load_profile("ch")
    with pytest.raises(PolicyError, match="profile not found"):
        load_profile("nope")
    r = _cli("run", "-p", "bad", "--", "true")
    assert r.returncode == 125 and "bad.toml:4: [filesystem].wrte" in r.stderr


def _wait_for(pred, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = pred()
        if value:
            return value
        time.sleep(0.05)
    return pred()


def test_ps_inspect_kill(home, tmp_path):
    marker = tmp_path / "survived"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # A sandbox whose program leaves a background child: the kill must reach it too.
    run = subprocess.Popen(
        [sys.executable, "-m", "sandlock", "run", "--name", "job1", "-w", str(tmp_path),
         "--", "/bin/sh", "-c", f"(sleep 3; touch {marker}) & sleep 60"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        listed = _wait_for(lambda: "job1" in _cli("ps").stdout)
        assert listed
        rows = [json.loads(x) for x in _cli("ps", "--json").stdout.splitlines()]
        job = next(x for x in rows if x["name"] == "job1")
        assert job["argv"][:2] == ["/bin/sh", "-c"]
        r = _cli("inspect", "job1", "--json")
        policy = json.loads(r.stdout)
        assert str(tmp_path) in policy["fs_writable"], r.stdout
        assert "[filesystem]" in _cli("inspect", "job1", "--toml").stdout
        r = _cli("kill", "job1")
        assert r.returncode == 0, r.stderr
        run.wait(timeout=15)
        assert run.returncode != 0
        assert _wait_for(lambda: "job1" not in _cli("ps").stdout)
        time.sleep(3.5)
        assert not marker.exists()  # the background child was ended with the sandbox
    finally:
        run.kill()
        run.wait()
    r = _cli("kill", "job1")
    assert r.returncode == 125 and "no running sandbox called job1" in r.stderr


def test_registry_never_lists_the_dead_and_refuses_a_foreign_directory(home, tmp_path):
    from sandlock import registry
    d = registry.directory()
    # An entry whose pid lives but started at another time (a reused pid): not listed,
    # removed.
    stale = os.path.join(d, "1.json")
    with open(stale, "w") as f:
        json.dump({"name": "ghost", "root": 1, "pid": 1, "start_time": 12345,
                   "started": 0, "argv": [], "policy": {}}, f)
    sb_names = [e["name"] for e in registry.entries()]
    assert "ghost" not in sb_names and not os.path.exists(stale)
    # Positive control: a live sandbox is listed while it runs, and gone after.
    from conftest import sandbox
    from sandlock import StdioMode
    p = sandbox(name="live1").popen(["sleep", "10"], stdout=StdioMode.NULL)
    try:
        assert [e["name"] for e in registry.entries()] == ["live1"]
    finally:
        p.kill()
        p.wait(timeout=10)
    assert registry.entries() == []
    os.chmod(d, 0o755)  # not private any more: refused, not used
    with pytest.raises(Exception, match="mode 0700"):
        registry.directory()
    os.chmod(d, 0o700)


def test_a_forged_entry_never_makes_kill_signal_another_process(home, tmp_path):
    """A sandbox that can write the registry (same uid) plants an entry naming an
    unrelated process with its true start time (found by review: `sandlock kill` then
    sent it SIGTERM). An entry is believed only for a live sandlock root, child of the
    recorded supervisor."""
    from sandlock import registry
    victim = subprocess.Popen(["sleep", "30"])
    try:
        d = registry.directory()
        forged = {"name": "job9", "root": victim.pid, "pid": victim.pid,
                  "start_time": registry.start_time(victim.pid),
                  "pid_start_time": registry.start_time(victim.pid),
                  "supervisor": os.getpid(),
                  "supervisor_start_time": registry.start_time(os.getpid()),
                  "started": time.time(), "argv": ["x"], "cwd": "/", "policy": {}}
        with open(os.path.join(d, f"{victim.pid}.json"), "w") as f:
            json.dump(forged, f)
        assert "job9" not in _cli("ps").stdout
        for sig in ("TERM", "KILL"):
            r = _cli("kill", "job9", "-s", sig)
            assert r.returncode == 125 and "no running sandbox called job9" in r.stderr
        registry.kill(forged)  # even handed the entry directly
        assert victim.poll() is None  # still running
        # A malformed entry is dropped, and never breaks ps.
        with open(os.path.join(d, "2.json"), "w") as f:
            json.dump({"name": 5, "started": "x"}, f)
        r = _cli("ps")
        assert r.returncode == 0 and not os.path.exists(os.path.join(d, "2.json"))
    finally:
        victim.kill()
        victim.wait()
