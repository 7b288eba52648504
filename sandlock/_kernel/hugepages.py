"""Backing what init_fn built with huge pages (MADV_COLLAPSE, Linux >= 6.1) before the COW
clones are forked.

A fork copies one page-table entry per mapped 4 KiB page, and each clone's exit tears them
down again; a huge page (2 MiB on x86-64) is one entry. With 200 MB built by init_fn, this
makes the forking 4x faster (bench/cow.py). A clone that writes to a collapsed page splits
it back into 4 KiB entries in that clone only, and copies one 4 KiB page, as before.

Invariant: only huge-page-sized chunks of private anonymous memory whose every page is
present and mapped by this process alone (/proc/self/pagemap: present, exclusively mapped,
not file or shared) are collapsed. Pages still shared with the caller and the shared zero
page (read but never written) are neither: collapsing copies nothing the caller shares and
makes no page resident that was not, so memory use does not grow. It is an optimization
only: any failure leaves the memory as it was.
"""

from __future__ import annotations

import array
import ctypes
import os

MADV_COLLAPSE = 25
PAGE = os.sysconf("SC_PAGE_SIZE")
_PRESENT, _FILE_OR_SHARED, _EXCLUSIVE = 1 << 63, 1 << 61, 1 << 56
_WINDOW = 64 << 20  # pagemap is read for at most this much address space at a time


def _huge_size() -> int:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 2 << 20


HUGE = _huge_size()  # read in the caller at import: the init process may not see /sys

_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


def _read_all(fd: int) -> bytes:
    chunks = []
    os.lseek(fd, 0, os.SEEK_SET)
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _anon_ranges(maps_fd: int):
    """Private anonymous writable mappings (the heap included), aligned inwards to huge
    pages, from an open /proc/self/maps (re-read: the kernel regenerates it)."""
    for line in _read_all(maps_fd).splitlines():
        parts = line.split()
        if len(parts) < 5 or parts[1] != b"rw-p" or (len(parts) > 5 and parts[5] != b"[heap]"):
            continue
        lo, hi = (int(x, 16) for x in parts[0].split(b"-"))
        lo, hi = -(-lo // HUGE) * HUGE, hi // HUGE * HUGE
        if hi > lo:
            yield lo, hi


def _own_chunks(maps_fd: int, pagemap_fd: int):
    """Start addresses of the chunks whose every page is present and this process's own."""
    per = HUGE // PAGE
    want = _PRESENT | _EXCLUSIVE
    for lo, hi in _anon_ranges(maps_fd):
        for start in range(lo, hi, _WINDOW):
            length = min(_WINDOW, hi - start)
            raw = os.pread(pagemap_fd, length // PAGE * 8, start // PAGE * 8)
            entries = array.array("Q")
            entries.frombytes(raw[:len(raw) // 8 * 8])
            for k in range(0, len(entries) - per + 1, per):
                if all(e & want == want and not e & _FILE_OR_SHARED
                       for e in entries[k:k + per]):
                    yield start + k * PAGE


def collapse_own(maps_fd: int, pagemap_fd: int) -> int:
    """Collapse every chunk of this process's own memory (see the invariant); returns the
    bytes now backed by huge pages (0 where the kernel cannot)."""
    done = 0
    try:
        for start in list(_own_chunks(maps_fd, pagemap_fd)):
            if _libc.madvise(start, HUGE, MADV_COLLAPSE) == 0:
                done += HUGE
    except (OSError, ValueError):
        pass  # an optimization only
    return done
