"""bench_incluster's tracemalloc report (BENCH_TRACEMALLOC=1): where the service's live memory went."""

from __future__ import annotations

import signal
import subprocess
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
# The CLI under tracemalloc; SIGUSR1 writes a snapshot to the file named by BENCH_SNAPSHOT, SIGUSR2 a census
# (tests/bench/census.py) to the file named by BENCH_CENSUS_FILE.
TRACED = """
import os, signal, sys, tracemalloc
signal.signal(signal.SIGUSR1, lambda *_: tracemalloc.take_snapshot().dump(os.environ["BENCH_SNAPSHOT"]))
if os.environ.get("BENCH_CENSUS_FILE"):
    from tests.bench.census import install
    install()
from service.cli import app
sys.argv[0] = "proxy-operator"
app()
"""


def report_allocations(process: subprocess.Popen[bytes], path: Path, *, until: Callable[..., Any]) -> None:
    """Where the live memory of the service was allocated (tracemalloc), by line and by file; `path` is
    the traced service's BENCH_SNAPSHOT."""
    process.send_signal(signal.SIGUSR1)
    until(lambda: path.exists() and path.stat().st_size > 0, what="the tracemalloc snapshot")
    time.sleep(2)  # the dump is written at once; let it finish
    snapshot = tracemalloc.Snapshot.load(str(path)).filter_traces(
        [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen importlib*")]
    )
    total = sum(stat.size for stat in snapshot.statistics("filename"))
    print(f"tracemalloc: {total / 2**20:.1f} MiB live in Python allocations; the largest by line:")
    for stat in snapshot.statistics("lineno")[:15]:
        frame = stat.traceback[0]
        print(f"  {stat.size / 2**20:6.1f} MiB {stat.count:8d} blocks  {_where(frame)}")
    callers: dict[str, int] = {}
    foreign = []
    for stat in snapshot.statistics("traceback"):
        ours = [f for f in reversed(stat.traceback) if _ours(f.filename)]
        where = _where(ours[0]) if ours else f"(no frame of ours within {len(stat.traceback)})"
        callers[where] = callers.get(where, 0) + stat.size
        if not ours:
            foreign.append(stat)
    print("  by the line of ours nearest the allocation:")
    for where, size in sorted(callers.items(), key=lambda item: -item[1])[:12]:
        print(f"  {size / 2**20:6.1f} MiB  {where}")
    print("  the largest with no frame of ours, outermost frame first:")
    for stat in foreign[:6]:
        frames = " <- ".join(_where(f) for f in list(stat.traceback)[::-1][:6])
        print(f"  {stat.size / 2**20:6.1f} MiB  {frames}")


def report_census(process: subprocess.Popen[bytes], path: Path, *, until: Callable[..., Any]) -> None:
    """Print a census of the service's objects by what holds them (tests/bench/census.py); `path` is the
    service's BENCH_CENSUS_FILE."""
    process.send_signal(signal.SIGUSR2)
    until(lambda: path.exists() and path.stat().st_size > 0, what="the census")
    print(path.read_text())


def _ours(filename: str) -> bool:
    return filename.startswith(str(ROOT)) and "/.venv/" not in filename


def _where(frame: tracemalloc.Frame) -> str:
    name = frame.filename
    short = name[len(str(ROOT)) + 1 :] if _ours(name) else name.split("site-packages/")[-1]
    return f"{short}:{frame.lineno}"
