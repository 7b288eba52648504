"""/proc/PID/stat: its fields after the command name, which may itself hold spaces and
parentheses (so the text is cut at the last ')')."""

from __future__ import annotations

import os

STATE, PPID, PGRP, NUM_THREADS = 0, 1, 2, 17  # indexes into fields(): stat(5) fields 3, 4, 5, 20


def read(path: str) -> bytes:
    """A stat file's text, with one read and no file object (it is read on every
    supervised connect)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 1024)
    finally:
        os.close(fd)


def fields(stat: bytes) -> list[bytes]:
    """The fields from the state on. ValueError if `stat` is not a stat line."""
    return stat[stat.rindex(b")") + 2:].split()
