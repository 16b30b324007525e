"""A sticky lease on Redis waits for one round trip, not four (the session, its proxy's penalty, the lease,
the session's renewal): one script does all four. In bench_discovery's mix (a tenth of the requests in
sticky sessions) the four round trips were the Redis store's p99: x2.2 the bare route's.

Counted at the pipe: each write to Redis is one batch of commands, and the lease waits for each batch's
replies before it can send the next.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from service.discovery import redis_pipe
from service.discovery.errors import DiscoveryError
from service.discovery.memory import MemoryStore
from service.discovery.redis_store import RedisStore
from service.discovery.service import DiscoveryService, LeaseQuery
from service.settings import DiscoverySettings
from tests.service.conftest import FakeClock, RedisServer, healthy_inventory


def test_a_sticky_lease_waits_for_one_round_trip(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches: list[int] = []  # commands per write
    flush = redis_pipe._Protocol._flush

    def counted(self: Any) -> None:
        if self._outgoing:
            batches.append(len(self._outgoing))
        flush(self)

    monkeypatch.setattr(redis_pipe._Protocol, "_flush", counted)
    clock = FakeClock()
    discovery = DiscoveryService(
        inventory=healthy_inventory([f"p{i}" for i in range(5)]),
        store=RedisStore.from_url(redis_server.url, prefix="sticky-trips"),
        settings=DiscoverySettings(),
        clock=clock,
    )
    query = LeaseQuery(client="crawler", target="shop.example", session="s1")

    async def scenario() -> tuple[str, str]:
        try:
            first = await discovery.lease(query)  # binds the session
            clock.advance(1)
            await discovery.lease(query)  # the first sticky one uploads the pool its share counts over, once
            clock.advance(1)
            batches.clear()
            again = await discovery.lease(query)
            return first.leases[0].proxy, again.leases[0].proxy
        finally:
            await discovery.store.close()

    first, again = asyncio.run(scenario())
    assert again == first  # sticky
    assert batches == [1]


@pytest.mark.parametrize("store_kind", ["memory", "redis"])
def test_a_sticky_request_refused_still_keeps_its_session(
    store_kind: str, request: pytest.FixtureRequest
) -> None:
    """Both stores alike (docs/api.md, "Sessions"): the request named the session, so its idle time starts
    again, even though the client's lease rate refused the lease (429 lease_rate)."""
    clock = FakeClock()
    if store_kind == "memory":
        store: Any = MemoryStore()
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        store = RedisStore.from_url(server.url, prefix="sticky-refused")
    # one lease per 100 s: the first takes the only token, the one 50 s later is refused
    settings = DiscoverySettings(session_idle_seconds=60, lease_rate=0.01, lease_burst=1)
    discovery = DiscoveryService(
        inventory=healthy_inventory([f"p{i}" for i in range(5)]), store=store, settings=settings, clock=clock
    )
    query = LeaseQuery(client="crawler", target="shop.example", session="s1")

    async def refused() -> str:
        try:
            await discovery.lease(query)
        except DiscoveryError as exc:
            return exc.reason
        return "granted"

    async def scenario() -> tuple[str, str, str, bool]:
        try:
            first = await discovery.lease(query)  # binds the session until 60
            clock.advance(50)
            why = await refused()  # on the bound proxy: renews the binding until 110
            clock.advance(50)  # 100: past the first binding's end, within the renewed one
            again = await discovery.lease(query)
            return first.leases[0].proxy, why, again.leases[0].proxy, again.rebound
        finally:
            await store.close()

    first, why, again, rebound = asyncio.run(scenario())
    assert why == "lease_rate"
    assert (again, rebound) == (first, False)  # a forgotten session would have leased the LRU's first
