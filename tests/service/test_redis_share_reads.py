"""The Redis store's fair share reads a client's leases only when one request could reach its limit.

A client that never releases holds more leases than proxies (one per target, and again after each cooldown).
The share counts distinct proxies, so a client far under it in proxies must not have its leases read on
every request, however many it has: in the bench (issue 20) each lease of a client past 10,000 leases read
them all, 10-300 ms of Redis per lease, and the queue behind them ended in 500s. Counted here by Redis's own
command statistics (the scripts' commands are counted too), not by time.
"""

from __future__ import annotations

import asyncio
import uuid

import redis.asyncio as aioredis

from service.discovery.redis_store import RedisStore
from service.discovery.store import AcquireRequest, FairShare
from tests.service.conftest import RedisServer

NOW = 1_800_000_000.0
POOL = ("a", "b", "c", "d")


def _sticky(tag: str, target: str) -> AcquireRequest:
    """A sticky session's lease of `a` (its one candidate), under a share of 2 of the pool's 4 proxies."""
    return AcquireRequest(
        client="crawler",
        target=target,
        candidates=["a"],
        count=1,
        ttl=60,
        cooldown=10,
        lease_ids=[f"{tag}-0"],
        ignore_cooldown=True,
        share=FairShare(pool=list(POOL), holding=2, rate=None, burst=1),
    )


async def _calls(redis: aioredis.Redis) -> dict[str, int]:
    stats = await redis.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


def test_many_leases_on_few_proxies_are_not_read_on_each_lease(redis_server: RedisServer) -> None:
    async def main() -> None:
        store = RedisStore.from_url(redis_server.url, prefix=f"share-{uuid.uuid4().hex[:8]}")
        redis = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
        try:
            for i in range(6):  # six leases, one proxy: 1 of the 2 proxies its share allows
                got = await store.acquire(_sticky(str(i), f"site{i}.example"), now=NOW + i)
                assert [lease.proxy for lease in got.leases] == ["a"]
            await redis.config_resetstat()
            again = await store.acquire(_sticky("7", "site7.example"), now=NOW + 7)
            calls = await _calls(redis)
        finally:
            await store.close()
            await redis.aclose()
        assert [lease.proxy for lease in again.leases] == ["a"]
        assert again.limited is None
        assert calls.get("evalsha") == 1
        assert "hget" not in calls, f"the client's leases were read one by one: {calls}"
        assert "zrange" not in calls, f"the client's leases were listed: {calls}"

    asyncio.run(main())
