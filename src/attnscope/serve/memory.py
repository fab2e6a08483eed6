"""The server process's resident memory: measured, given back to the system, kept under a ceiling.

glibc keeps freed memory for reuse; with default settings a server that builds and drops
arrays of tens of MB ratchets up (the mmap threshold grows to 32 MB and each worker thread
gets its own arena). `tune()` fixes the threshold and the arena count, `release()` trims
what is free back to the system. Both do nothing where glibc is not the allocator.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import importlib
import logging
import os
import resource
import sys

log = logging.getLogger(__name__)
_M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
_MMAP_THRESHOLD = 4 * 2**20
_TRIM_THRESHOLD = 256 * 2**20
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


_LIBC = _libc()


def rss_bytes() -> int:
    """Resident memory now (Linux: /proc/self/statm), else the peak the system reports."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak) * (1 if sys.platform == "darwin" else 1024)


def tune() -> None:
    """Large arrays straight from mmap (returned on free), a heap kept between requests, and two arenas
    for all the worker threads.

    The threshold is 4 MiB: a trace's stacked arrays (19 MB of weights at 256 tokens) come from mmap
    and go back on free, while a forward pass's per-layer temporaries (3 MB of scores) reuse the heap.
    At 256 KiB every one of those was a fresh mmap whose pages fault in: the forward pass ran ~1.7x slower.
    Setting the threshold also fixes glibc's trim threshold at 128 KiB, so the heap's free top went back to
    the system after every request and faulted in again on the next: it is 256 MiB (release() still trims).
    """
    if _LIBC is not None:
        _LIBC.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
        _LIBC.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
        _LIBC.mallopt(_M_ARENA_MAX, 2)
    numpy_huge_pages(False)


def numpy_huge_pages(ask: bool) -> bool:
    """Whether numpy asks the kernel for transparent huge pages (madvise) for arrays of 4 MiB or more, as it does by
    default; returns what it did before (False where this numpy has no such switch).

    The server turns it off: where the kernel defragments huge pages on demand for regions that asked (THP defrag
    "madvise", a common default), the first touch of each 2 MiB page may wait for the kernel to compact memory. A
    long trace's uint8 maps (SmolLM2 at 2,048 tokens: 37.7 MB a layer, written once) took 65 ms a layer to fault in
    against 17 ms in 4 KiB pages on this machine (docs/serve.md); they are read a row or a head at a time, where
    huge pages save little. torch's allocator, which holds the forward pass's tensors, never asks."""
    for where in ("numpy._core.multiarray", "numpy.core.multiarray"):  # numpy >= 2, then 1.x
        try:
            switch = getattr(importlib.import_module(where), "_set_madvise_hugepage", None)
        except ImportError:
            continue
        if switch is not None:
            return bool(switch(ask))
    return False


def release(collect: bool = False) -> None:
    """Give memory that is free inside the allocator back to the system; collect: Python's reference cycles
    first (what only they hold is freed now rather than at the collector's next run)."""
    if collect:
        gc.collect()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
