"""Clocks injected into timers, so tests move time instead of waiting for it."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Protocol


class Clock(Protocol):
    """Monotonic seconds and a sleep that follows them."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class MonotonicClock:
    """The real clock: `time.monotonic` and `asyncio.sleep`."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class FakeClock:
    """Time that moves only when a test calls `advance`; sleepers wake in deadline order."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()  # ties wake in the order they went to sleep
        self._added: asyncio.Event | None = None

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._order), future))
        if self._added is not None:
            self._added.set()
            self._added = None
        await future  # a cancelled sleeper leaves a cancelled future that `advance` skips

    @property
    def sleepers(self) -> list[float]:
        """Deadlines of the sleepers still waiting, earliest first."""
        return sorted(deadline for deadline, _, future in self._sleepers if not future.done())

    async def advance(self, seconds: float) -> None:
        """Move time forward; each sleeper due wakes at its own deadline and runs until its next await."""
        if seconds < 0:
            raise ValueError("time does not go backwards")
        target = self._now + seconds
        await asyncio.sleep(0)  # tasks created just before this call get to start their sleep first
        while self._sleepers and self._sleepers[0][0] <= target:
            deadline, _, future = heapq.heappop(self._sleepers)
            if future.done():
                continue
            self._now = max(self._now, deadline)
            future.set_result(None)
            await asyncio.sleep(0)  # one loop turn: the woken task takes its next step at `deadline`
        self._now = target
        await asyncio.sleep(0)

    async def wait_for_sleepers(self, count: int = 1) -> None:
        """Return once at least `count` sleepers are waiting (no polling, no wall clock)."""
        while len(self.sleepers) < count:
            if self._added is None:
                self._added = asyncio.Event()
            await self._added.wait()
