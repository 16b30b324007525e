"""The memory store's LRU: proxies in the order they were last handed out, never handed out first (by key).

A list with holes rather than an OrderedDict, so that a position can be remembered and a walk resumed from it:
handing a proxy out appends it and leaves a hole where it was, so the positions of the others do not move.
Walks jump over runs of holes (each hole points further on, and the pointers are shortened as they are
followed), so holes piling up behind proxies that are never handed out (banned everywhere) cost nothing. The
list is compacted when it holds as many holes as proxies; `epoch` changes whenever positions do (compaction,
new proxies). A position remembered in the epoch before a compaction is carried over (`carried`): the keys
keep their order, so it maps to the last key at or before it. New proxies go first and change the order
itself: a position from before them is not carried.

Each slot also keeps when it was filled (`stamp`: the hand-out's time, never below the one before it, so the
stamps ascend along the list; never handed out: -inf), so that the first position handed out at or after a
time is a bisection (`since`): a client at its share walks only what was handed out since its oldest
running lease was (memory.py).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator

COMPACT_SLACK = 1024  # holes allowed beyond one per proxy before the list is compacted
NEVER = float("-inf")  # the stamp of a proxy never handed out


class HandOutOrder:
    def __init__(self) -> None:
        self._slots: list[str | None] = []
        # for a hole: a position after it, at or before the next proxy (an array: as a list of ints, each
        # an object of its own, it was 0.45 MiB of the store at 500 leases a second)
        self._jump = array("q")
        self._position: dict[str, int] = {}
        self._stamp = array("d")  # per slot: when it was filled (ascending)
        self._last = NEVER
        self.epoch = 0
        self._before: array[int] | None = None  # after a compaction: each position's position before it

    def __len__(self) -> int:
        return len(self._position)

    def __contains__(self, key: object) -> bool:
        return key in self._position

    def position(self, key: str) -> int:
        """Where `key` is now (-1: never seen); smaller is less recently used."""
        return self._position.get(key, -1)

    def learn(self, keys: Iterable[str]) -> None:
        """Put the keys never seen before the others, in key order (ties among the never used go by key)."""
        new = sorted(key for key in keys if key not in self._position)
        if new:
            known = [(key, self._stamp[i]) for i, key in enumerate(self._slots) if key is not None]
            self._rebuild([*new, *(key for key, _ in known)], [NEVER] * len(new) + [at for _, at in known])
            self._before = None

    def touch(self, key: str, now: float) -> None:
        """`key` was just handed out (at `now`): it becomes the most recently used."""
        old = self._position[key]
        self._slots[old] = None
        self._jump[old] = old + 1
        self._position[key] = len(self._slots)
        self._slots.append(key)
        self._jump.append(len(self._jump))
        self._last = max(self._last, now)
        self._stamp.append(self._last)
        if len(self._slots) > 2 * len(self._position) + COMPACT_SLACK:
            kept = [key for key in self._slots if key is not None]
            before = array("q", (self._position[key] for key in kept))  # ascending: the order is kept
            self._rebuild(kept, [self._stamp[i] for i in before])
            self._before = before

    def since(self, at: float) -> int:
        """The first position handed out at or after `at` (at the stamps' clock): every key handed out then
        or later is at it or after it."""
        return bisect_left(self._stamp, at)

    def carried(self, position: int, epoch: int) -> int | None:
        """Where the walk from the key at `position`, remembered in `epoch`, goes on now: the position of the
        last key at or before it (-1: none); None when the order changed otherwise (new proxies went first)
        or more than one compaction ago. Keys handed out since only moved to the end, after it."""
        if epoch == self.epoch:
            return position
        if epoch == self.epoch - 1 and self._before is not None:
            return bisect_right(self._before, position) - 1
        return None

    def walk(self, start: int = 0) -> Iterator[tuple[int, str]]:
        """(position, key) from `start` on, least recently used first."""
        slots = self._slots
        position = self._next_key(start)
        while position < len(slots):
            yield position, slots[position]  # type: ignore[misc]  # _next_key stops at a key
            position = self._next_key(position + 1)

    def _next_key(self, position: int) -> int:
        """The first position at or after `position` that holds a key (the end if none)."""
        slots, jump, end = self._slots, self._jump, len(self._slots)
        found = position
        while found < end and slots[found] is None:
            found = jump[found]
        while position < found:  # shorten the path just followed
            jump[position], position = found, jump[position]
        return found

    def _rebuild(self, keys: list[str], stamps: list[float]) -> None:
        self._slots = list(keys)
        self._stamp = array("d", stamps)
        self._jump = array("q", range(len(keys)))
        self._position = {key: i for i, key in enumerate(keys)}
        self.epoch += 1
