"""service/discovery/fair_share.py MemoryHoldings, kept by lease_table.py LeaseTable: what a lease request
counts (`held_count`, kept counted per pool as leases start and end; `holds`; `held_keys`) always agrees
with `held` (what a 429's Retry-After counts, from every running lease's end), whatever the leases,
releases, renewals, bans and pools asked about; a lease released holds nothing from then on; and renewals
and releases leave no pile of stale entries behind."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from service.discovery.fair_share import MemoryHoldings
from service.discovery.lease_table import CLIENT_SLACK, HEAP_SLACK, LeaseTable
from service.discovery.store import LeaseRecord

PROXIES = [f"p{i}" for i in range(6)]
TARGETS = ["t1", "t2"]

step = st.one_of(
    st.tuples(st.just("took"), st.sampled_from(PROXIES), st.floats(0, 50)),
    st.tuples(st.just("other"), st.sampled_from(PROXIES), st.floats(0, 50)),  # another client's lease
    st.tuples(st.just("moved"), st.integers(0, 30), st.floats(0, 50)),
    st.tuples(st.just("released"), st.integers(0, 30), st.just(0.0)),
    st.tuples(st.just("banned"), st.sampled_from(PROXIES), st.floats(0, 50)),
    st.tuples(st.just("tick"), st.just(""), st.floats(0, 5)),
    st.tuples(st.just("sweep"), st.just(""), st.just(0.0)),
)


def kept(ended_kept: int = 20_000) -> tuple[MemoryHoldings, LeaseTable]:
    holdings = MemoryHoldings()
    table = LeaseTable(
        ended_kept=ended_kept, on_end=lambda client, _t, proxy, _e: holdings.ended(client, proxy)
    )
    return holdings, table


def took(
    holdings: MemoryHoldings,
    table: LeaseTable,
    lease_id: str,
    *,
    proxy: str,
    now: float,
    end: float,
    client: str = "c",
) -> None:
    table.taken(LeaseRecord(lease_id, client, "t1", proxy, now, end))
    holdings.took(client, proxy=proxy, tat=None)


def running(table: LeaseTable, lease_id: str, now: float) -> bool:
    record = table.record(lease_id)
    return record is not None and not record.released and record.expires_at > now


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(step, max_size=40),
    pools=st.lists(st.frozensets(st.sampled_from(PROXIES), min_size=1), min_size=1, max_size=3),
    target=st.sampled_from(TARGETS),
)
def test_what_a_request_counts_is_what_held_lists(
    steps: list[tuple[str, object, float]], pools: list[frozenset[str]], target: str
) -> None:
    (holdings, table), now, issued, others = kept(ended_kept=3), 0.0, 0, 0
    for kind, what, value in steps:
        if kind == "took":
            took(holdings, table, f"l{issued}", proxy=str(what), now=now, end=now + value)
            issued += 1
        elif kind == "other":  # slots are reused across clients once their leases are forgotten
            took(holdings, table, f"o{others}", proxy=str(what), now=now, end=now + value, client="d")
            others += 1
        elif kind == "moved" and issued:
            lease_id = f"l{int(str(what)) % issued}"
            if running(table, lease_id, now):  # as the store renews: a running lease only
                table.renewed(lease_id, until=now + value / 10)
        elif kind == "released" and issued:
            lease_id = f"l{int(str(what)) % issued}"
            if running(table, lease_id, now):
                table.released(lease_id, now=now)
        elif kind == "banned":
            holdings.banned("c", target=target, proxy=str(what), until=now + value)
        elif kind == "sweep":
            holdings.sweep(now=now)
            table.sweep(now)
        else:
            now += value
        table.expire(now)  # as the store does before a request counts
        pool = pools[len(str(what)) % len(pools)]  # the pool asked about changes now and then
        listed = set(holdings.held("c", target=target, pool=pool, now=now, ends=table.ends_of("c", now=now)))
        assert holdings.held_count("c", target=target, pool=pool, now=now) == len(listed)
        assert holdings.held_keys("c", target=target, pool=pool, now=now) == listed
        assert {p for p in pool if holdings.holds("c", target=target, proxy=p, now=now)} == listed
        if kind == "released" and issued:
            gone = f"l{int(str(what)) % issued}"
            assert gone not in table.active("c", now=now)
        model = {f"l{n}" for n in range(issued) if running(table, f"l{n}", now)}
        assert set(table.active("c", now=now)) == model


def test_a_released_lease_stops_counting_at_once_and_stale_entries_do_not_pile_up() -> None:
    """Released leases leave the counts when released, not at the next expiry pass; the heap entries that
    renewals leave behind and the client's list of slots are rebuilt once stale entries are most of them (a
    client releasing every lease early, or renewing one lease all day, kept them all)."""
    (holdings, table), pool = kept(), frozenset(PROXIES)
    for n in range(2000):
        took(holdings, table, f"l{n}", proxy=PROXIES[n % 2], now=float(n), end=10_000.0 + n)
        if n % 10:  # nine in ten released: the ones kept are all on PROXIES[0]
            table.released(f"l{n}", now=float(n))
    table.expire(2000.0)
    assert holdings.held_keys("c", target="t1", pool=pool, now=2000.0) == {PROXIES[0]}
    assert holdings.held_count("c", target="t1", pool=pool, now=2000.0) == 1
    assert len(table.active("c", now=2000.0)) == 200
    assert len(table._of_client["c"]) <= 2 * 200 + CLIENT_SLACK
    for n in range(5000):
        table.renewed("l0", until=10_000.0 + n)
    assert len(table._heap) <= 2 * 200 + HEAP_SLACK
    table.expire(10_000.0 + 4998.5)  # every lease but "l0" ended (it runs to its latest renewal)
    assert table.active("c", now=10_000.0 + 4998.5) == ["l0"]
    assert holdings.held_keys("c", target="t1", pool=pool, now=10_000.0 + 4998.5) == {PROXIES[0]}
    table.expire(10_000.0 + 4999)
    assert table.active("c", now=10_000.0 + 4999) == []
    assert holdings.held_count("c", target="t1", pool=pool, now=10_000.0 + 4999) == 0


def test_a_slot_reused_by_another_client_is_not_the_first_clients() -> None:
    """A forgotten lease's slot goes to the next lease, whoever takes it: the first client's list still names
    that slot, and must not read the new lease as its own."""
    holdings, table = kept(ended_kept=0)
    took(holdings, table, "l0", proxy=PROXIES[0], now=0.0, end=1.0)
    took(holdings, table, "l1", proxy=PROXIES[1], now=0.0, end=100.0)
    table.sweep(2.0)  # "l0" ends and, none ended being kept, is forgotten: its slot is free
    took(holdings, table, "o0", proxy=PROXIES[2], now=2.0, end=50.0, client="d")
    assert table.record("l0") is None
    assert table.active("c", now=2.0) == ["l1"]
    assert table.ends_of("c", now=2.0) == {PROXIES[1]: 100.0}
    assert table.active("d", now=2.0) == ["o0"]


def test_leases_released_long_before_their_end_leave_no_pile_of_heap_entries() -> None:
    """A crawler that leases for an hour and releases after a page: each release leaves its heap entry at
    the lease's old end, an hour on; the heap is rebuilt from the running leases once those are most of it."""
    holdings, table = kept()
    for n in range(5000):
        took(holdings, table, f"l{n}", proxy=PROXIES[n % 6], now=float(n), end=3600.0 + n)
        table.released(f"l{n}", now=float(n) + 0.5)
    assert table.active("c", now=5000.0) == []
    assert len(table._heap) <= HEAP_SLACK + 1


def test_a_lease_ended_at_now_ends_even_behind_one_running_past_now_within_the_same_microsecond() -> None:
    """The heap keys ends in whole microseconds: a lease running past `now` by less than a microsecond
    shares its key with `now`, and sits first when its slot is lower. Expiry stopped at it and left a lease
    that ended exactly at `now` counted while `held` no longer listed it (found by the property test above
    in CI: held_count 1, held 0)."""
    (holdings, table), pool, now = kept(), frozenset(PROXIES), 100.0
    took(holdings, table, "a", proxy=PROXIES[0], now=0.0, end=now + 1e-7)  # slot 0, running at `now`
    took(holdings, table, "b", proxy=PROXIES[1], now=0.0, end=now)  # slot 1, ended at `now`
    table.expire(now)
    assert table.active("c", now=now) == ["a"]
    assert holdings.held_count("c", target="t1", pool=pool, now=now) == 1
    assert holdings.held_keys("c", target="t1", pool=pool, now=now) == {PROXIES[0]}
    table.expire(now + 1e-6)  # and the one held back still ends when its time comes
    assert table.active("c", now=now + 1e-6) == []
    assert holdings.held_count("c", target="t1", pool=pool, now=now + 1e-6) == 0
