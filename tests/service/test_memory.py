"""service/memory.py: free C heap pages given back to the system (glibc's malloc_trim), for real."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from service import memory

ROOT = Path(__file__).resolve().parents[2]

# 200,000 blocks of 1 KiB (above pymalloc's 512 B: glibc's heap), one in 16 kept: the heap is full of free
# holes that glibc keeps (only a free top is given back on its own).
HOLES = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[1])
    from service.memory import trim

    def rss():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024

    blocks = [bytes(1024) + bytes([i % 256]) for i in range(200_000)]
    kept = blocks[::16]
    del blocks
    before = rss()
    trimmed = trim()
    print(trimmed, before, rss())
    """
)


def test_trim_gives_the_free_holes_of_the_heap_back() -> None:
    """About 190 MiB freed in holes: the RSS falls by most of it (measured 226 -> 82 MiB). Without the
    trim (or with a no-op) the RSS stays where it was, and this fails."""
    out = subprocess.run(
        [sys.executable, "-c", HOLES, str(ROOT)], capture_output=True, text=True, check=True, timeout=120
    ).stdout.split()
    trimmed, before, after = out[0] == "True", float(out[1]), float(out[2])
    assert trimmed
    assert before - after > 100, f"RSS {before:.1f} -> {after:.1f} MiB: the free holes were kept"


# Four threads allocating at once, then the number of C heaps (arenas) glibc's malloc_info reports.
ARENAS = textwrap.dedent(
    """
    import ctypes, os, sys, tempfile, threading
    sys.path.insert(0, sys.argv[1])
    from service.memory import limit_arenas

    if sys.argv[2] == "limit":
        assert limit_arenas(1)
    barrier = threading.Barrier(4)

    def work():
        blocks = [bytes(4096) for _ in range(1000)]
        barrier.wait()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    libc = ctypes.CDLL(None)
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    fd, path = tempfile.mkstemp()
    os.close(fd)
    stream = libc.fopen(path.encode(), b"w")
    libc.malloc_info(0, stream)
    libc.fclose(stream)
    print(open(path).read().count("<heap nr="))
    os.unlink(path)
    """
)


def heaps(mode: str) -> int:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    out = subprocess.run(
        [sys.executable, "-c", ARENAS, str(ROOT), mode], capture_output=True, text=True, check=True, env=env
    )
    return int(out.stdout)


def test_limit_arenas_keeps_threads_on_few_heaps() -> None:
    """Without the limit, each of the four threads gets a heap of its own (5 measured); with it, one."""
    assert heaps("none") > 2, "the scenario makes no arenas: it cannot show the limit"
    assert heaps("limit") == 1


def test_the_periodic_trim_runs_in_a_thread_until_cancelled(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    async def scenario() -> None:
        loop, three = asyncio.get_running_loop(), asyncio.Event()

        def malloc_trim(pad: int) -> int:  # called in a thread
            calls.append(pad)
            if len(calls) == 3:
                loop.call_soon_threadsafe(three.set)
            return 1

        monkeypatch.setattr(memory, "_malloc_trim", lambda: malloc_trim)
        task = asyncio.create_task(memory.trim_periodically(0.01))
        await three.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(asyncio.wait_for(scenario(), 30))
    assert calls[:3] == [0, 0, 0]


def test_no_periodic_trim_when_off_or_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    asyncio.run(asyncio.wait_for(memory.trim_periodically(0), 5))  # returns at once: off
    monkeypatch.setattr(memory, "_malloc_trim", lambda: None)
    asyncio.run(asyncio.wait_for(memory.trim_periodically(0.01), 5))  # returns at once: no malloc_trim
    assert memory.trim() is False
