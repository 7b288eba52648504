"""Interactive use under a real pseudo-terminal: bash with job control inside the sandbox,
Ctrl-C and Ctrl-Z reaching the foreground job, window-size changes, and the terminal given
back afterwards."""

import fcntl
import os
import pty
import re
import select
import signal
import struct
import sys
import termios
import time

import pytest

SANDLOCK = [sys.executable, "-m", "sandlock"]


class Term:
    """A child on a new pseudo-terminal (its controlling terminal), read and typed into."""

    def __init__(self, argv, env=None):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            # A terminal's session starts with the default dispositions, whatever the suite
            # was started with (`make test &` ignores SIGINT and SIGQUIT, which the
            # program, as bash's jobs, would keep: Ctrl-C would then do nothing)
            for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGTSTP, signal.SIGTTIN,
                        signal.SIGTTOU, signal.SIGHUP, signal.SIGTERM):
                signal.signal(sig, signal.SIG_DFL)
            os.execvpe(argv[0], argv, env or os.environ)
        self.out = b""

    def type(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def expect(self, pattern: str, timeout: float = 15) -> str:
        deadline = time.monotonic() + timeout
        rx = re.compile(pattern.encode())
        while True:
            m = rx.search(self.out)
            if m:
                found = self.out[:m.end()].decode(errors="replace")
                self.out = self.out[m.end():]
                return found
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                raise AssertionError(f"no {pattern!r} in {self.out[-2000:]!r}")
            try:
                self.out += os.read(self.fd, 65536)
            except OSError:
                raise AssertionError(f"terminal closed before {pattern!r}: {self.out!r}")

    def resize(self, rows: int, cols: int) -> None:
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def close(self) -> int:
        try:  # its whole process group: a sandlock CLI left behind would wait forever
            os.killpg(self.pid, 9)
        except ProcessLookupError:
            pass
        _, status = os.waitpid(self.pid, 0)
        os.close(self.fd)
        return status


@pytest.fixture
def shell():
    # An outer sh reads commands after sandlock ends: it can only if the terminal's
    # foreground was given back.
    env = dict(os.environ, PS1="$ ", TERM="dumb")
    t = Term(["sh", "-c", " ".join(SANDLOCK) + " run -- bash --norc --noprofile -i; "
              "echo SANDLOCK-DONE; exec sh -i"], env)
    yield t
    t.close()


def test_bash_job_control_under_a_terminal(shell):
    t = shell
    t.expect(r"\$ ")
    t.type("echo started\n")
    t.expect("started")
    t.expect(r"\$ ")
    assert b"setpgid" not in t.out and b"job control" not in t.out  # bash started clean
    t.type("sleep 100\n")
    time.sleep(0.5)
    t.type("\x03")  # Ctrl-C interrupts the foreground job, the prompt returns
    t.expect(r"\$ ")
    t.type("echo rc=$?\n")
    t.expect("rc=130")
    t.type("sleep 100\n")
    time.sleep(0.5)
    t.type("\x1a")  # Ctrl-Z stops it
    t.expect("Stopped")
    t.expect(r"\$ ")
    t.type("jobs\n")
    t.expect(r"\[1\]\+ +Stopped +sleep 100")
    t.type("fg\n")
    t.expect("sleep 100")
    time.sleep(0.3)
    t.type("\x03")
    t.expect(r"\$ ")
    t.type("echo rc=$?\n")
    t.expect("rc=130")
    # At the prompt: a size changed while bash was between commands, with "stty size"
    # typed ahead, was read as "0 0" once in a few dozen runs (not understood; bash's
    # own window-size handling between commands is the suspect, nothing of sandlock
    # sets one).
    t.expect(r"\$ ")
    t.resize(33, 77)  # the window size reaches the foreground
    t.type("stty size\n")
    t.expect("33 77")
    t.type("exit\n")
    t.expect("SANDLOCK-DONE")
    t.type("echo outer-$((40+2))\n")  # the outer shell has the terminal back
    t.expect("outer-42")


def test_the_final_kill_reaches_jobs_left_behind(shell, tmp_path):
    t = shell
    t.expect(r"\$ ")
    n = os.getpid() % 1000  # its own: the unprivileged rerun may run this test meanwhile
    t.type(f"sleep 77.{n} & setsid sleep 78.{n} & sleep 0.2; "
           f"echo pids=$(pgrep -d, -f '^sleep 7[78][.]{n}$')\n")
    pids = [int(p) for p in t.expect(r"pids=[\d,]+").split("=")[-1].split(",")]
    assert len(pids) == 2
    t.type("exit\n")
    t.expect("SANDLOCK-DONE")
    time.sleep(0.3)
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or \
            open(f"/proc/{pid}/stat").read().split()[2] == "Z"


def test_the_terminal_is_given_back_usable(tmp_path):
    """A program that sets the terminal exclusive (every later open fails with EBUSY) and
    stops its output (tcflow TCOOFF) does not leave it so for the user's shell."""
    prog = tmp_path / "spoil.py"
    prog.write_text("import fcntl, termios\n"
                    "fcntl.ioctl(0, termios.TIOCEXCL)\n"
                    "termios.tcflow(0, termios.TCOOFF)\n")
    probe = tmp_path / "probe.py"
    probe.write_text("import fcntl, struct\n"
                     "x = struct.unpack('i', fcntl.ioctl(0, 0x80045440, b'0000'))[0]\n"
                     "print('excl=%d' % (40 + x))\n")
    env = dict(os.environ, PS1="$ ", TERM="dumb")
    t = Term(["sh", "-c", f"{' '.join(SANDLOCK)} run -r {tmp_path} -- {sys.executable} {prog}; "
              f"echo SANDLOCK-DONE; exec sh -i"], env)
    try:
        t.expect("SANDLOCK-DONE")  # output flows again (TCOOFF would hold it back)
        t.expect(r"\$ ")
        t.type(f"{sys.executable} {probe}\n")
        t.expect("excl=40")  # not exclusive (40 + 1 if it were)
        t.type(f"{sys.executable} {probe} < /dev/tty\n")
        t.expect("excl=40")  # and it can be opened again
    finally:
        t.close()
