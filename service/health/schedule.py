"""When each proxy is probed next: keys in one list per tick of TICK seconds, the ticks in a heap (issue 20).

A heap of `(due, key)` tuples cost about 88 bytes a proxy (the tuple, its float, the heap's slot): 0.9 MiB
of a leader's 10,000. Probes every 10 s +/- 1 s need no finer grain than a few milliseconds, so a key's due
time is rounded down to its tick (a probe may start up to TICK early, never late) and the key waits in its
tick's list: 8 bytes a key, and a list, a dict entry and an int per tick in use (at most one interval's
worth: 500 at 10 s).
"""

from __future__ import annotations

import heapq
import math

__all__ = ["TICK", "Schedule"]

TICK = 0.02  # seconds


class Schedule:
    __slots__ = ("_buckets", "_ticks")

    def __init__(self) -> None:
        self._buckets: dict[int, list[str]] = {}  # tick -> the keys due then
        self._ticks: list[int] = []  # heap of the ticks in `_buckets`

    def push(self, due: float, key: str) -> None:
        """Probe `key` at `due` (or up to TICK before it)."""
        tick = math.floor(due / TICK)
        bucket = self._buckets.get(tick)
        if bucket is None:
            self._buckets[tick] = [key]
            heapq.heappush(self._ticks, tick)
        else:
            bucket.append(key)

    def pop_due(self, now: float) -> tuple[float, str] | None:
        """A key due by `now` with its tick's time, from the earliest tick first; None when none is due."""
        ticks, buckets = self._ticks, self._buckets
        while ticks and ticks[0] * TICK <= now:
            bucket = buckets[ticks[0]]
            if bucket:
                return ticks[0] * TICK, bucket.pop()
            del buckets[heapq.heappop(ticks)]  # emptied: the tick goes
        return None

    def next_due(self) -> float | None:
        """The earliest tick's time (it may have been emptied: then `pop_due` drops it); None when empty."""
        return self._ticks[0] * TICK if self._ticks else None

    def entries(self) -> list[tuple[float, str]]:
        """Every (due tick's time, key), earliest first (tests, inspection)."""
        return sorted((tick * TICK, key) for tick, keys in self._buckets.items() for key in keys)

    def __len__(self) -> int:
        return sum(len(keys) for keys in self._buckets.values())
