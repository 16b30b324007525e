"""service/discovery/fair_share.py MemoryHoldings: what a lease request counts (`held_count`, kept counted
per pool as leases start and end; `holds`; `held_keys`) always agrees with `held` (what a 429's Retry-After
counts, from every lease), whatever the leases, releases, renewals, bans and pools asked about."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from service.discovery.fair_share import MemoryHoldings

PROXIES = [f"p{i}" for i in range(6)]
TARGETS = ["t1", "t2"]

step = st.one_of(
    st.tuples(st.just("took"), st.sampled_from(PROXIES), st.floats(0, 50)),
    st.tuples(st.just("moved"), st.integers(0, 30), st.floats(0, 50)),
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
            holdings.took("c", f"l{issued}", proxy=str(what), end=now + value, tat=None)
            issued += 1
        elif kind == "moved" and issued:
            holdings.moved("c", f"l{int(str(what)) % issued}", end=now + value / 10)
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
