"""Resource limits without cgroups (sandlock.limits): max_memory, max_processes, max_cpu,
cpu_cores, lowered by a policy_fn mid-run; the CLI flags and YAML `limits:`."""

import os
import subprocess
import sys
import threading
import time

from conftest import PY, run_py, sandbox

from sandlock import ExitReason, StdioMode
from sandlock.process_tree import members

SANDLOCK = [sys.executable, "-m", "sandlock"]


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_one_process_past_max_memory_gets_enomem():
    r = run_py(sandbox(max_memory="128M"),
               "try:\n    x = bytearray(300 << 20)\n    print('allocated')\n"
               "except MemoryError:\n    print('ENOMEM')\ny = bytearray(64 << 20)\nprint('ok')")
    assert r.stdout == b"ENOMEM\nok\n", r.stderr  # the smaller one still fits
    r = run_py(sandbox(), "x = bytearray(300 << 20)\nprint('allocated')")
    assert r.stdout == b"allocated\n"  # the control


HOGS = r"""
import os, time
for i in range(4):
    if os.fork() == 0:
        x = bytearray(60 << 20)  # each under the limit, together past it
        for i in range(0, len(x), 4096):
            x[i] = 1
        time.sleep(20)
        os._exit(0)
time.sleep(20)
"""


def test_processes_together_past_max_memory_are_killed_with_the_reason():
    before = _rss()
    t0 = time.monotonic()
    r = run_py(sandbox(max_memory="128M"), HOGS, timeout=30)
    assert r.reason == ExitReason.MEMORY and not r.success, (r.reason, r.stderr)
    assert "max_memory" in r.error
    assert time.monotonic() - t0 < 10  # killed, not waited out
    assert _rss() - before < 32 << 20  # the supervising process did not grow with it
    r = run_py(sandbox(max_memory="512M"), HOGS.replace("time.sleep(20)", "time.sleep(0.5)"))
    assert r.success, r.stderr  # the control: under the limit it runs to the end


FORKER = r"""
def forker(pause):
    while True:
        try:
            if os.fork() == 0:
                time.sleep(pause)
                os._exit(0)
        except OSError:
            time.sleep(0.001)
"""
BOMB = "import os, time\n" + FORKER + "forker(0.5)\n"


def test_a_fork_bomb_never_exceeds_max_processes():
    peak = _peak_members(20, BOMB, 3)
    assert 15 <= peak <= 20, peak  # it reached the limit, never past it


THREADED_BOMB = ("import os, threading, time\n" + FORKER
                 + "for _ in range(3):\n"
                   "    threading.Thread(target=forker, args=(0.3,), daemon=True).start()\n"
                   "forker(0.3)\n")


def _peak_members(limit: int, script: str, seconds: float) -> int:
    """Run `script` under max_processes=`limit` for `seconds`: the most processes its
    tree ever had at once."""
    proc = sandbox(max_processes=limit).popen([PY, "-c", script], stdout=StdioMode.NULL,
                                              stderr=StdioMode.NULL)
    peak, stop = [0], threading.Event()

    def watch():
        while not stop.is_set():
            peak[0] = max(peak[0], len(members(proc.root)))
    t = threading.Thread(target=watch)
    t.start()
    try:
        time.sleep(seconds)
    finally:
        stop.set()
        t.join()
        proc.kill()
        proc.wait()
        proc.close()
    return peak[0]


def test_forks_continued_in_c_stay_within_max_processes():
    """Far from the limit the supervisor lends the C fast path forks it has already counted
    (supervisor/forks.py): four threads of every process forking at once, some let through
    in C and some in Python, never take the tree past the limit."""
    from sandlock.supervisor.fastpath import fast_path
    fast = fast_path()
    before = fast.stats()["forks_continued"] if fast else 0
    peak = _peak_members(60, THREADED_BOMB, 2.5)
    assert 50 <= peak <= 60, peak
    if fast is not None:  # the C path took part (make helper builds it)
        assert fast.stats()["forks_continued"] > before


def test_max_cpu_holds_the_tree_to_its_share():
    code = ("import os, time\nif os.fork() == 0:\n    t = time.time()\n"
            "    while time.time() - t < 3: pass\n    os._exit(0)\nt = time.time()\n"
            "while time.time() - t < 3: pass\nos.wait()\n"
            "print(sum(os.times()[:4]) / (time.time() - t))")
    r = run_py(sandbox(max_cpu=50), code, timeout=30)
    assert r.success, r.stderr
    share = float(r.stdout)  # two busy processes, together
    assert 0.45 <= share <= 0.55, share
    r = run_py(sandbox(), code, timeout=30)
    assert float(r.stdout) > 0.9  # the control (two cores here)


def test_cpu_cores_pins_every_process():
    code = ("import os\nprint(sorted(os.sched_getaffinity(0)), flush=True)\nif os.fork() == 0:\n"
            "    print(sorted(os.sched_getaffinity(0)), flush=True)\n    os._exit(0)\nos.wait()\n"
            "try:\n    os.sched_setaffinity(0, {0, 1})\n    print('changed')\n"
            "except OSError as e:\n    print('refused', e.errno)")
    r = run_py(sandbox(cpu_cores=[0]), code)
    assert r.stdout == b"[0]\n[0]\nrefused 1\n", r.stderr


def test_a_policy_fn_lowers_the_limits_mid_run():
    def fn(event, ctx):
        if event.syscall == "execve" and event.argv and "lower" in event.argv:
            ctx.restrict_max_processes(3)
            ctx.restrict_max_memory("96M")
    code = ("import os, subprocess, time\n"
            "x = bytearray(150 << 20)\n"  # fits before
            "del x\n"
            "subprocess.run(['true', 'lower'])\n"
            "try:\n    y = bytearray(150 << 20)\n    print('allocated')\n"
            "except MemoryError:\n    print('ENOMEM')\n"
            "n = 0\nfor i in range(6):\n    try:\n"
            "        if os.fork() == 0:\n            time.sleep(1)\n            os._exit(0)\n"
            "        n += 1\n    except OSError:\n        pass\nprint(n)")
    sb = sandbox(max_memory="512M", max_processes=50, policy_fn=fn,
                 policy_fn_events=["exec"])
    r = run_py(sb, code)
    assert r.stdout == b"ENOMEM\n2\n", r.stderr  # 3 live: this one and two children


def test_cli_flags_and_yaml_limits(tmp_path):
    r = subprocess.run(SANDLOCK + ["run", "-m", "64M", "-P", "4", "--max-cpu", "80",
                                   "--cpu-cores", "0", "--", PY, "-c",
                                   "import os; print(sorted(os.sched_getaffinity(0)))\n"
                                   "try:\n    x = bytearray(100 << 20)\n"
                                   "except MemoryError:\n    print('ENOMEM')"],
                       capture_output=True, text=True, timeout=60)
    assert r.stdout == "[0]\nENOMEM\n", r.stderr
    pol = tmp_path / "p.yaml"
    pol.write_text("version: 1\nlimits:\n  processes: 3\n  memory: 64M\n")
    r = subprocess.run(SANDLOCK + ["run", "--policy", str(pol), "--", "sh", "-c",
                                   "sleep 1 & sleep 1 & sleep 1 & sleep 1 & wait"],
                       capture_output=True, text=True, timeout=60)
    assert "fork" in r.stderr.lower(), r.stderr
    r = subprocess.run(SANDLOCK + ["run", "--cpu-cores", "999", "--", "true"],
                       capture_output=True, text=True)
    assert r.returncode == 125 and "--cpu-cores: CPU 999 is not available" in r.stderr
    r = subprocess.run(SANDLOCK + ["run", "-P", "0", "--", "true"], capture_output=True,
                       text=True)
    assert r.returncode == 125 and "-P/--max-processes" in r.stderr


def test_memory_held_in_a_memfd_counts():
    # Written with write(): in no process's RSS, and RLIMIT_DATA does not see it.
    code = ("import os, time\nfd = os.memfd_create('x')\nchunk = b'x' * (1 << 20)\n"
            "for i in range(256):\n    os.write(fd, chunk)\nprint('written', flush=True)\n"
            "time.sleep(3)\nprint('survived')")
    r = run_py(sandbox(max_memory="64M"), code, timeout=30)
    assert r.reason == ExitReason.MEMORY and b"survived" not in r.stdout, (r.reason, r.stdout)
    r = run_py(sandbox(max_memory="512M"), code.replace("time.sleep(3)", "time.sleep(0.3)"))
    assert r.stdout == b"written\nsurvived\n", r.stderr  # the control


def test_pages_shared_by_forked_processes_count_once():
    # 48 forks of one interpreter: their resident sizes add up past the limit, what they
    # really use (proportional shares) does not.
    code = ("import os, time\nx = bytearray(24 << 20)\nkids = []\nfor i in range(48):\n"
            "    p = os.fork()\n    if p == 0:\n        time.sleep(2)\n        os._exit(0)\n"
            "    kids.append(p)\nrss = 0\nfor k in kids:\n"
            "    rss += int(open(f'/proc/{k}/statm').read().split()[1]) * 4096\n"
            "print(rss >> 20 > 256, flush=True)\nfor k in kids:\n    os.waitpid(k, 0)\n"
            "print('finished')")
    r = run_py(sandbox(max_memory="256M"), code, timeout=30)
    assert r.stdout == b"True\nfinished\n", (r.reason, r.error, r.stdout)


def test_short_lived_children_are_charged_their_cpu(tmp_path):
    # Children that burn 4 ms each and are reaped by the kernel (SIGCHLD ignored): their
    # time is in nobody's cutime.
    exe = tmp_path / "short_burners"
    subprocess.run(["cc", "-O2", "-o", str(exe), os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "helpers", "short_burners.c")], check=True)
    share = lambda r: float(r.stdout.split(b"=")[1].split(b"%")[0])  # noqa: E731
    r = sandbox(fs_readable=[str(tmp_path)], max_cpu=20).run([str(exe), "1", "2"], timeout=60)
    assert r.success, r.stderr
    assert share(r) <= 30, r.stdout
    r = sandbox(fs_readable=[str(tmp_path)]).run([str(exe), "1", "2"], timeout=60)
    assert share(r) > 60, r.stdout  # the control


def test_short_commands_one_after_another_fit_a_small_process_limit():
    r = sandbox(max_processes=5).run(
        ["/bin/sh", "-c", "for i in $(seq 200); do /bin/true || exit 1; done; echo ran"],
        timeout=60)
    assert r.stdout == b"ran\n", r.stderr
    r = sandbox(max_processes=5).run(  # the control: the shell and five at once are too many
        ["/bin/sh", "-c", "sleep 2 & sleep 2 & sleep 2 & sleep 2 & sleep 2 & wait; echo ok"],
        timeout=60)
    assert b"Cannot fork" in r.stderr and r.stdout == b"", (r.stdout, r.stderr)


def test_process_events_are_still_heard_with_forks_counted():
    seen = []

    def fn(event, ctx):
        if event.category == "process":
            seen.append(event.syscall)
    r = sandbox(max_processes=10, policy_fn=fn, policy_fn_events=["process"]).run(
        ["/bin/sh", "-c", "/bin/true; /bin/true; echo ok"], timeout=30)
    assert r.stdout == b"ok\n", r.stderr
    forks = [s for s in seen if s in ("clone", "clone3", "fork", "vfork")]
    assert len(forks) >= 2, seen
