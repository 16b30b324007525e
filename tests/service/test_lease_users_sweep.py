"""The sweeper's decisions (service/discovery/lease_users.py) against the real memory store, with the
proxy's control channel recorded: a lease renewed on another replica is moved on, not revoked; an expired
or released one is revoked; a proxy that never acknowledged is not answered and not swept; a `local`
proxy's leases are not swept at all (the proxy ends each user itself, before a sweep could)."""

from __future__ import annotations

import asyncio
from typing import Any

from service.discovery.lease_users import LeaseUsers
from service.discovery.memory import MemoryStore
from service.discovery.store import AcquireRequest
from service.inventory import Inventory
from stacks.forward_proxy.control import ControlError
from tests.service.conftest import endpoint

NOW = 1_800_000_000.0


class Channel:
    """What reached each proxy's control socket; `down` proxies refuse."""

    def __init__(self, down: frozenset[str] = frozenset()) -> None:
        self.sent: list[tuple[str, str]] = []
        self.down = down

    async def __call__(
        self, path: str, request: dict[str, Any], *, wait: float, password: str | None = None
    ) -> dict[str, Any]:
        if path in self.down:
            raise ControlError(f"{path}: gone")
        self.sent.append((request["op"], request["user"]))
        return {"ok": True}


ADDRESSES = {"a": "10.0.0.1", "b": "10.0.0.2"}  # each proxy's one pod


async def resolve(host: str, port: int) -> list[str]:
    return [ADDRESSES[host]]


def setup(
    down: frozenset[str] = frozenset(), *, local: bool = False
) -> tuple[LeaseUsers, MemoryStore, Channel]:
    """Proxies a and b, on `tcp://` channels (pods) or, `local`, on unix sockets."""
    inventory = Inventory()
    inventory.replace_all(
        [endpoint(n, control=f"/run/{n}.ctl" if local else f"tcp://{n}:7000") for n in ("a", "b")]
    )
    channel = Channel(down)
    return (
        LeaseUsers(inventory=inventory, enabled=True, call=channel, resolve=resolve),
        MemoryStore(),
        channel,
    )


async def acquire(store: MemoryStore, *ids: str) -> list[Any]:
    request = AcquireRequest(
        client="c",
        target="*",
        candidates=["default/a", "default/b"],
        count=len(ids),
        ttl=60,
        cooldown=0,
        lease_ids=list(ids),
    )
    return (await store.acquire(request, now=NOW)).leases


def test_the_sweep_revokes_ended_leases_and_moves_renewed_ones_on() -> None:
    async def scenario() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        users, store, channel = setup()
        leases = await acquire(store, "l1", "l2")
        issued, failed = await users.issue(leases, now=NOW)
        assert (sorted(issued), failed) == (["l1", "l2"], [])
        await store.renew("l2", now=NOW + 30, ttl=120, cooldown=0)  # on another replica: not told here
        channel.sent.clear()
        await users.sweep(now=NOW + 61, lookup=store.get_lease)
        first = list(channel.sent)
        channel.sent.clear()
        await users.sweep(now=NOW + 151, lookup=store.get_lease)
        return first, channel.sent

    first, later = asyncio.run(scenario())
    assert first == [("revoke", "lease-l1")]  # l2 was renewed elsewhere: moved on, kept
    assert later == [("revoke", "lease-l2")]


def test_a_lease_whose_push_failed_gets_no_user_and_is_not_swept() -> None:
    async def scenario() -> tuple[dict[str, str], set[str], list[str], list[tuple[str, str]]]:
        users, store, channel = setup(down=frozenset({"tcp://10.0.0.2:7000"}))
        leases = await acquire(store, "l1", "l2")
        issued, failed = await users.issue(leases, now=NOW)
        channel.sent.clear()
        await users.sweep(now=NOW + 61, lookup=store.get_lease)
        proxies = {lease.lease_id: lease.proxy for lease in leases}
        return proxies, set(issued), [lease.lease_id for lease in failed], channel.sent

    proxies, issued, failed, swept = asyncio.run(scenario())
    on_a = next(lease_id for lease_id, proxy in proxies.items() if proxy == "default/a")
    on_b = next(lease_id for lease_id, proxy in proxies.items() if proxy == "default/b")
    assert (issued, failed) == ({on_a}, [on_b])
    assert swept == [("revoke", f"lease-{on_a}")]


def test_a_local_proxys_leases_are_neither_kept_for_the_sweep_nor_swept() -> None:
    async def scenario() -> tuple[int, list[tuple[str, str]], list[tuple[str, str]]]:
        users, store, channel = setup(local=True)
        leases = await acquire(store, "l1", "l2")
        await users.issue(leases, now=NOW)
        await users.extend(leases[0], now=NOW + 30)
        pushed = list(channel.sent)
        channel.sent.clear()
        await users.sweep(now=NOW + 1_000, lookup=store.get_lease)
        return len(users._ends), pushed, channel.sent

    kept, pushed, swept = asyncio.run(scenario())
    assert sorted(pushed) == [("add", "lease-l1"), ("add", "lease-l2"), ("renew", "lease-l1")]
    assert (kept, swept) == (0, [])
