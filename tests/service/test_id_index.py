"""The memory store's index of lease ids (service/discovery/id_index.py) against a dict: random hex ids as
the service makes them, other ids as tests and older clients name them, slots reused once freed, growth
past several sizes and removals that shift entries back across the table's end."""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from service.discovery.id_index import IdIndex

OTHER = st.sampled_from(["l1", "l2", "x", "A" * 32, "0" * 31, "g" * 32, "ab cd" + "0" * 27, ""])
HEX = st.binary(min_size=16, max_size=16).map(bytes.hex)
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.one_of(HEX, OTHER)),
        st.tuples(st.just("remove"), st.integers(min_value=0, max_value=200)),
        st.tuples(st.just("get"), st.one_of(HEX, OTHER)),
    ),
    max_size=300,
)


def check(index: IdIndex, model: dict[str, int]) -> None:
    assert len(index) == len(model)
    assert sorted(index.slots()) == sorted(model.values())
    for lease_id, slot in model.items():
        assert index.get(lease_id) == slot
        assert index.id_of(slot) == lease_id


@settings(max_examples=300, deadline=None)
@given(STEPS)
def test_the_index_answers_as_a_dict_would(steps: list[tuple[str, object]]) -> None:
    index, model, free, next_slot = IdIndex(), dict[str, int](), list[int](), 0
    for op, arg in steps:
        if op == "put" and isinstance(arg, str) and arg not in model:
            slot = free.pop() if free else next_slot
            next_slot += slot == next_slot
            index.put(arg, slot)
            model[arg] = slot
        elif op == "remove" and isinstance(arg, int) and model:
            lease_id = sorted(model)[arg % len(model)]
            slot = model.pop(lease_id)
            index.remove(slot)
            free.append(slot)
            assert index.get(lease_id) is None
        elif op == "get" and isinstance(arg, str):
            assert index.get(arg) == model.get(arg)
    check(index, model)


def test_fifty_thousand_ids_in_and_out_as_the_store_keeps_them() -> None:
    """The store's steady state: ids come in and older ones go, their slots reused, the table never fuller
    than half."""
    index, model, order, free = IdIndex(), dict[str, int](), list[str](), list[int]()
    for n in range(120_000):
        if len(model) >= 50_000:
            gone = order.pop(n % len(order))
            free.append(model.pop(gone))
            index.remove(free[-1])
        slot = free.pop() if free else len(model)
        lease_id = os.urandom(16).hex()
        index.put(lease_id, slot)
        model[lease_id] = slot
        order.append(lease_id)
    assert len(index._table) == 131_072  # 50,000 ids at most half full
    check(index, model)


def test_ids_other_than_lowercase_hex_come_back_exactly() -> None:
    index = IdIndex()
    others = ["l1", "A" * 32, "ab cd" + "0" * 27, "0" * 31, "g" * 32, ""]
    for slot, lease_id in enumerate(others):
        index.put(lease_id, slot)
    index.put("a" * 32, len(others))  # the lower-case twin of an upper-case id: another lease
    check(index, {**{lease_id: slot for slot, lease_id in enumerate(others)}, "a" * 32: len(others)})
