"""service/discovery/holds.py: the memory store's cooldown holds in an open-addressing table (issue 20).

The table answers as a dict of (pair, proxy) -> until would, whatever the order of adds, raises, removals
and sweeps (removals shift entries back, so the probe runs of the others must stay whole, wrapped around the
table's end included), and each hold counts as one use of its pair: a pair goes when its last hold goes.
The store's cooldown rules on top of it are held to the Redis store's by test_store_conformance.py.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from service.discovery.holds import MIN_CAPACITY, HoldTable, PairIds

CLIENTS = ["a", "b"]
TARGETS = ["t1", "t2", "t3"]
PROXIES = [f"ns/p{i}" for i in range(60)]  # more than MIN_CAPACITY / 2: the table grows, wraps, shrinks

key = st.tuples(st.sampled_from(CLIENTS), st.sampled_from(TARGETS), st.sampled_from(PROXIES))
step = st.one_of(
    st.tuples(st.just("put"), key, st.integers(1, 100)),
    st.tuples(st.just("raise"), key, st.integers(1, 100)),
    st.tuples(st.just("remove"), key, st.just(0)),
    st.tuples(st.just("end_by"), key, st.integers(1, 100)),
    st.tuples(st.just("sweep"), st.just(("", "", "")), st.integers(0, 100)),
)


@settings(max_examples=300, deadline=None)
@given(steps=st.lists(step, max_size=200))
def test_the_table_answers_as_a_dict_and_a_pair_goes_with_its_last_hold(
    steps: list[tuple[str, tuple[str, str, str], int]],
) -> None:
    pairs = PairIds()
    table = HoldTable(pairs)
    model: dict[tuple[str, str, str], float] = {}
    for kind, (client, target, proxy), value in steps:
        until = float(value)
        if kind == "sweep":
            table.sweep(until)
            model = {k: v for k, v in model.items() if v > until}
        else:
            pair = pairs.find(client, target)
            if pair is None:  # as the store does: a pair is named before its first hold (by a lease)
                pair = pairs.use(client, target)
                added = True
            else:
                added = False
            if kind == "put":
                table.put(pair, proxy, until)
                model[client, target, proxy] = until
            elif kind == "raise":
                table.raise_to(pair, proxy, until)
                model[client, target, proxy] = max(model.get((client, target, proxy), 0.0), until)
            elif kind == "remove":
                table.remove(pair, proxy)
                model.pop((client, target, proxy), None)
            else:
                table.end_by(pair, proxy, until)
                if model.get((client, target, proxy), float("inf")) <= until:
                    del model[client, target, proxy]
            if added:
                pairs.drop(pair)  # the lease that named it ended
        assert len(table) == len(model)
        for client in CLIENTS:
            for target in TARGETS:
                pair = pairs.find(client, target)
                held = {p for (c, t, p) in model if (c, t) == (client, target)}
                assert (pair is not None) == bool(held)  # a pair is named exactly while it has holds
                for proxy in PROXIES:
                    expected = model.get((client, target, proxy), -1.0)
                    assert (table.get(pair, proxy, -1.0) if pair is not None else -1.0) == expected


def test_a_table_emptied_by_a_sweep_shrinks_back() -> None:
    pairs = PairIds()
    table = HoldTable(pairs)
    pair = pairs.use("a", "t")
    for i in range(5_000):
        table.put(pair, f"ns/p{i}", 10.0)
    grown = len(table._index)
    assert grown >= 2 * 5_000
    table.sweep(10.0)
    assert len(table) == 0
    assert len(table._index) < grown // 2
    table.sweep(10.0)
    assert len(table._index) >= MIN_CAPACITY
    pairs.drop(pair)
    assert len(pairs) == 0
