"""How late the event loop runs what is due: a small task sleeps `every` seconds and records the overshoot.

Everything of the service that is not a thread (the API, discovery, the control loop, a follower's inventory)
shares one event loop, so work that holds it (a pass over 10,000 Proxies) delays every lease by as much. The
overshoot of a short sleep measures exactly that delay, from inside, at the cost of a wake-up every 20 ms. It
is the histogram `proxy_operator_event_loop_lag_seconds` on /metrics; `tests/bench/bench_incluster.py` reads
it to give the lag's p99 on a leader and a follower.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Histogram

EVERY = 0.02  # seconds between two wake-ups: 50 a second, about 0.7 % of a core here
BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class LoopLag:
    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        every: float = EVERY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.every = every
        self._clock = clock
        self.last_wake = clock()  # the loop's heartbeat (loop_stalls.py watches it)
        self.histogram = Histogram(
            "proxy_operator_event_loop_lag_seconds",
            f"How much later than due a {every * 1000:g} ms sleep on the event loop woke up.",
            buckets=BUCKETS,
            registry=registry,
        )

    async def run(self) -> None:
        """Until cancelled."""
        while True:
            due = self._clock() + self.every
            await asyncio.sleep(self.every)
            self.last_wake = self._clock()
            self.histogram.observe(max(0.0, self.last_wake - due))
