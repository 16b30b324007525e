"""The health engine: a `prober` task that probes every addressed proxy once per interval, with jitter.

Each proxy has its own due time (its first probe within a second, or spread at 1000 a second over at most one
interval when many arrive at once; then every interval +/- jitter), kept in a schedule of ticks
(`schedule.py`); at most `concurrency` probes are in flight. Every result feeds the metrics; only state
transitions reach `on_transition` (the lead wires it to Proxy status and events). A `local` proxy whose
port is not held by the process its stack started is not probed at all (`listener.py`) and turns unhealthy
at once.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from service.health import listener
from service.health.egress import shared_egress
from service.health.metrics import HealthMetrics
from service.health.probe import ProbeResult
from service.health.schedule import Schedule
from service.health.thresholds import Thresholds
from service.inventory import Health, HealthState, Inventory, ProxyEndpoint
from stacks.keyset import KeySet

log = logging.getLogger(__name__)
MAX_IDLE_SLEEP = 0.5  # re-read the inventory at least this often
FIRST_SPREAD_SECONDS = 1.0  # new proxies are first probed within this long (a few of them) ...
FIRST_PROBES_PER_SECOND = 1000.0  # ... or at this rate (a whole fleet at start), within one interval


@dataclass(frozen=True)
class HealthTransition:
    key: str
    previous: HealthState
    current: HealthState
    reason: str
    egress_ip: str | None
    at: float


TransitionSink = Callable[[HealthTransition], Awaitable[None] | None]


class Prober(Protocol):
    async def probe(self, endpoint: ProxyEndpoint) -> ProbeResult: ...


class HealthEngine:
    def __init__(
        self,
        *,
        inventory: Inventory,
        prober: Prober,
        metrics: HealthMetrics,
        thresholds: Thresholds,
        interval: float = 10.0,
        jitter: float = 0.1,
        concurrency: int = 200,
        on_transition: TransitionSink | None = None,
        on_probe: Callable[[str, Health], None] | None = None,
        on_gone: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self._inventory = inventory
        self._prober = prober
        self._metrics = metrics
        self._thresholds = thresholds
        self._interval = interval
        self._jitter = jitter
        self._semaphore = asyncio.Semaphore(concurrency)
        self._on_transition = on_transition
        self._on_probe = on_probe  # every probe's result (the fleet page's probe history); must be quick
        self._on_gone = on_gone  # a key it probed is no longer in the inventory (the history forgets it)
        self._clock = clock
        self._wall = wall_clock
        self._rng = rng or random.Random()
        self._due = Schedule()
        self._scheduled = KeySet()  # the keys in `_due` (a set's table: 2.5x the size)
        self._seen_version = -1
        self._tasks: set[asyncio.Task[Health | None]] = set()

    async def probe_once(self, key: str) -> Health | None:
        """Probe one proxy now and apply the result. None if it has no address (or is gone)."""
        endpoint = self._inventory.get(key)
        if endpoint is None or not endpoint.has_address:
            return None
        refused = listener.refusal(endpoint)  # not the listener its stack made: not one byte is sent
        result = await self._prober.probe(endpoint) if refused is None else _not_probed(refused)
        self._metrics.observe(
            provider=endpoint.provider,
            outcome=result.outcome,
            latency=result.latency_seconds if refused is None else None,
        )
        if self._inventory.get(key) != endpoint:
            return None  # changed while in flight: this result says nothing about the new address
        return await self._apply(
            key,
            ok=result.ok,
            latency=result.latency_seconds,
            egress_ip=result.egress_ip,
            error=result.error,
            decisive=refused is not None,  # another listener may hold its port: out of discovery now
        )

    async def probe_all(self) -> None:
        """One round over every addressed proxy (tests and `make run` start-up use it)."""
        keys = [ep.key for ep in self._inventory.endpoints() if ep.has_address]
        await asyncio.gather(*(self._probe_limited(key) for key in keys))

    async def _probe_limited(self, key: str) -> None:
        async with self._semaphore:
            await self.probe_once(key)

    async def record_failure(self, key: str, *, reason: str = "client reported an error") -> None:
        """A failure seen by a client counts like a failed probe."""
        if self._inventory.get(key) is not None:
            await self._apply(key, ok=False, latency=None, egress_ip=None, error=reason)

    def shared_egress(self) -> dict[str, list[str]]:
        return shared_egress(self.health_by_key())

    def health_by_key(self) -> Mapping[str, Health]:
        return {ep.key: self._inventory.health(ep.key) for ep in self._inventory.endpoints()}

    async def run(self) -> None:
        """The `prober` task: runs until cancelled, then cancels and awaits its in-flight probes."""
        try:
            while True:
                self._sync_schedule()
                await self._start_due()
                await asyncio.sleep(self._idle_time())
        finally:
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _apply(
        self,
        key: str,
        *,
        ok: bool,
        latency: float | None,
        egress_ip: str | None,
        error: str | None,
        decisive: bool = False,
    ) -> Health:
        previous = self._inventory.health(key)
        current = self._thresholds.apply(
            previous,
            ok=ok,
            at=self._wall(),
            latency=latency,
            egress_ip=egress_ip,
            error=error,
            decisive=decisive,
        )
        self._inventory.set_health(key, current)
        if self._on_probe is not None:
            self._on_probe(key, current)
        if current.state is not previous.state:
            self._metrics.transitions.labels(current.state.value).inc()
            await self._emit(
                HealthTransition(
                    key=key,
                    previous=previous.state,
                    current=current.state,
                    reason="probe succeeded" if ok else (error or "probe failed"),
                    egress_ip=current.egress_ip,
                    at=current.last_probe_at or 0.0,
                )
            )
        return current

    async def _emit(self, transition: HealthTransition) -> None:
        if self._on_transition is None:
            return
        try:
            outcome = self._on_transition(transition)
            if inspect.isawaitable(outcome):
                await outcome
        except Exception:  # a failing status writer must not stop the probing
            log.exception("health transition sink failed for %s", transition.key)

    def _sync_schedule(self) -> None:
        if self._inventory.version == self._seen_version:
            return
        self._seen_version = self._inventory.version
        now = self._clock()
        new = [
            endpoint.key
            for endpoint in self._inventory.endpoints()
            if endpoint.has_address and endpoint.key not in self._scheduled
        ]
        # First probes soon (a proxy is never leased before one), spread at FIRST_PROBES_PER_SECOND so a
        # start with the whole fleet new does not probe it all at once: at most one interval.
        spread = min(self._interval, max(FIRST_SPREAD_SECONDS, len(new) / FIRST_PROBES_PER_SECOND))
        for key in new:
            self._scheduled.add(key)
            self._due.push(now + self._rng.uniform(0, spread), key)

    async def _start_due(self) -> None:
        now = self._clock()
        while (entry := self._due.pop_due(now)) is not None:
            due, key = entry
            endpoint = self._inventory.get(key)
            if endpoint is None or not endpoint.has_address:
                self._scheduled.discard(key)
                if endpoint is None and self._on_gone is not None:
                    self._on_gone(key)
                continue
            await self._spawn(key)
            spread = self._interval * self._rng.uniform(1 - self._jitter, 1 + self._jitter)
            self._due.push(max(due, now - self._interval) + spread, key)

    async def _spawn(self, key: str) -> None:
        # Take the slot before creating the task, so the number of tasks stays bounded too.
        await self._semaphore.acquire()
        task = asyncio.create_task(self.probe_once(key), name=f"probe {key}")
        self._tasks.add(task)
        task.add_done_callback(self._probe_done)

    def _probe_done(self, task: asyncio.Task[Health | None]) -> None:
        self._tasks.discard(task)
        self._semaphore.release()
        if not task.cancelled() and task.exception() is not None:
            log.error("probe task %s failed", task.get_name(), exc_info=task.exception())

    def _idle_time(self) -> float:
        due = self._due.next_due()
        if due is None:
            return MAX_IDLE_SLEEP
        return min(max(due - self._clock(), 0.0), MAX_IDLE_SLEEP)


def _not_probed(reason: str) -> ProbeResult:
    return ProbeResult(False, listener.UNVERIFIED, 0.0, error=reason)
