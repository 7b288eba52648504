"""Backing what init_fn built with huge pages (MADV_COLLAPSE, Linux >= 6.1) before the COW
clones are forked.

A fork copies one page-table entry per mapped 4 KiB page, and each clone's exit tears them
down again; a 2 MiB huge page is one entry. With 200 MB built by init_fn, this makes the
forking 4x faster (bench/cow.py). A clone that writes to a collapsed page splits it back
into 4 KiB entries in that clone only, and copies one 4 KiB page, as before.

Invariant: only 2 MiB chunks of private anonymous memory that are entirely mapped now and
had no page mapped before init_fn ran are collapsed. Those pages are the init process's
own (init_fn wrote them after the fork from the caller): collapsing them copies nothing
the caller still shares and maps no page that was not mapped. It is an optimization
only: a kernel or a moment without huge pages leaves the memory as it was.
"""

from __future__ import annotations

import ctypes
import os

MADV_COLLAPSE = 25
HUGE = 2 << 20
PAGE = os.sysconf("SC_PAGE_SIZE")
_WINDOW = 64 << 20  # mincore() is asked about at most this much at a time

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)
_libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


def _anon_ranges(maps_fd: int):
    """Private anonymous writable mappings (the heap included), 2 MiB-aligned inwards,
    from an open /proc/self/maps (re-read from the start: the kernel regenerates it)."""
    chunks = []
    os.lseek(maps_fd, 0, os.SEEK_SET)
    while chunk := os.read(maps_fd, 65536):
        chunks.append(chunk)
    for line in b"".join(chunks).splitlines():
        parts = line.split()
        if len(parts) < 5 or parts[1] != b"rw-p" or (len(parts) > 5 and parts[5] != b"[heap]"):
            continue
        lo, hi = (int(x, 16) for x in parts[0].split(b"-"))
        lo, hi = -(-lo // HUGE) * HUGE, hi // HUGE * HUGE
        if hi > lo:
            yield lo, hi


def _chunks(maps_fd: int, whole: bool) -> set[int]:
    """Start addresses of the 2 MiB chunks with every page mapped (whole=True) or with
    any page mapped (whole=False)."""
    out = set()
    per = HUGE // PAGE
    for lo, hi in _anon_ranges(maps_fd):
        for start in range(lo, hi, _WINDOW):
            length = min(_WINDOW, hi - start)
            vec = ctypes.create_string_buffer(length // PAGE)
            if _libc.mincore(start, length, vec) != 0:
                continue  # unmapped meanwhile: nothing to say about it
            raw = vec.raw
            for k in range(0, len(raw), per):
                mapped = per - raw.count(0, k, k + per)  # mincore: 1 mapped, 0 not
                if (mapped == per) if whole else mapped:
                    out.add(start + k * PAGE)
    return out


def mapped_before(maps_fd: int) -> set[int]:
    """The chunks that hold any mapped page now (call it before init_fn)."""
    return _chunks(maps_fd, whole=False)


def collapse_new(maps_fd: int, before: set[int]) -> int:
    """Collapse the chunks entirely mapped now and in `before` not at all; returns the
    bytes now backed by huge pages (0 where the kernel cannot)."""
    done = 0
    for start in sorted(_chunks(maps_fd, whole=True) - before):
        if _libc.madvise(start, HUGE, MADV_COLLAPSE) == 0:
            done += HUGE
    return done
