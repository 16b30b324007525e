"""The lease table's two queues of slots, in arrays: no Python object per lease (`lease_table.py`).

`EndHeap` is a min-heap of (end, slot) for the running leases. As a list of ints for `heapq` (the end in
microseconds shifted left past the slot) each entry was an 83-bit int of 40 bytes plus the list's 8: 1.0
MiB at 2,000 proxies and 30,000 running leases (census run 27 in operations.md). Here it is two arrays, an
end (`d`) and a slot (`i`) per entry, 12 bytes; the sift loops are heapq's own algorithm in Python, about
2 us a push or pop at 30,000 entries (two a lease: a replica at 500 leases a second spends 2 ms a second).

`SlotRing` is a first-in first-out queue of slots in one `array('i')` (a deque held an int object per
slot: 0.5 MiB for 20,000 ended leases kept for reports). Its front moves on as slots are taken off; the
array is cut once the front passes half of it, so it never holds more than twice its slots plus a few.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable

RING_SLACK = 256  # taken-off entries kept before the front of a ring's array is cut


class EndHeap:
    def __init__(self) -> None:
        self._end = array("d")
        self._slot = array("i")

    def __len__(self) -> int:
        return len(self._end)

    def first(self) -> tuple[float, int]:
        """The entry with the earliest end (the heap must not be empty)."""
        return self._end[0], self._slot[0]

    def push(self, end: float, slot: int) -> None:
        self._end.append(end)
        self._slot.append(slot)
        self._sift_down(0, len(self._end) - 1)

    def pop(self) -> tuple[float, int]:
        """Take the entry with the earliest end off (the heap must not be empty)."""
        ends, slots = self._end, self._slot
        last_end, last_slot = ends.pop(), slots.pop()
        if not ends:
            return last_end, last_slot
        first = ends[0], slots[0]
        ends[0], slots[0] = last_end, last_slot
        self._sift_up(0)
        return first

    def rebuild(self, entries: Iterable[tuple[float, int]]) -> None:
        """The heap of exactly these entries (heapq.heapify's order of work: O(n))."""
        self._end, self._slot = array("d"), array("i")
        for end, slot in entries:
            self._end.append(end)
            self._slot.append(slot)
        for at in reversed(range(len(self._end) // 2)):
            self._sift_up(at)

    # heapq's _siftdown and _siftup, on the two arrays: (end, slot) pairs compare as tuples would

    def _sift_down(self, start: int, at: int) -> None:
        ends, slots = self._end, self._slot
        end, slot = ends[at], slots[at]
        while at > start:
            parent = (at - 1) >> 1
            parent_end = ends[parent]
            if end > parent_end or (end == parent_end and slot >= slots[parent]):
                break
            ends[at], slots[at] = parent_end, slots[parent]
            at = parent
        ends[at], slots[at] = end, slot

    def _sift_up(self, at: int) -> None:
        ends, slots = self._end, self._slot
        size, start = len(ends), at
        end, slot = ends[at], slots[at]
        child = 2 * at + 1
        while child < size:  # move the smaller child up until a leaf (heapq's bottom-up variant)
            right = child + 1
            if right < size and (
                ends[right] < ends[child] or (ends[right] == ends[child] and slots[right] < slots[child])
            ):
                child = right
            ends[at], slots[at] = ends[child], slots[child]
            at = child
            child = 2 * at + 1
        ends[at], slots[at] = end, slot
        self._sift_down(start, at)


class SlotRing:
    def __init__(self) -> None:
        self._slots = array("i")
        self._front = 0

    def __len__(self) -> int:
        return len(self._slots) - self._front

    def first(self) -> int:
        """The slot put in longest ago (the ring must not be empty)."""
        return self._slots[self._front]

    def append(self, slot: int) -> None:
        self._slots.append(slot)

    def popleft(self) -> int:
        """Take the slot put in longest ago off (the ring must not be empty)."""
        if self._front >= len(self._slots):
            raise IndexError("pop from an empty SlotRing")
        slot = self._slots[self._front]
        self._front += 1
        if self._front > RING_SLACK and 2 * self._front > len(self._slots):
            del self._slots[: self._front]
            self._front = 0
        return slot
