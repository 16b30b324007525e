"""KeySet (stacks/keyset.py): a set's add, discard and membership over a dict's keys, at under half a set's
size."""

from __future__ import annotations

import sys

from hypothesis import given
from hypothesis import strategies as st

from stacks.keyset import KeySet

names = st.lists(st.text(max_size=3), max_size=4)
ops = st.lists(st.tuples(st.sampled_from(["add", "discard", "update"]), names))


@given(ops)
def test_it_holds_what_a_set_would(steps: list[tuple[str, list[str]]]) -> None:
    keys, model = KeySet(), set[str]()
    for op, given_keys in steps:
        if op == "update":
            keys.update_keys(given_keys)
            model.update(given_keys)
        for key in given_keys if op != "update" else ():
            getattr(keys, op)(key)
            getattr(model, op)(key)
        assert set(keys) == model
        assert len(keys) == len(model)
        assert all(key in keys for key in model)


def test_ten_thousand_keys_take_less_than_half_a_set() -> None:
    names = [f"crawl/p{i}" for i in range(10_000)]
    assert sys.getsizeof(KeySet(names)) < sys.getsizeof(set(names)) / 2
