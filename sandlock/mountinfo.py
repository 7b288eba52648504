"""This process's mount table, parsed from /proc/self/mountinfo (proc(5)): one reader for
what asks which mounts expose a path (home_policy.exposures) and on which filesystem a
path lies (service/reads.py)."""

from __future__ import annotations

import os


def _unescape(field: bytes) -> str:
    """A path field: the kernel writes space, tab, newline and backslash as \\ooo."""
    if b"\\" in field:
        field = field.decode("unicode_escape").encode("latin-1")
    return os.fsdecode(field)


def mounts() -> list[tuple[str, str, str, str]]:
    """(device "major:minor", root within its filesystem, mount point, filesystem type)
    of each mount; empty if the table cannot be read."""
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        fields, _, rest = line.partition(b" - ")
        f = fields.split()
        if len(f) > 4 and rest:
            out.append((f[2].decode(), _unescape(f[3]), _unescape(f[4]),
                        rest.split()[0].decode()))
    return out
