"""service/discovery/redis_sets.py: a candidate set in Redis holds exactly its members, whether uploaded whole
or built from an earlier set by its change; a new healthy set costs its change, not the fleet; the sets of a
churning fleet leave Redis (and the service) within seconds; a set a request still uses stays. Against the
session's real redis-server."""

from __future__ import annotations

import asyncio
import uuid

import redis.asyncio as aioredis
from hypothesis import given, settings
from hypothesis import strategies as st

from service.discovery.redis_sets import (
    CANDIDATE_SET_TTL_MS,
    RECENT_SETS,
    RETIRED_SET_TTL_MS,
    CandidateSets,
)
from service.discovery.redis_store import RedisStore
from service.discovery.store import AcquireRequest
from tests.service.conftest import RedisServer

NOW = 1_800_000_000.0
FLEET = frozenset(f"p{i:04d}" for i in range(400))


def _prefix() -> str:
    return f"sets-{uuid.uuid4().hex[:8]}"


def _request(candidates: frozenset[str], n: int) -> AcquireRequest:
    return AcquireRequest(
        client="crawler",
        target=f"site{n}.example",
        candidates=candidates,
        count=1,
        ttl=60,
        cooldown=10,
        lease_ids=[f"l{n}"],
    )


def test_a_changed_set_is_built_from_the_last_by_its_change(redis_server: RedisServer) -> None:
    async def main() -> None:
        redis = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
        prefix = _prefix()
        sets = CandidateSets(redis, prefix=prefix)
        try:
            first = await sets.key(FLEET)
            await redis.zadd(f"{prefix}:lru", {"p0001": 7.0})  # handed out since: the change keeps its score
            second_members = (FLEET - {"p0001", "p0002"}) | {"new-1"}
            await redis.config_resetstat()
            second = await sets.key(second_members)
            stats = await redis.info("commandstats")
            assert (sets.whole, sets.patched) == (1, 1)
            assert second != first
            assert set(await redis.smembers(second)) == second_members
            assert set(await redis.smembers(first)) == FLEET  # a set is never changed once named
            assert await redis.zscore(f"{prefix}:lru", "new-1") == 0.0  # never used: the oldest
            assert await redis.zscore(f"{prefix}:lru", "p0001") == 7.0
            # the change travelled, not the set: one member added, two removed
            assert int(stats["cmdstat_sadd"]["calls"]) == 1
            assert int(stats["cmdstat_srem"]["calls"]) == 1
            assert 0 < await redis.pttl(first) <= RETIRED_SET_TTL_MS  # the base is retired
            assert await redis.pttl(second) > RETIRED_SET_TTL_MS
            assert await sets.key(FLEET) == first  # the same members, the same set: no upload
            assert (sets.whole, sets.patched) == (1, 1)
        finally:
            await redis.aclose()

    asyncio.run(main())


def test_replicas_name_a_set_alike_however_each_came_to_it(redis_server: RedisServer) -> None:
    """A set's name is its members' digest, whether built from a base by a change or uploaded whole, so
    replicas share a set (and the scripts' resume record, kept by the set's name, holds across them); a
    set another replica made is not built again."""

    async def main() -> None:
        redis = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
        prefix = _prefix()
        one, other = CandidateSets(redis, prefix=prefix), CandidateSets(redis, prefix=prefix)
        try:
            changed = (FLEET - {"p0005", "p0006"}) | {"new-2"}
            await one.key(FLEET)
            built = await one.key(changed)
            assert (one.whole, one.patched) == (1, 1)
            assert await other.key(changed) == built  # uploaded whole here: the same name
            assert await other.key(FLEET) == await one.key(FLEET)
            back = await other.key(changed - {"p0007"})  # built from a base by the other
            assert await one.key(changed - {"p0007"}) == back
            assert set(await redis.smembers(back)) == changed - {"p0007"}
            elsewhere = CandidateSets(redis, prefix=_prefix())  # another installation: its own salt
            assert (await elsewhere.key(FLEET)).split(":")[-1] != built.split(":")[-1]
        finally:
            await redis.aclose()

    asyncio.run(main())


def test_a_base_gone_from_redis_sends_the_set_whole(redis_server: RedisServer) -> None:
    async def main() -> None:
        redis = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
        sets = CandidateSets(redis, prefix=_prefix())
        try:
            first = await sets.key(FLEET)
            await redis.delete(first)  # expired in Redis, as far as this process knows still there
            members = FLEET - {"p0003"}
            key = await sets.key(members)
            assert (sets.whole, sets.patched) == (2, 0)
            assert set(await redis.smembers(key)) == members
        finally:
            await redis.aclose()

    asyncio.run(main())


def test_a_churning_fleet_leaves_few_sets_and_a_set_in_use_stays(redis_server: RedisServer) -> None:
    """One proxy in turn leaves the healthy set and comes back (a probe failing, then passing), 40 times.
    Every lease is served from the right set; the process remembers RECENT_SETS of them; in Redis only
    those stay longer than RETIRED_SET_TTL_MS; and the whole fleet's set, in use all along, is not retired."""

    async def main() -> None:
        prefix = _prefix()
        store = RedisStore.from_url(redis_server.url, prefix=prefix, small_set=0)
        redis = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
        sets = store._sets
        try:
            for n in range(40):
                gone = f"p{n:04d}"
                for members in (FLEET - {gone}, FLEET):
                    got = await store.acquire(_request(members, n), now=NOW + n)
                    assert len(got.leases) == 1
                    assert got.leases[0].proxy in members
            assert sets.remembered() == RECENT_SETS <= 8  # 8 sets of 10,000: 4 MiB of the service
            assert len(sets._uploaded) <= RECENT_SETS
            assert sets.whole == 1  # the first; every other set was built from one before it
            keys = [key async for key in redis.scan_iter(f"{prefix}:cand:*")]
            lasting = [key for key in keys if await redis.pttl(key) > 60_000]
            assert len(lasting) <= 8, f"{len(lasting)} of {len(keys)} sets kept for minutes"
            whole = await sets.key(FLEET)
            assert await redis.pttl(whole) > CANDIDATE_SET_TTL_MS - 60_000  # its last use restored it
        finally:
            await store.close()
            await redis.aclose()

    asyncio.run(main())


def test_a_set_retired_but_used_again_is_kept_again(redis_server: RedisServer) -> None:
    """A set another was built from is retired, and the scripts restore its ttl at its next use (else a
    filter whose set was a base would find it gone and upload it again every few seconds)."""

    async def main() -> None:
        store = RedisStore.from_url(redis_server.url, prefix=_prefix(), small_set=0)
        redis = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
        try:
            await store.acquire(_request(FLEET, 0), now=NOW)
            await store.acquire(_request(FLEET - {"p0000"}, 1), now=NOW + 1)
            first = await store._sets.key(FLEET)
            assert await redis.pttl(first) <= RETIRED_SET_TTL_MS
            await store.acquire(_request(FLEET, 2), now=NOW + 2)
            assert await redis.pttl(first) > CANDIDATE_SET_TTL_MS - 60_000
        finally:
            await store.close()
            await redis.aclose()

    asyncio.run(main())


changes = st.lists(
    st.tuples(
        st.frozensets(st.sampled_from(sorted(FLEET)[:120]), max_size=40),  # members leaving
        st.frozensets(st.sampled_from([f"x{i}" for i in range(20)]), max_size=5),  # members arriving
        st.sampled_from(["", "told", "silent"]),  # the key last named vanishes from Redis first
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(steps=changes)
def test_every_set_named_holds_exactly_its_members(
    redis_server: RedisServer, steps: list[tuple[frozenset[str], frozenset[str], str]]
) -> None:
    async def main() -> None:
        redis = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
        sets = CandidateSets(redis, prefix=_prefix())
        try:
            last = ""
            for leaving, arriving, vanish in steps:
                if vanish and last:  # expired in Redis: found by a script's 'nocand', or not yet
                    await redis.delete(last)
                    if vanish == "told":
                        sets.gone(last)
                members = (FLEET - leaving) | arriving
                last = await sets.key(members)
                if not await redis.exists(last):  # as the store does when its script answers 'nocand'
                    sets.gone(last)
                    last = await sets.key(members)
                assert set(await redis.smembers(last)) == members
            assert sets.remembered() <= RECENT_SETS
        finally:
            await redis.aclose()

    asyncio.run(main())
