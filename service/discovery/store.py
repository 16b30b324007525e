"""The state discovery keeps between requests, behind one narrow protocol with two implementations.

`MemoryStore` serves one replica; `RedisStore` lets several replicas share cooldowns, penalties, sessions and
leases. Each method that decides is atomic in its store, so concurrent requests never hand out a proxy inside
its cooldown. Times are wall-clock seconds passed in by the caller (an injected clock), never read here.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

from service.discovery.report_summary import ReportEntry


@dataclass(frozen=True)
class LeaseRecord:
    """One proxy handed to one client for one target until `expires_at` (or an early release)."""

    lease_id: str
    client: str
    target: str
    proxy: str
    handed_at: float
    expires_at: float
    released: bool = False
    banned: bool = False  # a `banned` report on it was counted (at most one per lease)


@dataclass(frozen=True)
class Limited:
    """The client's fair share stopped a lease: `reason` names the limit (`lease_share`, `lease_rate`),
    `until` is when the limit first lets one more lease through (store-clock seconds)."""

    reason: str
    until: float


@dataclass(frozen=True)
class Acquired:
    """What `acquire` handed out, and when the first candidate it skipped becomes eligible (None: no such);
    `limited` when the client's share or rate is what kept it from more (then `leases` may be empty)."""

    leases: list[LeaseRecord]
    earliest: float | None
    limited: Limited | None = None


@dataclass(frozen=True)
class Penalty:
    target: str
    until: float
    strikes: int


@dataclass(frozen=True)
class ErrorVotes:
    """The distinct clients whose `error` reports on one proxy fall in the window (the reporter's included),
    and whether the reporter's vote is new in it (a client's repeated reports count once)."""

    voters: int
    new: bool


@dataclass(frozen=True)
class FairShare:
    """What one client may take (docs/security.md, "Fair shares"), decided atomically with the hand-out.

    `holding`: the client may hold leases on at most this many distinct proxies of `pool` at once (a proxy
    it holds already, for another target, can be leased again). `rate` (leases per second, with `burst`):
    a token bucket of hand-outs per client, counted over every pool. None: that limit is off."""

    pool: Collection[str]
    holding: int | None
    rate: float | None
    burst: float


@dataclass(frozen=True)
class AcquireRequest:
    client: str
    target: str
    candidates: Collection[str]
    count: int
    ttl: float
    cooldown: float
    lease_ids: Sequence[str]
    ignore_cooldown: bool = False  # a sticky session re-uses its proxy whatever the cooldown
    share: FairShare | None = None


@dataclass(frozen=True, slots=True)
class BoundSession:
    proxy: str
    penalty_until: float  # the proxy's penalty for the request's target; 0.0: none


class Store(Protocol):
    async def acquire(self, request: AcquireRequest, *, now: float) -> Acquired:
        """Pick up to `count` eligible candidates, least recently used first, and lease them atomically."""
        ...

    async def get_lease(self, lease_id: str, *, now: float) -> LeaseRecord | None:
        """A lease, also after expiry or release while the store still keeps it for reports."""
        ...

    async def release(self, lease_id: str, *, now: float, cooldown: float) -> LeaseRecord | None:
        """End an active lease early; the cooldown from its hand-out still applies. None if not active."""
        ...

    async def renew(self, lease_id: str, *, now: float, ttl: float, cooldown: float) -> LeaseRecord | None:
        """Make an active lease end `ttl` seconds from `now` (its hold follows). None if not active."""
        ...

    async def penalise(
        self,
        *,
        proxy: str,
        target: str,
        now: float,
        base: float,
        cap: float,
        fraction: float,
        lease_id: str | None = None,
    ) -> Penalty | None:
        """Record a ban: until = now + fraction * min(cap, base * 2**strikes_before); `strikes` counts this
        ban (1 for the first since the last good report). With `lease_id` (as reports always send: the
        lease it was reported on), None and nothing changed when that lease's ban was counted already or
        the lease is gone; without, no lease is checked (store tests and benches)."""
        ...

    async def forgive(self, *, proxy: str, target: str, now: float) -> bool:
        """A good report: forget the proxy's strikes for that target, unless a penalty still runs there (a
        good report never lifts a running ban: one client could undo another's). True if forgotten."""
        ...

    async def last_held(self, *, client: str, proxy: str) -> float | None:
        """When the latest lease of `client` on `proxy` ends or ended (renewals included), while kept; None
        if it never held one. Who may report on a proxy is decided from this."""
        ...

    async def vote_error(self, *, proxy: str, client: str, now: float, window: float) -> ErrorVotes:
        """Record an `error` report of `client` on `proxy`; votes older than `window` seconds are dropped."""
        ...

    async def count_report(self, *, client: str, now: float, period: float) -> tuple[int, float]:
        """Count one report of `client` in the current fixed window of `period` seconds: (reports in it,
        this one included; when it ends)."""
        ...

    async def note_report(self, *, proxy: str, target: str, client: str, kind: str, now: float) -> None:
        """Count an accepted report in the proxy's summary (service/discovery/report_summary.py: at most 32
        entries per proxy, each gone 24 h after its latest report)."""
        ...

    async def reports_on(self, proxy: str, *, now: float) -> list[ReportEntry]:
        """The proxy's report summary, the latest report first."""
        ...

    async def penalties(self, proxy: str, *, now: float) -> list[Penalty]:
        """The proxy's current penalties (one per target still penalised)."""
        ...

    async def penalty_until(self, *, proxy: str, target: str) -> float: ...

    async def sticky(
        self, request: AcquireRequest, *, session: str, idle: float, now: float
    ) -> Acquired | BoundSession | None:
        """A sticky session's lease in one step (one round trip on Redis). The session's proxy is read with
        its penalty for `request.target`; when it is bound, in `request.share.pool` and not penalised now,
        the session's idle time starts again and `request` is acquired on that proxy alone (its
        `candidates` are not read). None: the session is not bound (or idled past its end); a
        BoundSession: bound to a proxy that left the pool or is penalised (nothing done)."""
        ...

    async def bind_session(
        self, *, client: str, session: str, proxy: str, now: float, idle: float
    ) -> None: ...

    async def sessions_on(self, proxies: Sequence[str], *, now: float) -> dict[str, int]:
        """How many sticky sessions are bound to each of `proxies` now (the fleet page's rows)."""
        ...

    async def active_leases(self, client: str, *, now: float) -> list[LeaseRecord]:
        """The client's leases that run now (neither released nor expired); bounded by its fair share."""
        ...

    async def ping(self) -> bool: ...

    async def close(self) -> None: ...
