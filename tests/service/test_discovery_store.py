"""The Store protocol, asserted the same on the memory store and on a real redis-server."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TypeVar

import pytest

from service.discovery.backoff import FullJitter
from service.discovery.store import Acquired, AcquireRequest, BoundSession, FairShare, Store
from tests.service.conftest import StoreFactory

T = TypeVar("T")
NOW = 1_800_000_000.0


def run(store_factory: StoreFactory, scenario: Callable[[Store], Awaitable[T]]) -> T:
    async def main() -> T:
        store = store_factory()
        try:
            return await scenario(store)
        finally:
            await store.close()

    return asyncio.run(main())


def request(
    *candidates: str, count: int = 1, ttl: float = 5, cooldown: float = 10, **kw: object
) -> AcquireRequest:
    return AcquireRequest(
        client=str(kw.get("client", "c")),
        target=str(kw.get("target", "t")),
        candidates=list(candidates),
        count=count,
        ttl=ttl,
        cooldown=cooldown,
        lease_ids=[f"id-{i}-{kw.get('tag', '')}" for i in range(count)],
        ignore_cooldown=bool(kw.get("ignore_cooldown", False)),
    )


def test_acquire_is_lru_and_reports_the_earliest_eligible(store_factory: StoreFactory) -> None:
    async def scenario(store: Store) -> None:
        first = await store.acquire(request("a", "b", count=2, tag="1"), now=NOW)
        assert [lease.proxy for lease in first.leases] == ["a", "b"]
        none = await store.acquire(request("a", "b", tag="2"), now=NOW + 1)
        assert none.leases == []
        assert none.earliest == pytest.approx(NOW + 10)
        other_target = await store.acquire(request("b", "a", target="u", tag="3"), now=NOW + 2)
        assert [lease.proxy for lease in other_target.leases] == ["a"]  # a was used longest ago
        sticky = await store.acquire(request("a", ignore_cooldown=True, tag="4"), now=NOW + 3)
        assert [lease.proxy for lease in sticky.leases] == ["a"]

    run(store_factory, scenario)


def test_release_ends_the_hold_but_not_the_cooldown(store_factory: StoreFactory) -> None:
    async def scenario(store: Store) -> None:
        lease = (await store.acquire(request("a", ttl=100, cooldown=10, tag="1"), now=NOW)).leases[0]
        assert (await store.acquire(request("a", tag="2"), now=NOW + 50)).earliest == pytest.approx(NOW + 100)
        released = await store.release(lease.lease_id, now=NOW + 5, cooldown=10)
        assert released is not None
        assert released.released
        assert (await store.acquire(request("a", tag="3"), now=NOW + 6)).earliest == pytest.approx(NOW + 10)
        assert await store.release(lease.lease_id, now=NOW + 7, cooldown=10) is None  # only once
        kept = await store.get_lease(lease.lease_id, now=NOW + 7)
        assert kept is not None
        assert kept.proxy == "a"  # kept for late reports

    run(store_factory, scenario)


def test_penalty_is_full_jitter_per_target_and_forgiven(store_factory: StoreFactory) -> None:
    schedule = FullJitter(base=300, cap=1000)

    async def scenario(store: Store) -> None:
        for strikes_before, fraction in enumerate([0.5, 0.5, 0.9, 0.1]):
            now = NOW + 5000 * strikes_before
            penalty = await store.penalise(
                proxy="a", target="t", now=now, base=300, cap=1000, fraction=fraction
            )
            assert penalty.strikes == strikes_before + 1
            assert penalty.until == pytest.approx(now + schedule.delay(strikes_before, fraction))
        assert [p.target for p in await store.penalties("a", now=NOW + 15000)] == ["t"]
        assert (await store.acquire(request("a", target="t"), now=NOW + 15001)).leases == []
        assert len((await store.acquire(request("a", target="other"), now=NOW + 15001)).leases) == 1
        assert await store.forgive(proxy="a", target="t", now=NOW + 15001) is False  # still running
        assert await store.forgive(proxy="a", target="t", now=NOW + 15101) is True  # ran out
        assert await store.penalties("a", now=NOW) == []
        again = await store.penalise(proxy="a", target="t", now=NOW, base=300, cap=1000, fraction=1.0)
        assert again.strikes == 1  # the good report reset the count

    run(store_factory, scenario)


def test_renew_moves_the_end_and_the_hold_of_an_active_lease_only(store_factory: StoreFactory) -> None:
    async def scenario(store: Store) -> None:
        lease = (await store.acquire(request("a", ttl=100, cooldown=10, tag="1"), now=NOW)).leases[0]
        renewed = await store.renew(lease.lease_id, now=NOW + 50, ttl=300, cooldown=10)
        assert renewed is not None
        assert renewed.expires_at == pytest.approx(NOW + 350)
        kept = await store.get_lease(lease.lease_id, now=NOW + 51)
        assert kept is not None
        assert kept.expires_at == pytest.approx(NOW + 350)
        held = await store.acquire(request("a", tag="2"), now=NOW + 200)  # past the first end: still held
        assert (held.leases, held.earliest) == ([], pytest.approx(NOW + 350))
        shorter = await store.renew(lease.lease_id, now=NOW + 201, ttl=1, cooldown=10)
        assert shorter is not None
        assert (await store.acquire(request("a", tag="3"), now=NOW + 202)).earliest is None  # hold followed
        released = await store.release(lease.lease_id, now=NOW + 202, cooldown=10)
        assert released is None  # it ended at NOW + 202: nothing to release
        assert await store.renew(lease.lease_id, now=NOW + 203, ttl=100, cooldown=10) is None  # ended
        assert await store.renew("nope", now=NOW, ttl=100, cooldown=10) is None

    run(store_factory, scenario)


def test_a_renewed_lease_released_ends_its_hold(store_factory: StoreFactory) -> None:
    async def scenario(store: Store) -> None:
        lease = (await store.acquire(request("a", ttl=100, cooldown=10, tag="1"), now=NOW)).leases[0]
        assert await store.renew(lease.lease_id, now=NOW + 50, ttl=300, cooldown=10) is not None
        assert await store.release(lease.lease_id, now=NOW + 60, cooldown=10) is not None
        again = await store.acquire(request("a", tag="2"), now=NOW + 61)
        assert [granted.proxy for granted in again.leases] == ["a"]

    run(store_factory, scenario)


def test_a_new_ban_never_shortens_a_running_penalty(store_factory: StoreFactory) -> None:
    async def scenario(store: Store) -> None:
        long = await store.penalise(proxy="a", target="t", now=NOW, base=300, cap=3600, fraction=0.99)
        short = await store.penalise(proxy="a", target="t", now=NOW + 1, base=300, cap=3600, fraction=0.0)
        assert short.until == pytest.approx(long.until)

    run(store_factory, scenario)


def sticky(
    store: Store,
    *,
    client: str = "c",
    target: str = "t",
    pool: tuple[str, ...] = ("a", "b"),
    now: float,
    tag: str,
) -> Awaitable[Acquired | BoundSession | None]:
    """The session "s"'s lease, idle 30 s, its share of `pool` (no holding limit)."""
    share = FairShare(pool=frozenset(pool), holding=None, rate=None, burst=1.0)
    asked = replace(request(client=client, target=target, ignore_cooldown=True, tag=tag), share=share)
    return store.sticky(asked, session="s", idle=30, now=now)


def test_sessions_expire_when_idle(store_factory: StoreFactory) -> None:
    async def scenario(store: Store) -> None:
        await store.bind_session(client="c", session="s", proxy="a", now=NOW, idle=30)
        assert await sticky(store, client="other", now=NOW, tag="1") is None
        assert await sticky(store, now=NOW + 30, tag="2") is None  # idle for 30 s
        await store.bind_session(client="c", session="s", proxy="a", now=NOW + 40, idle=30)
        got = await sticky(store, now=NOW + 69, tag="3")  # renews it: idle from now on
        assert isinstance(got, Acquired)
        assert [(lease.proxy, lease.lease_id) for lease in got.leases] == [("a", "id-0-3")]
        got = await sticky(store, now=NOW + 98, tag="4")
        assert isinstance(got, Acquired)
        assert [lease.proxy for lease in got.leases] == ["a"]

    run(store_factory, scenario)


def test_a_sticky_lease_stops_at_a_proxy_banned_for_its_target_or_out_of_its_pool(
    store_factory: StoreFactory,
) -> None:
    """Nothing is done then (no lease, no renewal): the service re-binds the session or refuses."""

    async def scenario(store: Store) -> None:
        ban = await store.penalise(proxy="a", target="t", now=NOW, base=300, cap=3600, fraction=0.5)
        await store.penalise(proxy="a", target="u", now=NOW - 4000, base=300, cap=3600, fraction=0.5)  # over
        await store.bind_session(client="c", session="s", proxy="a", now=NOW, idle=30)
        banned = await sticky(store, now=NOW + 1, tag="1")
        assert banned == BoundSession("a", pytest.approx(ban.until))
        outside = await sticky(store, target="u", pool=("b", "c"), now=NOW + 2, tag="2")
        assert isinstance(outside, BoundSession)
        assert outside.proxy == "a"
        assert await sticky(store, now=NOW + 31, tag="3") is None  # neither renewed it
        await store.bind_session(client="c", session="s", proxy="a", now=NOW + 40, idle=30)
        other = await sticky(store, target="u", now=NOW + 41, tag="4")  # its ban for "u" is over
        assert isinstance(other, Acquired)
        assert [lease.proxy for lease in other.leases] == ["a"]

    run(store_factory, scenario)


def test_the_backoff_schedule() -> None:
    schedule = FullJitter(base=300, cap=3600)
    assert [schedule.ceiling(n) for n in range(6)] == [300, 600, 1200, 2400, 3600, 3600]
    assert schedule.delay(1, 0.5) == 300
    assert schedule.ceiling(10_000) == 3600  # no overflow


def test_lru_order_holds_for_a_small_subset_of_a_big_fleet(store_factory: StoreFactory) -> None:
    fleet = [f"p{i:02d}" for i in range(40)]

    async def scenario(store: Store) -> list[list[str]]:
        picks = []
        for tag, (candidates, count) in enumerate([(fleet, 3), (["p01", "p05"], 1), (["p02", "p01"], 1)]):
            acquired = await store.acquire(
                request(*candidates, count=count, target=f"t{tag}", tag=tag), now=NOW + tag
            )
            picks.append([lease.proxy for lease in acquired.leases])
        return picks

    assert run(store_factory, scenario) == [["p00", "p01", "p02"], ["p05"], ["p01"]]
