"""Giving the terminal to a sandbox while it runs, and taking it back.

A sandbox started from an interactive terminal runs in the terminal's foreground: its
program starts in its root's process group (sandlock-init.c), which becomes the
terminal's foreground group, so the program reads the terminal, Ctrl-C and Ctrl-Z reach
it (not the process that started it), window-size changes reach it (SIGWINCH goes to the
foreground group), and a shell inside does its own job control (setpgid, tcsetpgrp). When
it ends, the foreground group, the terminal's modes, its exclusive flag (TIOCEXCL makes
every later open of the terminal fail with EBUSY) and its output flow (tcflow TCOOFF
silences it) are restored, whatever state the program left them in. The window size is
not: the user may have resized the terminal meanwhile, and a size the program set is
corrected by the next resize. Nothing of the terminal becomes a way out: TIOCSTI and TIOCLINUX
stay refused by the filter.
"""

from __future__ import annotations

import fcntl
import os
import signal
import struct
import termios

TIOCGEXCL = 0x80045440  # not in the termios module


class Foreground:
    """The terminal on `fd` (default: stdin) handed to process group `pgid` if we hold its
    foreground; `restore()` takes it back."""

    def __init__(self, pgid: int, fd: int = 0):
        self.fd = -1
        self.modes = None
        self.exclusive = False
        try:
            if os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp():
                self.fd = fd
                self.modes = termios.tcgetattr(fd)
                self.exclusive = _exclusive(fd)
        except (OSError, termios.error):
            self.fd = -1
        if self.fd >= 0:
            self._give(pgid)
            # As a shell's `fg` does: a program that looked at the terminal before it was
            # handed over (an interactive bash does at once) stopped itself with SIGTTIN
            # and waits to be continued in the foreground.
            try:
                os.killpg(pgid, signal.SIGCONT)
            except OSError:
                pass

    def _give(self, pgid: int) -> None:
        # A background group's tcsetpgrp stops it with SIGTTOU unless SIGTTOU is blocked.
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTTOU})
        try:
            os.tcsetpgrp(self.fd, pgid)
        except OSError:
            pass
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def restore(self) -> None:
        if self.fd < 0:
            return
        self._give(os.getpgrp())
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTTOU})
        try:
            for restore in (self._modes, self._flow, self._exclusive):
                try:
                    restore()
                except (OSError, termios.error):
                    pass
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        self.fd = -1

    def _modes(self) -> None:
        if self.modes is not None:
            termios.tcsetattr(self.fd, termios.TCSANOW, self.modes)

    def _flow(self) -> None:
        termios.tcflow(self.fd, termios.TCOON)

    def _exclusive(self) -> None:
        if _exclusive(self.fd) != self.exclusive:
            fcntl.ioctl(self.fd, termios.TIOCEXCL if self.exclusive else termios.TIOCNXCL)


def _exclusive(fd: int) -> bool:
    try:
        return struct.unpack("i", fcntl.ioctl(fd, TIOCGEXCL, b"\0" * 4))[0] != 0
    except OSError:
        return False
