"""What held the event loop: when it runs late by `threshold` seconds, where its thread (and the others) were.

The lag histogram (loop_lag.py) says how often the loop ran late and by how much, not why: a lease that
waits 200 ms behind a stall cannot tell which part of the service held the loop. A watcher thread looks at
the loop's heartbeat (the lag task's last wake-up) every quarter `threshold`; while the beat is older than
its period plus `threshold`, it takes the stack of the loop's thread and the innermost frame of every other
thread the kernel has running or runnable (`sys._current_frames`, /proc's thread states). Once the loop
beats again, a warning names the stalls' lengths, how much of them the loop's thread spent on a CPU and
waiting for one (the kernel's schedstat), its most sampled stacks and the busy threads:

    event loop held 1 time(s) since the last warning, longest 240 ms, 240 ms in all (its thread on a CPU
    230 ms, waiting for one 4 ms); loop at (samples): _pass (health/engine.py:88) < ... (3x); busy threads:
    none

So a stall reads one of three ways: its thread on a CPU for most of it (the stack says in what); waiting
for a CPU (other processes had the cores); neither (asleep: the GIL held by a busy thread, which is then
listed, or a blocking call on the loop).

At most one warning every REPORT_EVERY seconds: the stalls in between go into the next one, with their
samples. Every stall is counted on /metrics (`proxy_operator_event_loop_stalls_total`). Costs a thread's
wake-up and one /proc read four times per `threshold` (8 a second at 0.5 s), nothing on the loop;
`loop_stall_seconds` sets the threshold, 0 turns it off.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from prometheus_client import CollectorRegistry, Counter

log = logging.getLogger(__name__)

REPORT_EVERY = 10.0  # seconds between two warnings at most
DEPTH = 8  # frames of the loop's stack in a warning
TOP = 3  # stacks in a warning
INNER = 2  # innermost frames of a deeper stack kept before the installation's own
_ROOT = str(Path(__file__).resolve().parents[1]) + os.sep  # the installation's packages (service, ...)
# where a stack stops: the loop's own frames (asyncio's, or the runner's frame under uvloop's C loop), the
# same in every stall
_LOOP_CODES = frozenset(
    {asyncio.Handle._run.__code__, asyncio.Runner.run.__code__,
     asyncio.BaseEventLoop.run_forever.__code__, asyncio.BaseEventLoop.run_until_complete.__code__,
     asyncio.BaseEventLoop._run_once.__code__}  # type: ignore[attr-defined]
)  # fmt: skip
TASKS = Path("/proc/self/task")


def _where(frame: FrameType) -> str:
    code = frame.f_code
    path = code.co_filename.replace("\\", "/").split("/")
    return f"{code.co_name} ({'/'.join(path[-2:])}:{frame.f_lineno})"


def stack_of(frame: FrameType | None, depth: int = DEPTH) -> str:
    """`frame` and its callers, innermost first: `f (dir/file.py:12) < g (dir/file.py:40) < ...`, up to the
    callback the loop runs (asyncio's `Handle._run` and the loop's own frames are the same in every stall).
    A deeper stack keeps its INNER innermost frames and then the installation's own (a blocking call deep in
    a client library is named by the call of ours that made it)."""
    frames: list[FrameType] = []
    while frame is not None and frame.f_code not in _LOOP_CODES:
        frames.append(frame)
        frame = frame.f_back
    if len(frames) > depth:
        own = [f for f in frames[INNER:] if _own(f)][: depth - INNER]
        return " < ".join([*map(_where, frames[:INNER]), "...", *map(_where, own)])
    # no frame of a callback: the loop in its own (uvloop's C) code, or its thread waiting there for the GIL
    return " < ".join(map(_where, frames)) or "(the loop's own code)"


def _own(frame: FrameType) -> bool:
    name = frame.f_code.co_filename
    return name.startswith(_ROOT) and "site-packages" not in name


class StallWatch:
    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        threshold: float,
        period: float,
        beat: Callable[[], float],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`beat()`: when the loop last woke its lag task (`clock`'s time), which wakes every `period`."""
        self.threshold = threshold
        self._period = period
        self._beat = beat
        self._clock = clock
        self.stalls = Counter(
            "proxy_operator_event_loop_stalls",
            f"Times the event loop ran at least loop_stall_seconds ({threshold:g} s) late; each is logged "
            "with where the loop's thread was (at most one warning every 10 s).",
            registry=registry,
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop_thread = 0
        self._started = float("-inf")
        self._stall_from: float | None = None  # the beat the current stall followed
        self._loop_stacks: collections.Counter[str] = collections.Counter()
        self._busy: collections.Counter[str] = collections.Counter()
        self._held: list[float] = []  # the stalls since the last warning, seconds each
        self._loop_tid = 0
        # the loop thread's (time, on-CPU ns, runqueue ns) at the last looks, for a stall's start
        self._sched: collections.deque[tuple[float, int, int]] = collections.deque(maxlen=64)
        self._stall_sched: tuple[int, int] | None = None  # the loop's reading before the current stall
        self._cpu = [0, 0]  # the loop thread's on-CPU and runqueue ns in the stalls since the last warning
        self._reported = float("-inf")

    def start(self) -> None:
        """From the loop's thread (whose stack is the one sampled)."""
        self._loop_thread = threading.get_ident()
        self._loop_tid = threading.get_native_id()
        self._started = self._clock()  # a beat from before the start is no stall of the loop's
        self._thread = threading.Thread(target=self._run, name="loop-stall-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.threshold / 4):
            self.check()

    def check(self) -> None:
        """One look at the heartbeat: sample while the loop is late, report once it beats again."""
        beat, now = max(self._beat(), self._started), self._clock()
        sched = _schedstat(self._loop_tid)
        if now - beat >= self._period + self.threshold:
            if self._stall_from is None:
                self._stall_from = beat
                before = [(cpu, wait) for at, cpu, wait in self._sched if at <= beat]
                self._stall_sched = before[-1] if before else None
            self._sample()
        elif self._stall_from is not None and beat > self._stall_from:
            if sched is not None and self._stall_sched is not None:
                self._cpu[0] += sched[0] - self._stall_sched[0]
                self._cpu[1] += sched[1] - self._stall_sched[1]
            self._report(held=beat - self._stall_from - self._period, now=now)
        if sched is not None:
            self._sched.append((now, *sched))

    def _sample(self) -> None:
        names = {thread.ident: thread for thread in threading.enumerate()}
        for ident, frame in sys._current_frames().items():
            if ident == self._loop_thread:
                self._loop_stacks[stack_of(frame)] += 1
                continue
            thread = names.get(ident)
            if ident == threading.get_ident() or thread is None or thread.native_id is None:
                continue
            if _running(thread.native_id):  # on a CPU or waiting for one: not in a wait or a syscall's sleep
                self._busy[f"{thread.name} in {_where(frame)}"] += 1

    def _report(self, *, held: float, now: float) -> None:
        self.stalls.inc()
        self._stall_from = None
        self._held.append(held)
        if now - self._reported < REPORT_EVERY:
            return  # its samples go into the next warning's
        loop_at = "; ".join(f"{stack} ({n}x)" for stack, n in self._loop_stacks.most_common(TOP)) or "none"
        busy = "; ".join(f"{where} ({n}x)" for where, n in self._busy.most_common(TOP)) or "none"
        log.warning(
            "event loop held %d time(s) since the last warning, longest %.0f ms, %.0f ms in all (its thread "
            "on a CPU %.0f ms, waiting for one %.0f ms); loop at (samples): %s; busy threads: %s",
            len(self._held), max(self._held) * 1000, sum(self._held) * 1000, self._cpu[0] / 1e6,
            self._cpu[1] / 1e6, loop_at, busy,
        )  # fmt: skip
        self._cpu = [0, 0]
        self._reported = now
        self._held.clear()
        self._loop_stacks.clear()
        self._busy.clear()


def _schedstat(tid: int) -> tuple[int, int] | None:
    """The thread's time on a CPU and waiting on a runqueue, in ns (the kernel's schedstat); None where the
    kernel has none."""
    try:
        on_cpu, waiting, _ = (TASKS / str(tid) / "schedstat").read_text().split()
        return int(on_cpu), int(waiting)
    except (OSError, ValueError):
        return None


def _running(tid: int) -> bool:
    """The thread is running or runnable (state R), not asleep in a wait, a lock (the GIL too) or I/O."""
    try:
        return (TASKS / str(tid) / "stat").read_text().rsplit(")", 1)[1].split()[0] == "R"
    except (OSError, IndexError):
        return False
