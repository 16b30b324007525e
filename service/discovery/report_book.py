"""What the memory store keeps for reports: who held which proxy, `error` votes, report counts per client.

The Redis store keeps the same in `P:used:<client>`, `P:err:<proxy>` and `P:rate:<client>:<window>` (see
redis_scripts.py); tests/service/test_store_conformance.py holds both to one behaviour.
"""

from __future__ import annotations

import math

from service.discovery.held_ends import HeldEnds
from service.discovery.store import ErrorVotes


class ReportBook:
    """Not locked: the memory store calls it under its own lock. Who held which proxy: `HeldEnds`."""

    def __init__(self) -> None:
        self._held = HeldEnds()  # (client, proxy) -> its latest lease end there
        self._votes: dict[str, dict[str, float]] = {}  # proxy -> client -> when it reported `error`
        self._counts: dict[str, tuple[float, int]] = {}  # client -> (when its window ends, reports in it)

    def held(self, *, client: str, proxy: str, until: float) -> None:
        self._held.put(client, proxy, until)

    def last_held(self, *, client: str, proxy: str) -> float | None:
        return self._held.get(client, proxy)

    def pairs(self) -> int:
        return self._held.pairs()

    def vote_error(self, *, proxy: str, client: str, now: float, window: float) -> ErrorVotes:
        votes = {c: at for c, at in self._votes.get(proxy, {}).items() if at > now - window}
        new = client not in votes
        votes[client] = now
        self._votes[proxy] = votes
        return ErrorVotes(voters=len(votes), new=new)

    def count_report(self, *, client: str, now: float, period: float) -> tuple[int, float]:
        ends = (math.floor(now / period) + 1) * period
        known_end, count = self._counts.get(client, (ends, 0))
        count = count + 1 if known_end == ends else 1
        self._counts[client] = (ends, count)
        return count, ends

    def sweep(self, *, now: float, keep: float) -> None:
        """Forget lease ends older than `keep` seconds and votes older than that."""
        self._held.sweep(now=now, keep=keep)
        for proxy in [p for p, votes in self._votes.items() if max(votes.values()) + keep <= now]:
            del self._votes[proxy]
        for client in [c for c, (ends, _) in self._counts.items() if ends <= now]:
            del self._counts[client]
