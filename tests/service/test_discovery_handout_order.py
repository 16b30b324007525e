"""The memory store's LRU order: never used first by key, hand-outs to the end, positions stable between
compactions, and walks that jump over the holes hand-outs leave."""

from __future__ import annotations

from service.discovery import handout_order
from service.discovery.handout_order import HandOutOrder


def _keys(order: HandOutOrder, start: int = 0) -> list[str]:
    return [key for _, key in order.walk(start)]


def test_new_keys_go_first_in_key_order_and_hand_outs_to_the_end() -> None:
    order = HandOutOrder()
    order.learn(["b", "a", "c"])
    order.touch("a")
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
        order.touch(f"k{i:03d}")
    assert (order.epoch, order.position("k050")) == (epoch, at)
    assert _keys(order, at) == [f"k{i:03d}" for i in range(50, 100)] + [f"k{i:03d}" for i in range(40)]
    for _ in range(handout_order.COMPACT_SLACK + 200):
        order.touch("k099")
    assert order.epoch == epoch + 1
    assert _keys(order)[-1] == "k099"
    assert len(_keys(order)) == 100


def test_walks_jump_over_the_holes_behind_a_key_never_handed_out() -> None:
    order = HandOutOrder()
    order.learn(["a-banned"] + [f"k{i:03d}" for i in range(500)])
    for i in range(499):
        order.touch(f"k{i:03d}")  # 499 holes right after the first key
    assert _keys(order)[:3] == ["a-banned", "k499", "k000"]
    assert _keys(order, 1)[0] == "k499"
    assert order._jump[1] == order.position("k499")  # the path was shortened to one step
