"""A set of keys kept as a dict's keys: what the leader's fleet-wide sets of 10,000 Proxy keys are (issue 20).

A set keeps its table at most 60 % full, of 16-byte slots: about 52 bytes a key at 10,000 (66 at 500). A
dict keeps a 4-byte index a slot and a 16-byte entry a key: about 21 bytes a key (26 at 500), in insertion
order. `KeySet` is that dict with a set's `add` and `discard`; `in`, `len`, iteration and `set(...)` are the
dict's own.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["KeySet"]


class KeySet(dict[str, None]):
    __slots__ = ()

    def __init__(self, keys: Iterable[str] = ()) -> None:
        super().__init__(dict.fromkeys(keys))

    def add(self, key: str) -> None:
        self[key] = None

    def discard(self, key: str) -> None:
        self.pop(key, None)

    def update_keys(self, keys: Iterable[str]) -> None:
        """Add every key of `keys` (a dict's `update` takes pairs)."""
        for key in keys:
            self[key] = None
