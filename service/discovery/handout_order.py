"""The memory store's LRU: proxies in the order they were last handed out, never handed out first (by key).

A list with holes rather than an OrderedDict, so that a position can be remembered and a walk resumed from it:
handing a proxy out appends it and leaves a hole where it was, so the positions of the others do not move.
The list is compacted when it holds as many holes as proxies; `epoch` changes whenever positions do
(compaction, new proxies), so a remembered position is only used in the epoch it was taken in.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

COMPACT_SLACK = 1024  # holes allowed beyond one per proxy before the list is compacted


class HandOutOrder:
    def __init__(self) -> None:
        self._slots: list[str | None] = []
        self._position: dict[str, int] = {}
        self._head = 0  # no proxy before this position
        self.epoch = 0

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
            self._rebuild([*new, *(key for key in self._slots[self._head :] if key is not None)])

    def touch(self, key: str) -> None:
        """`key` was just handed out: it becomes the most recently used."""
        old = self._position[key]
        self._slots[old] = None
        self._position[key] = len(self._slots)
        self._slots.append(key)
        if old == self._head:
            while self._slots[self._head] is None:
                self._head += 1
        if len(self._slots) > 2 * len(self._position) + COMPACT_SLACK:
            self._rebuild([key for key in self._slots[self._head :] if key is not None])

    def walk(self, start: int = 0) -> Iterator[tuple[int, str]]:
        """(position, key) from `start` on, least recently used first."""
        slots = self._slots
        for position in range(max(start, self._head), len(slots)):
            key = slots[position]
            if key is not None:
                yield position, key

    def _rebuild(self, keys: list[str]) -> None:
        self._slots = list(keys)
        self._position = {key: i for i, key in enumerate(keys)}
        self._head = 0
        self.epoch += 1
