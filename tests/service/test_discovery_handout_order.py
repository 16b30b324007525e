"""The memory store's LRU order: never used first by key, hand-outs to the end, positions stable between
compactions, and walks that jump over the holes hand-outs leave."""

from __future__ import annotations

from unittest import mock

from hypothesis import example, given, settings
from hypothesis import strategies as st

from service.discovery import handout_order
from service.discovery.handout_order import HandOutOrder


def _keys(order: HandOutOrder, start: int = 0) -> list[str]:
    return [key for _, key in order.walk(start)]


def test_new_keys_go_first_in_key_order_and_hand_outs_to_the_end() -> None:
    order = HandOutOrder()
    order.learn(["b", "a", "c"])
    order.touch("a", 0.0)
    order.learn(["a", "b", "c", "z", "y"])
    assert _keys(order) == ["y", "z", "b", "c", "a"]
    assert len(order) == 5
    assert "y" in order
    assert order.position("nope") == -1


def test_positions_hold_until_a_compaction_changes_the_epoch() -> None:
    order = HandOutOrder()
    order.learn([f"k{i:03d}" for i in range(100)])
    epoch, at = order.epoch, order.position("k050")
    for i in range(40):
        order.touch(f"k{i:03d}", 0.0)
    assert (order.epoch, order.position("k050")) == (epoch, at)
    assert _keys(order, at) == [f"k{i:03d}" for i in range(50, 100)] + [f"k{i:03d}" for i in range(40)]
    for _ in range(handout_order.COMPACT_SLACK + 200):
        order.touch("k099", 0.0)
    assert order.epoch == epoch + 1
    assert _keys(order)[-1] == "k099"
    assert len(_keys(order)) == 100


def test_walks_jump_over_the_holes_behind_a_key_never_handed_out() -> None:
    order = HandOutOrder()
    order.learn(["a-banned"] + [f"k{i:03d}" for i in range(500)])
    for i in range(499):
        order.touch(f"k{i:03d}", 0.0)  # 499 holes right after the first key
    assert _keys(order)[:3] == ["a-banned", "k499", "k000"]
    assert _keys(order, 1)[0] == "k499"
    assert order._jump[1] == order.position("k499")  # the path was shortened to one step


def test_a_position_is_carried_over_one_compaction_and_not_over_new_keys() -> None:
    order = HandOutOrder()
    order.learn([f"k{i:03d}" for i in range(100)])
    epoch, at = order.epoch, order.position("k050")
    assert order.carried(at, epoch) == at
    for i in range(40):
        order.touch(f"k{i:03d}", 0.0)  # holes at 0-39; k000-k039 go to the end
    order.touch("k050", 0.0)  # the remembered key itself leaves its place: k049 is the last before it
    while order.epoch == epoch:
        order.touch("k099", 0.0)
    now = order.carried(at, epoch)
    assert now is not None
    assert _keys(order, now + 1)[:3] == ["k051", "k052", "k053"]  # the walk goes on right after the run
    assert _keys(order)[now] == "k049"
    assert order.carried(0, epoch) == -1  # a hole before every kept key: the walk starts at the front
    second = order.epoch
    order.learn(["a-new"])  # new keys go first: no position from before them is carried
    assert order.carried(now, second) is None
    assert order.carried(at, epoch) is None


def test_a_position_is_not_carried_over_two_compactions() -> None:
    order = HandOutOrder()
    order.learn([f"k{i:03d}" for i in range(10)])
    epoch = order.epoch
    while order.epoch < epoch + 2:
        order.touch("k009", 0.0)
    assert order.carried(5, epoch) is None
    assert order.carried(5, epoch + 1) == 5  # one compaction ago: k005 has not moved
    assert order.carried(5, epoch + 2) == 5


@settings(max_examples=300, deadline=None)
@given(
    first=st.lists(st.integers(0, 19), max_size=30),
    since=st.lists(st.integers(0, 19), min_size=20, max_size=60),
    remembered=st.integers(0, 19),
)
def test_a_carried_position_has_the_same_keys_at_or_before_it(
    first: list[int], since: list[int], remembered: int
) -> None:
    """Whatever the hand-outs and compactions: the keys at or before a carried position are those that were
    at or before it when it was taken, less the ones handed out since (they went to the end)."""
    with mock.patch.object(handout_order, "COMPACT_SLACK", 3):  # a compaction every 24 hand-outs or so
        order = HandOutOrder()
        keys = [f"k{i:02d}" for i in range(20)]
        order.learn(keys)
        for i in first:
            order.touch(keys[i], 0.0)
        position, epoch = order.position(keys[remembered]), order.epoch
        before = {key for at, key in order.walk() if at <= position}
        for i in since:
            order.touch(keys[i], 0.0)
        now = order.carried(position, epoch)
        if order.epoch - epoch > 1:
            assert now is None
            return
        assert now is not None
        assert {key for at, key in order.walk() if at <= now} == before - {keys[i] for i in since}


@settings(max_examples=200, deadline=None)
@example(touches=[(n % 20, float(n + 1)) for n in range(25)], late=[], pick=3)  # one compaction between
@given(
    touches=st.lists(st.tuples(st.integers(0, 19), st.floats(0, 100)), min_size=10, max_size=120),
    late=st.lists(st.integers(0, 29), max_size=3),
    pick=st.integers(0, 79),
)
def test_every_key_handed_out_since_a_hand_out_is_at_or_after_its_since(
    touches: list[tuple[int, float]], late: list[int], pick: int
) -> None:
    """Whatever the hand-outs (their clock may step back), compactions and keys learned late: every key whose
    last hand-out came at or after the `pick`-th one is at or after `since` of that hand-out's time (what
    a client at its share relies on to start its walk there, memory.py)."""
    with mock.patch.object(handout_order, "COMPACT_SLACK", 0):  # a compaction every 20 hand-outs or so
        order = HandOutOrder()
        keys = [f"k{i:02d}" for i in range(20)]
        order.learn(keys)
        last: dict[str, int] = {}
        for n, (i, now) in enumerate(touches):
            order.touch(keys[i], now)
            last[keys[i]] = n
            if n == len(touches) // 2:
                order.learn([f"k{i:02d}" for i in late])  # new keys go first: positions change
        if not touches:
            return
        j = pick % len(touches)
        start = order.since(touches[j][1])
        assert all(order.position(key) >= start for key, n in last.items() if n >= j)
