"""Process lifecycle: exit status, signals, timeouts that kill the whole tree, stdio, env,
concurrency and resource hygiene."""

import gc
import io
import os
import signal
import subprocess
import threading
import time

import pytest

from sandlock import ExitReason, Sandbox, StdioMode
from conftest import PY, open_fds, run_py, sandbox

HERE = os.path.dirname(os.path.abspath(__file__))


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_exit_code_and_output():
    r = sandbox().run(["sh", "-c", "echo out; echo err >&2; exit 7"])
    assert (r.exit_code, r.stdout, r.stderr, r.success) == (7, b"out\n", b"err\n", False)
    assert r.reason == ExitReason.EXITED and r.signal == -1


def test_killed_by_signal():
    r = sandbox().run(["sh", "-c", "kill -SEGV $$"])
    assert r.reason == ExitReason.SIGNALED and r.signal == signal.SIGSEGV and not r.success


def test_timeout_kills_grandchildren(tmp_path):
    sb = sandbox(fs_writable=[tmp_path])
    pids = tmp_path / "pids"
    t0 = time.monotonic()
    r = sb.run(["sh", "-c", f"sleep 60 & echo $! > {pids}; (sleep 60 &) ; sleep 60"],
               timeout=0.5)
    assert time.monotonic() - t0 < 5
    assert r.reason == ExitReason.TIMEOUT and not r.success and "timed out" in r.error
    bg = int(pids.read_text())
    time.sleep(0.1)
    assert not pid_alive(bg)


def test_background_process_cannot_outlive_the_sandbox(tmp_path):
    sb = sandbox(fs_writable=[tmp_path])
    pidfile = tmp_path / "pid"
    code = ("import subprocess, sys; p = subprocess.Popen(['sleep', '60'], "
            "start_new_session=False); open(sys.argv[1], 'w').write(str(p.pid))")
    r = run_py(sb, code, str(pidfile))
    assert r.success
    time.sleep(0.1)
    assert not pid_alive(int(pidfile.read_text()))


def test_a_new_session_is_still_ended_with_the_sandbox(tmp_path):
    """setsid and setpgid are allowed (job control needs them); a process that made a
    session of its own is still a member of the sandbox and ends with it."""
    pidfile = tmp_path / "pid"
    os.chmod(tmp_path, 0o777)
    code = ("import os, subprocess, sys\n"
            "p = subprocess.Popen(['sleep', '60'], start_new_session=True)\n"
            "os.setpgid(0, 0)\n"
            "open(sys.argv[1], 'w').write(str(p.pid))\n"
            "print(os.getsid(p.pid) == p.pid, os.getpgid(0) == os.getpid())\n")
    r = run_py(sandbox(fs_writable=[str(tmp_path)]), code, str(pidfile))
    assert r.success and r.stdout == b"True True\n", r.stderr
    assert not pid_alive(int(pidfile.read_text()))


def test_env_and_clean_env(monkeypatch):
    monkeypatch.setenv("SANDLOCK_TEST_SECRET", "hunter2")
    r = sandbox(env={"FOO": "bar"}).run(["sh", "-c", "echo $FOO $SANDLOCK_TEST_SECRET"])
    assert r.stdout == b"bar hunter2\n"
    r = sandbox(env={"FOO": "bar"}, clean_env=True).run(
        ["sh", "-c", "echo $FOO ${SANDLOCK_TEST_SECRET:-gone}; echo $PATH"])
    lines = r.stdout.decode().splitlines()
    assert lines[0] == "bar gone" and "/usr/bin" in lines[1]


def test_cwd(tmp_path):
    r = sandbox(fs_readable=[tmp_path], cwd=str(tmp_path)).run(["pwd"])
    assert r.stdout.decode().strip() == str(tmp_path)


def test_stdin_input_and_popen_pipes():
    r = sandbox().run(["tr", "a-z", "A-Z"], input=b"hello")
    assert r.stdout == b"HELLO"
    with sandbox().popen(["sh", "-c", "read x; echo got $x"], stdin=StdioMode.PIPED,
                         stdout=StdioMode.PIPED, stderr=StdioMode.NULL) as p:
        res = p.communicate(input=b"line\n", timeout=10)
    assert res.stdout == b"got line\n"


def test_popen_streams_are_files_read_and_written_as_the_program_runs():
    """stdin/stdout/stderr of a PIPED popen are binary files: a conversation line by line
    with a running program, EOF by closing stdin; None for streams that are not PIPED."""
    code = ("import sys\n"
            "for line in sys.stdin:\n"
            "    print(line.strip().upper(), flush=True)\n"
            "print('bye', file=sys.stderr)\n")
    with sandbox().popen([PY, "-c", code], stdin=StdioMode.PIPED, stdout=StdioMode.PIPED,
                         stderr=StdioMode.PIPED) as p:
        reader = io.BufferedReader(p.stdout)
        for word in (b"one", b"two"):
            p.stdin.write(word + b"\n")
            assert reader.readline() == word.upper() + b"\n"  # answered before the next
        assert p.is_running
        p.stdin.close()  # EOF: the program ends
        assert p.stdin is None
        assert p.wait(10).exit_code == 0
        assert reader.read() == b"" and p.stderr.read() == b"bye\n"
    with sandbox().popen(["true"], stdout=StdioMode.NULL) as p:
        assert p.stdin is None and p.stdout is None and p.stderr is None
        p.wait(10)


def test_popen_wait_kill_and_pause():
    with sandbox().popen(["sleep", "60"], stdout=StdioMode.NULL) as p:
        assert p.is_running
        p.pause()
        time.sleep(0.05)
        with open(f"/proc/{p.pid}/stat") as f:
            assert f.read().split()[2] == "T"
        p.resume()
        with pytest.raises(TimeoutError):
            p.wait_code(timeout=0.1)
        p.kill()
        assert p.wait_code(timeout=5) == -signal.SIGKILL
        assert p.wait().reason == ExitReason.KILLED
        assert not p.is_running


def test_command_not_found_and_exec_failure(tmp_path):
    r = sandbox().run(["definitely-not-a-command-xyz"])
    assert r.exit_code == 127 and "command not found" in r.error
    script = tmp_path / "s.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    os.chmod(script, 0o755)
    r = sandbox().run([str(script)])  # not readable/executable under the policy
    assert r.exit_code == 126 and "execve" in r.error and r.stdout == b""
    r = sandbox(fs_readable=[tmp_path]).run([str(script)])  # control
    assert r.success and r.stdout == b"hi\n"


def test_fifty_concurrent_sandboxes_from_threads():
    sb = sandbox()
    results = [None] * 50

    def work(i):
        results[i] = sb.run(["sh", "-c", f"echo {i}"], timeout=60)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(not t.is_alive() for t in threads)
    for i, r in enumerate(results):
        assert r.success and r.stdout == f"{i}\n".encode(), (i, r)


def _fds_added_since(before: dict[str, str], settle: float = 5.0) -> dict[str, str]:
    """fds open now that were not open (as the same object) in `before`; fds of earlier
    tests that close meanwhile do not count. Listeners close when the kernel reports HUP,
    so the check waits a little for them."""
    deadline = time.monotonic() + settle
    while True:
        gc.collect()
        added = {fd: t for fd, t in open_fds().items() if before.get(fd) != t}
        if not added or time.monotonic() > deadline:
            return added
        time.sleep(0.05)


def test_no_fd_leak_after_200_runs():
    sb = sandbox()
    sb.run(["true"])  # builds the kernel objects once
    time.sleep(0.2)
    before = open_fds()
    for _ in range(200):
        assert sb.run(["true"]).success
    assert _fds_added_since(before) == {}


def test_sandboxes_release_their_kernel_objects(tmp_path):
    """Each Sandbox builds a Landlock ruleset and a sealed BPF memfd (and opens its audit
    log); dropping the Sandbox, or changing a field, which rebuilds them, must close them."""
    before = open_fds()
    for i in range(30):
        sb = sandbox(audit_log=str(tmp_path / f"audit{i % 2}.jsonl"),
                     net_allow=["127.0.0.1:9"]) if i % 2 else sandbox()
        assert sb.run(["true"]).success
        sb.env = {"ROUND": str(i)}  # drops the built objects
        assert sb.run(["true"]).success
        del sb
    assert _fds_added_since(before) == {}


def test_sandbox_fields_are_validated_on_change(tmp_path):
    sb = Sandbox(fs_readable=["/usr"])
    with pytest.raises(ValueError):
        sb.fs_readable = ["/nonexistent-path-xyz"]
    assert sb.fs_readable == ["/usr"] and sb.policy.fs_readable == ("/usr",)


def test_inherited_fds_do_not_reach_the_sandbox(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("leak")
    fd = os.open(secret, os.O_RDONLY)
    os.set_inheritable(fd, True)  # a careless parent: the fd has no O_CLOEXEC
    try:
        code = ("import os, sys\ntry:\n print(os.read(int(sys.argv[1]), 10))\n"
                "except OSError as e: print(e.errno)\nprint(sorted(os.listdir('/proc/self/fd')))")
        r = run_py(sandbox(), code, str(fd))
        assert r.stdout.decode().splitlines() == ["9", "['0', '1', '2', '3']"]  # EBADF
        # Control: an unconfined child does inherit it.
        import subprocess
        out = subprocess.run([PY, "-c", code, str(fd)], capture_output=True, close_fds=False)
        assert out.stdout.startswith(b"b'leak'")
    finally:
        os.close(fd)


def test_confine_restricts_the_calling_process(tmp_path):
    (tmp_path / "allowed").write_text("a")
    code = f"""
import os, sys
from sandlock import Sandbox, confine, landlock_abi_version, system_readable
assert landlock_abi_version() >= 6
confine(Sandbox(fs_readable=system_readable() + [{str(tmp_path / 'allowed')!r}]))
print(open({str(tmp_path / 'allowed')!r}).read())
try:
    open("/etc/hostname" if False else {str(tmp_path)!r} + "/new", "w")
except OSError as e:
    print(e.errno)
"""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.stdout.split() == ["a", "13"], r.stderr
    assert not (tmp_path / "new").exists()


def test_confine_refuses_a_threaded_process():
    import subprocess
    import sys
    code = ("import threading, time\nfrom sandlock import Sandbox, confine\n"
            "threading.Thread(target=time.sleep, args=(2,), daemon=True).start()\n"
            "try:\n confine(Sandbox(fs_readable=['/usr']))\nexcept Exception as e: print(e)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "single-threaded" in r.stdout


def test_sandboxes_end_when_the_supervising_process_exits(tmp_path):
    import subprocess
    import sys
    pidfile = tmp_path / "pid"
    code = (f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
            f"from conftest import sandbox\nfrom sandlock import StdioMode\n"
            f"p = sandbox().popen(['sleep', '60'], stdout=StdioMode.NULL)\n"
            f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n")  # exits without waiting
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(pid)


def _with_tag(tag: bytes) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if tag in f.read():
                        out.append(int(name))
            except OSError:
                pass
    return [p for p in out if pid_alive(p)]


SHOW_SIGNALS = ["sh", "-c", "grep ^SigIgn /proc/self/status; kill -TERM $$; echo survived"]


@pytest.mark.parametrize("disposition", [signal.SIG_IGN, signal.SIG_DFL])
def test_the_program_keeps_the_caller_s_signal_dispositions(disposition):
    """As subprocess starts it: SIGINT and SIGTERM ignored by the caller (a shell's
    background job, a server that ignores them) stay ignored in the program, and nothing
    else is (the trampoline had reset both to default, and glibc's posix_spawn left its own
    signals 32 and 33 ignored). Control: default, SIGTERM ends the program.
    Signals 32 and 33 are compared with this process's own (as posix_spawn's child, the
    trampoline, cannot see them): Python's subprocess gives them back differently by how
    it starts a child (under make, which leaves both ignored: only 32 with pipes)."""
    # glibc installs its handler of 33 as a process starts its first thread (an ignored
    # 33 inherited from make then ends): one started first, this process's dispositions
    # stay those read here
    t = threading.Thread(target=lambda: None)
    t.start()
    t.join()
    with open("/proc/self/status") as f:
        mine = int(f.read().split("SigIgn:")[1].split()[0], 16)
    old = {sig: signal.signal(sig, disposition) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        r = sandbox().run(SHOW_SIGNALS, timeout=20)
        bare = subprocess.run(SHOW_SIGNALS, capture_output=True, timeout=20)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    ignored = int(r.stdout.split()[1], 16)
    low, internal = (1 << 31) - 1, 3 << 31
    assert ignored & low == int(bare.stdout.split()[1], 16) & low, (r.stdout, bare.stdout)
    assert ignored & internal == mine & internal, (r.stdout, hex(mine))
    assert r.stdout.split()[2:] == bare.stdout.split()[2:], (r.stdout, bare.stdout)
    both = 1 << (signal.SIGINT - 1) | 1 << (signal.SIGTERM - 1)
    if disposition == signal.SIG_IGN:  # (others the suite inherited ignored: as bare)
        assert ignored & both == both and r.exit_code == 0
        assert r.stdout.endswith(b"survived\n")
    else:
        assert ignored & both == 0
        assert (r.reason, r.signal) == (ExitReason.SIGNALED, signal.SIGTERM)
        assert bare.returncode == -signal.SIGTERM


def test_the_program_keeps_the_caller_s_blocked_signals():
    """As subprocess starts it: signals the calling thread blocks stay blocked in the
    program (posix_spawn had been given an empty mask). Control: the same run once the
    caller's mask is back has none blocked."""
    show = ["grep", "^SigBlk", "/proc/self/status"]
    blocked = {signal.SIGINT, signal.SIGUSR2, signal.SIGWINCH, signal.SIGRTMIN + 3}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    try:
        r = sandbox().run(show, timeout=20)
        bare = subprocess.run(show, capture_output=True, timeout=20)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    mask = sum(1 << (sig - 1) for sig in blocked)
    assert int(r.stdout.split()[1], 16) == int(bare.stdout.split()[1], 16) == mask, \
        (r.stdout, bare.stdout)
    control = sandbox().run(show, timeout=20)
    assert int(control.stdout.split()[1], 16) == 0, control.stdout


def test_glibc_s_own_signals_are_never_blocked_in_the_program():
    """A caller with glibc's 32 and 33 blocked (the kernel's call: glibc refuses them):
    subprocess's child has them unblocked, and so has the program (the mask had been
    passed through raw), with the caller's other blocked signals kept."""
    import ctypes
    show = ["grep", "^SigBlk", "/proc/self/status"]
    mask = 3 << 31 | 1 << (signal.SIGUSR1 - 1)
    out = {}

    def in_a_thread():  # its own mask: this one's threads keep theirs
        raw = ctypes.c_uint64(mask)
        ctypes.CDLL(None).syscall(14, 0, ctypes.byref(raw), None, 8)  # rt_sigprocmask
        with open("/proc/thread-self/status") as f:
            out["self"] = int(f.read().split("SigBlk:")[1].split()[0], 16)
        out["sandbox"] = sandbox().run(show, timeout=20).stdout
        out["bare"] = subprocess.run(show, capture_output=True, timeout=20).stdout
    t = threading.Thread(target=in_a_thread)
    t.start()
    t.join(60)
    assert out["self"] == mask, out  # the caller had them blocked
    expected = 1 << (signal.SIGUSR1 - 1)
    got, bare = (int(out[k].split()[1], 16) for k in ("sandbox", "bare"))
    assert got == bare == expected, out


def test_a_double_forked_daemon_is_killed_at_the_end(tmp_path):
    tag = f"daemon-{os.getpid()}"
    r = sandbox().run(["sh", "-c", f"(setsid sh -c 'exec -a {tag} sleep 60' &) ; sleep 0.2; "
                                   f"pgrep -f {tag} >/dev/null && echo started"], timeout=20)
    assert r.stdout == b"started\n", r.stderr  # it ran, in a session of its own
    time.sleep(0.2)
    assert _with_tag(tag.encode()) == []


FORK_RACE = r"""
import os, sys, time
depth = 0
if os.fork() == 0:
    while depth < 3:  # a tree of forks still growing when the program ends
        pid = os.fork()
        depth += 1
        if pid and os.fork() == 0:
            continue
    time.sleep(60)
    os._exit(0)
time.sleep(0.0005 * (int(sys.argv[2]) % 10))
"""


def test_a_fork_tree_racing_the_final_kill_leaves_nothing_behind():
    tag = f"forkrace-{os.getpid()}"
    sb = sandbox()
    for trial in range(200):
        r = run_py(sb, FORK_RACE, tag, str(trial))
        assert r.exit_code == 0, r.stderr
        left = _with_tag(tag.encode())
        assert left == [], (trial, left)


def _run_bounded(sb, argv, timeout: float, join: float):
    """run() on a thread, waited for at most `join` seconds: a root that never ends must
    fail the test, not hang it."""
    res = {}
    t = threading.Thread(target=lambda: res.setdefault("r", sb.run(argv, timeout=timeout)),
                         daemon=True)
    t.start()
    t.join(join)
    return res.get("r")


def _kill_all(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def test_a_thousand_children_are_all_ended():
    # More children than one page of /proc/PID/task/TID/children lists (~680).
    tag = f"manykids-{os.getpid()}"
    code = ("import os, sys, time\nfor i in range(1000):\n    if os.fork() == 0:\n"
            "        time.sleep(120)\n        os._exit(0)\nprint('forked', flush=True)")
    try:
        r = _run_bounded(sandbox(), [PY, "-c", code, tag], timeout=30, join=60)
        assert r is not None, "the sandbox did not end"
        assert r.stdout == b"forked\n", r.stderr
        time.sleep(0.2)
        assert _with_tag(tag.encode()) == []
    finally:
        _kill_all(_with_tag(tag.encode()))


def test_processes_woken_by_sigcont_timers_are_all_ended(tmp_path):
    # Every process arms a 1 ms timer delivering SIGCONT: stopping the tree holds nobody,
    # and it keeps forking while it is being killed.
    exe = tmp_path / f"sigcont-{os.getpid()}"
    subprocess.run(["cc", "-O2", "-o", str(exe), os.path.join(HERE, "helpers",
                                                               "sigcont_timers.c")], check=True)
    try:
        for _ in range(3):
            r = _run_bounded(sandbox(fs_readable=[str(tmp_path)]), [str(exe), "4"],
                             timeout=15, join=40)
            assert r is not None, "the sandbox did not end"
            assert r.stdout == b"program exiting\n", r.stderr
            time.sleep(0.2)
            assert _with_tag(str(exe).encode()) == []
    finally:
        _kill_all(_with_tag(str(exe).encode()))


def test_a_root_that_does_not_end_the_tree_is_ended_from_outside(monkeypatch):
    # The root is stopped from outside (standing in for a root that never handles the
    # request): killing the sandbox must still end every process and return.
    import sandlock.process
    monkeypatch.setattr(sandlock.process, "_ROOT_GRACE", 1.0)
    tag = f"stuckroot-{os.getpid()}"
    proc = sandbox().popen([PY, "-c", "import os, time\nif os.fork() == 0:\n"
                                      "    time.sleep(60)\ntime.sleep(60)", tag],
                           stdout=StdioMode.NULL)
    try:
        deadline = time.monotonic() + 10
        while len(_with_tag(tag.encode())) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(_with_tag(tag.encode())) == 2
        os.kill(proc.root, signal.SIGSTOP)
        t0 = time.monotonic()
        proc.kill()
        r = proc.communicate()  # no timeout of its own: the kill is what bounds it
        assert time.monotonic() - t0 < 5
        assert r.reason == ExitReason.KILLED
        time.sleep(0.1)
        assert _with_tag(tag.encode()) == []
    finally:
        _kill_all(_with_tag(tag.encode()))
        proc.close()
