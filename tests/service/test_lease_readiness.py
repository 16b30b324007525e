"""`/readyz` is 200 only once a lease can be served, and new proxies are probed within a second.

Before: `/readyz` answered 200 about 1.7 s after a restart while leases answered 503 `no_candidates` until
about 7 s, because every proxy's first probe was spread over a whole interval (10 s) and readiness did not
look at health at all.
"""

from __future__ import annotations

import random

from service.health.engine import HealthEngine
from service.health.readiness import leases_not_ready
from service.inventory import Health, HealthState, Inventory
from tests.service.conftest import endpoint


def _inventory(count: int) -> Inventory:
    inventory = Inventory()
    inventory.replace_all([endpoint(f"p{i}", port=20000 + i) for i in range(count)])
    return inventory


def test_not_ready_while_no_proxy_is_healthy_and_some_are_not_probed() -> None:
    inventory = _inventory(3)
    assert leases_not_ready(inventory) == (
        "first health probes running: 0 of 3 proxies probed, none healthy yet"
    )
    inventory.set_health("default/p0", Health(state=HealthState.unhealthy))
    assert "1 of 3 proxies probed" in str(leases_not_ready(inventory))
    inventory.set_health("default/p1", Health(state=HealthState.healthy))
    assert leases_not_ready(inventory) is None  # one lease can be served


def test_ready_when_every_proxy_was_probed_even_if_none_is_healthy() -> None:
    inventory = _inventory(2)
    for key in ("default/p0", "default/p1"):
        inventory.set_health(key, Health(state=HealthState.unhealthy))
    assert leases_not_ready(inventory) is None  # the fleet's state, not this replica's
    assert leases_not_ready(Inventory()) is None  # nothing to probe


class _Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


def _first_due(count: int, *, interval: float = 10.0) -> list[float]:
    clock = _Clock()
    engine = HealthEngine(
        inventory=_inventory(count),
        prober=None,  # type: ignore[arg-type]  # never called: only the schedule is read
        metrics=None,  # type: ignore[arg-type]
        thresholds=None,  # type: ignore[arg-type]
        interval=interval,
        clock=clock,
        rng=random.Random(3),
    )
    engine._sync_schedule()
    return sorted(due - clock.now for due, _ in engine._due.entries())


def test_a_few_new_proxies_are_first_probed_within_a_second() -> None:
    assert max(_first_due(3)) <= 1.0  # before: spread over the 10 s interval


def test_a_whole_new_fleet_is_spread_at_most_over_one_interval() -> None:
    due = _first_due(20_000)
    assert max(due) <= 10.0
    assert max(due) > 9.0  # 1000 a second would take 20 s: capped at the interval
    assert max(_first_due(3000)) <= 3.0
