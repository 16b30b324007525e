"""Fair shares: what one client may take, so that one token can crowd out only itself.

Two limits, both decided in the store in the same atomic step as the hand-out (the Redis scripts repeat these
rules in Lua; tests/service/test_store_conformance.py holds both stores to one behaviour):

- **Holding**: a client holds at most `holding` distinct proxies of the pool its request matches
  (`holding_limit`: a share of that pool, at least one). It holds a proxy while it has a lease on it, and,
  for requests for the same target, while a penalty that its own `banned` report set there runs: so one
  token can keep at most its share of a pool out of service for a target, however it spreads its leases and
  reports over time, while its other sites are not held back by the bans one site gave it. A proxy it holds
  already may be leased again (for another target); past the limit the request gets what fits, and nothing
  at all answers 429 `lease_share` with `Retry-After` set to when the first of its proxies is free again.
- **Rate**: a token bucket per client (GCRA: one "theoretical arrival time" per client) of `rate` hand-outs
  per second with `burst` at once, counted over every pool; an empty bucket answers 429 `lease_rate` with
  `Retry-After` set to when one more fits.

`MemoryHoldings` is the memory store's half (called under its lock).
"""

from __future__ import annotations

import math
from collections.abc import Collection

EPSILON = 1e-9  # a float tolerance so that exactly `burst` hand-outs fit


def holding_limit(share: float, pool_size: int) -> int:
    """How many distinct proxies of a pool of `pool_size` one client may hold: ceil(share * size), >= 1
    (half of 3 proxies is 2; of 2, 1)."""
    return max(1, math.ceil(share * pool_size - EPSILON))


def rate_allowance(tat: float, *, now: float, rate: float, burst: float) -> tuple[int, float]:
    """(hand-outs that fit now, when the next one fits) for a client whose bucket is at `tat`."""
    ahead = max(tat, now) - now
    fits = math.floor(burst - ahead * rate + EPSILON)
    return max(fits, 0), now + max(ahead - (burst - 1) / rate, 0.0)


def charged(tat: float, *, now: float, rate: float, count: int) -> float:
    """The bucket after `count` hand-outs."""
    return max(tat, now) + count / rate


class MemoryHoldings:
    """Per client, how many of its running leases each proxy has (so the number of distinct proxies a client
    holds is a `len`), the penalties its reports set, and its rate bucket. The leases themselves, and when
    each ends, are the memory store's `LeaseTable` (lease_table.py): it reports each lease that starts
    (`took`) and ends (`ended`, once it is noticed: the store has it notice every end up to a request's
    `now` before the request counts anything here)."""

    def __init__(self) -> None:
        self._per_proxy: dict[str, dict[str, int]] = {}  # client -> proxy -> its running leases
        # (client, target) -> proxy -> end of the penalty the client's report set for that target
        self._banned: dict[tuple[str, str], dict[str, float]] = {}
        self._tat: dict[str, float] = {}
        # client -> (the last pool it asked about, how many of the proxies it leases are in it): a request
        # counts its holdings without a pass over them (pools are the Candidates' frozensets, one object per
        # filter while the inventory stands), and each lease that starts or ends keeps the count
        self._in_pool: dict[str, tuple[Collection[str], int]] = {}

    def held(
        self, client: str, *, target: str, pool: Collection[str], now: float, ends: dict[str, float]
    ) -> dict[str, float]:
        """The proxies of `pool` the client holds now for a request for `target` (a lease, for any target, or
        a running penalty its report set for this target), each with when it stops holding it; `ends` is
        proxy -> the latest end of its running leases there (`LeaseTable.ends_of`)."""
        mine = {proxy: end for proxy, end in ends.items() if proxy in pool}
        for proxy, end in self._banned.get((client, target), {}).items():
            if end > now and proxy in pool:
                mine[proxy] = max(mine.get(proxy, 0.0), end)
        return mine

    def held_keys(self, client: str, *, target: str, pool: Collection[str], now: float) -> set[str]:
        """The proxies `held` would return, without when each stops being held: a lease costs what its
        client's distinct proxies cost, not what all its leases do (a client leasing 500/s with 60 s leases
        has 30,000; `held` walked them all on every request, half the service's CPU in the
        10,000-running-proxies bench)."""
        mine = self._per_proxy.get(client, {}).keys() & pool
        for proxy, end in self._banned.get((client, target), {}).items():
            if end > now and proxy in pool:
                mine.add(proxy)
        return mine

    def held_count(self, client: str, *, target: str, pool: Collection[str], now: float) -> int:
        """`len(held_keys(...))`, without a pass over the client's proxies when it asked about this pool
        before (at 10,000 proxies a client holding them all paid a millisecond a lease for the set)."""
        counts = self._per_proxy.get(client, {})
        cached = self._in_pool.get(client)
        if cached is None or cached[0] is not pool:
            cached = (pool, len(counts.keys() & pool) if counts else 0)
            self._in_pool[client] = cached
        held = cached[1]
        for proxy, end in self._banned.get((client, target), {}).items():
            if end > now and proxy in pool and proxy not in counts:
                held += 1
        return held

    def holds(self, client: str, *, target: str, proxy: str, now: float) -> bool:
        """Whether `held` lists `proxy`, the pool aside."""
        if proxy in self._per_proxy.get(client, ()):
            return True
        return self._banned.get((client, target), {}).get(proxy, 0.0) > now

    def _counted(self, client: str, proxy: str, change: int) -> None:
        """A proxy the client leases started (+1) or stopped (-1) being one: the cached count follows."""
        cached = self._in_pool.get(client)
        if cached is not None and proxy in cached[0]:
            self._in_pool[client] = (cached[0], cached[1] + change)

    def most_held(self, client: str, *, target: str) -> int:
        """At least as many as `held` would return for any pool (every proxy with a lease, every ban for
        `target`, running or not): a client this far under its limit cannot reach it with one request."""
        return len(self._per_proxy.get(client, ())) + len(self._banned.get((client, target), ()))

    def running_bans(self, client: str, *, target: str, now: float) -> list[str]:
        """The proxies the client holds by a running penalty its reports set for `target`."""
        return [proxy for proxy, end in self._banned.get((client, target), {}).items() if end > now]

    def banned(self, client: str, *, target: str, proxy: str, until: float) -> None:
        """A penalty on `proxy` for `target` that `client`'s report set (or lengthened) runs until `until`."""
        bans = self._banned.setdefault((client, target), {})
        bans[proxy] = max(bans.get(proxy, 0.0), until)

    def bucket(self, client: str) -> float:
        return self._tat.get(client, 0.0)

    def took(self, client: str, *, proxy: str, tat: float | None) -> None:
        """A lease on `proxy` started (and the client's bucket is at `tat` after it, when it has one)."""
        counts = self._per_proxy.setdefault(client, {})
        before = counts.get(proxy, 0)
        counts[proxy] = before + 1
        if not before:
            self._counted(client, proxy, +1)
        if tat is not None:
            self._tat[client] = tat

    def ended(self, client: str, proxy: str) -> None:
        """A running lease on `proxy` ended (expired or released): it holds nothing from now on."""
        counts = self._per_proxy[client]
        left = counts[proxy] - 1
        if left:
            counts[proxy] = left
            return
        del counts[proxy]
        self._counted(client, proxy, -1)
        if not counts:
            del self._per_proxy[client]
            self._in_pool.pop(client, None)

    def sweep(self, *, now: float) -> None:
        for pair, bans in list(self._banned.items()):
            for proxy in [p for p, end in bans.items() if end <= now]:
                del bans[proxy]
            if not bans:
                del self._banned[pair]
        for client in [c for c, tat in self._tat.items() if tat <= now]:
            del self._tat[client]
        # each count pins the pool it was taken for; pools change with the inventory, and an idle client's
        # would stay: counted again by the next request instead (one pass over its proxies a minute)
        self._in_pool.clear()
