"""`serve` builds the discovery store its settings name: Redis through the queued connection pool."""

from __future__ import annotations

import asyncio

from service import ui
from service.config import OperatorSettings
from service.discovery.memory import MemoryStore
from service.discovery.redis_store import RedisStore
from service.serve import _ended_sessions, _store
from service.settings import DiscoverySettings
from tests.service.conftest import RedisServer


def test_serve_builds_a_redis_store_on_the_queued_pool(redis_server: RedisServer) -> None:
    settings = OperatorSettings(discovery=DiscoverySettings(store="redis", redis_url=redis_server.url))
    store = _store(settings)
    assert isinstance(store, RedisStore)

    async def check() -> None:
        assert await store.ping()
        pool = store._r.connection_pool
        assert type(pool).__name__ == "BlockingConnectionPool", "past 100 in flight: a queue, not a 500"
        await store.close()

    asyncio.run(check())
    assert isinstance(_store(OperatorSettings()), MemoryStore)


def test_serve_gives_the_memory_store_its_bounds() -> None:
    discovery = DiscoverySettings(ended_leases_kept=7, report_window_seconds=900, error_window_seconds=60)
    store = _store(OperatorSettings(discovery=discovery))
    assert isinstance(store, MemoryStore)
    assert (store._leases.ended_kept, store._report_keep) == (7, 900)


def test_log_outs_go_to_redis_only_with_the_redis_store(redis_server: RedisServer) -> None:
    """The fleet page's ended sessions are shared in Redis when the store is Redis's (every replica refuses
    them); with the memory store they stay local, and the Redis client is not even imported for it
    (tests/service/test_lazy_imports.py)."""
    settings = OperatorSettings(discovery=DiscoverySettings(store="redis", redis_url=redis_server.url))
    store = _store(settings)
    assert isinstance(store, RedisStore)
    ended = _ended_sessions(store)
    assert isinstance(ended, ui.RedisEndedSessions)
    assert (ended.client, ended.prefix) == (store.client, store.prefix)
    asyncio.run(store.close())
    assert _ended_sessions(_store(OperatorSettings())) is None
