"""automation/flat_names.py: the planner's index of shared flat names answers as a dict of sets would."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import given
from hypothesis import strategies as st

from automation.flat_names import FlatNameGroups

FLATS = st.sampled_from(["a-b", "a-c", "x-y"])
KEYS = st.sampled_from(["a/b", "a-b/c", "a/b-c", "x/y", "x-y/z"])
STEPS = st.lists(st.tuples(st.booleans(), FLATS, KEYS), max_size=40)


@given(steps=STEPS)
def test_the_groups_answer_as_sets_do(steps: list[tuple[bool, str, str]]) -> None:
    groups, model = FlatNameGroups(), defaultdict(set)
    for add, flat, key in steps:
        if add:
            groups.add(flat, key)
            model[flat].add(key)
        else:
            groups.discard(flat, key)
            model[flat].discard(key)
        for name in ("a-b", "a-c", "x-y"):
            assert groups.get(name) == model[name]
            assert (name in groups) == bool(model[name])


def test_a_group_is_a_copy() -> None:
    groups = FlatNameGroups()
    groups.add("a-b", "a/b")
    groups.get("a-b").add("a-b/c")
    assert groups.get("a-b") == {"a/b"}
    groups.add("a-b", "a-b/c")
    groups.get("a-b").clear()
    assert groups.get("a-b") == {"a/b", "a-b/c"}
