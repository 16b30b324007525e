"""A waiting lease wakes when a source thread changes the inventory (a proxy turns healthy)."""

from __future__ import annotations

import asyncio
import threading

from service.discovery.memory import MemoryStore
from service.discovery.service import DiscoveryService, LeaseQuery
from service.inventory import Health, HealthState, Inventory
from service.settings import DiscoverySettings
from tests.service.conftest import FakeClock, endpoint


def test_a_waiting_lease_wakes_on_an_inventory_change_from_another_thread() -> None:
    inventory = Inventory()
    inventory.replace_all([endpoint("a")])
    clock = FakeClock()
    discovery = DiscoveryService(
        inventory=inventory, store=MemoryStore(), settings=DiscoverySettings(), clock=clock
    )

    async def scenario() -> list[str]:
        waiting = asyncio.create_task(discovery.lease(LeaseQuery(client="c", wait=20)))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        source = threading.Thread(
            target=inventory.set_health, args=("default/a", Health(state=HealthState.healthy))
        )
        source.start()
        source.join()
        grant = await asyncio.wait_for(waiting, 5)  # woken by the change, long before the 20 s
        return [lease.proxy for lease in grant.leases]

    assert asyncio.run(scenario()) == ["default/a"]
