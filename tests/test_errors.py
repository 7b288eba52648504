"""Bad input: a one-line error naming the problem, and nothing runs."""

import os
import subprocess
import sys

import pytest

from sandlock import PolicyError, Sandbox

SANDLOCK = [sys.executable, "-m", "sandlock"]


@pytest.mark.parametrize("kwargs, fragment", [
    ({"fs_readable": ["/nonexistent/dir"]}, "fs_readable: /nonexistent/dir does not exist"),
    ({"fs_writable": "/tmp"}, "expected a list of paths"),
    ({"extra_deny_syscalls": ["not_a_syscall"]}, "unknown syscall 'not_a_syscall'"),
    ({"extra_allow_syscalls": ["everything"]}, "'everything' is not an allowable group"),
    ({"net_allow": [":70000"]}, "port 70000 is outside 1-65535"),
    ({"net_allow": [":http"]}, "':http': 'http' is not a port"),
    ({"net_deny": ["example.com"]}, "deny rules take addresses or CIDRs"),
    ({"net_allow": ["*.com:443"]}, "at least two labels"),
    ({"net_allow_unix": ["relative.sock"]}, "must be an absolute path"),
    ({"dns_servers": ["not-an-ip"]}, "dns_servers: 'not-an-ip' is not an address"),
    ({"net_allow": ["*:80,*"]}, "'*' cannot be combined"),
    ({"net_allow": ["ftp://:21"]}, "unknown scheme 'ftp'"),
    ({"net_allow_bind": ["9000-8000"]}, "range 9000-8000 is empty"),
    ({"keep_capabilities": ["CAP_WIZARD"]}, "unknown capability 'CAP_WIZARD'"),
    ({"env": {"A=B": "x"}}, "'A=B' is not a valid variable name"),
    ({"cwd": "/nonexistent/dir"}, "cwd: /nonexistent/dir is not a directory"),
    ({"fs_readable": ["/tmp"], "fs_denied": ["/"]}, "fs_denied / contains the granted path"),
    ({"max_open_files": 0}, "max_open_files"),
])
def test_policy_errors_name_the_problem(kwargs, fragment):
    with pytest.raises(PolicyError) as exc:
        Sandbox(**kwargs)
    msg = str(exc.value)
    assert fragment in msg and "\n" not in msg


@pytest.mark.parametrize("field, value", [
    ("port_remap", {80: 8080}), ("num_cpus", 2),
    ("uid", 1000),
])
def test_fields_of_later_mechanisms_are_refused_not_ignored(field, value):
    with pytest.raises(PolicyError, match=f"{field}=.*does not implement"):
        Sandbox(**{field: value})


def test_missing_kernel_feature_is_an_error_and_nothing_runs(tmp_path):
    marker = tmp_path / "ran"
    code = (f"from sandlock import Sandbox, system_readable\n"
            f"sb = Sandbox(fs_readable=system_readable(), fs_writable=[{str(tmp_path)!r}])\n"
            f"sb.run(['touch', {str(marker)!r}])")
    env = dict(os.environ, SANDLOCK_TEST_LANDLOCK_ABI="3")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and not marker.exists()
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("sandlock.errors.LandlockUnavailableError: kernel lacks")
    assert "Landlock ABI 3" in last and "allow_degraded" in last


def test_allow_degraded_runs_and_says_what_is_lost(tmp_path):
    code = ("from sandlock import Sandbox, system_readable, system_devices\n"
            "sb = Sandbox(fs_readable=system_readable(), fs_writable=system_devices(), "
            "allow_degraded=True)\n"
            "print(sb.degradations); print(sb.run(['echo', 'ran']).stdout)")
    env = dict(os.environ, SANDLOCK_TEST_LANDLOCK_ABI="3")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "no TCP port rules, so all TCP sockets are denied" in r.stdout
    assert "b'ran\\n'" in r.stdout


def test_cli_bad_input_one_line_exit_125_nothing_runs(tmp_path):
    marker = tmp_path / "ran"
    for args in (["-r", "/nonexistent/dir"], ["--net-allow", ":99999"],
                 ["--extra-deny-syscall", "nope"], ["--env", "NOEQUALS"]):
        r = subprocess.run(SANDLOCK + ["run", "-w", str(tmp_path), *args, "--", "touch",
                                       str(marker)], capture_output=True, text=True)
        assert r.returncode == 125, (args, r.stderr)
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("sandlock: error: ")
        assert not marker.exists()
    env = dict(os.environ, SANDLOCK_TEST_LANDLOCK_ABI="5")
    r = subprocess.run(SANDLOCK + ["run", "-w", str(tmp_path), "--", "touch", str(marker)],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 125 and "kernel lacks landlock ABI >= 6" in r.stderr
    assert not marker.exists()
