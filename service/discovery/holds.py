"""The memory store's cooldown holds, in arrays: (client, target, proxy) -> until, no object per hold.

A proxy handed to a client for a target is not handed to it for that target again until its hold ends: while
the lease runs, and for the cooldown after (docs/api.md). At 500 leases a second of 60 s over 100 targets
that is 30,000 holds. As a dict of proxy -> until per (client, target), each hold was a dict entry and a
float object of its own: 2.2 MiB of RSS for 30,000 (tests/bench/bench_lease_memory.py's store, the holds
taken out). Here the holds are packed entries in three columns, its pair's id (`PairIds`, 4 bytes), its
proxy (the caller's string, 8) and its end (8), found through an open-addressing index of entry numbers (4
bytes a position, linear probing, at most half full; a removal shifts the positions after it back, so no
tombstones pile up, and moves the last entry into the removed one's place): about 30 bytes a hold, as
CPython's own dicts are laid out, without the float object or a dict per (client, target).

The table's home for an entry is read from its proxy's hash (a string's, cached on it; the proxies are the
operator's names, not a client's) mixed with its pair's id. Not locked: the memory store calls it under its
lock.
"""

from __future__ import annotations

from array import array

MIN_CAPACITY = 64  # a power of two
EMPTY = -1
MIX = 0x9E3779B1  # spreads consecutive pair ids over the table (Fibonacci hashing's constant)


class PairIds:
    """Each (client, target) that a kept lease or a hold names, as a small id, counted by its uses: a
    lease table's slot keeps its pair's id in an `array('I')` (4 bytes where two lists of strings took
    16: 0.6 MiB at 50,000 kept leases), a hold likewise. A pair is forgotten with its last use (targets are
    the clients' own strings: a table that only grew would keep every one ever named)."""

    def __init__(self) -> None:
        self._names: list[tuple[str, str]] = []
        self._id: dict[tuple[str, str], int] = {}
        self._uses = array("I")
        self._free: list[int] = []

    def __len__(self) -> int:
        return len(self._id)

    def find(self, client: str, target: str) -> int | None:
        """The pair's id while something uses it, else None."""
        return self._id.get((client, target))

    def use(self, client: str, target: str) -> int:
        """The pair's id, counted as used once more."""
        pair = (client, target)
        found = self._id.get(pair)
        if found is None:
            if self._free:
                found = self._free.pop()
                self._names[found] = pair
            else:
                found = len(self._names)
                self._names.append(pair)
                self._uses.append(0)
            self._id[pair] = found
        self._uses[found] += 1
        return found

    def use_again(self, pair_id: int) -> None:
        """One use more of a used id."""
        self._uses[pair_id] += 1

    def names(self, pair_id: int) -> tuple[str, str]:
        """(client, target) of a used id."""
        return self._names[pair_id]

    def drop(self, pair_id: int) -> None:
        """One use less: the pair is forgotten with its last."""
        left = self._uses[pair_id] - 1
        self._uses[pair_id] = left
        if not left:
            del self._id[self._names[pair_id]]
            self._names[pair_id] = ("", "")
            self._free.append(pair_id)


class HoldTable:
    def __init__(self, pairs: PairIds) -> None:
        self._pairs = pairs  # each hold is one use of its pair
        # the holds, one entry each, packed (a removal moves the last entry into its place)
        self._pair = array("I")
        self._proxy: list[str] = []
        self._until = array("d")
        # open addressing over the entries: entry numbers, EMPTY where none
        self._index = array("i", [EMPTY]) * MIN_CAPACITY
        self._mask = MIN_CAPACITY - 1

    def __len__(self) -> int:
        return len(self._proxy)

    def get(self, pair: int, proxy: str, default: float = 0.0) -> float:
        """When the hold of `proxy` for the pair ends (`default`: it has none). The probe inlined: a walk
        asks this of each proxy it passes."""
        index, pairs, proxies, mask = self._index, self._pair, self._proxy, self._mask
        at = (hash(proxy) ^ pair * MIX) & mask
        while (entry := index[at]) != EMPTY:
            if pairs[entry] == pair and ((found := proxies[entry]) is proxy or found == proxy):
                return self._until[entry]
            at = (at + 1) & mask
        return default

    def raise_to(self, pair: int, proxy: str, until: float) -> None:
        """The hold of `proxy` for the pair ends at `until` at the earliest (a longer one stays)."""
        at = self._probe(pair, proxy)
        if at >= 0:
            entry = self._index[at]
            if self._until[entry] < until:
                self._until[entry] = until
        else:
            self._add(~at, pair, proxy, until)

    def put(self, pair: int, proxy: str, until: float) -> None:
        """The hold of `proxy` for the pair ends at `until` (whether it had one or not)."""
        at = self._probe(pair, proxy)
        if at >= 0:
            self._until[self._index[at]] = until
        else:
            self._add(~at, pair, proxy, until)

    def remove(self, pair: int, proxy: str) -> None:
        """`proxy` is no longer held for the pair (nothing when it was not)."""
        at = self._probe(pair, proxy)
        if at >= 0:
            self._remove(at)

    def end_by(self, pair: int, proxy: str, end: float) -> None:
        """Forget the hold of `proxy` for the pair when it ends by `end` (a lease's end: its hold goes with it
        unless a cooldown or a longer lease keeps it)."""
        at = self._probe(pair, proxy)
        if at >= 0 and self._until[self._index[at]] <= end:
            self._remove(at)

    def sweep(self, now: float) -> None:
        """Forget every hold that ended by `now`; the index shrinks once it is mostly empty."""
        until = self._until
        ended = [(self._pair[entry], proxy) for entry, proxy in enumerate(self._proxy) if until[entry] <= now]
        for pair, proxy in ended:
            self.remove(pair, proxy)
        capacity = len(self._index)
        if capacity > MIN_CAPACITY and len(self._proxy) * 8 < capacity:
            self._resize(max(MIN_CAPACITY, capacity // 4))

    # --- inside

    def _probe(self, pair: int, proxy: str) -> int:
        """The index position of (pair, proxy)'s entry, or ~(the empty position where it would go)."""
        index, pairs, proxies, mask = self._index, self._pair, self._proxy, self._mask
        at = (hash(proxy) ^ pair * MIX) & mask
        while (entry := index[at]) != EMPTY:
            if pairs[entry] == pair and ((found := proxies[entry]) is proxy or found == proxy):
                return at
            at = (at + 1) & mask
        return ~at

    def _add(self, at: int, pair: int, proxy: str, until: float) -> None:
        """A new entry, at index position `at` (where its probe ended) unless the index grows first."""
        entry = len(self._proxy)
        self._pair.append(pair)
        self._proxy.append(proxy)
        self._until.append(until)
        self._pairs.use_again(pair)
        if (entry + 1) * 2 > len(self._index):
            self._resize(len(self._index) * 2)  # places the new entry too
        else:
            self._index[at] = entry

    def _remove(self, at: int) -> None:
        """Remove the entry at index position `at`: the index's hole is closed by shifting back, and the
        last entry moves into the removed one's place."""
        index, mask = self._index, self._mask
        entry = index[at]
        self._pairs.drop(self._pair[entry])
        hole = at
        while True:  # close the hole: move back each entry after it that could not be found past it
            at = (at + 1) & mask
            other = index[at]
            if other == EMPTY:
                break
            home = (hash(self._proxy[other]) ^ self._pair[other] * MIX) & mask
            if (at - home) & mask < (at - hole) & mask:  # its home lies in (hole, at]: it stays
                continue
            index[hole] = other
            hole = at
        index[hole] = EMPTY
        last = len(self._proxy) - 1
        if entry != last:  # the last entry takes the removed one's place
            moved = self._probe(self._pair[last], self._proxy[last])
            index[moved] = entry
            self._pair[entry], self._proxy[entry], self._until[entry] = (
                self._pair[last],
                self._proxy[last],
                self._until[last],
            )
        self._pair.pop()
        self._proxy.pop()
        self._until.pop()

    def _resize(self, capacity: int) -> None:
        self._index = array("i", [EMPTY]) * capacity
        self._mask = mask = capacity - 1
        index, pairs = self._index, self._pair
        for entry, proxy in enumerate(self._proxy):
            at = (hash(proxy) ^ pairs[entry] * MIX) & mask
            while index[at] != EMPTY:
                at = (at + 1) & mask
            index[at] = entry
