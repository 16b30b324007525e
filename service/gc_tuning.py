"""CPython's cyclic garbage collector, set for a service that holds a big and long-lived heap.

The collector's oldest generation is scanned whole: once a service holds the objects of 10,000 Proxies (the
watch's cache, the inventory, the board), every full collection walks all of them with the event loop
stopped, and a lease load makes full collections frequent (each lease record outlives the young
generations). Measured in `bench_discovery` (10,000 healthy proxies, the Redis store, 10 s): 33 full
collections of up to 49 ms, 1.1 s of the server's CPU in the collector (docs/operations.md).

Two settings, as large Python services use them (`gc.freeze` was added to CPython for this: Instagram's
web servers):
- **Settled objects are frozen.** At start, and every `every` seconds after, one full collection runs and
  what survives it is moved to the permanent generation (`gc.freeze`), which no collection scans. Objects
  made since are collected as usual. Frozen objects are still freed by reference counting; a reference cycle
  among them that becomes garbage waits for the next settle, which first gives the frozen objects back
  (`gc.unfreeze`) so that its full collection sees them all. One pause of a full collection every `every`
  seconds, instead of one every few seconds under load.
- **A young generation of `YOUNG` allocations** instead of 700: each collection of it costs about what it
  finds, and seldom promoted objects reach the old generations less often.

`every` = 0 leaves the collector as CPython sets it. Each settle's pause and the objects it froze are on
/metrics (`SettleMetrics`): `proxy_operator_gc_settle_seconds` and `proxy_operator_gc_frozen_objects`.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Gauge, Histogram

log = logging.getLogger(__name__)

EVERY = 300.0  # seconds between two settles (the first after `FIRST`); 0 turns the tuning off
FIRST = 60.0  # the first settle after start: the first pass's objects (a leader's intake) are in by then
YOUNG = 10_000  # the young generation's threshold (CPython's: 700); the older two stay at theirs


OnSettle = Callable[[int, float], None]  # (objects frozen, seconds the settle held the interpreter)


class SettleMetrics:
    """The settles on /metrics: each one's pause (a full collection holds the loop) and what it froze."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.seconds = Histogram(
            "proxy_operator_gc_settle_seconds",
            "How long each settle of the garbage collector (a full collection, then gc.freeze) held the "
            "interpreter; one at start and one every gc_settle_seconds.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=registry,
        )
        self.frozen = Gauge(
            "proxy_operator_gc_frozen_objects",
            "Objects the last settle moved out of the collector's reach (gc.get_freeze_count()).",
            registry=registry,
        )

    def observe(self, frozen: int, took: float) -> None:
        self.seconds.observe(took)
        self.frozen.set(frozen)


def settle() -> tuple[int, float]:
    """One full collection of everything, then freeze what survived: (objects frozen, seconds it took)."""
    started = time.perf_counter()
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count(), time.perf_counter() - started


def release(*, tuned: bool) -> tuple[int, float]:
    """A full collection now, the frozen objects given back to the collector first: what a leadership
    term held in reference cycles (its controller, planner, reporter, queue) was frozen with the rest at
    the last settle, and would stay until the next one (up to `every` seconds) while the next term builds
    all of it again: two terms' state at once, and the allocator's arenas left fragmented after (a new term
    at 6,000 running proxies took the service from 162 to 194 MiB). Frozen again after when the tuning is on
    (`tuned`). Returns (objects frozen, seconds it took)."""
    if tuned:
        return settle()
    started = time.perf_counter()
    gc.unfreeze()
    gc.collect()
    return gc.get_freeze_count(), time.perf_counter() - started


def tune(every: float = EVERY, on_settle: OnSettle | None = None) -> bool:
    """At start, once the service's parts are built: a larger young generation and a first settle. False
    (nothing changed) when `every` is 0."""
    if every <= 0:
        return False
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG, older, oldest)
    frozen, took = settle()
    log.debug("gc: %d objects frozen at start in %.0f ms", frozen, took * 1000)
    if on_settle is not None:
        on_settle(frozen, took)
    return True


async def settle_periodically(
    every: float = EVERY, *, first: float = FIRST, on_settle: OnSettle | None = None
) -> None:
    """Until cancelled: `settle()` after `first` seconds (at most `every`), then every `every` seconds. On the
    event loop: a collection holds the interpreter whichever thread runs it."""
    if every <= 0:
        return
    delay = min(first, every)
    while True:
        await asyncio.sleep(delay)
        delay = every
        frozen, took = settle()
        log.debug("gc: settled, %d objects frozen in %.0f ms", frozen, took * 1000)
        if on_settle is not None:
            on_settle(frozen, took)
