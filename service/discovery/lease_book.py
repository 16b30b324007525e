"""The memory store's leases: every running one, and the latest ended ones for late reports.

A lease is kept while it runs. Once ended (expired or released) it is kept for reports by lease id for at
most LEASE_GRACE seconds and only while it is among the latest `ended_kept` to end: kept for the hour
alone, 500 leases a second were 1.8 million records (tests/bench/bench_lease_memory.py). Ends are found
in order without a heap: lease ids wait in the order they were taken (`_running`), and those whose end was
noticed in the order it was (`_ended`); a lease taken moves at most RETIRE_STEP of them along, the store's
sweep the rest. A running lease ending more than LONG_LEASE from now goes to the back of the running order
so that it does not hold back the shorter ones taken after it. Not locked: the memory store calls it under
its own lock.
"""

from __future__ import annotations

from collections import deque
from typing import Final

from service.discovery.store import LeaseRecord

LEASE_GRACE = 3600.0  # an ended lease is kept for late reports at most this long
ENDED_KEPT = 20_000  # and only while it is among this many latest ended
LONG_LEASE = 120.0
RETIRE_STEP = 4

# A lease as kept: (client, target, proxy, handed_at, expires_at, released, banned). The garbage collector
# stops tracking a tuple of atoms, so the leases kept for late reports do not lengthen its pauses.
Kept = tuple[str, str, str, float, float, bool, bool]
EXPIRES: Final = 4  # the positions in Kept that are read by name
RELEASED: Final = 5
BANNED: Final = 6


def keep(lease: LeaseRecord) -> Kept:
    return (
        lease.client,
        lease.target,
        lease.proxy,
        lease.handed_at,
        lease.expires_at,
        lease.released,
        lease.banned,
    )


class LeaseBook:
    def __init__(self, *, ended_kept: int = ENDED_KEPT) -> None:
        self._leases: dict[str, Kept] = {}
        self._running: deque[str] = deque()
        self._ended: deque[str] = deque()
        self.ended_kept = ended_kept

    def get(self, lease_id: str) -> Kept | None:
        return self._leases.get(lease_id)

    def record(self, lease_id: str) -> LeaseRecord | None:
        kept = self._leases.get(lease_id)
        return LeaseRecord(lease_id, *kept) if kept is not None else None

    def taken(self, lease: LeaseRecord, *, now: float) -> None:
        """A new lease (running)."""
        self._leases[lease.lease_id] = keep(lease)
        self._running.append(lease.lease_id)
        self.retire(now, budget=RETIRE_STEP)

    def put(self, lease_id: str, kept: Kept) -> None:
        """A kept lease changed (renewed, reported): not its end's order."""
        self._leases[lease_id] = kept

    def released(self, lease: LeaseRecord) -> None:
        """A running lease ended by its release (`lease` as released): ended from now on."""
        self._leases[lease.lease_id] = keep(lease)
        self._ended.append(lease.lease_id)

    def retire(self, now: float, *, budget: int) -> None:
        """Note the end of leases at the front of the running order (at most `budget` looked at), then forget
        ended leases past the bound or ended over LEASE_GRACE ago."""
        running, ended, leases = self._running, self._ended, self._leases
        while running and budget > 0:
            budget -= 1
            kept = leases.get(running[0])
            if kept is None or kept[RELEASED]:  # forgotten, or released (noted as ended at its release)
                running.popleft()
            elif kept[EXPIRES] <= now:
                ended.append(running.popleft())
            elif kept[EXPIRES] > now + LONG_LEASE:  # long or renewed: not to hold back the ones behind it
                running.rotate(-1)
            else:
                break
        while ended:
            kept = leases.get(ended[0])
            if kept is not None and len(ended) <= self.ended_kept and kept[EXPIRES] + LEASE_GRACE > now:
                break
            lease_id = ended.popleft()
            if kept is not None:
                del leases[lease_id]

    def sweep(self, now: float) -> None:
        """Everything `retire` can do now."""
        self.retire(now, budget=len(self._running))

    def counts(self, *, now: float) -> tuple[int, int]:
        """(leases running at `now`, ended leases still kept)."""
        running = sum(1 for kept in self._leases.values() if kept[EXPIRES] > now)
        return running, len(self._leases) - running
