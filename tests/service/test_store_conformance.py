"""Security: the memory and Redis stores agree on what keeps one client from getting one proxy twice.

Each case runs on `MemoryStore` and on `RedisStore` against a real redis-server (small candidate lists and
uploaded candidate sets). Redis expires keys by its own clock, which the tests cannot move; `Stores.advance`
does what that much time would do to the keys of the test's prefix (deletes those whose TTL runs out, shortens
the rest), so a key TTL that is too short shows as a wrong answer, not as a wait.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest
import redis.asyncio as aioredis

from service.discovery.memory import MemoryStore
from service.discovery.redis_store import RedisStore
from service.discovery.report_summary import KEEP_SECONDS, MOST, ReportEntry
from service.discovery.store import Acquired, AcquireRequest, ErrorVotes, FairShare, Limited, Store
from tests.service.conftest import RedisServer

NOW = 1_800_000_000.0


@dataclass
class Stores:
    store: Store
    redis: aioredis.Redis | None
    prefix: str

    async def advance(self, seconds: float) -> None:
        """What `seconds` of Redis's clock would do to this test's keys (the memory store has no TTLs)."""
        if self.redis is None:
            return
        gone = int(seconds * 1000)
        async for key in self.redis.scan_iter(match=f"{self.prefix}:*"):
            left = await self.redis.pttl(key)
            if 0 <= left <= gone:
                await self.redis.delete(key)
            elif left > gone:
                await self.redis.pexpire(key, left - gone)


Scenario = Callable[[Stores], Awaitable[None]]


@pytest.fixture(params=["memory", "redis", "redis-set"])
def run(request: pytest.FixtureRequest) -> Callable[[Scenario], None]:
    kind = str(request.param)

    def run_scenario(scenario: Scenario) -> None:
        async def main() -> None:
            prefix = f"conf-{uuid.uuid4().hex[:8]}"
            redis = None
            store: Store = MemoryStore()
            if kind != "memory":
                server: RedisServer = request.getfixturevalue("redis_server")
                small_set = 0 if kind == "redis-set" else 64
                store = RedisStore.from_url(server.url, prefix=prefix, small_set=small_set)
                redis = aioredis.Redis.from_url(server.url, decode_responses=True)
            try:
                await scenario(Stores(store, redis, prefix))
            finally:
                await store.close()
                if redis is not None:
                    await redis.aclose()

        asyncio.run(main())

    return run_scenario


def lease(*candidates: str, tag: str, count: int = 1, ttl: float, sticky: bool = False) -> AcquireRequest:
    return AcquireRequest(
        client="crawler",
        target="example.com",
        candidates=list(candidates),
        count=count,
        ttl=ttl,
        cooldown=10,
        lease_ids=[f"{tag}-{i}" for i in range(count)],
        ignore_cooldown=sticky,
    )


def test_a_short_lease_keeps_a_longer_lease_s_hold(run: Callable[[Scenario], None]) -> None:
    """Before the fix, Redis's hold key took the short lease's TTL: A came back while its lease ran."""

    async def scenario(s: Stores) -> None:
        long = await s.store.acquire(lease("a", "b", tag="long", ttl=3600), now=NOW)
        assert [x.proxy for x in long.leases] == ["a"]
        short = await s.store.acquire(lease("a", "b", tag="short", ttl=1), now=NOW + 1)
        assert [x.proxy for x in short.leases] == ["b"]
        await s.advance(600)
        again = await s.store.acquire(lease("a", "b", tag="again", count=2, ttl=60), now=NOW + 601)
        assert [x.proxy for x in again.leases] == ["b"]  # never a second lease on a while it is held
        assert again.earliest == pytest.approx(NOW + 3600)

    run(scenario)


def test_a_short_sticky_lease_keeps_a_longer_lease_s_hold(run: Callable[[Scenario], None]) -> None:
    """A session re-using its proxy with a short ttl must not lower the hold of the long lease it has."""

    async def scenario(s: Stores) -> None:
        await s.store.acquire(lease("a", tag="long", ttl=3600), now=NOW)
        sticky = await s.store.acquire(lease("a", tag="sticky", ttl=1, sticky=True), now=NOW + 1)
        assert [x.proxy for x in sticky.leases] == ["a"]
        await s.advance(600)
        again = await s.store.acquire(lease("a", tag="again", ttl=60), now=NOW + 601)
        assert again.leases == []
        assert again.earliest == pytest.approx(NOW + 3600)

    run(scenario)


def test_releasing_the_short_lease_keeps_the_long_hold(run: Callable[[Scenario], None]) -> None:
    async def scenario(s: Stores) -> None:
        await s.store.acquire(lease("a", "b", tag="long", ttl=3600), now=NOW)
        short = await s.store.acquire(lease("a", "b", tag="short", ttl=30), now=NOW + 1)
        assert await s.store.release(short.leases[0].lease_id, now=NOW + 2, cooldown=10) is not None
        await s.advance(600)
        again = await s.store.acquire(lease("a", "b", tag="again", count=2, ttl=60), now=NOW + 601)
        assert [x.proxy for x in again.leases] == ["b"]

    run(scenario)


def test_a_renewal_keeps_the_hold_key_alive(run: Callable[[Scenario], None]) -> None:
    async def scenario(s: Stores) -> None:
        first = await s.store.acquire(lease("a", "b", tag="first", ttl=30), now=NOW)
        await s.store.acquire(lease("a", "b", tag="other", ttl=1), now=NOW + 1)
        assert await s.store.renew(first.leases[0].lease_id, now=NOW + 20, ttl=3600, cooldown=10) is not None
        await s.advance(1200)
        again = await s.store.acquire(lease("a", "b", tag="again", count=2, ttl=60), now=NOW + 1220)
        assert [x.proxy for x in again.leases] == ["b"]

    run(scenario)


def test_who_held_a_proxy_and_until_when(run: Callable[[Scenario], None]) -> None:
    async def scenario(s: Stores) -> None:
        assert await s.store.last_held(client="crawler", proxy="a") is None
        first = await s.store.acquire(lease("a", tag="first", ttl=30), now=NOW)
        assert await s.store.last_held(client="crawler", proxy="a") == pytest.approx(NOW + 30)
        assert await s.store.last_held(client="other", proxy="a") is None
        assert await s.store.renew(first.leases[0].lease_id, now=NOW + 10, ttl=100, cooldown=10) is not None
        assert await s.store.last_held(client="crawler", proxy="a") == pytest.approx(NOW + 110)
        await s.store.acquire(lease("a", tag="sticky", ttl=5, sticky=True), now=NOW + 20)
        assert await s.store.last_held(client="crawler", proxy="a") == pytest.approx(
            NOW + 110
        )  # the latest end
        await s.advance(600)
        assert await s.store.last_held(client="crawler", proxy="a") == pytest.approx(
            NOW + 110
        )  # kept for reports

    run(scenario)


def test_sticky_sessions_are_counted_on_the_proxy_they_are_bound_to(
    run: Callable[[Scenario], None],
) -> None:
    """The fleet page's "sticky sessions" per proxy: a session moved to another proxy counts there only;
    an idle one stops counting."""

    async def scenario(s: Stores) -> None:
        bind = s.store.bind_session
        await bind(client="crawler", session="s1", proxy="a", now=NOW, idle=60)
        await bind(client="crawler", session="s2", proxy="a", now=NOW, idle=60)
        await bind(client="other", session="s1", proxy="b", now=NOW, idle=60)
        assert await s.store.sessions_on(["a", "b", "c"], now=NOW + 1) == {"a": 2, "b": 1, "c": 0}
        await bind(client="crawler", session="s2", proxy="b", now=NOW + 2, idle=60)  # rebound
        await bind(client="crawler", session="s1", proxy="a", now=NOW + 2, idle=60)  # renewed: still one
        assert await s.store.sessions_on(["a", "b"], now=NOW + 3) == {"a": 1, "b": 2}
        assert await s.store.sessions_on(["a", "b"], now=NOW + 61) == {"a": 1, "b": 1}  # other's s1 idled
        assert await s.store.sessions_on(["a", "b"], now=NOW + 63) == {"a": 0, "b": 0}

    run(scenario)


def test_error_votes_count_distinct_clients_in_the_window(run: Callable[[Scenario], None]) -> None:
    async def scenario(s: Stores) -> None:
        vote = s.store.vote_error
        assert await vote(proxy="a", client="x", now=NOW, window=60) == ErrorVotes(voters=1, new=True)
        assert await vote(proxy="a", client="x", now=NOW + 1, window=60) == ErrorVotes(voters=1, new=False)
        assert await vote(proxy="b", client="y", now=NOW + 2, window=60) == ErrorVotes(voters=1, new=True)
        assert await vote(proxy="a", client="y", now=NOW + 3, window=60) == ErrorVotes(voters=2, new=True)
        assert await vote(proxy="a", client="z", now=NOW + 62, window=60) == ErrorVotes(voters=2, new=True)

    run(scenario)


def test_reports_are_counted_per_client_in_fixed_windows(run: Callable[[Scenario], None]) -> None:
    async def scenario(s: Stores) -> None:
        start = 1_800_000_000.0  # a multiple of 60: windows are [start, start + 60)
        counts = [await s.store.count_report(client="x", now=start + i, period=60) for i in range(3)]
        assert counts == [(1, start + 60), (2, start + 60), (3, start + 60)]
        assert await s.store.count_report(client="y", now=start + 5, period=60) == (1, start + 60)
        assert await s.store.count_report(client="x", now=start + 60, period=60) == (1, start + 120)

    run(scenario)


def test_the_report_summary_counts_per_target_client_and_kind(run: Callable[[Scenario], None]) -> None:
    async def scenario(s: Stores) -> None:
        note = s.store.note_report
        await note(proxy="a", target="shop.example", client="x", kind="banned", now=NOW)
        await note(proxy="a", target="shop.example", client="x", kind="banned", now=NOW + 5)
        await note(proxy="a", target="shop.example", client="y", kind="ok", now=NOW + 7)
        await note(proxy="a", target="*", client="x", kind="error", now=NOW + 6)
        await note(proxy="b", target="shop.example", client="x", kind="banned", now=NOW + 8)
        assert await s.store.reports_on("a", now=NOW + 10) == [
            ReportEntry(target="shop.example", client="y", kind="ok", count=1, last=NOW + 7),
            ReportEntry(target="*", client="x", kind="error", count=1, last=NOW + 6),
            ReportEntry(target="shop.example", client="x", kind="banned", count=2, last=NOW + 5),
        ]
        assert [e.count for e in await s.store.reports_on("b", now=NOW + 10)] == [1]
        assert await s.store.reports_on("c", now=NOW + 10) == []

    run(scenario)


def test_the_report_summary_keeps_32_entries_per_proxy_and_a_day(run: Callable[[Scenario], None]) -> None:
    async def scenario(s: Stores) -> None:
        for i in range(MOST + 3):
            await s.store.note_report(proxy="a", target=f"t{i}", client="x", kind="banned", now=NOW + i)
        kept = await s.store.reports_on("a", now=NOW + 100)
        assert len(kept) == MOST
        assert {e.target for e in kept} == {f"t{i}" for i in range(3, MOST + 3)}  # the oldest three dropped
        await s.store.note_report(proxy="a", target="t3", client="x", kind="banned", now=NOW + 100)
        await s.advance(KEEP_SECONDS - 50)  # the keys outlive the oldest entries' day...
        late = NOW + KEEP_SECONDS + 50
        assert await s.store.reports_on("a", now=late) == [
            ReportEntry(target="t3", client="x", kind="banned", count=2, last=NOW + 100)
        ]  # ...whose entries are gone
        await s.store.note_report(proxy="a", target="u", client="x", kind="ok", now=late)
        assert [e.target for e in await s.store.reports_on("a", now=late)] == ["u", "t3"]
        await s.advance(KEEP_SECONDS - 1)  # a new report keeps the keys another day
        assert [e.target for e in await s.store.reports_on("a", now=late + KEEP_SECONDS - 1)] == ["u"]
        await s.advance(2)
        assert await s.store.reports_on("a", now=late + KEEP_SECONDS + 1) == []

    run(scenario)


def test_a_good_report_never_lifts_a_running_penalty(run: Callable[[Scenario], None]) -> None:
    async def scenario(s: Stores) -> None:
        ban = await s.store.penalise(proxy="a", target="t", now=NOW, base=300, cap=3600, fraction=0.5)
        assert ban.until == pytest.approx(NOW + 150)
        assert await s.store.forgive(proxy="a", target="t", now=NOW + 10) is False
        assert await s.store.penalty_until(proxy="a", target="t") == pytest.approx(NOW + 150)
        assert await s.store.forgive(proxy="a", target="t", now=NOW + 151) is True  # ran out: strikes reset
        again = await s.store.penalise(proxy="a", target="t", now=NOW + 200, base=300, cap=3600, fraction=1)
        assert again.strikes == 1

    run(scenario)


def shared(
    *candidates: str,
    tag: str,
    count: int = 1,
    ttl: float = 60,
    target: str = "example.com",
    holding: int | None = None,
    rate: float | None = None,
    burst: float = 1,
    pool: tuple[str, ...] | None = None,
    sticky: bool = False,
) -> AcquireRequest:
    """A lease request under a fair share: `pool` (default: the candidates) is what the share counts over."""
    listed = list(candidates)
    share = FairShare(pool=listed if pool is None else list(pool), holding=holding, rate=rate, burst=burst)
    return AcquireRequest(
        client="crawler",
        target=target,
        candidates=listed,
        count=count,
        ttl=ttl,
        cooldown=10,
        lease_ids=[f"{tag}-{i}" for i in range(count)],
        ignore_cooldown=sticky,
        share=share,
    )


def _proxies(acquired: Acquired) -> list[str]:
    return sorted(lease.proxy for lease in acquired.leases)


def test_a_client_holds_at_most_its_share_of_the_pool(run: Callable[[Scenario], None]) -> None:
    async def scenario(s: Stores) -> None:
        first = await s.store.acquire(shared("a", "b", "c", "d", tag="1", count=4, holding=2), now=NOW)
        assert _proxies(first) == ["a", "b"]  # never used: key order
        other = await s.store.acquire(
            shared("a", "b", "c", "d", tag="2", count=4, holding=2, target="other"), now=NOW
        )
        assert _proxies(other) == ["a", "b"]  # the two it holds, for another target; no third
        taken = await s.store.acquire(shared("a", "b", "c", "d", tag="3", holding=2), now=NOW + 1)
        assert taken.leases == []
        assert taken.limited == Limited("lease_share", pytest.approx(NOW + 60))
        assert await s.store.release(first.leases[0].lease_id, now=NOW + 2, cooldown=10) is not None
        assert await s.store.release(other.leases[0].lease_id, now=NOW + 2, cooldown=10) is not None
        freed = await s.store.acquire(shared("a", "b", "c", "d", tag="4", count=4, holding=2), now=NOW + 3)
        assert _proxies(freed) == ["c"]  # a cools down for this target; one new proxy fits
        alone = await s.store.acquire(shared("a", "b", tag="5", holding=2, target="t2"), now=NOW + 3)
        assert alone.limited is None  # every candidate its own: not the share's doing

    run(scenario)


def test_a_proxy_the_client_holds_already_takes_no_room_in_its_share(run: Callable[[Scenario], None]) -> None:
    """A lease on a proxy it holds (for another target) is not one more proxy held: the rest of the room goes
    to the next ones (the count is the client's distinct proxies, kept as its leases start and end)."""

    async def scenario(s: Stores) -> None:
        first = await s.store.acquire(shared("a", tag="1", holding=2, target="t1"), now=NOW)
        assert _proxies(first) == ["a"]
        other = AcquireRequest(
            client="other",
            target="t1",
            candidates=["b", "c"],
            count=2,
            ttl=60,
            cooldown=10,
            lease_ids=["o1", "o2"],
        )
        assert len((await s.store.acquire(other, now=NOW + 1)).leases) == 2  # b, c: more recent than a
        got = await s.store.acquire(shared("a", "b", "c", tag="2", count=3, holding=2), now=NOW + 2)
        assert [lease.proxy for lease in got.leases] == ["a", "b"]  # a (its own), then one more: b

    run(scenario)


def test_a_client_holding_its_whole_pool_gets_its_proxies_least_recently_used_first(
    run: Callable[[Scenario], None],
) -> None:
    """A client at its share leases only what it holds, least recently used first: in the memory store the
    held proxies of a big pool are walked in the LRU, not sorted (issue 20), and when each is held is
    counted only for the 429."""
    pool = tuple(f"p{i:03d}" for i in range(64))

    async def scenario(s: Stores) -> None:
        first = await s.store.acquire(shared(*pool, tag="1", count=64, holding=64), now=NOW)
        assert _proxies(first) == list(pool)
        got = []
        for n, target in enumerate(("t1", "t2", "t3")):
            asked = shared(*pool, tag=f"2{n}", count=2, holding=64, target=target)
            got.append(_proxies(await s.store.acquire(asked, now=NOW + 1 + n)))
        assert got == [["p000", "p001"], ["p002", "p003"], ["p004", "p005"]]
        # p010 released: it no longer counts in the share, but cools down for example.com; the rest of
        # p008-p015 are held for it, by leases until NOW + 60, and the share (4) is taken
        assert await s.store.release(first.leases[10].lease_id, now=NOW + 5, cooldown=10) is not None
        part = pool[8:16]
        done = await s.store.acquire(shared(*part, tag="3", holding=4, pool=part), now=NOW + 6)
        assert done.leases == []
        assert done.limited == Limited("lease_share", pytest.approx(NOW + 60))

    run(scenario)


def test_a_sticky_request_counts_in_the_share_of_its_pool(run: Callable[[Scenario], None]) -> None:
    async def scenario(s: Stores) -> None:
        pool = ("a", "b", "c", "d")
        held = await s.store.acquire(shared(*pool, tag="1", count=2, holding=2), now=NOW)
        assert _proxies(held) == ["a", "b"]
        other = await s.store.acquire(shared("c", tag="2", holding=2, pool=pool, sticky=True), now=NOW)
        assert other.limited is not None
        assert other.limited.reason == "lease_share"
        own = await s.store.acquire(shared("a", tag="3", holding=2, pool=pool, sticky=True), now=NOW)
        assert _proxies(own) == ["a"]

    run(scenario)


def test_a_client_leases_at_most_at_its_rate(run: Callable[[Scenario], None]) -> None:
    async def scenario(s: Stores) -> None:
        def ask(tag: str, count: int) -> AcquireRequest:
            return shared("a", "b", "c", "d", tag=tag, count=count, rate=2, burst=3, target=tag)

        assert len((await s.store.acquire(ask("1", 4), now=NOW)).leases) == 3  # the burst
        empty = await s.store.acquire(ask("2", 1), now=NOW)
        assert empty.leases == []
        assert empty.limited == Limited("lease_rate", pytest.approx(NOW + 0.5))
        assert len((await s.store.acquire(ask("3", 4), now=NOW + 0.5)).leases) == 1
        assert len((await s.store.acquire(ask("4", 4), now=NOW + 10)).leases) == 3  # full again

    run(scenario)


def test_a_lease_s_ban_counts_once_and_holds_the_proxy_for_the_share(
    run: Callable[[Scenario], None],
) -> None:
    async def scenario(s: Stores) -> None:
        got = await s.store.acquire(shared("a", "b", tag="1", holding=1, ttl=5), now=NOW)
        lease_id = got.leases[0].lease_id
        ban = await s.store.penalise(
            lease_id=lease_id, proxy="a", target="example.com", now=NOW, base=300, cap=3600, fraction=0.5
        )
        assert ban is not None
        assert ban.strikes == 1
        again = await s.store.penalise(
            lease_id=lease_id, proxy="a", target="example.com", now=NOW, base=300, cap=3600, fraction=1
        )
        assert again is None
        assert await s.store.penalty_until(proxy="a", target="example.com") == pytest.approx(NOW + 150)
        kept = await s.store.get_lease(lease_id, now=NOW)
        assert kept is not None
        assert kept.banned
        assert await s.store.release(lease_id, now=NOW + 1, cooldown=0) is not None
        held = await s.store.acquire(shared("a", "b", tag="2", holding=1, target="t2"), now=NOW + 2)
        assert _proxies(held) == ["b"]  # its ban for example.com holds nothing back for another site
        assert await s.store.release(held.leases[0].lease_id, now=NOW + 3, cooldown=0) is not None
        taken = await s.store.acquire(shared("a", "b", tag="3", holding=1), now=NOW + 3)
        assert taken.limited == Limited("lease_share", pytest.approx(NOW + 150))
        await s.advance(150)
        after = await s.store.acquire(shared("a", "b", tag="4", holding=1), now=NOW + 151)
        assert len(after.leases) == 1

    run(scenario)
