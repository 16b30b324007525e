"""What the memory store keeps for reports: who held which proxy, `error` votes, report counts per client.

The Redis store keeps the same in `P:used:<client>`, `P:err:<proxy>` and `P:rate:<client>:<window>` (see
redis_scripts.py); tests/service/test_store_conformance.py holds both to one behaviour.
"""

from __future__ import annotations

import math

from service.discovery.store import ErrorVotes


class ReportBook:
    """Not locked: the memory store calls it under its own lock.

    Who held which proxy is kept for the longest window a report looks back (the store's `report_keep`: 10
    minutes by default), one entry per (client, proxy) pair leased: at 500 leases a second, 20 clients over
    10,000 proxies make all 200,000 pairs within minutes. They are kept by client, then by proxy (the
    proxy's key is the inventory's string): 45 bytes a pair, where a dict keyed by (client, proxy) tuples
    took 132 (a tuple each, and a table for keys of any type); tests/bench/bench_lease_memory.py measures
    it."""

    def __init__(self) -> None:
        self._held: dict[str, dict[str, float]] = {}  # client -> proxy -> its latest lease end there
        self._votes: dict[str, dict[str, float]] = {}  # proxy -> client -> when it reported `error`
        self._counts: dict[str, tuple[float, int]] = {}  # client -> (when its window ends, reports in it)

    def held(self, *, client: str, proxy: str, until: float) -> None:
        ends = self._held.get(client)
        if ends is None:
            ends = self._held[client] = {}
        ends[proxy] = max(ends.get(proxy, until), until)

    def last_held(self, *, client: str, proxy: str) -> float | None:
        ends = self._held.get(client)
        return None if ends is None else ends.get(proxy)

    def pairs(self) -> int:
        return sum(len(ends) for ends in self._held.values())

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
        for client, ends in list(self._held.items()):
            for proxy in [p for p, until in ends.items() if until + keep <= now]:
                del ends[proxy]
            if not ends:
                del self._held[client]
        for proxy in [p for p, votes in self._votes.items() if max(votes.values()) + keep <= now]:
            del self._votes[proxy]
        for client in [c for c, (ends, _) in self._counts.items() if ends <= now]:
            del self._counts[client]
