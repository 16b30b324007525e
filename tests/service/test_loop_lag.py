"""The event loop's lag (service/loop_lag.py): each wake-up records how late it came, on the registry."""

from __future__ import annotations

import asyncio
import time

from prometheus_client import CollectorRegistry

from service.loop_lag import LoopLag


def _count(registry: CollectorRegistry, le: str) -> float:
    value = registry.get_sample_value("proxy_operator_event_loop_lag_seconds_bucket", {"le": le})
    return value or 0.0


def test_a_loop_held_by_a_long_step_shows_as_lag() -> None:
    """The loop is held for 0.3 s by a blocking call: one wake-up comes that much late, the others on
    time. The monitor reads the real monotonic clock, so the held one is told by its bucket only."""
    registry = CollectorRegistry()
    lag = LoopLag(registry, every=0.01)

    async def scenario() -> None:
        task = asyncio.create_task(lag.run())
        await asyncio.sleep(0.1)
        time.sleep(0.3)  # noqa: ASYNC251  # a step that holds the loop (a pass over the fleet did)
        await asyncio.sleep(0.1)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())
    total = _count(registry, "+Inf")
    assert total >= 5
    assert total - _count(registry, "0.25") == 1, "the held wake-up was not recorded as late"


def test_the_lag_is_the_time_past_due() -> None:
    """With a clock that says each sleep ended 25 ms past its due time, every sample is 25 ms."""
    registry = CollectorRegistry()
    now = [0.0]

    def clock() -> float:
        now[0] += 0.035  # read before the sleep (due: 10 ms on) and after it, 35 ms on: 25 ms past due
        return now[0]

    lag = LoopLag(registry, every=0.01, clock=clock)

    async def scenario() -> None:
        task = asyncio.create_task(lag.run())
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())
    total = _count(registry, "+Inf")
    assert total >= 1
    assert _count(registry, "0.02") == 0
    assert _count(registry, "0.03") == total
