"""COW fork and map-reduce: init_fn once, n confined copy-on-write clones, a reducer."""

from __future__ import annotations

import os

import pytest

from sandlock import PolicyError, Sandbox, system_devices, system_readable

from conftest import PY, open_fds

STATE = {}


def _init():
    STATE["squares"] = [i * i for i in range(1000)]  # built once, shared by every clone
    STATE["init_pid"] = os.getpid()


def _square(clone_id):
    assert os.environ["CLONE_ID"] == str(clone_id)
    assert os.getppid() == STATE["init_pid"]  # a fork of the init process
    print(STATE["squares"][clone_id])


def mapper(work_fn=_square, init_fn=_init, **kw):
    kw["fs_readable"] = system_readable() + list(kw.get("fs_readable") or [])
    kw["fs_writable"] = system_devices() + list(kw.get("fs_writable") or [])
    return Sandbox(init_fn=init_fn, work_fn=work_fn, **kw)


def reducer(**kw):
    kw["fs_readable"] = system_readable() + list(kw.get("fs_readable") or [])
    kw["fs_writable"] = system_devices() + list(kw.get("fs_writable") or [])
    return Sandbox(**kw)


SUM = [PY, "-c", "import sys; print(sum(int(line) for line in sys.stdin))"]


def test_fork_100_and_reduce_gives_the_right_answer():
    clones = mapper().fork(100, timeout=60)
    assert len(clones) == 100 and len(set(clones.pids)) == 100
    r = reducer().reduce(SUM, clones, timeout=60)
    assert r.success, r.stderr
    assert int(r.stdout) == sum(i * i for i in range(100))
    assert all(c.exit_code == 0 for c in clones)


def test_each_clone_has_its_own_stdout_and_clone_id():
    clones = mapper(work_fn=lambda i: print(f"clone {i} of {os.environ['CLONE_ID']}")).fork(
        20, timeout=60).wait(timeout=60)
    assert [c.stdout for c in clones] == [f"clone {i} of {i}\n".encode() for i in range(20)]
    assert [c.id for c in clones] == list(range(20))


def test_clones_cannot_read_what_the_mapper_policy_forbids(tmp_path):
    public, secret = tmp_path / "public", tmp_path / "secret"
    public.mkdir()
    secret.mkdir()
    (public / "data").write_text("public data\n")
    (secret / "key").write_text("TOPSECRET\n")

    def work(i):
        print(open(public / "data").read().strip())  # positive control
        try:
            print(open(secret / "key").read())
        except PermissionError:
            print("denied")
    clones = mapper(work_fn=work, init_fn=None, fs_readable=[str(public)]).fork(
        5, timeout=60).wait(timeout=60)
    for c in clones:
        assert c.stdout == b"public data\ndenied\n"


def test_init_fn_runs_confined_too(tmp_path):
    secret = tmp_path / "key"
    secret.write_text("TOPSECRET\n")

    def init():
        try:
            STATE["leak"] = open(secret).read()
        except PermissionError:
            STATE["leak"] = "denied"
    clones = mapper(work_fn=lambda i: print(STATE["leak"]), init_fn=init).fork(
        3, timeout=60).wait(timeout=60)
    assert {c.stdout for c in clones} == {b"denied\n"}


def test_clones_inherit_no_open_file_of_the_parent(tmp_path):
    outside = tmp_path / "outside.txt"
    fd = os.open(outside, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        def work(i):
            try:
                os.write(fd, b"escaped\n")
                print("wrote")
            except OSError as e:
                print("error", e.errno)
        clones = mapper(work_fn=work, init_fn=None).fork(3, timeout=60).wait(timeout=60)
    finally:
        os.close(fd)
    assert {c.stdout for c in clones} == {b"error 9\n"}  # EBADF: the fd was closed
    assert outside.read_text() == ""


def test_the_reducer_cannot_read_what_its_policy_forbids(tmp_path):
    secret = tmp_path / "reducer-secret"
    secret.write_text("TOPSECRET\n")
    clones = mapper().fork(4, timeout=60)
    r = reducer().reduce(["sh", "-c", f"cat; cat {secret}; echo rc=$?"], clones, timeout=60)
    out = r.stdout.decode()
    assert out.splitlines()[:4] == ["0", "1", "4", "9"]  # the clones' data went through
    assert "TOPSECRET" not in out and out.splitlines()[-1] == "rc=1"


def test_a_failing_clone_is_reported_and_others_finish():
    def work(i):
        if i == 2:
            raise RuntimeError("boom")
        print(i)
    clones = mapper(work_fn=work, init_fn=None).fork(4, timeout=60).wait(timeout=60)
    assert [c.exit_code for c in clones] == [0, 0, 1, 0]
    assert clones[3].stdout == b"3\n"


def test_a_failing_init_fn_raises_and_leaves_nothing_running():
    def init():
        raise ValueError("no model")
    with pytest.raises(Exception, match="init_fn failed: ValueError: no model"):
        mapper(init_fn=init).fork(3, timeout=60)


def test_a_hanging_init_fn_is_bounded():
    import time
    with pytest.raises(Exception, match="did not complete within"):
        mapper(init_fn=lambda: time.sleep(60)).fork(2, timeout=1)


def test_clones_that_hang_are_killed_at_the_timeout():
    import time
    clones = mapper(work_fn=lambda i: time.sleep(60), init_fn=None).fork(3, timeout=30)
    t0 = time.monotonic()
    clones.wait(timeout=1)
    assert time.monotonic() - t0 < 10
    assert all(c.exit_code == -9 for c in clones)


@pytest.mark.parametrize("kw, what", [
    ({"net_allow": ["example.com:443"]}, "network rules naming hosts"),
    ({"policy_fn": lambda e, c: None}, "policy_fn"),
])
def test_policies_that_need_the_supervisor_are_refused(kw, what):
    with pytest.raises(PolicyError, match=what):
        mapper(**kw).fork(2)


def test_fork_needs_work_fn_and_a_positive_count():
    with pytest.raises(PolicyError, match="work_fn"):
        Sandbox(fs_readable=system_readable()).fork(2)
    with pytest.raises(PolicyError, match="positive integer"):
        mapper().fork(0)


def test_clones_cannot_reach_each_others_pipes_or_the_report():
    """Clones share a uid and a Landlock domain, but are not dumpable: /proc/<sibling>/fd
    and the init process's report pipe are out of reach; output cannot be forged."""
    def work(i):
        import time
        if i == 0:
            time.sleep(0.3)
            hits = []
            for pid in [os.getppid()] + [p for p in range(os.getpid() - 8, os.getpid() + 8)]:
                for fd in range(0, 64):
                    try:
                        f = os.open(f"/proc/{pid}/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK)
                    except OSError:
                        continue
                    if pid != os.getpid():
                        hits.append((pid, fd))
                    os.close(f)
            print("hits", hits)
        else:
            time.sleep(0.6)
            print("clone", i)
    clones = mapper(work_fn=work, init_fn=None).fork(3, timeout=30).wait(timeout=30)
    assert clones[0].stdout == b"hits []\n"
    assert [c.stdout for c in clones[1:]] == [b"clone 1\n", b"clone 2\n"]  # untouched


def test_shared_writable_mappings_of_the_caller_are_not_inherited(tmp_path):
    import mmap
    data = tmp_path / "data"
    data.write_bytes(b"ORIGINAL")
    with open(data, "r+b") as f:
        m = mmap.mmap(f.fileno(), 8)

        def work(i):
            try:
                m[:8] = b"CLONE!!!"
                print("wrote")
            except BaseException:
                print("no")
        clones = mapper(work_fn=work, init_fn=None).fork(1, timeout=30).wait(timeout=30)
        m.close()
    assert data.read_bytes() == b"ORIGINAL"
    assert clones[0].exit_code != 0 or clones[0].stdout == b"no\n"


def test_process_fields_apply_to_clones(tmp_path):
    os.environ["SANDLOCK_TEST_CALLER_SECRET"] = "hunter2"
    try:
        clones = mapper(work_fn=lambda i: print(os.getcwd(), os.environ.get(
            "SANDLOCK_TEST_CALLER_SECRET"), os.environ.get("K")), init_fn=None,
            clean_env=True, env={"K": "v"}, cwd="/usr").fork(2, timeout=30).wait(timeout=30)
    finally:
        del os.environ["SANDLOCK_TEST_CALLER_SECRET"]
    assert {c.stdout for c in clones} == {b"/usr None v\n"}


def test_wait_timeout_holds_when_a_clone_closes_its_stdout_and_hangs():
    import time
    clones = mapper(work_fn=lambda i: (os.close(1), time.sleep(30)), init_fn=None).fork(
        2, timeout=30)
    t0 = time.monotonic()
    clones.wait(timeout=1)
    assert time.monotonic() - t0 < 8
    assert all(c.exit_code == -9 for c in clones)


def test_clone_stderr_is_collected_and_sys_exit_messages_kept():
    def work(i):
        print(f"warning from {i}", file=sys.stderr)
        sys.exit("bad input" if i == 1 else 0)
    import sys
    clones = mapper(work_fn=work, init_fn=None).fork(2, timeout=30).wait(timeout=30)
    assert [c.exit_code for c in clones] == [0, 1]
    err = clones.stderr.decode()
    assert "warning from 0" in err and "warning from 1" in err and "bad input" in err


def test_reduce_after_wait_is_a_clear_error():
    clones = mapper().fork(2, timeout=30).wait(timeout=30)
    with pytest.raises(Exception, match="already consumed"):
        reducer().reduce(SUM, clones)


def test_clones_get_no_unix_socket_and_no_unbound_listen(tmp_path):
    import socket
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    srv.bind(str(tmp_path / "srv.sock"))
    srv.settimeout(0.5)

    def work(i):
        out = []
        for what, fn in (
                ("socketpair", lambda: socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)),
                ("unix", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)),
                ("listen", lambda: socket.socket().listen()),
                ("tcp", lambda: socket.socket())):  # positive control
            try:
                fn()
                out.append(f"{what}:ok")
            except OSError as e:
                out.append(f"{what}:{e.errno}")
        print(" ".join(out))
    clones = mapper(work_fn=work, init_fn=None).fork(1, timeout=30).wait(timeout=30)
    assert clones[0].stdout == b"socketpair:1 unix:1 listen:1 tcp:ok\n"
    with pytest.raises(socket.timeout):
        srv.recv(100)  # nothing reached the pathname socket
    srv.close()


def _own_fds(i):
    """A clone prints its open fds (but the one listing them) and its stdout's pipe."""
    fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
    live = []
    for fd in fds:
        try:
            os.fstat(fd)
            live.append(fd)
        except OSError:
            pass  # the listing's own directory fd, closed by now
    print(live, os.readlink("/proc/self/fd/1"))


@pytest.mark.parametrize("loop", ["C", "Python"])
def test_each_clone_holds_only_its_own_pipe(loop, monkeypatch):
    """Each clone's pipe is made just before its fork and its read end leaves the init
    process within a batch of 32 forks: a clone holds fds 0, 1, 2 and no sibling's read
    end. 70 clones span three batches. The Python loop (no `make helper`) keeps the
    same invariant."""
    import sandlock.clones as clones_mod
    if loop == "Python":
        monkeypatch.setattr(clones_mod, "_loaded", [None])
    else:
        assert clones_mod._forkloop() is not None, "the C loop is not built (make helper)"
    clones = mapper(work_fn=_own_fds, init_fn=None,
                    fs_readable=["/proc"]).fork(70, timeout=60).wait(timeout=60)
    assert all(c.exit_code == 0 for c in clones), clones.stderr
    fds = [c.stdout.split(b"]")[0] + b"]" for c in clones]
    pipes = [c.stdout.split(b"]")[1].strip() for c in clones]
    assert set(fds) == {b"[0, 1, 2]"}
    assert len(set(pipes)) == 70 and all(p.startswith(b"pipe:") for p in pipes)


def _report_socket():
    """What init_fn can reach: the init process's report socket (its only socket)."""
    import socket
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                return socket.socket(fileno=os.dup(int(fd)))
        except OSError:
            continue
    raise AssertionError("no report socket in the init process")


def _forging_init():
    """init_fn runs in the init process, beside the report socket: it sends junk lines
    with fds attached, then a record that claims clone 1's output."""
    import array
    import socket
    sock = _report_socket()
    junk = [os.open("/dev/null", os.O_RDONLY) for _ in range(3)]
    rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", junk))]
    sock.sendmsg([b"hello\nX 1 2\n"], rights)
    if STATE.get("claim"):
        r, w = os.pipe()
        os.write(w, b"forged\n")
        # a write end would never reach EOF in the caller's hands: it is refused too
        end = w if STATE["claim"] == "write end" else r
        sock.sendmsg([b"P 1 %d\n" % os.getpid()],
                     [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [end]))])


@pytest.mark.parametrize("claim", [False, "read end", "write end"])
def test_what_init_fn_sends_on_the_report_is_contained(claim):
    """Unclaimed fds are closed at once and junk lines ignored: the clones' outputs are
    intact. A P line that init_fn sends before the real one makes the real one a
    duplicate: fork() fails (nothing is reported as a clone's output) and leaves neither
    an fd nor a process behind."""
    before = open_fds()
    STATE["claim"] = claim
    try:
        sb = mapper(init_fn=_forging_init, work_fn=lambda i: print(f"clone {i}"),
                    fs_readable=["/proc"])
        if claim:
            with pytest.raises(Exception, match="malformed report"):
                sb.fork(3, timeout=30)
        else:
            clones = sb.fork(3, timeout=30).wait(timeout=30)
            assert [c.stdout for c in clones] == [b"clone 0\n", b"clone 1\n", b"clone 2\n"]
            assert [c.exit_code for c in clones] == [0, 0, 0]
    finally:
        STATE.pop("claim", None)
    del sb  # its own Landlock ruleset and BPF memfd
    import gc
    gc.collect()
    after = open_fds()
    assert {fd: t for fd, t in after.items() if before.get(fd) != t} == {}


def _thp_available() -> bool:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[never]" not in f.read()
    except OSError:
        return False


BIG = {}


def _big_init():
    import mmap
    BIG["model"] = bytearray(48 << 20)
    for k in range(0, len(BIG["model"]), 4096):  # every page written: init_fn's own
        BIG["model"][k] = k // 4096 % 251
    sparse = mmap.mmap(-1, 64 << 20, flags=mmap.MAP_PRIVATE)
    total = sum(sparse[k] for k in range(0, len(sparse), 4096))  # read: the zero page
    for k in range(0, len(sparse), 2 << 20):
        sparse[k] = 1  # one real page per 2 MiB: collapsing would make the rest real
    BIG["sparse"] = (sparse, total)


def _big_work(i):
    m = BIG["model"]
    huge = [line.split()[1] for line in open("/proc/self/smaps_rollup")
            if line.startswith("AnonHugePages:")][0]
    m[i * 4096] = 255  # this clone's own copy of one page
    others = [m[k * 4096] for k in range(20) if k != i]
    import time
    time.sleep(0.05)  # the others write meanwhile
    others_after = [m[k * 4096] for k in range(20) if k != i]
    print(int(huge) // 1024, others == others_after == [k % 251 for k in range(20) if k != i],
          m[i * 4096])


@pytest.mark.skipif(not _thp_available(), reason="transparent huge pages are off here")
def test_what_init_fn_built_is_forked_as_huge_pages_and_stays_copy_on_write():
    """init_fn's 48 MB are collapsed into huge pages before the forks (one page-table
    entry per 2 MiB); the caller's own 64 MB, still shared with it, are not, and neither
    are 64 MB init_fn only read (the shared zero page) but for one byte per 2 MiB:
    collapsing never makes memory real. A clone's write stays its own."""
    caller = bytearray(64 << 20)
    for k in range(0, len(caller), 4096):
        caller[k] = 1
    clones = mapper(init_fn=_big_init, work_fn=_big_work).fork(20, timeout=60).wait(timeout=60)
    assert all(c.exit_code == 0 for c in clones), clones.stderr
    outs = [c.stdout.split() for c in clones]
    assert {o[1:] for o in map(tuple, outs)} == {(b"True", b"255")}
    huge_mb = [int(o[0]) for o in outs]
    assert all(40 <= mb <= 50 for mb in huge_mb), huge_mb  # init_fn's, not the caller's
    assert caller[4096] == 1 and len(caller) == 64 << 20


def _random_and_threads(i):
    import random
    import threading
    print(random.random(), len(threading.enumerate()))


def _threaded_init():
    """init_fn leaves a thread running, holding a lock most of the time; clones are then
    forked under Python's own fork protocol."""
    import threading

    def busy():
        lock = threading.Lock()
        while True:
            with lock:
                sum(range(1000))
    threading.Thread(target=busy, daemon=True).start()


@pytest.mark.parametrize("loop", ["C", "Python"])
@pytest.mark.parametrize("threaded", [False, True])
def test_clones_draw_their_own_random_numbers_and_see_one_thread(threaded, loop,
                                                                 monkeypatch):
    """A thread init_fn leaves running (here: busy, asking for the GIL) switches to
    Python's own fork protocol, run in each clone before its first bytecode."""
    import sandlock.clones as clones_mod
    if loop == "Python":
        monkeypatch.setattr(clones_mod, "_loaded", [None])
    clones = mapper(init_fn=_threaded_init if threaded else None,
                    work_fn=_random_and_threads).fork(40, timeout=60).wait(timeout=60)
    assert all(c.exit_code == 0 for c in clones), clones.stderr
    values = [c.stdout.split() for c in clones]
    assert len({v[0] for v in values}) == 40  # reseeded in each clone, as after os.fork()
    assert {v[1] for v in values} == {b"1"}  # init_fn's thread did not come along


def test_init_fn_output_is_not_lost(capfd):
    mapper(init_fn=lambda: print("model loaded"), work_fn=lambda i: None).fork(
        2, timeout=30).wait(timeout=30)
    assert "model loaded" in capfd.readouterr().out  # buffered, flushed before the forks


def _late(i):
    import time
    time.sleep(0.003 * i)  # exits spread out: one exit record after another
    print(i)


def test_many_spread_out_exits_do_not_stall_wait_or_reduce():
    """Every exit is reported on the socket; wait() and reduce() read it meanwhile, so the
    init process never blocks on a full socket (and the shared stderr ends)."""
    import time
    t0 = time.monotonic()
    clones = mapper(init_fn=None, work_fn=_late).fork(600, timeout=60).wait(timeout=30)
    assert time.monotonic() - t0 < 25
    assert [c.exit_code for c in clones] == [0] * 600
    assert [c.stdout for c in clones] == [b"%d\n" % i for i in range(600)]
    clones = mapper(init_fn=None, work_fn=_late).fork(600, timeout=60)
    r = reducer().reduce(SUM, clones, timeout=60)
    assert int(r.stdout) == sum(range(600)) and [c.exit_code for c in clones] == [0] * 600


def test_the_callers_read_ends_are_not_inherited_by_its_children():
    clones = mapper().fork(5, timeout=30)
    try:
        assert [os.get_inheritable(c.fd) for c in clones] == [False] * 5
    finally:
        clones.wait(timeout=30)


def test_a_low_open_file_limit_still_forks_every_clone():
    clones = mapper(max_open_files=20).fork(100, timeout=60).wait(timeout=60)
    assert [c.exit_code for c in clones] == [0] * 100
    assert [int(c.stdout) for c in clones] == [i * i for i in range(100)]


def _forger_thread_init():
    """A thread init_fn leaves behind sends exit lines with impossible statuses for the
    pids the clones will likely get."""
    import threading
    import time
    sock = _report_socket()
    me = os.getpid()

    def forge():
        time.sleep(0.2)
        sock.send(b"".join(b"X %d 127\nX %d 1099511627776\n" % (p, p)
                           for p in range(me + 1, me + 40)) + b"F 1" + b"9" * 400 + b"\n")
    threading.Thread(target=forge, daemon=True).start()


def test_forged_exit_and_timing_lines_do_not_break_wait():
    import time
    clones = mapper(init_fn=_forger_thread_init, work_fn=lambda i: (time.sleep(0.5), print(i)),
                    fs_readable=["/proc"]).fork(4, timeout=30).wait(timeout=30)
    assert [c.stdout for c in clones] == [b"0\n", b"1\n", b"2\n", b"3\n"]
    assert [c.exit_code for c in clones] == [0, 0, 0, 0]


def _early_timing_init():
    """init_fn ends the forking phase (F) before any clone is forked."""
    _report_socket().send(b"F 5\n")


def test_a_timing_line_before_the_clones_does_not_end_the_fork():
    """The fork loop sends F after its n P lines: an earlier F (init_fn's, or a thread's
    it left behind) is not the end of the forking phase."""
    clones = mapper(init_fn=_early_timing_init, work_fn=lambda i: print(i),
                    fs_readable=["/proc"]).fork(3, timeout=30).wait(timeout=30)
    assert [c.stdout for c in clones] == [b"0\n", b"1\n", b"2\n"]
    assert [c.exit_code for c in clones] == [0, 0, 0]


def _hijacking_init():
    """init_fn claims both clones' outputs with one pipe's read end, sent twice, and ends
    the forking phase itself (F): fork() takes those as the outputs."""
    import array
    import socket
    sock = _report_socket()
    r, w = os.pipe()
    os.write(w, b"x" * 10)
    STATE["hijack_w"] = w  # open until the init process ends: no EOF before that
    sock.sendmsg([b"P 0 %d\nP 1 %d\nF 5\n" % (os.getpid(), os.getpid())],
                 [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [r, r]))])


def test_one_pipe_claimed_twice_by_init_fn_does_not_break_wait():
    """Both fds name one pipe: when one read empties it, the other's would block (EAGAIN).
    wait() goes on; the real clones' records that come later are closed unread."""
    import time
    t0 = time.monotonic()
    clones = mapper(init_fn=_hijacking_init, work_fn=lambda i: print(i),
                    fs_readable=["/proc"]).fork(2, timeout=30).wait(timeout=30)
    assert time.monotonic() - t0 < 20
    assert sorted(c.stdout for c in clones) == [b"", b"x" * 10]
