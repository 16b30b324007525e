"""service/discovery/fair_share.py MemoryHoldings: what a lease request counts (`held_count`, kept counted
per pool as leases start and end; `holds`; `held_keys`) always agrees with `held` (what a 429's Retry-After
counts, from every lease), whatever the leases, releases, renewals, bans and pools asked about; and a
lease released holds nothing from then on."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from service.discovery.fair_share import MemoryHoldings

PROXIES = [f"p{i}" for i in range(6)]
TARGETS = ["t1", "t2"]

step = st.one_of(
    st.tuples(st.just("took"), st.sampled_from(PROXIES), st.floats(0, 50)),
    st.tuples(st.just("moved"), st.integers(0, 30), st.floats(0, 50)),
    st.tuples(st.just("released"), st.integers(0, 30), st.just(0.0)),
    st.tuples(st.just("banned"), st.sampled_from(PROXIES), st.floats(0, 50)),
    st.tuples(st.just("tick"), st.just(""), st.floats(0, 5)),
    st.tuples(st.just("sweep"), st.just(""), st.just(0.0)),
)


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(step, max_size=40),
    pools=st.lists(st.frozensets(st.sampled_from(PROXIES), min_size=1), min_size=1, max_size=3),
    target=st.sampled_from(TARGETS),
)
def test_what_a_request_counts_is_what_held_lists(
    steps: list[tuple[str, object, float]], pools: list[frozenset[str]], target: str
) -> None:
    holdings, now, issued = MemoryHoldings(), 0.0, 0
    for kind, what, value in steps:
        if kind == "took":
            holdings.took("c", f"l{issued}", proxy=str(what), end=now + value, tat=None, now=now)
            issued += 1
        elif kind == "moved" and issued:
            holdings.moved("c", f"l{int(str(what)) % issued}", end=now + value / 10)
        elif kind == "released" and issued:
            holdings.released("c", f"l{int(str(what)) % issued}")
        elif kind == "banned":
            holdings.banned("c", target=target, proxy=str(what), until=now + value)
        elif kind == "sweep":
            holdings.sweep(now=now)
        else:
            now += value
        pool = pools[len(str(what)) % len(pools)]  # the pool asked about changes now and then
        listed = set(holdings.held("c", target=target, pool=pool, now=now))
        assert holdings.held_count("c", target=target, pool=pool, now=now) == len(listed)
        assert holdings.held_keys("c", target=target, pool=pool, now=now) == listed
        assert {p for p in pool if holdings.holds("c", target=target, proxy=p, now=now)} == listed
        if kind == "released" and issued:
            gone = f"l{int(str(what)) % issued}"
            assert gone not in holdings.active("c", now=now)


def test_a_released_lease_stops_counting_at_once_and_its_ends_do_not_pile_up() -> None:
    """Released leases leave the counts when released, not at the next expiry pass; the ends they leave in
    the heap are dropped once they are most of it (a client releasing every lease early kept them all)."""
    holdings, pool = MemoryHoldings(), frozenset(PROXIES)
    for n in range(200):
        holdings.took("c", f"l{n}", proxy=PROXIES[n % 2], end=1000.0 + n, tat=None, now=float(n))
        if n % 10:  # nine in ten released: the ones kept are all on PROXIES[0]
            holdings.released("c", f"l{n}")
    assert holdings.held_keys("c", target="t1", pool=pool, now=200.0) == {PROXIES[0]}
    assert holdings.held_count("c", target="t1", pool=pool, now=200.0) == 1
    assert len(holdings.active("c", now=200.0)) == 20
    assert len(holdings._ends["c"]) <= 2 * 20 + 64
