"""Who held which proxy, until when: the memory store's one entry per (client, proxy) pair leased.

A client may report on a proxy while it holds a lease on it and for the report window after (10 minutes
by default), so the store keeps each pair's latest lease end for that long: at 500 leases a second, 20
clients over 10,000 proxies make all 200,000 pairs within minutes. A crawler's token leases across the
whole fleet, so most clients end up with most proxies.

A client with few pairs keeps them in a dict (proxy -> end: 45 bytes a pair, the float's object
included). A client with pairs on at least a quarter of the proxies that have a slot (and DENSE_MIN or
more) keeps them in an array of ends by slot instead, 8 bytes a slot, NaN where it holds none; every
dense client shares one slot per proxy. So 20 clients over all of 10,000 proxies keep 2.1 MiB (the
arrays and the slots) where their dicts took 8.5 MiB (tracemalloc; tests/bench/bench_lease_memory.py
for the whole store). The sweep, once a minute, reads every array: 11 ms for those 20. A dense client
whose pairs fall under an eighth of the slots goes back to a dict at the sweep, and a slot no dense
client uses is freed there for the next proxy. Not locked: the memory store calls it under its lock.
"""

from __future__ import annotations

import heapq
import math
from array import array

__all__ = ["HeldEnds"]

NONE = math.nan  # no end: the client holds no pair on that slot's proxy
DENSE_MIN = 1024  # a client's pairs go to an array only once there are this many ...
DENSE_SHARE = 4  # ... and they cover at least 1/DENSE_SHARE of the slots (back under 1/(2*DENSE_SHARE))


class HeldEnds:
    def __init__(self, *, dense_min: int = DENSE_MIN) -> None:
        self.dense_min = dense_min
        self._sparse: dict[str, dict[str, float]] = {}  # client -> proxy -> end
        self._dense: dict[str, array[float]] = {}  # client -> end by slot (NaN: none)
        self._slot: dict[str, int] = {}  # proxy -> its slot in every dense array
        self._proxies: list[str | None] = []  # slot -> its proxy (None: free)
        self._free: list[int] = []  # heap of the free slots below the last used one

    def put(self, client: str, proxy: str, until: float) -> None:
        """The client held `proxy` until `until` (a later end than the one kept replaces it)."""
        dense = self._dense.get(client)
        if dense is not None:
            slot = self._slot_of(proxy)
            if slot >= len(dense):
                dense.extend(array("d", [NONE]) * (len(self._proxies) - len(dense)))
            if not until <= dense[slot]:  # NaN (none) compares false
                dense[slot] = until
            return
        ends = self._sparse.get(client)
        if ends is None:
            ends = self._sparse[client] = {}
        kept = ends.get(proxy)
        if kept is None or until > kept:
            ends[proxy] = until
        if len(ends) >= self.dense_min and len(ends) * DENSE_SHARE >= len(self._slot):
            self._densify(client, ends)

    def get(self, client: str, proxy: str) -> float | None:
        dense = self._dense.get(client)
        if dense is None:
            ends = self._sparse.get(client)
            return None if ends is None else ends.get(proxy)
        slot = self._slot.get(proxy)
        if slot is None or slot >= len(dense):
            return None
        end = dense[slot]
        return None if end != end else end

    def pairs(self) -> int:
        return sum(len(ends) for ends in self._sparse.values()) + sum(
            sum(1 for end in dense if end == end) for dense in self._dense.values()
        )

    def sweep(self, *, now: float, keep: float) -> None:
        """Forget the ends older than `keep` seconds; a dense client left with few pairs goes back to a
        dict, and the slots no dense client uses are freed."""
        for client, ends in list(self._sparse.items()):
            for proxy in [p for p, until in ends.items() if until + keep <= now]:
                del ends[proxy]
            if not ends:
                del self._sparse[client]
        used = bytearray(len(self._proxies))
        for client, dense in list(self._dense.items()):
            count = 0
            for slot, end in enumerate(dense):
                if end == end:
                    if end + keep <= now:
                        dense[slot] = NONE
                    else:
                        count += 1
                        used[slot] = 1  # a client going back to a dict below keeps them one sweep more
            if count * 2 * DENSE_SHARE < len(self._slot):
                self._sparsify(client, dense)
        for slot, named in enumerate(self._proxies):
            if named is not None and not used[slot]:
                del self._slot[named]
                self._proxies[slot] = None
                heapq.heappush(self._free, slot)
        # Free slots at the end go (after a rotation of names the slots would stay at their peak): the
        # lowest free slots are taken first, so the used ones gather at the front.
        while self._proxies and self._proxies[-1] is None:
            self._proxies.pop()
        if len(self._free) > len(self._proxies) - len(self._slot):
            self._free = [slot for slot in self._free if slot < len(self._proxies)]
            heapq.heapify(self._free)
        for dense in self._dense.values():
            del dense[len(self._proxies) :]

    def _slot_of(self, proxy: str) -> int:
        slot = self._slot.get(proxy)
        if slot is None:
            if self._free:
                slot = heapq.heappop(self._free)
                self._proxies[slot] = proxy
            else:
                slot = len(self._proxies)
                self._proxies.append(proxy)
            self._slot[proxy] = slot
        return slot

    def _densify(self, client: str, ends: dict[str, float]) -> None:
        slots = [self._slot_of(proxy) for proxy in ends]
        dense = array("d", [NONE]) * len(self._proxies)
        for slot, end in zip(slots, ends.values(), strict=True):
            dense[slot] = end
        del self._sparse[client]
        self._dense[client] = dense

    def _sparsify(self, client: str, dense: array[float]) -> None:
        del self._dense[client]
        ends: dict[str, float] = {}
        for slot, end in enumerate(dense):
            proxy = self._proxies[slot]
            if end == end and proxy is not None:  # a slot with an end always names its proxy
                ends[proxy] = end
        if ends:
            self._sparse[client] = ends
