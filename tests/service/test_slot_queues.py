"""The lease table's queues in arrays (service/discovery/slot_queues.py) against heapq and a deque, and
what they cost: 12 bytes an entry in the heap of ends, 4 in the ring of ended slots (a list of ints for
heapq cost about 48, a deque of ints about 36: census run 27 in docs/operations.md)."""

from __future__ import annotations

import heapq
import tracemalloc
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.discovery.slot_queues import RING_SLACK, EndHeap, SlotRing

ENDS = st.sampled_from([0.5, 1.0, 1.0, 2.25, 3.0, 1e9, 1.8e9 + 0.000001])  # ties are common
HEAP_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("push"), ENDS, st.integers(0, 2**31 - 1)),
        st.tuples(st.just("pop"), st.just(0.0), st.just(0)),
        st.tuples(st.just("rebuild"), st.just(0.0), st.just(0)),
    ),
    max_size=400,
)


@settings(max_examples=300, deadline=None)
@given(HEAP_STEPS)
def test_the_heap_of_ends_answers_as_heapq_would(steps: list[tuple[str, float, int]]) -> None:
    heap, model = EndHeap(), list[tuple[float, int]]()
    for op, end, slot in steps:
        if op == "push":
            heap.push(end, slot)
            heapq.heappush(model, (end, slot))
        elif op == "pop" and model:
            assert heap.pop() == heapq.heappop(model)
        elif op == "rebuild":
            heap.rebuild(sorted(model, reverse=True))  # the worst order for a heap
        assert len(heap) == len(model)
        if model:
            assert heap.first() == model[0]
    assert [heap.pop() for _ in range(len(heap))] == sorted(model)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.integers(0, 2**31 - 1), st.none()), max_size=3 * RING_SLACK))
def test_the_ring_of_slots_answers_as_a_deque_would(steps: list[int | None]) -> None:
    ring, model = SlotRing(), deque[int]()
    for step in steps:
        if step is None:
            if model:
                assert ring.popleft() == model.popleft()
        else:
            ring.append(step)
            model.append(step)
        assert len(ring) == len(model)
        assert bool(ring) == bool(model)
        if model:
            assert ring.first() == model[0]


def test_a_ring_drained_over_and_over_does_not_grow() -> None:
    ring = SlotRing()
    for slot in range(100_000):
        ring.append(slot)
        if len(ring) > 1_000:
            assert ring.popleft() == slot - 1_000
    assert len(ring._slots) <= 2 * 1_000 + RING_SLACK + 1  # the cut front: not every slot ever put in
    with pytest.raises(IndexError):
        SlotRing().popleft()


def test_each_entry_costs_bytes_not_objects() -> None:
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        heap, ring = EndHeap(), SlotRing()
        for slot in range(30_000):
            heap.push(1.8e9 + 60 + slot / 500, slot + 100_000)
            ring.append(slot + 100_000)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held / 30_000 < 2 * (12 + 4)  # arrays (with their spare room); an int object each was 28+
