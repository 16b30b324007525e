"""service/discovery/memory.py and lease_table.py: what the memory store keeps of leases, and for how long
(issue 20).

A running lease is always kept. An ended one (expired or released) is kept for late reports by lease id
for at most LEASE_GRACE seconds and only while it is among the `ended_kept` latest ended: before, every
lease was kept for an hour, 1.8 million records at 500 leases a second (tests/bench/bench_lease_memory.py).
"""

from __future__ import annotations

import asyncio
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from service.discovery.lease_table import LEASE_GRACE, LeaseTable
from service.discovery.memory import SWEEP_EVERY, MemoryStore
from service.discovery.store import AcquireRequest, LeaseRecord

NOW = 1_800_000_000.0
PROXIES = frozenset(f"ns/p{i}" for i in range(200))
_ids = itertools.count()


def take(store: MemoryStore, *, at: float, ttl: float, client: str = "c") -> LeaseRecord:
    lease_id = f"lease-{next(_ids)}"
    request = AcquireRequest(
        client=client, target="t", candidates=PROXIES, count=1, ttl=ttl, cooldown=0, lease_ids=[lease_id]
    )
    got = asyncio.run(store.acquire(request, now=at))
    assert got.leases, got
    return got.leases[0]


def readable(store: MemoryStore, lease_id: str, *, at: float) -> bool:
    return asyncio.run(store.get_lease(lease_id, now=at)) is not None


def test_only_the_latest_ended_leases_are_kept_past_the_bound() -> None:
    store = MemoryStore(ended_kept=3)
    leases = [take(store, at=NOW + i, ttl=10) for i in range(10)]
    later = NOW + 100
    take(store, at=later, ttl=10)  # the sweep runs with a lease request
    kept = [lease.lease_id for lease in leases if readable(store, lease.lease_id, at=later)]
    assert kept == [lease.lease_id for lease in leases[-3:]]  # the last three to end


def test_a_running_lease_is_never_forgotten() -> None:
    store = MemoryStore(ended_kept=0)
    long = take(store, at=NOW, ttl=3000)  # at the front of the order, running behind everything after it
    short = [take(store, at=NOW + 1 + i / 100, ttl=1) for i in range(300)]
    at = NOW + 2 * SWEEP_EVERY
    take(store, at=at, ttl=1)
    assert readable(store, long.lease_id, at=at)
    assert not any(readable(store, lease.lease_id, at=at) for lease in short)
    assert store.kept_leases(now=at) == (2, 0)


def test_a_released_lease_is_ended_at_once() -> None:
    store = MemoryStore(ended_kept=2)
    leases = [take(store, at=NOW, ttl=600) for _ in range(5)]
    for lease in leases:
        assert asyncio.run(store.release(lease.lease_id, now=NOW + 1, cooldown=0)) is not None
    take(store, at=NOW + 2, ttl=600)
    assert [readable(store, lease.lease_id, at=NOW + 2) for lease in leases] == [False] * 3 + [True] * 2


def test_an_ended_lease_is_kept_for_the_grace_and_no_longer() -> None:
    store = MemoryStore()
    lease = take(store, at=NOW, ttl=10)
    end = NOW + 10
    take(store, at=end + LEASE_GRACE - 1, ttl=10)
    assert readable(store, lease.lease_id, at=end + LEASE_GRACE - 1)
    take(store, at=end + LEASE_GRACE + SWEEP_EVERY, ttl=10)
    assert not readable(store, lease.lease_id, at=end + LEASE_GRACE + SWEEP_EVERY)


def test_a_renewed_lease_stays_past_its_first_end() -> None:
    store = MemoryStore(ended_kept=0)
    lease = take(store, at=NOW, ttl=10)
    assert asyncio.run(store.renew(lease.lease_id, now=NOW + 5, ttl=600, cooldown=0)) is not None
    for i in range(50):
        take(store, at=NOW + 20 + i, ttl=1)
    take(store, at=NOW + 20 + 2 * SWEEP_EVERY, ttl=1)
    assert readable(store, lease.lease_id, at=NOW + 20 + 2 * SWEEP_EVERY)


step = st.one_of(
    st.tuples(st.just("take"), st.sampled_from([1.0, 10.0, 60.0, 200.0, 3000.0])),
    st.tuples(st.just("release"), st.integers(0, 1000)),
    st.tuples(st.just("renew"), st.sampled_from([1.0, 30.0, 500.0])),
    st.tuples(st.just("tick"), st.sampled_from([0.5, 5.0, 70.0, 400.0])),
)


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(step, max_size=60), bound=st.integers(0, 4))
def test_running_leases_stay_and_noticed_ended_ones_are_bounded(
    steps: list[tuple[str, float]], bound: int
) -> None:
    """Whatever the leases, releases, renewals and waits: every running lease reads back as it is; after a
    sweep no more than `bound` ended leases are kept beyond those a running one at most LONG_LEASE from its
    end still holds back."""
    store, now = MemoryStore(ended_kept=bound), NOW
    ends: dict[str, float] = {}  # the model: lease id -> its end (now, once released)
    for kind, value in steps:
        taken = list(ends)
        if kind == "take":
            lease = take(store, at=now, ttl=value)
            ends[lease.lease_id] = now + value
        elif kind == "release" and taken:
            lease_id = taken[int(value) % len(taken)]
            if asyncio.run(store.release(lease_id, now=now, cooldown=0)) is not None:
                assert ends[lease_id] > now
                ends[lease_id] = now
        elif kind == "renew" and taken:
            if asyncio.run(store.renew(taken[-1], now=now, ttl=value, cooldown=0)) is not None:
                assert ends[taken[-1]] > now
                ends[taken[-1]] = now + value
        else:
            now += value
        for lease_id, end in ends.items():
            if end > now:  # running: kept, as it is
                record = asyncio.run(store.get_lease(lease_id, now=now))
                assert record is not None
                assert record.expires_at == end
                assert not record.released
    now += SWEEP_EVERY + 3000  # every lease ended, the sweep comes with the next request
    take(store, at=now, ttl=1)
    running, ended = store.kept_leases(now=now)
    assert running == 1
    assert ended <= bound


def test_who_held_a_proxy_is_kept_for_the_report_window_not_the_hour() -> None:
    """Each (client, proxy) pair a lease ended on is an entry; kept an hour, hundreds of clients over a
    fleet of 10,000 made millions of them. A report by proxy looks back `report_keep` seconds at most."""
    store = MemoryStore(report_keep=600)
    lease = take(store, at=NOW, ttl=10)
    end = NOW + 10
    take(store, at=end + 599, ttl=1)  # a sweep, the pair still within the window
    assert asyncio.run(store.last_held(client="c", proxy=lease.proxy)) == end
    take(store, at=end + 600 + SWEEP_EVERY, ttl=1, client="other")
    assert asyncio.run(store.last_held(client="c", proxy=lease.proxy)) is None


def test_each_client_and_proxy_leased_is_one_pair_until_the_window_passes() -> None:
    """Kept by client, then proxy (report_book.py): one entry a pair, forgotten once past the window."""
    store = MemoryStore(report_keep=600)
    first = take(store, at=NOW, ttl=10, client="a")
    again = take(store, at=NOW + 20, ttl=10, client="a")
    assert again.proxy != first.proxy  # the LRU's next: a second pair of a's, not the first again
    take(store, at=NOW + 40, ttl=10, client="b")
    assert store.kept_pairs() == 3
    assert asyncio.run(store.last_held(client="a", proxy=first.proxy)) == NOW + 10
    assert asyncio.run(store.last_held(client="b", proxy=again.proxy)) is None
    take(store, at=NOW + 50 + 600 + SWEEP_EVERY, ttl=1, client="c")  # a sweep: a's and b's passed
    assert store.kept_pairs() == 1
    assert asyncio.run(store.last_held(client="a", proxy=first.proxy)) is None


def test_a_penalty_and_its_strikes_are_forgotten_a_week_after_it_ended() -> None:
    """As the Redis store's strikes expire: every (target, proxy) ever banned was kept for good."""
    store = MemoryStore()
    ban = asyncio.run(store.penalise(proxy="ns/p1", target="t", now=NOW, base=10, cap=60, fraction=1.0))
    assert ban is not None
    week = 7 * 86400
    take(store, at=ban.until + week - 1, ttl=1)
    second = asyncio.run(
        store.penalise(proxy="ns/p1", target="t", now=ban.until + week - 1, base=10, cap=60, fraction=1.0)
    )
    assert second is not None
    assert second.strikes == 2
    again = ban.until + week - 1 + 60  # the second penalty ends within a minute of that
    take(store, at=again + week + SWEEP_EVERY, ttl=1)
    later = again + week + SWEEP_EVERY
    fresh = asyncio.run(store.penalise(proxy="ns/p1", target="t", now=later, base=10, cap=60, fraction=1.0))
    assert fresh is not None
    assert fresh.strikes == 1  # its strikes forgotten


def test_a_lease_s_hold_goes_when_the_lease_ends_not_at_the_next_sweep() -> None:
    """Each running lease holds its proxy for its client and target; once it has ended (noticed with the
    next request) the hold is gone, long before the minute's sweep: a minute of ended holds was 1.7 MiB at
    500 leases a second. A cooldown past the lease's end keeps it until the cooldown ends."""
    store = MemoryStore()
    for i in range(100):
        take(store, at=NOW + i / 100, ttl=5)
    assert store.kept_holds() == 100
    take(store, at=NOW + 6, ttl=5)  # every earlier lease ended; no sweep is due for SWEEP_EVERY
    assert SWEEP_EVERY > 6
    assert store.kept_holds() == 1
    request = AcquireRequest(
        client="c", target="t", candidates=PROXIES, count=1, ttl=5, cooldown=30, lease_ids=["cooled"]
    )
    asyncio.run(store.acquire(request, now=NOW + 7))
    take(store, at=NOW + 20, ttl=5)  # the cooled lease ended at NOW + 12; its hold runs to NOW + 37
    assert store.kept_holds() == 2


names = st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(["t1", "t2", "t3", "t4"]))


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(st.tuples(names, st.sampled_from([1.0, 5.0, 30.0])), max_size=60), bound=st.integers(0, 3)
)
def test_each_kept_lease_names_its_own_client_and_target_and_a_pair_goes_with_its_last_lease(
    steps: list[tuple[tuple[str, str], float]], bound: int
) -> None:
    """A slot keeps its (client, target) as a pair's id (`PairIds`): each kept lease reads back with its own
    names after slots were reused by other pairs, its end is told with them, and a pair no kept lease names
    is forgotten (targets are the clients' own strings: a table that only grew would keep them all)."""
    told: list[tuple[str, str, str]] = []
    table = LeaseTable(
        ended_kept=bound,
        on_end=lambda client, target, lease_id, _end: told.append((client, target, lease_id)),
    )
    now, named = 0.0, {}
    for (client, target), ttl in steps:
        lease_id = f"l{len(named)}"
        table.taken(LeaseRecord(lease_id, client, target, lease_id, now, now + ttl))  # proxy = its id
        named[lease_id] = (client, target)
        now += 2.0
        table.sweep(now)
        for kept_id, pair in named.items():
            record = table.record(kept_id)
            if record is not None:
                assert (record.client, record.target) == pair
        kept = {named[i] for i in named if table.record(i) is not None}
        assert table.pairs_named() == len(kept)
    assert all(named[lease_id] == (client, target) for client, target, lease_id in told)
    table.sweep(now + 100 + LEASE_GRACE)
    assert table.pairs_named() == 0
