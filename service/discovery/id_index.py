"""Lease ids to the memory store's slots, with no Python object per lease (`lease_table.py`).

The service makes each lease id from 16 random bytes (32 lowercase hex digits). In a dict, each kept lease
cost its id's string (81 bytes), an int for its slot (28) and the dict's entry and index (about 60 at this
size): about 170 bytes, 8.9 MiB of a replica's memory at bench_running's 50,000 kept leases (census run
27 in operations.md). Here such an id is its 16 bytes in one `bytearray`, at its slot's offset, and the
index is an open-addressing table of slot numbers in an `array` (linear probing, at most half full, an
entry removed by shifting the ones after it back: no tombstones, so no periodic rebuild): about 26 bytes a
lease. A table's home for an id is read from the id's first 8 bytes, which are random: the service makes
every id that goes in (`os.urandom`), so nobody can choose ids that crowd one part of the table; a lookup
of an id from a request only reads.

Any other id (tests name leases `l1`; an id with upper-case digits would not come back as it went in) is
kept in a plain dict beside the table: the index answers for it exactly as for the others.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator

EMPTY = -1
ID_BYTES = 16
MIN_CAPACITY = 8  # a power of two


def _raw(lease_id: str) -> bytes | None:
    """The id's 16 bytes when it is 32 lowercase hex digits (it then comes back exactly), else None."""
    if len(lease_id) != 2 * ID_BYTES:
        return None
    try:
        raw = bytes.fromhex(lease_id)
    except ValueError:
        return None
    return raw if len(raw) == ID_BYTES and raw.hex() == lease_id else None


class IdIndex:
    def __init__(self) -> None:
        self._ids = bytearray()  # ID_BYTES a slot: the id of the lease in it (when it is a hex id)
        self._table = array("i", [EMPTY]) * MIN_CAPACITY  # slot numbers, EMPTY where none
        self._mask = MIN_CAPACITY - 1
        self._count = 0  # slots in the table
        self._other: dict[str, int] = {}  # ids that are not 32 lowercase hex digits -> slot
        self._other_of: dict[int, str] = {}  # and back

    def __len__(self) -> int:
        return self._count + len(self._other)

    def get(self, lease_id: str) -> int | None:
        raw = _raw(lease_id)
        if raw is None:
            return self._other.get(lease_id)
        position = self._find(raw)
        return None if position < 0 else self._table[position]

    def put(self, lease_id: str, slot: int) -> None:
        """Index a new id (not in the index) at `slot` (free: no id of its own)."""
        raw = _raw(lease_id)
        if raw is None:
            self._other[lease_id] = slot
            self._other_of[slot] = lease_id
            return
        if (self._count + 1) * 2 > len(self._table):
            self._resize(len(self._table) * 2)
        end = (slot + 1) * ID_BYTES
        if len(self._ids) < end:
            self._ids.extend(bytes(end - len(self._ids)))
        self._ids[end - ID_BYTES : end] = raw
        self._place(slot, raw)
        self._count += 1

    def remove(self, slot: int) -> None:
        """Forget the id at `slot` (nothing when it has none)."""
        other = self._other_of.pop(slot, None)
        if other is not None:
            del self._other[other]
            return
        position = self._find(self._id_bytes(slot))
        if position >= 0 and self._table[position] == slot:
            self._delete(position)
            self._count -= 1

    def id_of(self, slot: int) -> str:
        """The id at `slot` (one that `get` finds)."""
        other = self._other_of.get(slot)
        return other if other is not None else self._id_bytes(slot).hex()

    def slots(self) -> Iterator[int]:
        """Every slot with an id, in no particular order."""
        yield from (slot for slot in self._table if slot != EMPTY)
        yield from self._other.values()

    # --- inside

    def _id_bytes(self, slot: int) -> bytes:
        start = slot * ID_BYTES
        return bytes(self._ids[start : start + ID_BYTES])

    def _home(self, raw: bytes | bytearray) -> int:
        return int.from_bytes(raw[:8], "little") & self._mask

    def _find(self, raw: bytes) -> int:
        """The table's position holding `raw`'s slot, or -1."""
        table, ids, mask = self._table, self._ids, self._mask
        position = self._home(raw)
        while (slot := table[position]) != EMPTY:
            start = slot * ID_BYTES
            if ids[start : start + ID_BYTES] == raw:
                return position
            position = (position + 1) & mask
        return -1

    def _place(self, slot: int, raw: bytes | bytearray) -> None:
        table, mask = self._table, self._mask
        position = self._home(raw)
        while table[position] != EMPTY:
            position = (position + 1) & mask
        table[position] = slot

    def _delete(self, hole: int) -> None:
        """Empty `hole`, moving back each entry after it that could not be found past the hole."""
        table, mask, ids = self._table, self._mask, self._ids
        position = hole
        while True:
            position = (position + 1) & mask
            slot = table[position]
            if slot == EMPTY:
                break
            start = slot * ID_BYTES
            home = self._home(ids[start : start + 8])
            # the entry stays when its home lies cyclically in (hole, position]: the hole is not on its way
            if (position - home) & mask < (position - hole) & mask:
                continue
            table[hole] = slot
            hole = position
        table[hole] = EMPTY

    def _resize(self, capacity: int) -> None:
        slots = [slot for slot in self._table if slot != EMPTY]
        self._table = array("i", [EMPTY]) * capacity
        self._mask = capacity - 1
        for slot in slots:
            start = slot * ID_BYTES
            self._place(slot, self._ids[start : start + ID_BYTES])
