"""A long run of ineligible proxies at the front of the LRU is walked once, not on every lease, and what can
end it sooner (a release, a renewal, a good report, a new set of candidates, time) makes the walk start over.
Asserted on every store; the memory store also shows that the second walk starts after the run."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import pytest

from service.discovery.handout_order import HandOutOrder
from service.discovery.memory import MemoryStore
from service.discovery.store import AcquireRequest, Store
from tests.service.conftest import StoreFactory

NOW = 1_800_000_000.0
FLEET = frozenset(f"p{i:03d}" for i in range(200))
BANNED = sorted(FLEET)[:100]  # the front of the LRU: never used, by key


def _request(
    target: str = "t", *, tag: str, count: int = 1, ttl: float = 5, candidates: Any = FLEET
) -> AcquireRequest:
    return AcquireRequest(
        client="c",
        target=target,
        candidates=candidates,
        count=count,
        ttl=ttl,
        cooldown=10,
        lease_ids=[f"{tag}-{i}" for i in range(count)],
    )


def _run(store_factory: StoreFactory, scenario: Callable[[Store], Awaitable[None]]) -> None:
    async def main() -> None:
        store = store_factory()
        try:
            for key in BANNED:
                await store.penalise(proxy=key, target="t", now=NOW, base=1000, cap=1000, fraction=0.5)
            await scenario(store)
        finally:
            await store.close()

    asyncio.run(main())


async def _picks(store: Store, target: str, tags: str, *, now: float = NOW + 1) -> list[str]:
    return [(await store.acquire(_request(target, tag=tag), now=now)).leases[0].proxy for tag in tags]


def test_leases_skip_a_banned_front_in_lru_order_until_the_bans_run_out(store_factory: StoreFactory) -> None:
    async def scenario(store: Store) -> None:
        assert await _picks(store, "t", "abc") == ["p100", "p101", "p102"]
        assert await _picks(store, "u", "d") == ["p000"]  # banned for t only
        assert await store.forgive(proxy="p050", target="t", now=NOW + 1) is False  # a running ban stays
        assert await _picks(store, "t", "e") == ["p103"]
        assert await store.forgive(proxy="p050", target="t", now=NOW + 600) is True  # ran out: strikes reset
        assert await _picks(store, "t", "f", now=NOW + 600) == ["p001"]  # the front again (p000 went to u)

    _run(store_factory, scenario)


def test_a_release_or_renewal_inside_the_run_ends_the_skip(store_factory: StoreFactory) -> None:
    async def scenario(store: Store) -> None:
        held = (await store.acquire(_request("t", tag="a", count=100, ttl=100), now=NOW + 1)).leases
        assert [lease.proxy for lease in held[:2]] == ["p100", "p101"]
        nothing = await store.acquire(_request("t", tag="b"), now=NOW + 2)  # all banned or held
        assert (nothing.leases, nothing.earliest) == ([], pytest.approx(NOW + 101))
        assert await store.release(held[50].lease_id, now=NOW + 20, cooldown=10) is not None
        assert await _picks(store, "t", "c", now=NOW + 21) == ["p150"]
        assert await store.renew(held[10].lease_id, now=NOW + 30, ttl=1, cooldown=10) is not None
        assert await _picks(store, "t", "d", now=NOW + 32) == ["p110"]

    _run(store_factory, scenario)


def test_when_all_are_held_or_banned_the_earliest_is_still_reported(store_factory: StoreFactory) -> None:
    async def scenario(store: Store) -> None:
        got = await store.acquire(_request("t", tag="a", count=100), now=NOW + 1)
        assert len(got.leases) == 100
        first = await store.acquire(_request("t", tag="b"), now=NOW + 2)
        second = await store.acquire(_request("t", tag="c"), now=NOW + 3)
        assert first.leases == second.leases == []
        assert first.earliest == second.earliest == pytest.approx(NOW + 11)  # the holds' cooldown
        after = await store.acquire(_request("t", tag="d"), now=NOW + 11)
        assert [lease.proxy for lease in after.leases] == ["p100"]

    _run(store_factory, scenario)


def test_new_candidates_are_walked_from_the_front(store_factory: StoreFactory) -> None:
    async def scenario(store: Store) -> None:
        assert await _picks(store, "t", "ab") == ["p100", "p101"]
        grown = FLEET | {"a-new"}
        got = await store.acquire(_request("t", tag="c", candidates=grown), now=NOW + 2)
        assert [lease.proxy for lease in got.leases] == ["a-new"]

    _run(store_factory, scenario)


@pytest.fixture
def walked(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The positions the memory store's walks visit, in order (`HandOutOrder.walk`, counted)."""
    seen: list[int] = []
    walk = HandOutOrder.walk

    def counting(self: HandOutOrder, start: int = 0) -> Any:
        for item in walk(self, start):
            seen.append(item[0])
            yield item

    monkeypatch.setattr(HandOutOrder, "walk", counting)
    return seen


def test_the_memory_store_walks_a_banned_front_once(walked: list[int]) -> None:
    async def scenario(store: Store) -> None:
        assert await _picks(store, "t", "a") == ["p100"]
        assert len(walked) == 101
        walked.clear()
        assert await _picks(store, "t", "bcd") == ["p101", "p102", "p103"]
        assert len(walked) == 3

    _run(MemoryStore, scenario)


def test_the_memory_store_walks_a_banned_front_once_across_a_compaction(walked: list[int]) -> None:
    """The order compacts after about a thousand hand-outs beyond its size; the run remembered before is
    carried over (at 10,000 proxies with a banned front for each of 100 targets, walking it again after each
    compaction was half the steps of a lease)."""

    async def scenario(store: Store) -> None:
        assert isinstance(store, MemoryStore)
        for key in BANNED:  # banned for the other target too: its hand-outs leave the front where it is
            await store.penalise(proxy=key, target="u", now=NOW, base=1000, cap=1000, fraction=0.5)
        assert await _picks(store, "t", "a") == ["p100"]
        epoch = store._lru.epoch
        tag = 0
        while store._lru.epoch == epoch:  # hand-outs for the other target until the order compacts
            tag += 1
            request = replace(_request("u", tag=f"u{tag}"), ignore_cooldown=True)
            got = await store.acquire(request, now=NOW + 1)
            assert got.leases[0].proxy not in BANNED
        walked.clear()
        got = await store.acquire(_request("t", tag="b"), now=NOW + 2)
        assert len(got.leases) == 1
        assert got.leases[0].proxy not in BANNED
        assert len(walked) < 10, walked[:5]  # not the hundred banned ones again

    _run(MemoryStore, scenario)
