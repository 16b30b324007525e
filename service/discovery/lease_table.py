"""The memory store's leases, in columns: every running lease, and the latest ended ones for late reports.

A lease is kept while it runs. Once ended (expired or released) it is kept for reports by lease id for at
most LEASE_GRACE seconds and only while it is among the latest `ended_kept` to end: kept for the hour
alone, 500 leases a second were 1.8 million records (tests/bench/bench_lease_memory.py).

Each lease is a slot: its fields sit in one list or array per field, and its id maps to its slot. At 500
leases a second with 60-s leases a replica keeps about 30,000 running leases and 20,000 ended ones. As a
tuple per lease with two floats of its own in a lease book, plus a tuple in its client's dict of leases
and one in its client's heap of ends, a lease cost about 290 bytes beside its id (traced, 30,000 running);
here it costs 45 bytes of columns (its client and target as one pair's id: `PairIds`, 4 bytes where two
lists of strings took 16) and, while it runs, 12 bytes in the heap of ends and one entry in its client's
list. Its id is kept as its 16 bytes at its slot in `IdIndex` (`id_index.py`, about 26 bytes with
its index) instead of a string, a dict entry and an int (about 170 bytes: 8.9 MiB at 50,000 kept leases,
census run 27 in operations.md). A slot is reused once its lease is forgotten; the columns keep their
largest size, as a dict does.

Ends are exact: a heap of (end, slot) in two arrays (`slot_queues.EndHeap`), an entry pushed for each
lease taken and each renewal; an entry whose slot no longer runs, or runs to a later end (renewed), is
skipped when it comes up, and the heap is rebuilt from the running leases once such entries are most of
it. The ended slots wait to be forgotten in a `SlotRing`. Whoever keeps state for running leases learns
of each end (`on_end(client, target, proxy, end)`) when it is noticed: `expire(now)` notices every lease
ended by `now`, in end order, at a cost of what ended. A client's running leases are a list of its slots
in the order they were taken, each with the slot's generation (a slot reused since holds another lease,
whoever took it): its oldest running lease is the first entry still valid (`oldest_handed`). Not locked:
the memory store calls it under its own lock.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator

from service.discovery.holds import PairIds
from service.discovery.id_index import IdIndex
from service.discovery.slot_queues import EndHeap, SlotRing
from service.discovery.store import LeaseRecord

LEASE_GRACE = 3600.0  # an ended lease is kept for late reports at most this long
ENDED_KEPT = 20_000  # and only while it is among this many latest ended
# a client's list entry's low bits: the slot (4 billion leases at once is far past any replica)
SLOT_BITS = 32
SLOT_MASK = (1 << SLOT_BITS) - 1
GENERATIONS = 1 << 31  # a slot's generation, beside it in a client's list (a signed 64-bit entry)
HEAP_SLACK = 1024  # stale heap entries allowed beyond one per running lease before a rebuild
CLIENT_SLACK = 64  # and slots in a client's list beyond twice its running leases

# a slot's state
FREE, RUNNING, ENDED = 0, 1, 2
STATE = 3
RELEASED, BANNED = 4, 8  # flags beside the state


class LeaseTable:
    def __init__(
        self,
        *,
        ended_kept: int = ENDED_KEPT,
        on_end: Callable[[str, str, str, float], None],
        pairs: PairIds | None = None,
    ) -> None:
        """`pairs`: the ids of (client, target) pairs, shared with whoever else keeps them (the holds)."""
        self.ended_kept = ended_kept
        self._on_end = on_end
        self._slot = IdIndex()  # lease id -> slot
        self._pair = array("I")  # per slot: its (client, target)'s id in `_pairs`
        self._pairs = PairIds() if pairs is None else pairs
        self._proxy: list[str] = []
        self._handed = array("d")
        self._expires = array("d")
        self._state = bytearray()
        self._generation = array("i")  # how many leases the slot held before its current one (< 2**31)
        self._free: list[int] = []
        self._heap = EndHeap()  # (end, slot) for the running leases (and some stale entries)
        self._running = 0
        # client -> its running slots, in the order taken, each `slot | generation << SLOT_BITS` (and some
        # entries no longer valid); and where in that list the first valid entry may be
        self._of_client: dict[str, array[int]] = {}
        self._front: dict[str, int] = {}
        self._running_of: dict[str, int] = {}  # client -> how many of its leases run
        self._ended = SlotRing()  # ended slots, in the order their end was noticed

    # --- reading

    def record(self, lease_id: str) -> LeaseRecord | None:
        slot = self._slot.get(lease_id)
        if slot is None:
            return None
        state = self._state[slot]
        client, target = self._pairs.names(self._pair[slot])
        return LeaseRecord(
            lease_id,
            client,
            target,
            self._proxy[slot],
            self._handed[slot],
            self._expires[slot],
            bool(state & RELEASED),
            bool(state & BANNED),
        )

    def active(self, client: str, *, now: float) -> list[str]:
        """The ids of the client's leases that run at `now`."""
        id_of, expires = self._slot.id_of, self._expires
        return [id_of(slot) for slot in self._running_slots(client) if expires[slot] > now]

    def oldest_handed(self, client: str) -> float | None:
        """When the client's oldest running lease was handed out (None: it has none). Every lease it took
        after that one was taken after it, at the store's clock."""
        slots = self._of_client.get(client)
        if slots is None:
            return None
        front = self._front.get(client, 0)
        while front < len(slots) and not self._valid(slots[front]):
            front += 1
        self._front[client] = front
        return self._handed[slots[front] & SLOT_MASK] if front < len(slots) else None

    def ends_of(self, client: str, *, now: float) -> dict[str, float]:
        """proxy -> the latest end of the client's leases on it that run at `now`."""
        ends: dict[str, float] = {}
        for slot in self._running_slots(client):
            end = self._expires[slot]
            if end > now:
                proxy = self._proxy[slot]
                ends[proxy] = max(ends.get(proxy, 0.0), end)
        return ends

    def pairs_named(self) -> int:
        """How many (client, target) pairs are named (by the kept leases, and whoever shares the ids)."""
        return len(self._pairs)

    def counts(self, *, now: float) -> tuple[int, int]:
        """(leases running at `now`, ended leases still kept)."""
        state, expires = self._state, self._expires
        running = sum(
            1 for slot in self._slot.slots() if state[slot] & STATE == RUNNING and expires[slot] > now
        )
        return running, len(self._slot) - running

    # --- changes

    def taken(self, lease: LeaseRecord) -> None:
        """A new lease (running). Its id must be new."""
        slot = self._free.pop() if self._free else self._grow()
        self._slot.put(lease.lease_id, slot)
        self._pair[slot] = self._pairs.use(lease.client, lease.target)
        self._proxy[slot] = lease.proxy
        self._handed[slot] = lease.handed_at
        self._expires[slot] = lease.expires_at
        self._state[slot] = RUNNING
        self._heap.push(lease.expires_at, slot)
        self._running += 1
        slots = self._of_client.get(lease.client)
        if slots is None:
            slots = self._of_client[lease.client] = array("q")
        slots.append(slot | self._generation[slot] << SLOT_BITS)
        self._running_of[lease.client] = self._running_of.get(lease.client, 0) + 1

    def released(self, lease_id: str, *, now: float) -> None:
        """A running lease released at `now`: ended from now on."""
        slot = self._slot.get(lease_id)
        if slot is None:
            raise KeyError(lease_id)
        self._expires[slot] = now
        self._state[slot] |= RELEASED
        self._end(slot)
        self._bound_heap()  # its entry stays until its old end: an hour's lease released at once, all day

    def renewed(self, lease_id: str, *, until: float) -> None:
        """A running lease now ends at `until`."""
        slot = self._slot.get(lease_id)
        if slot is None:
            raise KeyError(lease_id)
        self._expires[slot] = until
        self._heap.push(until, slot)
        self._bound_heap()

    def mark_banned(self, lease_id: str) -> str | None:
        """Count a `banned` report on the lease once: its client, or None when it is gone or was counted."""
        slot = self._slot.get(lease_id)
        if slot is None or self._state[slot] & BANNED:
            return None
        self._state[slot] |= BANNED
        return self._pairs.names(self._pair[slot])[0]

    def expire(self, now: float) -> None:
        """Notice every running lease that ended by `now` (its end is then reported to `on_end`)."""
        heap, state, expires = self._heap, self._state, self._expires
        while heap and heap.first()[0] <= now:
            slot = heap.pop()[1]
            if state[slot] & STATE == RUNNING and expires[slot] <= now:
                self._end(slot)
            # else: a lease renewed since (its new end has an entry of its own), or one that ended
            # otherwise (released): a stale entry. A slot reused since is ended only once it ends.

    def forget(self, now: float) -> None:
        """Forget ended leases past the bound or ended over LEASE_GRACE ago (the oldest ended first)."""
        ended, expires = self._ended, self._expires
        while ended and (len(ended) > self.ended_kept or expires[ended.first()] + LEASE_GRACE <= now):
            self._free_slot(ended.popleft())

    def sweep(self, now: float) -> None:
        self.expire(now)
        self.forget(now)

    # --- inside

    def _end(self, slot: int) -> None:
        self._state[slot] = (self._state[slot] & ~STATE) | ENDED
        self._running -= 1
        client, target = self._pairs.names(self._pair[slot])
        left = self._running_of[client] - 1
        if left:
            self._running_of[client] = left
            slots = self._of_client[client]
            if len(slots) > 2 * left + CLIENT_SLACK:
                self._of_client[client] = array("q", (entry for entry in slots if self._valid(entry)))
                self._front.pop(client, None)
        else:
            del self._running_of[client], self._of_client[client]
            self._front.pop(client, None)
        self._ended.append(slot)
        self._on_end(client, target, self._proxy[slot], self._expires[slot])

    def _valid(self, entry: int) -> bool:
        """Is this entry of a client's list a running lease (not one that ended, or a slot reused since)?"""
        slot = entry & SLOT_MASK
        return self._state[slot] & STATE == RUNNING and self._generation[slot] == entry >> SLOT_BITS

    def _running_slots(self, client: str) -> Iterator[int]:
        """The client's running slots (its list keeps entries that ended, or whose slot was reused since)."""
        for entry in self._of_client.get(client, ())[self._front.get(client, 0) :]:
            if self._valid(entry):
                yield entry & SLOT_MASK

    def _bound_heap(self) -> None:
        """Rebuild the heap from the running leases once stale entries are most of it."""
        if len(self._heap) > 2 * self._running + HEAP_SLACK:
            self._rebuild_heap()

    def _rebuild_heap(self) -> None:
        state, expires = self._state, self._expires
        self._heap.rebuild(
            (expires[slot], slot) for slot in self._slot.slots() if state[slot] & STATE == RUNNING
        )

    def _grow(self) -> int:
        slot = len(self._state)
        self._pair.append(0)  # a free slot names no pair (nor counts as one of its uses)
        self._proxy.append("")
        self._handed.append(0.0)
        self._expires.append(0.0)
        self._state.append(FREE)
        self._generation.append(0)
        return slot

    def _free_slot(self, slot: int) -> None:
        self._slot.remove(slot)
        self._pairs.drop(self._pair[slot])
        self._proxy[slot] = ""
        self._state[slot] = FREE
        self._generation[slot] = (self._generation[slot] + 1) % GENERATIONS
        self._free.append(slot)
