"""What the report summary costs per proxy (service/discovery/report_summary.py's figures): Redis's own
`MEMORY USAGE` of a proxy's two keys, and the memory store's bytes by tracemalloc, for 4 entries (a few
crawlers on a few sites) and for the 32 a proxy keeps at most. Realistic names: a shop's host name, a
crawler's client name."""

from __future__ import annotations

import asyncio
import tracemalloc
import uuid

import redis.asyncio as aioredis

from service.discovery.memory import MemoryStore
from service.discovery.redis_store import RedisStore
from service.discovery.report_summary import MOST
from service.discovery.store import Store
from tests.service.conftest import RedisServer

NOW = 1_800_000_000.0
PROXIES = 200


async def _fill(store: Store, *, entries: int) -> None:
    for p in range(PROXIES):
        for i in range(entries):
            await store.note_report(
                proxy=f"crawl/proxy-{p:05}",
                target=f"www.shop-{i % 8}.example.com",
                client=f"crawler-{i // 8}",
                kind=("banned", "ok", "error")[i % 3],
                now=NOW + i,
            )


def _memory_bytes(entries: int) -> float:
    store = MemoryStore()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    asyncio.run(_fill(store, entries=entries))
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    return grown / PROXIES


def _redis_bytes(server: RedisServer, *, entries: int) -> float:
    prefix = f"mem-{uuid.uuid4().hex[:8]}"

    async def main() -> float:
        store = RedisStore.from_url(server.url, prefix=prefix)
        redis = aioredis.Redis.from_url(server.url, decode_responses=True)
        try:
            await _fill(store, entries=entries)
            total = 0
            async for key in redis.scan_iter(match=f"{prefix}:rep*"):
                total += int(await redis.memory_usage(key, samples=0) or 0)
            return total / PROXIES
        finally:
            await store.close()
            await redis.aclose()

    return asyncio.run(main())


def test_a_proxy_s_report_summary_stays_small(redis_server: RedisServer) -> None:
    found = {
        (where, n): measure(n)
        for where, measure in (
            ("redis", lambda n: _redis_bytes(redis_server, entries=n)),
            ("memory", _memory_bytes),
        )
        for n in (4, MOST)
    }
    print("report summary bytes per proxy:", {k: round(v) for k, v in found.items()})
    assert found["redis", 4] < 800
    assert found["redis", MOST] < 4_500
    assert found["memory", 4] < 2_000
    assert found["memory", MOST] < 12_000
