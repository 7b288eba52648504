"""The CLI service and its C client (sandlock/service/, sandlock/_libexec/sandlock-client.c):
the same results as the in-process CLI, signals, a client or supervisor that dies, who may
use the socket, a stale socket, concurrency; and the CLI test files run through it."""

import os
import signal
import socket
import struct
import subprocess
import sys
import time

import pytest

from conftest import CLIENT, PY

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.skipif(not os.access(CLIENT, os.X_OK),
                                reason="the C client is built by `make helper`")

IN_PROCESS = [sys.executable, "-m", "sandlock"]


def _sock(env):
    return os.path.join(env["XDG_RUNTIME_DIR"], "sandlock", "service.sock")


def _status(env):
    return subprocess.run(IN_PROCESS + ["service", "status"], env=env, capture_output=True,
                          text=True, timeout=30)


def _wait_served(env, timeout=30.0):
    """Until a call is taken by the service (the first call starts one and falls back)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = client(env, "run", "--", "/bin/true", debug=True)
        if "service: accepted" in r.stderr:
            return
        time.sleep(0.2)
    raise AssertionError(f"no service answered: {r.stderr}")


@pytest.fixture
def env(tmp_path):
    run = tmp_path / "xdg"
    run.mkdir(mode=0o700)
    e = dict(os.environ, XDG_RUNTIME_DIR=str(run),
             PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
             SANDLOCK_PYTHON=sys.executable)
    e.pop("SANDLOCK_SERVICE_DEBUG", None)
    yield e
    subprocess.run(IN_PROCESS + ["service", "stop"], env=e, capture_output=True, timeout=30)


def client(env, *args, debug=False, **kw):
    e = dict(env, **({"SANDLOCK_SERVICE_DEBUG": "1"} if debug else {}))
    kw.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.run([CLIENT, *args], env=e, capture_output=True, text=True,
                          timeout=60, **kw)


def in_process(env, *args, **kw):
    kw.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.run(IN_PROCESS + list(args), env=env, capture_output=True, text=True,
                          timeout=60, **kw)


def test_first_call_starts_the_service_and_results_are_the_in_process_cli_s(env, tmp_path):
    assert not os.path.exists(_sock(env))
    r = client(env, "run", "--", "sh", "-c", "echo first", debug=True)
    assert r.stdout == "first\n" and "accepted" not in r.stderr  # ran in-process
    _wait_served(env)
    assert "pid" in _status(env).stdout
    st = os.stat(os.path.dirname(_sock(env)))
    assert st.st_mode & 0o777 == 0o700 and os.stat(_sock(env)).st_mode & 0o077 == 0
    work = tmp_path / "w"
    work.mkdir()
    cases = [
        ("run", "--", "sh", "-c", "echo out; echo err >&2; exit 7"),
        ("run", "--", "sh", "-c", "echo $PWD; echo $SVC_TEST_VAR; umask; kill -TERM $$"),
        ("run", "--", "sh", "-c", "cat /etc/shadow"),        # denied, with its end line
        ("run", "-w", str(work), "--", "sh", "-c", f"echo x > {work}/f; cat {work}/f"),
        ("run", "-t", "0.5", "--", "sleep", "30"),            # 124 and the timeout line
        ("run", "--allow", "bad::spec", "--", "true"),        # a policy error: 125
        ("run", "--", "no-such-command-here"),               # 127
        ("pipe", "--", "printf", "a\\nb\\n", "::", "wc", "-l"),
        ("net-run", "--", "sh", "-c", "cat"),                 # stdin passed through
    ]
    for args in cases:
        kw = {"cwd": str(work), "input": "piped\n", "stdin": None}
        e = dict(env, SVC_TEST_VAR="v1")
        a = in_process(e, *args, **kw)
        b = client(e, *args, **kw)
        assert (b.returncode, b.stdout, b.stderr) == (a.returncode, a.stdout, a.stderr), args
    d = client(dict(env, SVC_TEST_VAR="v2"), *cases[1], debug=True, cwd=str(work))
    assert "service: accepted" in d.stderr and d.stdout == f"{work}\nv2\n0022\n"


def test_signals_reach_the_sandbox_and_a_dead_client_ends_it(env):
    _wait_served(env)
    for sig, expect in ((signal.SIGTERM, 130), (signal.SIGKILL, -signal.SIGKILL)):
        marker = f"{31 + sig / 100:.2f}"
        p = subprocess.Popen([CLIENT, "run", "--", "sleep", marker], env=env,
                             stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert _wait_for(lambda: _running(marker)), "the sandboxed sleep never started"
        p.send_signal(sig)
        assert p.wait(timeout=20) == expect
        assert _wait_for(lambda: not _running(marker)), f"{sig!r} left the sandbox running"
        p.stderr.close()


def test_a_killed_supervisor_ends_the_sandbox_never_lets_it_go_on(env, tmp_path):
    _wait_served(env)
    work = tmp_path / "w"
    work.mkdir()
    script = f"echo before > {work}/before; sleep 2; echo after > {work}/after; chmod 600 {work}/after"
    p = subprocess.Popen([CLIENT, "run", "-w", str(work), "--", "sh", "-c", script], env=env,
                         stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert _wait_for(lambda: (work / "before").exists())
    service = _service_pid(env)
    supervisors = {_ppid(pid) for pid in _pids()} & {pid for pid in _pids()
                                                     if _ppid(pid) == service}
    assert len(supervisors) == 1, "the service supervises the run in a child of its own"
    for pid in supervisors:
        os.kill(pid, signal.SIGKILL)
    assert p.wait(timeout=20) == 125
    assert "ended before it reported" in p.stderr.read()
    time.sleep(2.5)
    assert not (work / "after").exists()  # nothing of it ran on, supervised or not
    # The control: left alone, the same run gets there.
    r = client(env, "run", "-w", str(work), "--", "sh", "-c", script)
    assert r.returncode == 0 and (work / "after").read_text() == "after\n"


def test_another_uid_and_a_confined_client_are_not_served(env):
    _wait_served(env)
    if os.geteuid() == 0:  # only root can be another uid here
        _another_uid_is_refused(env)
    # no_new_privs (as under any Landlock sandbox): the command runs in-process instead.
    r = client(env, "run", "--", "sh", "-c", "grep NoNewPrivs /proc/self/status", debug=True)
    assert "accepted" in r.stderr
    e = dict(env, SANDLOCK_SERVICE_DEBUG="1")
    r = subprocess.run(["setpriv", "--no-new-privs", CLIENT, "run", "--", "echo", "ran"],
                       env=e, capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    assert r.stdout == "ran\n" and "NoNewPrivs (1) differs" in r.stderr, r.stderr


def _another_uid_is_refused(env):
    # As if the directory had been opened up: the service itself still refuses.
    path, opened = _sock(env), []
    d = os.path.dirname(path)
    while d != "/":  # every directory on the way, opened to others for this check
        mode = os.stat(d).st_mode & 0o7777
        if not mode & 0o001:
            opened.append((d, mode))
            os.chmod(d, mode | 0o011)
        d = os.path.dirname(d)
    os.chmod(path, 0o666)
    code = ("import socket, sys\ns = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
            "s.settimeout(10)\ns.connect(sys.argv[1])\n"
            "s.send(b'SLK1' + bytes(4 * 4 + 16 * 16 + 4))\nprint(s.recv(512).decode())")
    try:
        r = subprocess.run([PY, "-c", code, path], user=65534, group=65534,
                           capture_output=True, text=True, timeout=30)
    finally:
        for d, mode in opened:
            os.chmod(d, mode)
    assert "uid 65534" in r.stdout and r.stdout.startswith("F"), (r.stdout, r.stderr)
    r = subprocess.run([sys.executable, "-c", code, path], capture_output=True,
                       text=True, timeout=30)  # the control: the same bytes from the owner
    assert "malformed" in r.stdout and "uid" not in r.stdout, r.stdout


def test_a_stale_socket_is_replaced(env):
    path = _sock(env)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    stale.bind(path)
    stale.close()  # the file stays, nobody listens: ECONNREFUSED
    r = client(env, "run", "--", "echo", "still runs")
    assert r.stdout == "still runs\n"
    _wait_served(env)


def test_twenty_concurrent_calls(env):
    _wait_served(env)
    procs = [subprocess.Popen([CLIENT, "run", "--", "sh", "-c", f"echo {i}; exit {i % 7}"],
                              env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(20)]
    for i, p in enumerate(procs):
        out, err = p.communicate(timeout=60)
        assert (p.returncode, out) == (i % 7, f"{i}\n"), err


def test_the_cli_test_files_pass_through_the_service(env):
    """The CLI's own tests, with `sandlock` being the C client and the service."""
    _wait_served(env)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        os.path.join(ROOT, "tests", "test_cli.py"),
                        os.path.join(ROOT, "tests", "test_cli_polish.py")],
                       env=dict(env, SANDLOCK_TEST_CLI="service"), cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "passed" in r.stdout and "failed" not in r.stdout


# -- helpers -------------------------------------------------------------------------------

def _wait_for(cond, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


def _pids():
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _ppid(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def _running(marker):
    for pid in _pids():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read() == b"sleep\0" + marker.encode() + b"\0":
                    return True
        except OSError:
            pass
    return False


def _service_pid(env):
    out = _status(env).stdout
    return int(out.split("pid ", 1)[1].split()[0])
