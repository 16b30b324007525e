"""When this crawler may next ask for a lease, per site and for all of them, learnt from the API's answers.

A 503 `all_cooling_down` closes one site's gate until its Retry-After, or until one of our own leases on
that site is released; a 429 `lease_share` closes that site's gate until its Retry-After or one of our own
releases (the proxies our bans took out count in the share for their site only, so another site may still
get a lease: it asks, and closes its own gate if it is refused too); any other
refusal (`lease_rate`, `no_candidates`, ...) until its Retry-After; an API that cannot be reached until a
backoff. A request that finds its gate closed does not call the API: it is parked until the gate opens,
or until the event named by the block's `wake` (see parking.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from proxy_operator_client.errors import NoProxyAvailable

EVERY_SITE = ""  # the key of a block on every site
# What wakes parked requests early (besides a site's own name: a release or a lease end on that site).
OWN_RELEASE = "\x00own-release"  # any of our releases: frees our share of the pool
API_BACK = "\x00api-back"  # the first lease after the API could not be reached
PER_SITE = frozenset({"all_cooling_down", "lease_user_failed", "lease_share"})
MIN_WAIT = 0.05
BUSY_WAIT = 30.0  # a site at its concurrency waits at most this long for one of its leases to end


@dataclass(frozen=True)
class Block:
    until: float
    reason: str
    wake: str | None  # the event that opens it early


class NoLeaseYet(Exception):
    """No lease for this request now: park it `seconds` (or until `wake`), outside the downloader."""

    def __init__(self, seconds: float, wake: str | None, reason: str) -> None:
        super().__init__(f"{reason}: no lease for {seconds:.2f} s")
        self.seconds, self.wake, self.reason = seconds, wake, reason


class Gates:
    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._blocks: dict[str, Block] = {}
        self._in_flight: Counter[str] = Counter()

    def check(self, site: str, *, concurrency: int = 0) -> None:
        """Raise NoLeaseYet when `site` may not ask now: a block, or its concurrency reached."""
        now = self._clock()
        blocks = [b for b in (self._blocks.get(site), self._blocks.get(EVERY_SITE)) if b and b.until > now]
        if blocks:
            block = max(blocks, key=lambda b: b.until)
            raise NoLeaseYet(max(MIN_WAIT, block.until - now), block.wake, block.reason)
        if concurrency and self._in_flight[site] >= concurrency:
            raise NoLeaseYet(BUSY_WAIT, site, "site_concurrency")

    def refused(self, site: str, exc: NoProxyAvailable) -> NoLeaseYet:
        """Close the gate the API's refusal names; the parking ticket of the refused request."""
        if exc.reason in PER_SITE:
            wake = OWN_RELEASE if exc.reason == "lease_share" else site
            return self._close(site, exc.retry_after, exc.reason, wake=wake)
        return self._close(EVERY_SITE, exc.retry_after, exc.reason, wake=None)

    def unreachable(self, seconds: float) -> NoLeaseYet:
        return self._close(EVERY_SITE, seconds, "api_unavailable", wake=API_BACK)

    def released(self, site: str) -> None:
        """One of our leases on `site` ended: its cooldown block and a share block may be over."""
        block = self._blocks.get(site)
        if block is not None and block.reason in PER_SITE:
            del self._blocks[site]
        for key in [k for k, b in self._blocks.items() if b.reason == "lease_share"]:
            del self._blocks[key]  # any release of ours frees a share for every site

    def reached(self) -> None:
        """A lease came: the API is back."""
        block = self._blocks.get(EVERY_SITE)
        if block is not None and block.reason == "api_unavailable":
            del self._blocks[EVERY_SITE]

    def enter(self, site: str) -> None:
        self._in_flight[site] += 1

    def leave(self, site: str) -> None:
        self._in_flight[site] -= 1
        if self._in_flight[site] <= 0:
            del self._in_flight[site]

    def _close(self, key: str, seconds: float, reason: str, *, wake: str | None) -> NoLeaseYet:
        seconds = max(MIN_WAIT, seconds)
        self._blocks[key] = Block(self._clock() + seconds, reason, wake)
        return NoLeaseYet(seconds, wake, reason)
