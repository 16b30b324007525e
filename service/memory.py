"""Giving freed memory back to the system: glibc's `malloc_trim` now and then, and few malloc arenas.

A leader's intake allocates and frees a lot (10,000 Proxies judged, written and read back): what Python
frees of the larger blocks goes back to glibc's heaps, and glibc keeps it there, so the RSS of a settled
leader stays at the intake's peak although the live data is smaller. `malloc_trim(0)` returns the free pages
of every heap (it advises them away, not only the heap's top), which is what a settled service needs: the
measured figures are in docs/operations.md ("A leader's memory"). It walks the heaps (a few milliseconds at
130 MiB) under glibc's own locks, so it runs in a thread, every `every` seconds, and only where it exists
(glibc: the image and Debian; musl and macOS have no `malloc_trim`, and there this does nothing).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
from collections.abc import Callable

log = logging.getLogger(__name__)

EVERY = 30.0  # seconds between two trims; 0 turns them off
ARENAS = 2  # glibc's malloc arenas (its default: 8 per core), as MALLOC_ARENA_MAX=2 would set
M_ARENA_MAX = -8  # mallopt's parameter (malloc.h)


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def limit_arenas(arenas: int = ARENAS) -> bool:
    """At most `arenas` C heaps (glibc makes one per thread that finds the others busy, up to 8 per core:
    each keeps what its threads freed). The service's threads (`asyncio.to_thread`, the watch's and the
    writers') allocate little; a leader at 10,000 Proxies keeps about 3 MiB less with 2 (docs/operations.md).
    Call it early: arenas made before stay. MALLOC_ARENA_MAX in the environment wins. False where there is
    no glibc."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt if name else None
    except (OSError, AttributeError):
        mallopt = None
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, arenas))


def trim() -> bool:
    """Give the free pages of the C heaps back now; True when some were. False where there is no way to."""
    malloc_trim = _malloc_trim()
    return bool(malloc_trim(0)) if malloc_trim is not None else False


async def trim_periodically(every: float = EVERY) -> None:
    """Until cancelled: `trim()` in a thread every `every` seconds (never, when `every` is 0 or glibc's
    `malloc_trim` is missing)."""
    malloc_trim = _malloc_trim()
    if every <= 0 or malloc_trim is None:
        log.debug("no periodic malloc_trim (every %s s, available: %s)", every, malloc_trim is not None)
        return
    while True:
        await asyncio.sleep(every)
        await asyncio.to_thread(malloc_trim, 0)
