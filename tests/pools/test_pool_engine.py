"""Pools with the real engine on two `local` providers: spread, scale, membership across a restart,
rotation by maxAge that never leaves fewer than `replicas - maxUnavailable` serving, replacement after ban
reports from two clients, rollback of a replacement that never turns healthy, demand up and down."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from service.discovery.errors import NoProxyAvailable
from service.discovery.service import LeaseQuery
from tests.automation.fleet import Fleet
from tests.conftest import PulumiEnv
from tests.pools.harness import POOL_KEY, PoolRig, Sampler, accepts, free_base
from tests.service.site import Site

HOUR = 3600.0


@pytest.fixture
def rig(pulumi_env: PulumiEnv, tmp_path: Path) -> Iterator[PoolRig]:
    fleet = Fleet(root=tmp_path, backend_url=pulumi_env.backend_url, providers=["a", "b"])
    site = Site()
    site.thread.start()
    yield PoolRig(fleet=fleet, site=site)
    site.server.shutdown()
    site.server.server_close()
    fleet.kill_proxies()


def ports() -> dict[str, int]:
    return {"port_a": free_base(), "port_b": free_base()}


def test_spread_scale_and_membership_survive_a_restart(rig: PoolRig) -> None:
    where = ports()

    async def scenario() -> None:
        rig.write_pool(replicas=6, **where)
        rig.start()
        await rig.step()
        await rig.step()
        assert rig.placements() == {"a": 3, "b": 3}
        first = {m.name for m in rig.children()}
        assert len(first) == 6
        assert all(rig.inventory.health(m.key).healthy for m in rig.children())

        rig.write_pool(replicas=8, **where)
        await rig.step()
        await rig.step()
        assert rig.placements() == {"a": 4, "b": 4}
        names = {m.name for m in rig.children()}
        assert first < names
        assert len(names) == 8

        await rig.controller.close(grace=5)
        rig.start()  # a restart: membership comes back from the stacks' outputs
        await rig.step()
        await rig.step()
        assert {m.name for m in rig.children()} == names
        assert rig.engine.ups == []  # nothing changed: no up, no new child

    run(rig, scenario)


def test_max_age_rotation_one_at_a_time_never_below_the_guard(rig: PoolRig) -> None:
    where = ports()
    replicas, max_unavailable = 4, 1

    async def scenario() -> None:
        rig.write_pool(replicas=replicas, rotation={"maxAge": "1h", "maxUnavailable": "1"}, **where)
        rig.start()
        await rig.step()
        await rig.step()
        original = {m.name for m in rig.children()}
        assert len(original) == replicas
        await rig.clock.advance(HOUR + 1)
        in_flight: list[int] = []
        with Sampler(rig.inventory) as sampler:
            for _ in range(40):
                await rig.step()
                in_flight.append(rig.source.status[POOL_KEY].replacing)
                if not original & {m.name for m in rig.children()}:
                    break
        assert not original & {m.name for m in rig.children()}, "every child older than maxAge was replaced"
        assert len(rig.children()) == replicas
        assert max(in_flight) == 1
        assert sampler.samples > 10
        assert sampler.lowest is not None
        assert sampler.lowest >= replicas - max_unavailable
        assert rig.placements() == {"a": 2, "b": 2}

    run(rig, scenario)


def test_ban_reports_from_two_clients_replace_a_proxy(rig: PoolRig) -> None:
    where = ports()

    async def scenario() -> None:
        placement = [{"provider": "a", "portBase": where["port_a"]}]
        rig.write_pool(
            replicas=1, placement=placement, rotation={"replaceAfterBans": {"count": 2, "window": "1h"}}
        )
        rig.start()
        await rig.step()
        await rig.step()
        [banned] = rig.children()
        # A ban penalises the proxy for that target: the second client crawls another site (bans count
        # across targets).
        for client, target in (("crawler-1", "shop.example"), ("crawler-2", "news.example")):
            grant = await rig.discovery.lease(LeaseQuery(client=client, pool="eu", target=target))
            lease = grant.leases[0]
            assert lease.proxy == banned.key
            await rig.discovery.report(
                client=client, outcome="banned", target=target, lease_id=lease.lease_id, proxy=None
            )
            if client == "crawler-1":
                await rig.step()
                assert [m.name for m in rig.children()] == [banned.name]  # one client is not enough
        for _ in range(6):
            await rig.step()
            await rig.clock.advance(61)  # the leases (60 s) run out; the drain then ends
        [fresh] = rig.children()
        assert fresh.name != banned.name
        assert rig.inventory.health(fresh.key).healthy
        assert not accepts(banned.proxy.spec.port)

    run(rig, scenario)


def test_replacement_that_never_turns_healthy_rolls_back(rig: PoolRig) -> None:
    where = ports()

    async def scenario() -> None:
        placement = [{"provider": "a", "portBase": where["port_a"]}]
        rotation = {"maxAge": "1h", "readyTimeout": "5m", "backoff": "10m"}
        rig.write_pool(replicas=1, placement=placement, rotation=rotation)
        rig.start()
        await rig.step()
        await rig.step()
        [old] = rig.children()
        await rig.clock.advance(HOUR + 1)
        rig.controller.sync()  # the pool starts a replacement
        await rig.step()
        [new] = [m for m in rig.children() if m.replaces == old.name]
        _kill(new.name, rig.fleet.local_state)  # its process dies: every probe fails from now on
        await rig.health.probe_all()
        assert not rig.inventory.health(new.key).healthy
        await rig.clock.advance(301)
        await rig.step()
        await rig.step()
        assert [m.name for m in rig.children()] == [old.name]  # rolled back; the old one serves on
        assert rig.inventory.health(old.key).healthy
        degraded = next(c for c in rig.source.status[POOL_KEY].conditions if c.type == "Degraded")
        assert degraded.status == "True"
        assert "rolled back" in degraded.message
        await rig.clock.advance(599)
        await rig.step()
        assert [m.name for m in rig.children()] == [old.name]  # backoff: no attempt before 10 minutes
        await rig.clock.advance(2)
        await rig.step()
        assert any(m.replaces == old.name for m in rig.children())  # the next attempt

    run(rig, scenario)


def test_demand_scales_up_then_idle_scales_down(rig: PoolRig) -> None:
    where = ports()

    async def scenario() -> None:
        placement = [{"provider": "a", "portBase": where["port_a"]}]
        demand = {"window": "1m", "unmetRequests": 3, "idleWindow": "10m", "idleShare": 0.5}
        rig.write_pool(replicas=1, minReplicas=1, maxReplicas=3, placement=placement, demand=demand)
        rig.start()
        await rig.step()
        await rig.step()
        [first] = rig.children()
        await rig.clock.advance(5)  # the next child is younger
        await rig.discovery.lease(LeaseQuery(client="c", pool="eu", target="t"))
        for _ in range(3):  # the only proxy cools down for this client: 503
            with pytest.raises(NoProxyAvailable):
                await rig.discovery.lease(LeaseQuery(client="c", pool="eu", target="t"))
        await rig.step()
        await rig.step()
        assert len(rig.children()) == 2
        assert all(rig.inventory.health(m.key).healthy for m in rig.children())
        await rig.clock.advance(601)  # nobody leases for the idle window
        for _ in range(3):
            await rig.step()
        assert [m.name for m in rig.children()] != [first.name]  # oldest first
        assert len(rig.children()) == 1
        assert not accepts(first.proxy.spec.port)

    run(rig, scenario)


def test_a_placement_naming_an_unknown_provider_holds_the_pool(rig: PoolRig) -> None:
    """A typo in a placement's provider: nothing is drained or deleted (its replacements could never be
    provisioned), the running children keep serving, the status says which placement and how to fix it;
    once corrected, the pool moves on."""
    where = ports()

    async def scenario() -> None:
        rig.write_pool(replicas=2, **where)
        rig.start()
        await rig.step()
        await rig.step()
        before = {m.name: m for m in rig.children()}
        assert rig.placements() == {"a": 1, "b": 1}
        typo = [
            {"provider": "a", "portBase": where["port_a"]},
            {"provider": "bb", "portBase": where["port_b"]},
        ]
        rig.write_pool(replicas=2, placement=typo)
        for _ in range(3):
            await rig.step()
            await rig.clock.advance(61)
        assert set(before) == {m.name for m in rig.children()}, "no child drained, deleted or added"
        for m in before.values():
            assert not rig.inventory.is_draining(m.key)
            assert rig.inventory.health(m.key).healthy
            assert accepts(m.proxy.spec.port)
        degraded = next(c for c in rig.source.status[POOL_KEY].conditions if c.type == "Degraded")
        assert (degraded.status, degraded.reason) == ("True", "UnknownProvider")
        assert "spec.placement[1] names provider 'bb'" in degraded.message
        assert "known: a, b" in degraded.message

    run(rig, scenario)


def run(rig: PoolRig, scenario: Callable[[], Awaitable[None]]) -> None:
    async def main() -> None:
        try:
            await scenario()
        finally:
            await rig.close()

    asyncio.run(main())


def _kill(name: str, under: Path) -> None:
    out = subprocess.run(["pgrep", "-f", f"{under}.*{name}"], capture_output=True, text=True)
    pids = [int(p) for p in out.stdout.split()]
    assert pids, f"no process of {name}"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
