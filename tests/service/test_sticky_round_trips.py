"""A sticky lease on Redis waits for two round trips, not four: the session is read with its proxy's penalty
(one script), then the lease and the session's renewal go out together. In bench_discovery's mix (a tenth of
the requests in sticky sessions) the four round trips were the Redis store's p99: x2.2 the bare route's.

Counted at the pipe: each write to Redis is one batch of commands, and the lease waits for each batch's
replies before it can send the next.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from service.discovery import redis_pipe
from service.discovery.redis_store import RedisStore
from service.discovery.service import DiscoveryService, LeaseQuery
from service.settings import DiscoverySettings
from tests.service.conftest import FakeClock, RedisServer, healthy_inventory


def test_a_sticky_lease_waits_for_two_round_trips(
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
    assert batches == [1, 2]  # the session with its penalty; then the lease and the session's renewal
