"""service/discovery/fair_share.py MemoryHoldings: `held_keys` (what a lease request counts) is always the
key set of `held` (what a 429's Retry-After counts), whatever the leases, releases, renewals and bans."""

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
)


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(step, max_size=40),
    pool=st.sets(st.sampled_from(PROXIES), min_size=1),
    target=st.sampled_from(TARGETS),
)
def test_held_keys_are_the_keys_of_held(
    steps: list[tuple[str, object, float]], pool: set[str], target: str
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
        else:
            now += value
        keys = holdings.held_keys("c", target=target, pool=pool, now=now)
        assert keys == set(holdings.held("c", target=target, pool=pool, now=now))
