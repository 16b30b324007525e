"""The inventory the sources fill and the health engine annotates."""

from __future__ import annotations

import threading
from dataclasses import replace

from service.inventory import Health, HealthState, Inventory
from tests.service.conftest import endpoint

HEALTHY = Health(state=HealthState.healthy, egress_ip="10.0.0.1")


def test_a_full_resync_keeps_the_health_of_proxies_that_stay() -> None:
    inventory = Inventory()
    assert not inventory.loaded
    inventory.replace_all([endpoint("a"), endpoint("b")])
    inventory.set_health("default/a", HEALTHY)
    inventory.replace_all([endpoint("a"), endpoint("c")])
    assert inventory.loaded
    assert inventory.health("default/a") == HEALTHY
    assert inventory.get("default/b") is None
    assert inventory.healthy_keys() == {"default/a"}


def test_a_new_address_must_prove_itself_again() -> None:
    inventory = Inventory()
    inventory.replace_all([endpoint("a", port=1000)])
    inventory.set_health("default/a", HEALTHY)
    inventory.upsert(replace(endpoint("a", port=1000), labels={"x": "y"}))  # same address: health kept
    assert inventory.health("default/a").healthy
    inventory.upsert(endpoint("a", port=2000))
    assert inventory.health("default/a").state is HealthState.unknown
    assert inventory.healthy_keys() == frozenset()


def test_unaddressed_and_removed_proxies_are_never_eligible() -> None:
    inventory = Inventory()
    inventory.replace_all([endpoint("a", host=None, port=None), endpoint("b")])
    inventory.set_health("default/a", HEALTHY)
    inventory.set_health("default/b", HEALTHY)
    assert inventory.healthy_keys() == {"default/b"}
    inventory.remove("default/b")
    inventory.set_health("default/b", HEALTHY)  # a probe that finishes after the removal
    assert inventory.healthy_keys() == frozenset()
    assert len(inventory) == 1


def test_listeners_hear_every_change_and_the_snapshot_is_shared_until_one() -> None:
    inventory = Inventory()
    heard: list[int] = []
    inventory.add_listener(lambda: heard.append(inventory.version))
    inventory.replace_all([endpoint("a")])
    inventory.set_health("default/a", HEALTHY)
    first = inventory.healthy_keys()
    assert inventory.healthy_keys() is first  # no rebuild without a change
    inventory.set_health("default/a", replace(HEALTHY, consecutive_successes=5))  # same verdict: no event
    assert len(heard) == 2
    inventory.set_health("default/a", Health(state=HealthState.unhealthy))
    assert len(heard) == 3
    assert inventory.healthy_keys() == frozenset()


def test_an_endpoint_reported_again_unchanged_is_no_change() -> None:
    """A drift check or an `up` reports every proxy of its stack again (500 at a time at 10,000): an equal
    endpoint must not drop the healthy set the lease path reads, nor wake its waiters (issue 20)."""
    inventory = Inventory()
    heard: list[int] = []
    inventory.add_listener(lambda: heard.append(inventory.version))
    inventory.upsert(endpoint("a"))
    inventory.set_health("default/a", HEALTHY)
    served, version = inventory.healthy_keys(), inventory.version
    inventory.upsert(endpoint("a"))  # an equal copy
    assert inventory.version == version
    assert len(heard) == 2
    assert inventory.healthy_keys() is served
    inventory.upsert(replace(endpoint("a"), instance_id="42-7"))  # the same address, a new process
    assert inventory.version == version + 1
    assert len(heard) == 3
    assert inventory.get("default/a").instance_id == "42-7"
    assert inventory.healthy_keys() == {"default/a"}


def test_threads_can_write_while_readers_read() -> None:
    inventory = Inventory()
    inventory.replace_all([endpoint(f"p{i}") for i in range(200)])

    def flip(offset: int) -> None:
        for i in range(offset, 200, 4):
            inventory.set_health(f"default/p{i}", HEALTHY)

    writers = [threading.Thread(target=flip, args=(n,)) for n in range(4)]
    for thread in writers:
        thread.start()
    while any(t.is_alive() for t in writers):
        assert inventory.healthy_keys() <= {f"default/p{i}" for i in range(200)}
    for thread in writers:
        thread.join()
    assert len(inventory.healthy_keys()) == 200
