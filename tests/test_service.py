"""The CLI service and its C client (sandlock/service/, sandlock/_libexec/sandlock-client.c):
the same results as the in-process CLI, signals, a client or supervisor that dies, who may
use the socket, a stale socket, concurrency; and the CLI test files run through it."""

import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid

import pytest

from conftest import CLIENT, PY
from test_explain import kernel_audit  # noqa: F401 (a fixture)

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
    _stop(e)


def _stop(env) -> None:
    """What `service stop` asks the service (SIGTERM), sent to the holder of its lock:
    without a Python start per test (~0.2 s each, ~50 tests)."""
    import fcntl
    try:
        fd = os.open(os.path.join(env["XDG_RUNTIME_DIR"], "sandlock", "service.lock"),
                     os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return
    try:
        held = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 0, 0, 0))
        kind, _, _, _, pid = struct.unpack("hhqqi4x", held)
        if kind == fcntl.F_WRLCK and pid > 0:
            os.kill(pid, signal.SIGTERM)
    finally:
        os.close(fd)


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


@pytest.mark.parametrize("mode", ["service", "in-process"])
def test_a_hangup_ends_a_net_run_and_leaves_nothing_in_the_caller_s_tmpdir(env, tmp_path,
                                                                           mode):
    """SIGHUP (a terminal closed, an ssh session gone) had the default action: the CLI (or
    the service's child) died at once, its sandbox killed by its death signal, and the
    private TMPDIR left in the caller's. Now it ends the run as SIGTERM does: status 129,
    the sandbox ended, its TMPDIR removed. Even before the program runs."""
    caller = tmp_path / "caller"
    caller.mkdir()
    e = dict(env, TMPDIR=str(caller), XDG_STATE_HOME=str(tmp_path / "state"))
    if mode == "service":
        _wait_served(e)
    else:
        e["SANDLOCK_SERVICE"] = "0"
    for delay in (None, 0.0):  # once the program runs; as early as the signal can come
        marker = f"{40 + (delay is None) / 100:.2f}"
        p = subprocess.Popen([CLIENT, "net-run", "--", "sleep", marker], env=e,
                             stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
        if delay is None:
            assert _wait_for(lambda: _running(marker)), "the sandboxed sleep never started"
        else:
            time.sleep(delay)
        p.send_signal(signal.SIGHUP)
        code = p.wait(timeout=20)
        p.stderr.close()
        # as early as it can come, the signal may find the CLI not started yet (-1)
        assert code in ((128 + signal.SIGHUP,) if delay is None else
                        (128 + signal.SIGHUP, -signal.SIGHUP)), code
        assert _wait_for(lambda: not _running(marker)), "SIGHUP left the sandbox running"
        assert _wait_for(lambda: list(caller.iterdir()) == [], 5), list(caller.iterdir())


@pytest.mark.parametrize("mode", ["service", "in-process"])
def test_sigterm_then_sighup_end_the_run_once(env, mode):
    """systemd's stop (SendSIGHUP=yes): SIGTERM then SIGHUP at once. Through the service
    the run hung until its program ended: the relayed signals were taken by the relay
    thread, the main one stayed in its wait; in-process the second one broke the first
    one's cleanup with a traceback (review)."""
    e = dict(env)
    if mode == "service":
        _wait_served(e)
    else:
        e["SANDLOCK_SERVICE"] = "0"
    for i, pair in enumerate(((signal.SIGTERM, signal.SIGHUP),
                              (signal.SIGINT, signal.SIGTERM))):  # Ctrl-C, then a stop
        marker = f"{42 + (mode == 'service') / 100 + i / 1000:.3f}"
        p = subprocess.Popen([CLIENT, "run", "--", "sleep", marker], env=e,
                             stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             preexec_fn=lambda: [signal.signal(s, signal.SIG_DFL) for s in
                                                 (signal.SIGHUP, signal.SIGINT)])
        assert _wait_for(lambda: _running(marker)), "the sandboxed sleep never started"
        for sig in pair:
            p.send_signal(sig)
        try:
            code = p.wait(timeout=15)
        finally:
            p.kill()
        err = p.stderr.read().decode()
        p.stderr.close()
        # whichever is taken first ends it (pending together, the lower number comes first)
        assert code in (129, 130) and "Traceback" not in err, (pair, code, err)
        assert _wait_for(lambda: not _running(marker)), "the sandbox went on"


def test_a_signal_during_the_workspace_commit_waits_for_its_end(env, tmp_path):
    """SIGHUP (or SIGTERM) while the workdir's changes were applied raised inside the
    commit: the workdir was left half-applied (473 of 3,000 files) under a summary saying
    "3000 change(s) applied", or an AttributeError (review). The commit now ends first;
    the run then ends as the signal says."""
    work = tmp_path / "w"
    work.mkdir()
    e = dict(env, SANDLOCK_SERVICE="0")
    n = 2000
    p = subprocess.Popen([CLIENT, "run", "--workdir", str(work), "--", "sh", "-c",
                          f"for i in $(seq {n}); do echo $i > f$i; done; echo written >&2"],
                         env=e, cwd=str(work), stdin=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    assert p.stderr.readline().strip() == "written"
    time.sleep(0.05)  # the program has ended: its changes are being applied
    p.send_signal(signal.SIGHUP)
    err = p.stderr.read()
    assert p.wait(timeout=60) == 129, err
    assert len(os.listdir(work)) == n and "Traceback" not in err, err
    assert f"{n} change(s) applied" in err


def test_a_killed_supervisor_ends_the_sandbox_never_lets_it_go_on(env, tmp_path):
    _wait_served(env)
    work = tmp_path / "w"
    work.mkdir()
    script = f"echo before > {work}/before; sleep 2; echo after > {work}/after; chmod 600 {work}/after"
    p = subprocess.Popen([CLIENT, "run", "-w", str(work), "--", "sh", "-c", script], env=env,
                         stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert _wait_for(lambda: (work / "before").exists())
    service = _service_pid(env)
    supervisors = set()
    for pid in _pids():  # the sandboxed sh, up to the child of the service above it
        if _cmdline(pid) == ["sh", "-c", script]:
            while pid > 1 and _ppid(pid) != service:
                pid = _ppid(pid)
            supervisors.add(pid)
    assert len(supervisors) == 1 and _ppid(min(supervisors)) == service, \
        "the service supervises the run in a child of its own"
    for pid in supervisors:
        os.kill(pid, signal.SIGKILL)
    assert p.wait(timeout=20) == 125
    assert "ended before it reported" in p.stderr.read()
    time.sleep(2.5)
    assert not (work / "after").exists()  # nothing of it ran on, supervised or not
    # The control: left alone, the same run gets there.
    r = client(env, "run", "-w", str(work), "--", "sh", "-c", script)
    assert r.returncode == 0 and (work / "after").read_text() == "after\n"


# A client speaking the protocol itself: connects (from a thread if asked), sends a run
# request with its own stdin/stdout/stderr/cwd, says "go" if accepted, prints each reply.
RAW = r"""
import os, socket, struct, sys, threading
def request(path, argv):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(20)
    s.connect(path)
    body = b"SLK1" + struct.pack("<II", 1, len(argv)) + b"".join(a.encode() + b"\0" for a in argv)
    body += struct.pack("<I", 0)
    cwd = os.open(".", os.O_PATH)
    try:
        s.sendmsg([body], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                            struct.pack("4i", 0, 1, 2, cwd))])
    except (BrokenPipeError, ConnectionResetError):
        pass  # refused (and closed) before the request went: the refusal is queued
    replies = [s.recv(512)]
    if replies[0] == b"A":
        s.send(b"G")
        replies.append(s.recv(512))
    print(replies, flush=True)
def confined_thread(path, argv):
    import ctypes
    ctypes.CDLL(None).prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS, this thread only
    request(path, argv)
mode, path, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
if mode == "thread":
    t = threading.Thread(target=confined_thread, args=(path, argv)); t.start(); t.join()
else:
    request(path, argv)
"""


def test_another_uid_and_a_confined_client_are_not_served(env, tmp_path):
    _wait_served(env)
    if os.geteuid() == 0:  # only root can be another uid here
        _another_uid_is_refused(env)
    # no_new_privs (as under any Landlock sandbox): the command runs in-process instead,
    # the client not even asking (nor starting a service that would inherit it).
    r = client(env, "run", "--", "sh", "-c", "grep NoNewPrivs /proc/self/status", debug=True)
    assert "accepted" in r.stderr
    e = dict(env, SANDLOCK_SERVICE_DEBUG="1")
    r = subprocess.run(["setpriv", "--no-new-privs", CLIENT, "run", "--", "echo", "ran"],
                       env=e, capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    assert r.stdout == "ran\n" and "this process is confined" in r.stderr, r.stderr
    # A process speaking the protocol itself gets the same answer from the service.
    flag = tmp_path / "ran"
    argv = ["run", "-w", str(tmp_path), "--", "touch", str(flag)]
    r = subprocess.run(["setpriv", "--no-new-privs", sys.executable, "-c", RAW, "process",
                        _sock(env), *argv], capture_output=True, text=True, timeout=60)
    assert "NoNewPrivs (1) differs" in r.stdout and not flag.exists(), (r.stdout, r.stderr)
    # The attack: one thread confined (no_new_privs, a Landlock domain, a seccomp filter
    # are all per thread), the leader not; /proc/PID/status shows the leader's.
    r = subprocess.run([sys.executable, "-c", RAW, "thread", _sock(env), *argv],
                       capture_output=True, text=True, timeout=60)
    assert "not a single live thread" in r.stdout and not flag.exists(), (r.stdout, r.stderr)
    # Nor a process that is not the client (the client only ever connects for itself).
    r = subprocess.run([sys.executable, "-c", RAW, "process", _sock(env), *argv],
                       capture_output=True, text=True, timeout=60)
    assert "does not run the sandlock client" in r.stdout and not flag.exists(), r.stdout
    # The control: the same request from the client runs.
    r = client(env, *argv, debug=True)
    assert "accepted" in r.stderr and flag.exists(), r.stderr


def test_a_sandbox_cannot_reach_the_service_through_its_supervisor(env, tmp_path):
    """The attack: a sandbox granted unix sockets beneath the service's directory (a grant
    of $XDG_RUNTIME_DIR for a desktop's sockets) connects; its supervisor performs the
    connect() on its behalf, so the connection carries the supervisor's credentials — an
    unconfined process of the user's. The service must still refuse to run its command."""
    _wait_served(env)
    flag = tmp_path / "escaped"
    raw = tmp_path / "raw.py"
    raw.write_text(RAW)
    argv = ["run", "-w", str(tmp_path), "--", "touch", str(flag)]
    r = in_process(dict(env, SANDLOCK_SERVICE="0"), "run", "-r", str(raw), "--net-allow-unix",
                   env["XDG_RUNTIME_DIR"], "--", sys.executable, str(raw), "process",
                   _sock(env), *argv)
    assert r.stdout.startswith("[b'F") and not flag.exists(), (r.stdout, r.stderr)
    assert "malformed" not in r.stdout  # refused for who it is, not for how it asked
    # The control: the grant does reach the socket (the service answered the sandbox).
    assert "b'F" in r.stdout and "Permission denied" not in r.stderr


@pytest.mark.parametrize("threads", [1, 3])
def test_an_impostor_socket_gets_nothing(env, tmp_path, threads):
    """A sandbox allowed to write the service's directory puts its own socket there: the
    next caller's environment, stdin and terminal must not reach it. Single-threaded, the
    sandbox listens itself (a confined listener); multi-threaded, its supervisor listens
    for it (an unconfined process of the user's, which holds no service lock)."""
    _wait_served(env)
    d = os.path.dirname(_sock(env))
    got = tmp_path / "got"
    impostor = ("import os, socket, sys, threading, time\n"
                f"for _ in range({threads} - 1):\n"
                "    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
                "p = sys.argv[1]\nos.unlink(p)\n"
                "s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\ns.bind(p)\n"
                "s.listen(8)\nprint('listening', flush=True)\ns.settimeout(30)\n"
                "c, _ = s.accept()\nc.settimeout(5)\n"
                "data = b''\n"
                "try:\n    data = c.recv(1 << 20)\nexcept OSError:\n    pass\n"
                "open(sys.argv[2], 'wb').write(data)\n")
    sb = subprocess.Popen(IN_PROCESS + ["run", "-w", d, "-w", str(tmp_path), "--",
                                        sys.executable, "-c", impostor, _sock(env), str(got)],
                          env=dict(env, SANDLOCK_SERVICE="0"), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    try:
        assert sb.stdout.readline() == "listening\n", sb.stderr.read()
        r = client(dict(env, SVC_SECRET="hunter2"), "run", "--", "echo", "ran", debug=True)
        why = "confined otherwise" if threads == 1 else "does not hold the service's lock"
        assert r.stdout == "ran\n" and why in r.stderr, r.stderr
        # It was connected to (and so could have been handed everything), and got nothing.
        assert sb.wait(timeout=30) == 0
        assert got.read_bytes() == b""
    finally:
        sb.kill()
        sb.wait()
    # The real service noticed its socket gone and left; a new one serves the next calls.
    _wait_served(env)


@pytest.fixture
def jail(tmp_path):
    """A chroot of the system's directories (bind mounts), /tmp and /proc included, whose
    root is not the service's."""
    if os.geteuid() != 0:
        pytest.skip("chroot and bind mounts need root")
    root = tmp_path / "jail"
    mounted = []
    try:
        for d in ("usr", "lib", "lib64", "bin", "etc", "proc", "tmp"):
            if not os.path.isdir("/" + d) or os.path.islink("/" + d):
                if os.path.islink("/" + d):
                    os.makedirs(root, exist_ok=True)
                    os.symlink(os.readlink("/" + d), root / d)
                continue
            (root / d).mkdir(parents=True)
            subprocess.run(["mount", "--bind", "/" + d, str(root / d)], check=True)
            mounted.append(root / d)
        yield root
    finally:
        for m in reversed(mounted):
            subprocess.run(["umount", "-l", str(m)])


def test_a_chrooted_process_neither_uses_nor_impersonates_the_service(env, jail, tmp_path):
    """A jail (chroot) is a confinement /proc/PID/status does not show: a jailed caller
    must not have the service run its command outside the jail, and a jailed process
    must not pass for the service to a caller outside it."""
    _wait_served(env)
    client_copy = tmp_path / "client"
    client_copy.write_bytes(open(CLIENT, "rb").read())
    client_copy.chmod(0o755)
    secret = tmp_path / "outside"
    secret.write_text("host only\n")
    e = dict(env, SANDLOCK_SERVICE_DEBUG="1")
    r = subprocess.run(["chroot", str(jail), str(client_copy), "run", "--", "true"], env=e,
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert "another root directory" in r.stderr and "accepted" not in r.stderr, r.stderr
    # The impostor: jailed, it takes the lock and the socket.
    d = os.path.dirname(_sock(env))
    got = tmp_path / "got"
    impostor = ("import fcntl, os, socket, sys\nd, got = sys.argv[1], sys.argv[2]\n"
                "os.unlink(d + '/service.lock')\n"
                "lock = os.open(d + '/service.lock', os.O_RDWR | os.O_CREAT, 0o600)\n"
                "fcntl.lockf(lock, fcntl.LOCK_EX)\nos.unlink(d + '/service.sock')\n"
                "s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
                "s.bind(d + '/service.sock')\ns.listen(8)\nprint('listening', flush=True)\n"
                "s.settimeout(30)\nc, _ = s.accept()\nc.settimeout(5)\ndata = b''\n"
                "try:\n    data = c.recv(1 << 20)\nexcept OSError:\n    pass\n"
                "open(got, 'wb').write(data)\n")
    p = subprocess.Popen(["chroot", str(jail), "/usr/bin/python3", "-c", impostor, d,
                          str(got)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "listening\n"
        r = client(dict(env, SVC_SECRET="hunter2"), "run", "--", "echo", "ran", debug=True)
        assert r.stdout == "ran\n" and "another root directory" in r.stderr, r.stderr
        assert p.wait(timeout=30) == 0 and got.read_bytes() == b""
    finally:
        p.kill()
        p.wait()
    _wait_served(env)


def test_the_command_gets_the_caller_s_attributes_not_the_service_s(env):
    """Limits, nice value, umask, OOM score, execution domain, ignored and blocked
    signals: what the caller has (read from the kernel, not from what the client says),
    as in-process."""
    _wait_served(env)
    show = ("ulimit -Hn; ulimit -Sn; umask; nice; cat /proc/self/oom_score_adj; "
            "cat /proc/self/personality; grep -E '^Sig(Ign|Blk)' /proc/self/status")
    show += "; chrt -p $$ | sed 's/.*: //'"
    # blocked by the kernel's call, with glibc's 32 and 33 (never blocked in a child)
    block = ("import ctypes, os, signal, sys\n"
             "m = ctypes.c_uint64(3 << 31 | 1 << (signal.SIGUSR2 - 1) | "
             "1 << (signal.SIGWINCH - 1))\n"
             "ctypes.CDLL(None).syscall(14, 0, ctypes.byref(m), None, 8)\n"
             "os.execvp(sys.argv[1], sys.argv[1:])")
    wrap = ("ulimit -Sn 200; ulimit -Hn 300; umask 027; trap '' HUP INT TERM USR1; "
            "echo 150 > /proc/self/oom_score_adj; "
            f"exec chrt --idle 0 setarch $(uname -m) -R nice -n 3 {sys.executable} -c "
            f"'{block}' \"$@\" run -- bash -c \"{show}\"")  # dash clears the mask
    a = subprocess.run(["sh", "-c", wrap, "sh", *IN_PROCESS], env=env, capture_output=True,
                       text=True, timeout=60, stdin=subprocess.DEVNULL)
    b = subprocess.run(["sh", "-c", wrap, "sh", CLIENT], capture_output=True, text=True,
                       env=dict(env, SANDLOCK_SERVICE_DEBUG="1"), timeout=60,
                       stdin=subprocess.DEVNULL)
    assert "service: accepted" in b.stderr
    nice = str(min(os.getpriority(os.PRIO_PROCESS, 0) + 3, 19))  # the suite's own, + 3
    assert a.stdout.split("\n")[:6] == ["300", "200", "0027", nice, "150", "00040000"], \
        a.stdout
    assert "SCHED_IDLE" in a.stdout
    ignored = int(a.stdout.split("SigIgn:")[1].split()[0], 16)
    trapped = sum(1 << (sig - 1) for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM,
                                             signal.SIGUSR1))
    assert ignored & trapped == trapped, a.stdout
    blocked = int(a.stdout.split("SigBlk:")[1].split()[0], 16)
    assert blocked == 1 << (signal.SIGUSR2 - 1) | 1 << (signal.SIGWINCH - 1), a.stdout
    assert (b.returncode, b.stdout) == (a.returncode, a.stdout)
    assert "Warning" not in b.stderr, b.stderr  # the service took the mask without a word
    # What the service would not carry over (here MDWE: no memory both writable and
    # executable, which the caller cannot undo) makes the client run in-process.
    mdwe = ("import ctypes, os, sys\nctypes.CDLL(None).prctl(65, 1, 0, 0, 0)\n"
            "os.execv(sys.argv[1], sys.argv[1:])")
    show = "python3 -c 'import ctypes; print(ctypes.CDLL(None).prctl(66, 0, 0, 0, 0))'"
    a = subprocess.run([sys.executable, "-c", mdwe, sys.executable, "-m", "sandlock", "run",
                        "--", "sh", "-c", show], env=env, capture_output=True, text=True,
                       timeout=60, stdin=subprocess.DEVNULL)
    b = subprocess.run([sys.executable, "-c", mdwe, CLIENT, "run", "--", "sh", "-c", show],
                       env=dict(env, SANDLOCK_SERVICE_DEBUG="1"), capture_output=True,
                       text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert a.stdout == "1\n" and b.stdout == a.stdout, (a.stdout, b.stdout, b.stderr)
    assert "this process is confined" in b.stderr


def test_a_sandbox_cannot_tie_up_the_service(env):
    """Connections from a confined process are answered (refused) at once, not held: the
    service's children stay few and a caller is still served meanwhile."""
    from sandlock.service.server import SPARE
    _wait_served(env)
    service = _service_pid(env)
    assert _wait_for(lambda: len([p for p in _pids() if _ppid(p) == service]) == SPARE)
    time.sleep(1.0)  # the spares' warm-up runs are over
    spares = {p for p in _pids() if _ppid(p) == service}
    hog = ("import socket, sys, time\nheld = []\n"
           "for _ in range(150):\n"
           "    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
           "    s.connect(sys.argv[1]); held.append(s)\n"
           "print('holding', flush=True)\ntime.sleep(30)\n")
    sb = subprocess.Popen(IN_PROCESS + ["run", "--net-allow-unix", env["XDG_RUNTIME_DIR"],
                                        "--", sys.executable, "-c", hog, _sock(env)],
                          env=dict(env, SANDLOCK_SERVICE="0"), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    try:
        assert sb.stdout.readline() == "holding\n", sb.stderr.read()
        time.sleep(0.5)
        children = [p for p in _pids() if _ppid(p) == service]
        assert len(children) <= 20, f"{len(children)} children serve one sandbox's sockets"
        # A refused connection costs no warmed child: the spares that refused them are
        # the ones that were there before (no replacement was forked and warmed).
        assert set(children) <= spares, "refused connections used up the warmed children"
        r = client(env, "run", "--", "echo", "served", debug=True)
        assert r.stdout == "served\n" and "accepted" in r.stderr, r.stderr
    finally:
        sb.kill()
        sb.wait()


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
            "s.send(b'SLK1' + bytes(12) + b'x')\nprint(s.recv(512).decode())")
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


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode() for a in f.read().split(b"\0")[:-1]]
    except OSError:
        return []


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


def test_without_xdg_runtime_dir_the_service_lives_in_tmp(env):
    """Without $XDG_RUNTIME_DIR: /tmp/sandlock-service-UID, even where /tmp/sandlock-UID
    exists as the fallback HOME Sandlock's registry makes (mode 0755: never the service's)."""
    e = {k: v for k, v in env.items() if k != "XDG_RUNTIME_DIR"}
    os.makedirs(f"/tmp/sandlock-{os.geteuid()}", mode=0o755, exist_ok=True)
    try:
        _wait_served(e)
        d = f"/tmp/sandlock-service-{os.geteuid()}"
        assert os.stat(d).st_mode & 0o777 == 0o700 and os.path.exists(d + "/service.sock")
    finally:
        subprocess.run(IN_PROCESS + ["service", "stop"], env=e, capture_output=True,
                       timeout=30)


def _state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "X"


def test_the_spare_a_call_used_is_replaced_when_it_ends_not_during_the_next(env):
    """A spare warms itself with a sandbox run, which takes a CPU: the service replaces the
    one a call used as soon as that call ends, so that the next call (an agent's next
    command) finds SPARE warm spares and nothing warming beside it. Before, the end was
    seen only at the next call or after up to a second."""
    from sandlock.service.server import SPARE
    _wait_served(env)
    service = _service_pid(env)

    def live_children():
        return [p for p in _pids() if _ppid(p) == service and _state(p) not in "ZX"]
    assert _wait_for(lambda: len(live_children()) == SPARE)
    before = set(live_children())
    r = client(env, "run", "--", "/bin/true", debug=True)
    assert r.returncode == 0 and "service: accepted" in r.stderr
    ended = time.monotonic()
    assert _wait_for(lambda: len(live_children()) == SPARE
                     and set(live_children()) != before, timeout=5.0)
    assert time.monotonic() - ended < 0.25  # woken by the child's end, not a timer


def test_service_stop_takes_effect_at_once(env):
    """`service stop` ends the service as it answers, not at its next wakeup (up to a
    second later, when a call arriving meanwhile was still served by it)."""
    _wait_served(env)
    service = _service_pid(env)
    r = in_process(env, "service", "stop")
    assert r.returncode == 0 and "stopped" in r.stdout
    stopped = time.monotonic()
    assert _wait_for(lambda: _state(service) in "ZX", timeout=5.0)
    assert time.monotonic() - stopped < 0.3
    assert not os.path.exists(_sock(env))


# The client's "go" (its only send(2), a sendto) held back 3 s, past the service's wait
# for it (REPLY_WAIT), then lost (EPIPE); the client is static: LD_PRELOAD never reaches it.
LATE_GO = ["strace", "-qq", "-o", "/dev/null", "-e", "trace=sendto",
           "-e", "inject=sendto:delay_enter=3000000:error=EPIPE"]


def test_a_client_whose_go_never_comes_has_its_command_run_once_by_itself(env, tmp_path):
    """The service runs nothing before the client's "go": a client that gave up (here its
    "go" is held back 3 s, then lost) runs the command in-process, and the service never
    does (once, not twice). The control: the same client, its go sent, is served."""
    _wait_served(env)
    marks = tmp_path / "marks"
    marks.mkdir()
    cmd = [CLIENT, "run", "-w", str(marks), "--", "sh", "-c", f"echo $$ >> {marks}/ran"]
    start = time.monotonic()
    r = subprocess.run(LATE_GO + cmd, env=dict(env, SANDLOCK_SERVICE_DEBUG="1"), text=True,
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "service: accepted" in r.stderr, r.stderr  # it got that far, then fell back
    assert time.monotonic() - start > 2.9  # the go held back, past the service's wait
    assert "prepared sandbox" not in r.stderr, r.stderr  # what a served call says
    time.sleep(0.5)
    assert len((marks / "ran").read_text().split()) == 1, "the command ran twice"
    r = subprocess.run(cmd, env=dict(env, SANDLOCK_SERVICE_DEBUG="1"), text=True,
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    assert r.returncode == 0 and "prepared sandbox" in r.stderr, r.stderr  # the control
    assert len((marks / "ran").read_text().split()) == 2


def test_a_net_run_whose_go_never_comes_leaves_no_private_tmp(env, tmp_path):
    """A net-run call that uses a sandbox built ahead makes its private TMPDIR's root while
    the client's "go" is on its way (prepared.check_early). A go that never comes removes
    it: the serving child ends with os._exit, which runs no finalizer. The control: the
    root is there while the service waits for the go (the client is held back 3 s)."""
    caller, work = tmp_path / "caller", tmp_path / "work"
    caller.mkdir()
    work.mkdir()
    env = dict(env, TMPDIR=str(caller), XDG_STATE_HOME=str(tmp_path),
               SANDLOCK_SERVICE_DEBUG="1")
    _wait_served(env)
    cmd = [CLIENT, "net-run", "--", "sh", "-c", f"echo $$ >> {work}/ran"]

    def call(late=()):
        return subprocess.Popen([*late, *cmd], env=env, cwd=work, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while "prepared sandbox used" not in call().communicate(timeout=60)[1]:
        assert time.monotonic() < deadline
        time.sleep(0.3)
    for attempt in range(3):  # until a spare had built it ahead again (slow machines)
        time.sleep(0.5 + attempt)
        ran = len((work / "ran").read_text().split())
        p, seen, start = call(LATE_GO), set(), time.monotonic()
        while time.monotonic() - start < 1.5:  # the service waits 2 s for the go
            seen.update(caller.iterdir())
            time.sleep(0.02)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0 and "service: accepted" in err, err  # then in-process
        assert "prepared sandbox" not in err, err
        assert list(caller.iterdir()) == []
        assert len((work / "ran").read_text().split()) == ran + 1  # once, not twice
        if seen:
            break
    assert [x.name.startswith("sandlock-tmp-") for x in seen] == [True], (seen, err)


def _served(env, *args):
    r = client(env, *args, debug=True)
    assert r.returncode == 0 and "service: accepted" in r.stderr, r.stderr
    return r


def test_a_service_killed_outright_leaves_no_cover_file_behind(env, tmp_path):
    """The empty file hidden files are covered with lives in the service's own directory,
    and the next service replaces what one killed with SIGKILL left there; before, each
    such service left a sandlock-hidden-* directory in its TMPDIR for good. Hidden files
    stay hidden through the new one (the control: a readable file beside them is read)."""
    tmp, home = tmp_path / "tmp", tmp_path / "home"
    tmp.mkdir()
    home.mkdir()
    (home / "notes.txt").write_text("public notes\n")
    (home / ".netrc").write_text("machine example.com password SECRET\n")
    env = dict(env, TMPDIR=str(tmp), HOME=str(home))
    cover = os.path.join(env["XDG_RUNTIME_DIR"], "sandlock", "hidden", "hidden")
    _wait_served(env)
    first = os.stat(cover)
    assert first.st_mode & 0o777 == 0 and first.st_size == 0
    left = os.path.join(os.path.dirname(cover), "left")
    open(left, "w").close()  # stands for what a service killed outright leaves there
    pid = _service_pid(env)
    os.kill(pid, signal.SIGKILL)
    assert _wait_for(lambda: _state(pid) in "ZX", timeout=10.0)
    _wait_served(env)
    assert _service_pid(env) != pid
    assert os.stat(cover).st_mode & 0o777 == 0 and not os.path.exists(left)  # replaced
    assert [p.name for p in tmp.iterdir()] == [], list(tmp.iterdir())
    for name, readable in (("notes.txt", True), (".netrc", False)):
        r = client(env, "run", "-r", str(home), "--", "cat", str(home / name), debug=True)
        assert "service: accepted" in r.stderr, r.stderr
        assert (r.returncode == 0) == readable and "SECRET" not in r.stdout, r.stdout
    subprocess.run(IN_PROCESS + ["service", "stop"], env=env, capture_output=True, timeout=30)
    # removed by a service that stops
    assert _wait_for(lambda: not os.path.exists(os.path.dirname(cover)), timeout=10.0)


def test_a_prepared_sandbox_is_used_only_while_what_it_read_is_unchanged(env, tmp_path):
    """A spare builds the last call's sandbox ahead (service/prepared.py). A call with the
    same inputs gets it — while nothing its build read has changed: a secret created in
    the home since is hidden all the same (a stale plan would grant it with the home);
    another environment is another build."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("public notes\n")
    env = dict(env, HOME=str(home))
    flags = ("run", "-r", str(home), "--")
    deadline, used = time.monotonic() + 30, 0
    # Every call has these inputs (the first starts the service), so every spare prepares
    # them; twice in a row: the spares are warm and have prepared.
    while used < 2:
        r = client(env, *flags, "cat", str(home / "notes.txt"), debug=True)
        assert r.stdout == "public notes\n", r.stderr
        used = used + 1 if "prepared sandbox used" in r.stderr else 0
        assert time.monotonic() < deadline, r.stderr
        time.sleep(0.3)
    time.sleep(1.0)  # they have warmed up and prepared this call's sandbox
    (home / ".netrc").write_text("machine example.com password SECRET\n")
    r = client(env, *flags, "cat", str(home / ".netrc"), debug=True)
    assert "SECRET" not in r.stdout and r.returncode != 0, (r.stdout, r.stderr)
    assert ("prepared sandbox not used: a directory it read changed "
            f"({home / '.netrc'})") in r.stderr, r.stderr  # where, for the user
    time.sleep(1.0)
    r = client(dict(env, OTHER="1"), *flags, "cat", str(home / "notes.txt"), debug=True)
    assert r.stdout == "public notes\n", r.stderr
    assert "prepared sandbox not used: another environment" in r.stderr, r.stderr


def test_a_prepared_sandbox_follows_the_command_s_toolchain_not_its_arguments(env, tmp_path):
    """A sandbox is built ahead from the call's options and its command's name: what the
    command's toolchain is (sandlock.toolchain: its `#!` interpreter's installation,
    granted) was read from files while building. Another argument is the same build; a
    script whose interpreter changed since is another: a stale build would lack the new
    interpreter's grant, and the script would not run. (Installations in the home are
    granted; the rest of the home is not.)"""
    home = tmp_path / "home"
    env = dict(env, HOME=str(home))
    for tree in ("a", "b"):
        (home / tree / "bin").mkdir(parents=True)
        shutil.copy(os.path.realpath("/bin/sh"), home / tree / "bin" / "sh")
    (home / "work" / "bin").mkdir(parents=True)
    script = home / "work" / "bin" / "tool"
    script.write_text(f"#!{home}/a/bin/sh\necho from-$1\n")
    script.chmod(0o755)
    deadline, used, n = time.monotonic() + 30, 0, 0
    while used < 2:  # every call another argument: built ahead all the same
        n += 1
        r = client(env, "run", "--", str(script), str(n), debug=True)
        assert r.stdout == f"from-{n}\n", r.stderr
        used = used + 1 if "prepared sandbox used" in r.stderr else 0
        assert time.monotonic() < deadline, r.stderr
        time.sleep(0.3)
    time.sleep(1.0)  # the spares have prepared it again
    script.write_text(f"#!{home}/b/bin/sh\necho from-$1\n")  # the same inode
    r = client(env, "run", "--", str(script), "new", debug=True)
    assert r.returncode == 0 and r.stdout == "from-new\n", r.stderr
    assert f"prepared sandbox not used: {script} changed" in r.stderr, r.stderr
    (home / "b" / "bin" / "sh").unlink()  # control: b's interpreter is what ran
    r = client(env, "run", "--", str(script), "gone")
    assert r.returncode != 0 and "from-" not in r.stdout, r.stderr


def test_another_command_takes_a_sandbox_built_ahead_only_with_the_same_grants(env, tmp_path):
    """An agent's calls are mostly other commands each time: a sandbox built ahead for one
    command serves another whose toolchain grants (sandlock.toolchain) are the same —
    system programs, most of them — and never one whose grants differ, either way: a
    command that needs a grant the build lacks, or one that would get a grant its own
    build would not give (the build's command's installation in the home)."""
    home = tmp_path / "home"
    env = dict(env, HOME=str(home))
    (home / "a" / "bin").mkdir(parents=True)
    shutil.copy(os.path.realpath("/bin/sh"), home / "a" / "bin" / "sh")
    (home / "a" / "data.txt").write_text("tool-data\n")
    (home / "work" / "bin").mkdir(parents=True)
    tool = home / "work" / "bin" / "tool"
    tool.write_text(f"#!{home}/a/bin/sh\ncat {home}/a/data.txt\n")
    tool.chmod(0o755)
    data = str(home / "a" / "data.txt")
    _until_prepared(env, "run", "--", "echo", "x", expect="x\n")
    r = client(env, "run", "--", "printf", "%s-%s\\n", "another", "command", debug=True)
    assert r.returncode == 0 and r.stdout == "another-command\n", r.stderr
    assert "prepared sandbox used" in r.stderr, r.stderr  # system programs: the same grants
    time.sleep(1.0)
    # Built for printf: the tool needs its interpreter's installation, which it lacks.
    r = client(env, "run", "--", str(tool), debug=True)
    assert r.returncode == 0 and r.stdout == "tool-data\n", r.stderr
    assert "not used: another command, whose toolchain grants differ" in r.stderr, r.stderr
    # Built for the tool (home/a granted, its data readable to it): cat is not given that.
    _until_prepared(env, "run", "--", str(tool), expect="tool-data\n")
    r = client(env, "run", "--", "cat", data, debug=True)
    assert "not used: another command, whose toolchain grants differ" in r.stderr, r.stderr
    assert r.returncode != 0 and "tool-data" not in r.stdout, (r.stdout, r.stderr)
    assert "Permission denied" in r.stderr, r.stderr
    r = in_process(env, "run", "--", "cat", data)  # what the in-process CLI does
    assert r.returncode != 0 and "tool-data" not in r.stdout, (r.stdout, r.stderr)


def test_a_sandbox_built_ahead_outlives_changes_beside_what_it_read(env, tmp_path):
    """A build ahead watches the directories above each path it read; only the entry the
    path goes through matters there (another file made in the home, or in /tmp beside the
    project, changes nothing it read: each such change threw the build away before, so a
    project under a busy /tmp, where every net-run makes its private TMPDIR, rarely found
    one). The controls: an entry on a path it read, and one in a directory it listed (the
    project's own), still mean a new build."""
    home, proj = tmp_path / "home", tmp_path / "up" / "proj"
    home.mkdir()
    proj.mkdir(parents=True)
    (proj / "notes").write_text("n\n")
    env = dict(env, HOME=str(home))
    args = ("run", "-w", str(proj), "--", "cat", "notes")

    def call():
        return client(env, *args, debug=True, cwd=proj)
    _until_prepared_in(env, proj, args, "n\n")
    (home / "unrelated").write_text("x")
    (tmp_path / "up" / "sibling").mkdir()  # beside the project, above it
    r = call()
    assert r.stdout == "n\n" and "prepared sandbox used" in r.stderr, r.stderr
    time.sleep(1.0)
    (proj / "new").write_text("y")  # in the project, which the build listed
    r = call()
    assert f"not used: a directory it read changed ({proj / 'new'})" in r.stderr, r.stderr
    _until_prepared_in(env, proj, args, "n\n")
    os.rename(tmp_path / "up", tmp_path / "up2")  # an entry on the path: moved away
    os.rename(tmp_path / "up2", tmp_path / "up")  # and back, the same directory
    r = call()
    assert f"not used: a directory it read changed ({tmp_path / 'up'})" in r.stderr, \
        r.stderr


def test_a_path_looked_up_through_another_filesystem_is_read_again(env, tmp_path):
    """A grant reached through a filesystem inotify cannot vouch for (here /proc: a
    process's cwd link, re-pointed when it changes directory; review: a symlink on FUSE
    to a local directory) is read again at use: the sandbox built with the old target is
    not used, and the call reads what a fresh build grants. The control: unchanged, used."""
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        (d / "f").write_text(f"in {d.name}\n")
    mover = subprocess.Popen([sys.executable, "-c", "import os, sys\n"
                              "for line in sys.stdin:\n os.chdir(line.strip()); print(1, "
                              "flush=True)"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        mover.stdin.write(f"{a}\n")
        mover.stdin.flush()
        assert mover.stdout.readline() == "1\n"
        link = f"/proc/{mover.pid}/cwd"
        args = ("run", "-r", link, "--", "cat", str(a / "f"))
        _until_prepared_in(env, tmp_path, args, "in a\n")  # the control: used
        mover.stdin.write(f"{b}\n")
        mover.stdin.flush()
        assert mover.stdout.readline() == "1\n"
        r = client(env, *args, debug=True, cwd=tmp_path)
        assert "prepared sandbox used" not in r.stderr, r.stderr
        assert r.returncode != 0 and r.stdout == "", (r.stdout, r.stderr)  # a: no longer
        fresh = in_process(env, *args, cwd=tmp_path)
        assert fresh.returncode != 0 and fresh.stdout == "", fresh.stdout
        r = client(env, "run", "-r", link, "--", "cat", str(b / "f"), cwd=tmp_path)
        assert r.stdout == "in b\n", r.stderr
    finally:
        mover.kill()
        mover.wait()


def test_a_sandbox_built_ahead_sees_what_a_path_through_dotdot_or_a_symlink_chain_meets(
        env, tmp_path):
    """(review of the watches above paths read) What counts in a directory above a path
    read is the entry the kernel looks up there, through `..` and symlinks as it takes
    them: a PATH entry `home/x/../bin` goes through `x` (missing at the build: the tool is
    found further down PATH, and its installation granted), and one through a chain of
    symlinks goes through each link's directory. Made or re-pointed since, the build is
    not used: the command found now is another, which must not get the first one's
    grants (its secret). The in-process CLI is the reference."""
    home, other = tmp_path / "home", tmp_path / "other"
    for d in (home / "bin", home / "optA" / "bin", other / "A", other / "B", other / "C" / "bin"):
        d.mkdir(parents=True)
    (home / "optA" / "secret").write_text("SECRET\n")
    (home / "optA" / "bin" / "tool").write_text("#!/bin/sh\necho A\n")
    for b in (home / "bin", other / "C" / "bin"):
        (b / "tool").write_text(f"#!/bin/sh\necho B; cat {home}/optA/secret\n")
    for t in (home / "optA" / "bin" / "tool", home / "bin" / "tool", other / "C" / "bin" / "tool"):
        t.chmod(0o755)
    os.symlink(other / "A" / "l2", home / "l")
    os.symlink(other / "B", other / "A" / "l2")
    for path, change in ((f"{home}/x/../bin", lambda: (home / "x").mkdir()),
                         (f"{home}/l/bin", lambda: (os.unlink(other / "A" / "l2"),
                                                    os.symlink(other / "C", other / "A" / "l2")))):
        e = dict(env, HOME=str(home), PATH=f"{path}:{home}/optA/bin:/usr/bin:/bin")
        args = ("run", "-r", str(home / "bin"), "-r", str(other), "--", "tool")
        _until_prepared_in(e, tmp_path, args, "A\n")
        change()
        r = client(e, *args, debug=True, cwd=tmp_path)
        assert "SECRET" not in r.stdout, (path, r.stdout, r.stderr)
        assert "prepared sandbox not used" in r.stderr, (path, r.stderr)
        ref = in_process(e, *args, cwd=tmp_path)
        assert r.stdout == ref.stdout == "B\n" and r.returncode == ref.returncode != 0, \
            (path, r.stdout, ref.stdout)


def test_a_spare_builds_again_what_changed_while_it_waited(env, tmp_path):
    """A spare reads its build's inotify events while it waits: when what the build read
    changes, it builds again once that has been quiet for a second (server.REBUILD_AFTER),
    so the next call gets a sandbox built ahead that sees the change — a secret made in
    the home since is hidden — instead of building its own (it found the old one stale).
    The control: a call right after the change does not use the stale build."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("public notes\n")
    env = dict(env, HOME=str(home))
    flags = ("run", "-r", str(home), "--", "cat")
    _until_prepared_in(env, tmp_path, (*flags, str(home / "notes.txt")), "public notes\n")
    (home / ".netrc").write_text("machine example.com password SECRET\n")
    r = client(env, *flags, str(home / ".netrc"), debug=True, cwd=tmp_path)
    assert "not used: a directory it read changed" in r.stderr, r.stderr  # the control
    assert "SECRET" not in r.stdout and r.returncode != 0, (r.stdout, r.stderr)
    time.sleep(1.0)  # the spares build the new call's sandbox (its inputs), and wait
    (home / ".aws").mkdir()
    (home / ".aws" / "credentials").write_text("SECRET2\n")
    time.sleep(2.5)  # more than REBUILD_AFTER of quiet: built again meanwhile
    r = client(env, *flags, str(home / ".aws" / "credentials"), debug=True, cwd=tmp_path)
    assert "prepared sandbox used" in r.stderr, r.stderr
    assert "SECRET2" not in r.stdout and r.returncode != 0, (r.stdout, r.stderr)


def _until_prepared_in(env, cwd, args, expect: str):
    deadline, used = time.monotonic() + 30, 0
    while used < 2:
        r = client(env, *args, debug=True, cwd=cwd)
        assert r.stdout == expect, r.stderr
        used = used + 1 if "prepared sandbox used" in r.stderr else 0
        assert time.monotonic() < deadline, r.stderr
        time.sleep(0.3)
    time.sleep(1.0)


def _exe_name(pid):
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return ""


def test_a_trampoline_started_ahead_runs_the_call_as_a_fresh_start_would(env, tmp_path):
    """A spare starts its sandbox's trampoline ahead (launch.Parked): forked, waiting
    outside any namespace and confinement for the call. The call's stdio, working
    directory, environment, arguments, exit status, ignored and blocked signals reach the
    program as from a fresh start (the in-process CLI, compared), and the program is confined
    all the same. A trampoline a spare no longer needs is killed, not left behind."""
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret\n")
    env = dict(env, SL_VAR="v a l")
    script = ("pwd; echo \"$SL_VAR\"; printf '[%s]' \"$@\"; echo; cat; "
              "grep -E '^SigIgn' /proc/self/status; grep -E '^SigBlk' /proc/self/status; "
              f"echo to-stderr >&2; cat {secret} || echo denied; "
              "cat /etc/hostname >/dev/null && echo allowed; exit 7")
    # bash: dash clears the blocked-signal mask it starts with
    argv = ["run", "--", "bash", "-c", script, "sh", "one two", "thrée"]

    def ignore_hup():
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
    seen = []
    for _ in range(20):
        r = client(env, *argv, debug=True, cwd=work / "sub", input="in-put\n", stdin=None,
                   preexec_fn=ignore_hup)
        seen.append(r.stderr)
        if "its trampoline started ahead took the call" in r.stderr:
            break
        time.sleep(0.3)
    else:
        raise AssertionError(seen[-3:])
    fresh = in_process(env, *argv, cwd=work / "sub", input="in-put\n", stdin=None,
                       preexec_fn=ignore_hup)
    assert r.returncode == fresh.returncode == 7, (r.stderr, fresh.stderr)
    assert r.stdout == fresh.stdout, (r.stdout, fresh.stdout)
    lines = r.stdout.splitlines()
    assert lines[:4] == [str(work / "sub"), "v a l", "[one two][thrée]", "in-put"], lines
    assert int(lines[4].split()[1], 16) & 1 << (signal.SIGHUP - 1), lines  # still ignored
    assert int(lines[5].split()[1], 16) == 1 << (signal.SIGUSR2 - 1), lines  # blocked
    assert "denied" in lines and "s3cret" not in r.stdout and "allowed" in lines, lines
    assert "to-stderr" in r.stderr
    # Without SIGHUP ignored, the same sandbox built ahead: not ignored in the program.
    time.sleep(0.5)
    r = client(env, *argv, debug=True, cwd=work / "sub", input="x\n", stdin=None,
               preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))  # even
    # under nohup (a suite run so: the client inherits its SIGHUP ignored)
    assert "its trampoline started ahead took the call" in r.stderr, r.stderr
    assert not int(r.stdout.splitlines()[4].split()[1], 16) & 1 << (signal.SIGHUP - 1)
    assert int(r.stdout.splitlines()[5].split()[1], 16) == 0, r.stdout
    # A parked start that died meanwhile (its waiting program killed): the call starts
    # afresh, nothing lost.
    time.sleep(1.0)
    service = _service_pid(env)
    spares = [p for p in _pids() if _ppid(p) == service]
    roots = [p for p in _pids() if _ppid(p) in spares and _exe_name(p) == "sandlock-exec"]
    waiting = [p for p in _pids() if _ppid(p) in roots and _exe_name(p) == "sandlock-exec"]
    assert waiting, (spares, roots)
    for p in waiting:
        os.kill(p, signal.SIGKILL)
    r = client(env, *argv, debug=True, cwd=work / "sub", input="in-put\n", stdin=None,
               preexec_fn=ignore_hup)
    assert "prepared sandbox used" in r.stderr, r.stderr
    assert "its trampoline started ahead took the call" not in r.stderr, r.stderr
    assert r.returncode == 7 and r.stdout == fresh.stdout, (r.stdout, r.stderr)
    # Each spare holds one parked start (its root and the waiting program). The spare that
    # serves a call with other options kills its own; the service's end kills the rest.
    from sandlock.service.server import SPARE
    service = _service_pid(env)
    time.sleep(1.0)

    def starts():
        """Each parked start's processes (its root, the waiting program) -> its spare."""
        spares = [p for p in _pids() if _ppid(p) == service]
        parked = {p: _ppid(p) for p in _pids()
                  if _ppid(p) in spares and _exe_name(p) == "sandlock-exec"}
        parked.update({p: parked[_ppid(p)] for p in _pids()
                       if _ppid(p) in parked and _exe_name(p) == "sandlock-exec"})
        return spares, parked
    spares, parked = starts()
    assert len(spares) == SPARE and 0 < len(parked) <= 2 * SPARE, (spares, parked)

    def alive(pid):
        return os.path.exists(f"/proc/{pid}") and _state(pid) not in "ZX"
    r = client(env, "run", "--strict", "--", "echo", "other", debug=True)
    assert r.stdout == "other\n" and "not used: other options" in r.stderr, r.stderr
    assert _wait_for(lambda: any(not alive(s) for s in spares))  # the one that served
    gone = [s for s in spares if not alive(s)]
    assert _wait_for(lambda: not any(alive(p) for p, spare in parked.items()
                                     if spare in gone))
    time.sleep(1.0)  # the spares build the new call's sandbox ahead and park its start
    spares, now = starts()
    assert now and all(alive(p) for p in now), now  # the control: starts wait
    subprocess.run(IN_PROCESS + ["service", "stop"], env=env, capture_output=True, timeout=30)
    assert _wait_for(lambda: not any(alive(p) for p in [*parked, *now])), (parked, now)


def _ctxt_switches(pid) -> int:
    with open(f"/proc/{pid}/status") as f:
        return sum(int(line.split()[1]) for line in f if "ctxt_switches" in line)


def test_a_trampoline_started_ahead_waits_idle_and_takes_its_limits_with_the_call(env):
    """(review) A parked start's root watched the limits every 10 ms while it waited
    (each spare's: ~300 wakeups a second for an idle service). Its limits now come with
    the call, and a root is woken for them only once it has some; a memory limit is
    enforced all the same through a start made ahead."""
    code = "import sys; b = bytearray(int(sys.argv[1])); print('ok', len(b))"
    argv = ["run", "-m", "64M", "--", PY, "-c", code]
    for _ in range(20):
        r = client(env, *argv, str(1 << 20), debug=True)
        assert r.returncode == 0 and r.stdout == f"ok {1 << 20}\n", r.stderr  # control
        if "its trampoline started ahead took the call" in r.stderr:
            break
        time.sleep(0.3)
    else:
        raise AssertionError(r.stderr)
    time.sleep(1.0)  # the spares have built and parked again
    service = _service_pid(env)
    spares = [p for p in _pids() if _ppid(p) == service]
    roots = [p for p in _pids() if _ppid(p) in spares and _exe_name(p) == "sandlock-exec"]
    assert roots, spares
    before = {p: _ctxt_switches(p) for p in roots}
    time.sleep(1.0)
    woken = {p: _ctxt_switches(p) - n for p, n in before.items()}
    assert all(n <= 3 for n in woken.values()), woken  # was ~100 each
    r = client(env, *argv, str(256 << 20), debug=True)
    assert "its trampoline started ahead took the call" in r.stderr, r.stderr
    assert r.returncode != 0 and "ok" not in r.stdout, (r.stdout, r.stderr)


def test_pipe_stages_skip_a_parked_start_and_leave_nothing_behind(env):
    """A pipe's stages start held, with passed fds: never through a start parked ahead,
    which the serving spare kills without waiting for it (on the call's path); the service
    ends with nothing of them left."""
    def ours():
        return {p for p in _pids() if _exe_name(p) == "sandlock-exec"
                and os.path.exists(f"/proc/{p}") and _state(p) not in "ZX"}
    before = ours()
    for _ in range(4):
        r = client(env, "pipe", "--", "echo", "hi", ":::", "--", "cat", debug=True)
        assert r.returncode == 0 and r.stdout == "hi\n", r.stderr
        assert "trampoline started ahead took the call" not in r.stderr, r.stderr
        time.sleep(0.4)
    subprocess.run(IN_PROCESS + ["service", "stop"], env=env, capture_output=True, timeout=30)
    assert _wait_for(lambda: not (ours() - before)), ours() - before


IGNORING_SIGCHLD = [PY, "-c", "import os, signal, sys\n"
                    "signal.signal(signal.SIGCHLD, signal.SIG_IGN)\n"
                    "os.execv(sys.argv[1], sys.argv[1:])"]


@pytest.mark.parametrize("mode", ["in-process", "service"])
def test_a_caller_that_ignores_sigchld_gets_the_status_and_no_hang(env, mode):
    """(review) A caller that ignores SIGCHLD (a common way to avoid zombies): the
    sandbox's root inherited it, the kernel reaped the program unseen and the root waited
    forever; the CLI hung after the program's output (in the service, its child raised
    ChildProcessError). The root now reaps with SIGCHLD default, tells the status on its
    control socket (the CLI's own process may not reap it either), and the program keeps
    the caller's disposition."""
    e = dict(env, SANDLOCK_SERVICE="0") if mode == "in-process" else env
    for _ in range(3 if mode == "service" else 1):  # the first call starts the service
        r = subprocess.run(IGNORING_SIGCHLD + [CLIENT, "run", "--", "sh", "-c",
                                               "echo hi; exit 3"],
                           env=e, capture_output=True, text=True, timeout=30)
        assert (r.returncode, r.stdout) == (3, "hi\n"), r.stderr
        time.sleep(0.3)
    r = subprocess.run(IGNORING_SIGCHLD + [CLIENT, "run", "--", "grep", "SigIgn",
                                           "/proc/self/status"],
                       env=e, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and int(r.stdout.split()[1], 16) & 1 << (signal.SIGCHLD - 1)
    r = subprocess.run(IGNORING_SIGCHLD + [CLIENT, "run", "--", "sh", "-c", "kill -TERM $$"],
                       env=e, capture_output=True, text=True, timeout=30)
    assert r.returncode == 128 + signal.SIGTERM, r.stderr
    r = subprocess.run([CLIENT, "run", "--", "grep", "SigIgn", "/proc/self/status"],
                       env=e, capture_output=True, text=True, timeout=30)  # the control
    assert not int(r.stdout.split()[1], 16) & 1 << (signal.SIGCHLD - 1), r.stdout


def _until_prepared(env, *args, expect: str):
    """Calls with these arguments until two in a row got a sandbox built ahead."""
    deadline, used = time.monotonic() + 30, 0
    while used < 2:
        r = client(env, *args, debug=True)
        assert r.stdout == expect, r.stderr
        used = used + 1 if "prepared sandbox used" in r.stderr else 0
        assert time.monotonic() < deadline, r.stderr
        time.sleep(0.3)
    time.sleep(1.0)  # the spares have prepared it again


@pytest.mark.skipif(os.geteuid() != 0, reason="root's sandboxes deny root-only files")
def test_a_file_made_root_only_since_the_build_ahead_is_denied(env):
    """(review 2026-12-05, of the builds ahead covering the system view) The scan of
    root-only files under /etc is the service's, cached: a build ahead read nothing of
    it, and a file made root-only since stayed readable through that build. The scan's
    answer is now part of what is compared at use."""
    # in a directory of its own, which no build reads (a build's own reads are watched)
    d = f"/etc/sandlock-test-{uuid.uuid4().hex[:8]}"
    os.mkdir(d)
    secret = f"{d}/secret"
    with open(secret, "w") as f:
        f.write("topsecret\n")
    os.chmod(secret, 0o644)
    try:
        _until_prepared(env, "run", "--", "cat", secret, expect="topsecret\n")
        os.chmod(secret, 0o600)
        r = client(env, "run", "--", "cat", secret, debug=True)
        assert "topsecret" not in r.stdout and r.returncode != 0, r.stderr
        assert "prepared sandbox not used: root_only.files changed" in r.stderr, r.stderr
        assert in_process(env, "run", "--", "cat", secret).returncode != 0  # the same
    finally:
        shutil.rmtree(d)


def test_a_pyenv_shim_s_python_is_built_ahead(env, tmp_path):
    """A user's own toolchain, as pyenv installs it: `python3` is a shim script whose `#!`
    names bash, over 1 MiB. The build ahead reads the interpreter it runs; it was abandoned
    ("over 1048576 bytes read"), so such a user's calls were never built ahead. A large
    file now stands by its stat (a write changes its ctime); the control: a change to the
    shim is seen."""
    home = tmp_path / "home"
    shims = home / ".pyenv" / "shims"
    shims.mkdir(parents=True)
    shim = shims / "python3"
    shim.write_text('#!/usr/bin/env bash\nexec /usr/bin/python3 "$@"\n')
    shim.chmod(0o755)
    env = dict(env, HOME=str(home), PATH=f"{shims}:/usr/bin:/bin")
    env.pop("PYENV_ROOT", None)
    assert os.path.getsize(os.path.realpath(shutil.which("bash"))) > (1 << 20)
    _until_prepared(env, "run", "--", "python3", "-c", "print('shimmed')", expect="shimmed\n")
    shim.write_text('#!/usr/bin/env bash\necho changed\n')
    r = client(env, "run", "--", "python3", "-c", "print('shimmed')", debug=True)
    assert r.stdout == "changed\n", (r.stdout, r.stderr)
    assert "prepared sandbox not used" in r.stderr, r.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="adds a user")
def test_a_user_s_home_changed_since_the_build_ahead_is_followed(env, tmp_path):
    """(review 2026-12-05) A policy's `~user` path is looked up in the user database,
    which libc reads unseen by the recording: a build ahead kept granting the old home.
    The lookup's answer is now compared at use."""
    old, new = tmp_path / "old", tmp_path / "new"
    for d in (old, new):
        (d / "data").mkdir(parents=True)
        (d / "data" / "f").write_text(f"{d.name}\n")
    user = f"sl{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "-M", "-d", str(old), user], check=True)
    try:
        policy = tmp_path / "p.yaml"
        policy.write_text(f"version: 1\nfilesystem: {{read: ['~{user}/data']}}\n")
        args = ("run", "--policy", str(policy), "--", "cat")
        _until_prepared(env, *args, str(old / "data" / "f"), expect="old\n")
        # Written in place, as an editor or `cat >` would: no entry of /etc changes
        # (usermod's rename would be seen by the watch on /etc, if a build read there).
        with open("/etc/passwd", "r+") as f:
            lines = f.read().splitlines(keepends=True)
            f.seek(0)
            f.write("".join(line.replace(f":{old}:", f":{new}:") if
                            line.startswith(user + ":") else line for line in lines))
            f.truncate()
        r = client(env, *args, str(old / "data" / "f"), debug=True)
        assert "old" not in r.stdout and r.returncode != 0, r.stderr
        assert "prepared sandbox not used" in r.stderr, r.stderr
        r = client(env, *args, str(new / "data" / "f"))  # control: the new home is granted
        assert r.stdout == "new\n", r.stderr
    finally:
        subprocess.run(["userdel", user], check=True)


def test_the_private_tmp_is_made_in_the_caller_s_tmpdir(env, tmp_path):
    """(review 2026-12-05; pre-existing) net-run's private /tmp was made in the TMPDIR of
    whoever started the service (tempfile caches it), not the caller's."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    _wait_served(dict(env, TMPDIR=str(first)))  # the service starts with this TMPDIR
    script = 'echo "$TMPDIR"; echo hi > "$TMPDIR/f" && cat "$TMPDIR/f"'
    for _ in range(3):
        r = client(dict(env, TMPDIR=str(second)), "net-run", "--", "sh", "-c", script,
                   debug=True, cwd=tmp_path)
        assert "service: accepted" in r.stderr, r.stderr
        where, hi = r.stdout.splitlines()
        assert where.startswith(f"{second}/sandlock-tmp-") and hi == "hi", r.stdout
        time.sleep(0.3)
    r = in_process(dict(env, TMPDIR=str(second)), "net-run", "--", "sh", "-c", script)
    assert r.stdout.startswith(f"{second}/sandlock-tmp-"), r.stdout  # the same in process


def test_net_run_is_built_ahead_and_its_private_tmp_is_made_by_the_run(env, tmp_path):
    """net-run's sandbox is built ahead too, without its private /tmp: a spare waiting
    with it has made nothing in any TMPDIR (review of c7e4899: a root made by the build
    waited there for minutes, where others can write). The run that uses it makes the
    root in the caller's TMPDIR and is granted it; it goes when the run is done."""
    own, caller, work, state = (tmp_path / n for n in ("own", "caller", "work", "state"))
    for d in (own, caller, work, state):
        d.mkdir()
    _wait_served(dict(env, TMPDIR=str(own)))  # the service's own TMPDIR
    env = dict(env, TMPDIR=str(caller), XDG_STATE_HOME=str(state))
    script = 'echo "$TMPDIR"; echo hi > "$TMPDIR/f" && cat "$TMPDIR/f" && echo m > made'

    def private_tmps():
        return [p for d in (own, caller) for p in d.iterdir()
                if p.name.startswith("sandlock-tmp-")]
    # Four in a row: each run makes and removes its private /tmp in a directory the
    # build watched, so the spares built before it check theirs again, not only the one
    # built after it (the kernel hands a client to the spare waiting longest).
    deadline, used = time.monotonic() + 30, 0
    while used < 4:
        r = client(env, "net-run", "--", "sh", "-c", script, debug=True, cwd=work)
        where, hi = r.stdout.splitlines()
        assert where.startswith(f"{caller}/sandlock-tmp-") and hi == "hi", r.stdout
        assert (work / "made").read_text() == "m\n"  # net-run's writable working directory
        used = used + 1 if "prepared sandbox used" in r.stderr else 0
        assert time.monotonic() < deadline, r.stderr
        time.sleep(0.5)
        assert private_tmps() == []  # gone with its run; none made ahead
    assert (state / "sandlock" / "net-run-audit.jsonl").exists()
    r = client(env, "net-run", "--", "sh", "-c", "echo x > /tmp/outside", debug=True,
               cwd=work)  # the control: its grant is its private /tmp, not the host's
    assert r.returncode != 0 and "prepared sandbox used" in r.stderr, r.stderr
    assert "Permission denied" in r.stderr and not os.path.exists("/tmp/outside")


def test_a_client_killed_outright_leaves_no_private_tmp_behind(env, tmp_path):
    """(review) A client killed with SIGKILL ends its sandbox as the in-process CLI killed
    so would; the serving child then kills itself too, and its private /tmp's root went
    with nothing to remove it. It is removed first now. The control: it existed."""
    caller, work = tmp_path / "caller", tmp_path / "work"
    caller.mkdir()
    work.mkdir()
    env = dict(env, TMPDIR=str(caller))
    _wait_served(env)
    p = subprocess.Popen([CLIENT, "net-run", "--", "sh", "-c", 'echo "$TMPDIR"; sleep 30'],
                         env=env, cwd=work, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         text=True)
    try:
        where = p.stdout.readline().strip()
        assert where.startswith(f"{caller}/sandlock-tmp-") and os.path.isdir(where), where
    finally:
        p.kill()
        p.wait(timeout=10)
    assert _wait_for(lambda: not list(caller.iterdir()), timeout=10.0), list(caller.iterdir())


def test_the_service_serves_where_the_kernel_s_audit_stream_is_readable(env, kernel_audit,
                                                                        tmp_path):
    """(found 2026-12-05; pre-existing) As root with the audit subsystem on (auditd), the
    service's warm-up built net-run's sandbox with its audit log, which started the
    thread reading Landlock's records in the process that forks: it refused to serve, so
    every call ran in-process and started another service that failed the same way. Now
    it serves, and a served net-run still has Landlock's own records (--explain)."""
    deadline = time.monotonic() + 30
    while True:
        r = client(env, "run", "--", "true", debug=True)
        if "service: accepted" in r.stderr:
            break
        assert time.monotonic() < deadline, _log(env)
        time.sleep(0.3)
    log = tmp_path / "audit.jsonl"
    r = client(env, "run", "--explain", "--audit", str(log), "--", "cat", "/etc/shadow",
               debug=True)
    assert "service: accepted" in r.stderr and r.returncode != 0, r.stderr
    assert "/etc/shadow" in log.read_text()  # the refusal, recorded
    assert "started a thread" not in _log(env)


def test_a_sandbox_built_ahead_is_not_used_once_the_kernel_s_audit_is_turned_on(env,
                                                                             tmp_path):
    """Whether the kernel's audit subsystem is on is asked again at each use of a net-run
    sandbox built ahead (its audit log then gets Landlock's own records): the question is
    sent first and its answer read after the other checks (the kernel takes ~0.15 ms).
    Turned on after the build, the sandbox is not used; the control: it is, while the
    answer stays the same. (With the audit on, net-run is not built ahead: its audit log
    would start reading the audit stream in the spare.)"""
    if os.geteuid() != 0:
        pytest.skip("the audit subsystem is turned on and off by root")
    from test_explain import _audit_enabled
    from sandlock._kernel import audit
    was = audit.enabled()
    _audit_enabled(False)
    env = dict(env, XDG_STATE_HOME=str(tmp_path))
    try:
        _wait_served(env)
        deadline = time.monotonic() + 60
        while True:
            _audit_enabled(False)
            while True:  # the control: used, while the answer stays the same
                r = client(env, "net-run", "--", "/bin/true", debug=True, cwd=tmp_path)
                if "prepared sandbox used" in r.stderr:
                    break
                assert time.monotonic() < deadline, r.stderr
                time.sleep(0.3)
            time.sleep(0.3)
            _audit_enabled(True)
            r = client(env, "net-run", "--", "/bin/true", debug=True, cwd=tmp_path)
            assert r.returncode == 0, r.stderr
            assert "prepared sandbox used" not in r.stderr, r.stderr
            if "prepared sandbox not used: audit.enabled changed" in r.stderr:
                break
            # Stale for another reason found first (the checks' order; a directory the
            # build read changed meanwhile, which the message names): again.
            assert time.monotonic() < deadline, r.stderr
    finally:
        _audit_enabled(was)


def _log(env) -> str:
    try:
        with open(os.path.join(env["XDG_RUNTIME_DIR"], "sandlock", "service.log")) as f:
            return f.read()[-2000:]
    except OSError:
        return ""


def test_a_prepared_build_reads_and_never_changes_anything(tmp_path):
    """What a build may do while it is recorded: read (each read is noted, with what it
    saw); anything else is refused before it happens."""
    from sandlock.service import reads
    f = tmp_path / "f"
    f.write_text("content")
    with reads.recording() as rec:
        with open(f) as fh:
            assert fh.read() == "content"
        assert os.path.isdir(tmp_path) and not os.path.exists(tmp_path / "none")
        assert os.listdir(tmp_path) == ["f"]
        with pytest.raises(PermissionError):
            open(tmp_path / "new", "w")
        with pytest.raises(PermissionError):
            os.mkdir(tmp_path / "dir")
        with pytest.raises(PermissionError):
            subprocess.run(["true"])
    assert rec.refused is not None
    assert sorted(os.listdir(tmp_path)) == ["f"]  # nothing was made
    deps = rec.deps
    assert deps[("O", str(f), 0)][-1] == b"content"
    assert deps[("S", str(tmp_path / "none"), True)][0] == "err"
    assert deps[("L", str(tmp_path))][1] == (("f", False, False),)
    # outside a recording nothing is refused
    open(tmp_path / "new", "w").close()


RAW_ENV = r"""
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
extern char **environ;
/* raw-env ENTRY PROG ARGS...: PROG with this environment and ENTRY, however malformed */
int main(int argc, char **argv) {
    int n = 0;
    while (environ[n]) n++;
    char **e = calloc(n + 2, sizeof *e);
    memcpy(e, environ, n * sizeof *e);
    e[n] = argv[1];
    execve(argv[2], argv + 2, e);
    return 127;
}
"""


def test_a_caller_state_the_service_cannot_take_falls_back(env, tmp_path):
    """An environment entry Python cannot set ("=x"): the service says so before the
    "go", and the client runs the in-process CLI, whatever that does with it — never a
    status of its own."""
    src, raw = tmp_path / "raw.c", tmp_path / "raw-env"
    src.write_text(RAW_ENV)
    subprocess.run(["cc", "-o", str(raw), str(src)], check=True)
    _wait_served(env)
    marks = tmp_path / "marks"
    marks.mkdir()
    for _ in range(3):
        r = subprocess.run([str(raw), "=weird", CLIENT, "run", "-w", str(marks), "--", "sh",
                            "-c", f"echo $$ >> {marks}/ran"], env=dict(
                                env, SANDLOCK_SERVICE_DEBUG="1"), stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=60)
        assert "cannot take the caller's state" in r.stderr, r.stderr
        assert "ended before it reported" not in r.stderr, r.stderr
    direct = subprocess.run([str(raw), "=weird", sys.executable, "-P", "-m", "sandlock",
                             "run", "--", "true"], env=env, stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=60)
    assert r.returncode == direct.returncode, (r.stderr, direct.stderr)


def test_a_caller_whose_limits_the_service_cannot_take_runs_once_in_process(env, tmp_path):
    """The service accepts ("A") before it takes the caller's attributes on (that overlaps
    the client's "go"): a caller with a higher hard limit than a service started under a
    lower one is told "F" after the "A", falls back, and its command runs once, in
    process. Control: a caller within the service's limit is served."""
    import resource
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] <= 512:
        pytest.skip("this process's hard limit on open files is 512 or less")
    low = ["sh", "-c", 'ulimit -Sn 512 && ulimit -Hn 512 && exec "$@"', "sh", CLIENT]
    deadline = time.monotonic() + 30
    while True:  # the first call starts the service, which keeps the lower limit
        r = subprocess.run(low + ["run", "--", "/bin/true"], env=dict(
            env, SANDLOCK_SERVICE_DEBUG="1"), stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=60)
        if "service: accepted" in r.stderr:
            break
        assert time.monotonic() < deadline, r.stderr
        time.sleep(0.2)
    marks = tmp_path / "marks"
    marks.mkdir()
    for i in range(3):
        r = client(env, "run", "-w", str(marks), "--", "sh", "-c",
                   f"ulimit -Hn; echo {i} >> {marks}/ran", debug=True)
        assert "service: accepted" in r.stderr and "resource limit" in r.stderr, r.stderr
        assert "ended before it reported" not in r.stderr, r.stderr
        assert r.returncode == 0 and r.stdout.strip() != "512", (r.stdout, r.stderr)
    assert (marks / "ran").read_text() == "0\n1\n2\n"  # each once
    r = subprocess.run(low + ["run", "--", "sh", "-c", "ulimit -Hn"], env=dict(
        env, SANDLOCK_SERVICE_DEBUG="1"), stdin=subprocess.DEVNULL, capture_output=True,
        text=True, timeout=60)
    assert "service: accepted" in r.stderr and "resource limit" not in r.stderr, r.stderr
    assert r.stdout == "512\n"


def test_a_padded_git_config_is_refused_never_left_out(env, tmp_path):
    """(review 2026-12-05) A file the build opens but could not keep whole (a padded
    ~/.gitconfig naming core.hooksPath) was left out of a sandbox built ahead, which then
    lacked the hooks' protection. A git config over 1 MiB is now refused by every build,
    served or in-process, ahead or not: nothing runs, the hooks directory never appears."""
    home, proj = tmp_path / "home", tmp_path / "home" / "proj"
    (proj / ".git").mkdir(parents=True)
    (home / ".gitconfig").write_text(f"[core]\n\thooksPath = {proj}/hooks\n"
                                     + "#" * (1 << 20) + "\n")
    env = dict(env, HOME=str(home))
    for _ in range(5):
        r = client(env, "run", "-w", str(proj), "--", "sh", "-c",
                   f"mkdir {proj}/hooks && echo WROTE", debug=True)
        assert "WROTE" not in r.stdout and r.returncode == 125, r.stderr
        assert "too large to check for core.hooksPath" in r.stderr, r.stderr
        time.sleep(0.3)
    assert not (proj / "hooks").exists()
    (home / ".gitconfig").write_text(f"[core]\n\thooksPath = {proj}/hooks\n")  # control
    r = client(env, "run", "-w", str(proj), "--", "sh", "-c",
               f"mkdir {proj}/made && mkdir {proj}/hooks; echo rc=$?")
    assert (proj / "made").is_dir() and not (proj / "hooks").exists(), r.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="a bind mount")
def test_one_directory_reached_by_another_path_is_another_build(env, tmp_path):
    """(review 2026-12-05) The working directory was compared by object alone: a sandbox
    built from a bind-mount alias of the home (where the plan hides nothing of the
    alias's path) was used from the home itself, and its secrets were read."""
    home, alias = tmp_path / "home", tmp_path / "alias"
    home.mkdir()
    alias.mkdir()
    (home / ".netrc").write_text("machine x password SECRET\n")
    (home / "notes").write_text("notes\n")
    subprocess.run(["mount", "--bind", str(home), str(alias)], check=True)
    try:
        env = dict(env, HOME=str(home), PWD=str(home))  # the same environment for both
        used, deadline = 0, time.monotonic() + 30
        while used < 2:
            r = client(env, "run", "-r", ".", "--", "cat", "notes", debug=True, cwd=alias)
            assert r.stdout == "notes\n", r.stderr
            used = used + 1 if "prepared sandbox used" in r.stderr else 0
            assert time.monotonic() < deadline, r.stderr
            time.sleep(0.3)
        time.sleep(1.0)
        r = client(env, "run", "-r", ".", "--", "cat", ".netrc", debug=True, cwd=home)
        assert "SECRET" not in r.stdout and r.returncode != 0, (r.stdout, r.stderr)
        assert "not used: another working directory" in r.stderr, r.stderr
    finally:
        subprocess.run(["umount", str(alias)], check=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="a mount")
def test_a_mount_since_the_build_ahead_is_another_build(env, tmp_path):
    """The mount table is not read again at each call (~50 µs): a poll on it, opened before
    the build read anything, reports a mount or unmount since (reads.mount_table). A
    tmpfs mounted over the project since, and unmounted again, each make the sandbox
    built ahead stale; the call sees what is mounted now."""
    proj = tmp_path / "proj"
    (proj / "data").mkdir(parents=True)
    (proj / "data" / "f").write_text("disk\n")
    env = dict(env, HOME=str(tmp_path))

    def warm():
        used, deadline = 0, time.monotonic() + 30
        while used < 2:
            r = client(env, "run", "-r", str(proj), "--", "ls", str(proj / "data"), debug=True)
            assert r.returncode == 0, r.stderr
            used = used + 1 if "prepared sandbox used" in r.stderr else 0
            assert time.monotonic() < deadline, r.stderr
            time.sleep(0.3)
        time.sleep(1.0)
    warm()
    subprocess.run(["mount", "-t", "tmpfs", "none", str(proj / "data")], check=True)
    try:
        (proj / "data" / "g").write_text("tmpfs\n")
        r = client(env, "run", "-r", str(proj), "--", "ls", str(proj / "data"), debug=True)
        assert (r.returncode, r.stdout) == (0, "g\n"), r.stderr
        assert "prepared sandbox not used: the mount table changed" in r.stderr, r.stderr
        warm()  # built again under the mount, then used
    finally:
        subprocess.run(["umount", str(proj / "data")], check=True)
    r = client(env, "run", "-r", str(proj), "--", "ls", str(proj / "data"), debug=True)
    assert (r.returncode, r.stdout) == (0, "f\n"), r.stderr
    assert "prepared sandbox not used: the mount table changed" in r.stderr, r.stderr


def test_a_fifo_where_the_build_reads_a_file_never_stalls_it(env, tmp_path):
    """(review 2026-12-05; pre-existing) A FIFO named .git in a writable grant (made by an
    earlier sandbox) hung every later build of that grant — in-process, and every spare
    of the service building it ahead. Not a file: skipped; the service stays usable."""
    proj = tmp_path / "proj"
    (proj / "sub").mkdir(parents=True)
    os.mkfifo(proj / "sub" / ".git")
    os.mkfifo(proj / ".gitconfig-fifo")
    r = in_process(env, "run", "-w", str(proj), "--", "echo", "ok")
    assert r.stdout == "ok\n", r.stderr
    _wait_served(env)
    for _ in range(4):
        r = client(env, "run", "-w", str(proj), "--", "echo", "ok", debug=True)
        assert r.stdout == "ok\n" and "accepted" in r.stderr, r.stderr
        time.sleep(0.3)
    assert _status(env).returncode == 0
