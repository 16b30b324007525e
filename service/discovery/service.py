"""Discovery: lease proxies (LRU among eligible, sticky sessions, bounded wait), release, and reports.

Eligible = healthy + addressed + matching the filters (from the inventory), not held or cooling down for this
client and target, and not penalised for this target (both in the store, decided atomically there).
A lease on a proxy with a control channel is answered only once its own user is on the proxy
(`lease_users.py`); release, renewal and expiry follow it there.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import os
import random
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field

from service.discovery.candidates import Candidates
from service.discovery.errors import LeaseLimited, LeaseNotFound, NoProxyAvailable, SessionLost
from service.discovery.fair_share import holding_limit
from service.discovery.lease_users import FOLLOW_SECONDS, SWEEP_SECONDS, LeaseUser, LeaseUsers
from service.discovery.limits import lease_ttl
from service.discovery.observer import DiscoveryObserver
from service.discovery.report_summary import ReportEntry
from service.discovery.reports import ANY_TARGET, ReportOutcome, Reports
from service.discovery.store import (
    Acquired,
    AcquireRequest,
    BoundSession,
    FairShare,
    LeaseRecord,
    Limited,
    Penalty,
    Store,
)
from service.discovery.waiter import Waiter
from service.inventory import Inventory
from service.settings import DiscoverySettings

POLL_SECONDS = 1.0  # a waiter re-checks at least this often: other replicas' releases do not wake it
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseQuery:
    client: str
    count: int = 1
    pool: str | None = None
    provider: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    protocol: str | None = None
    target: str = ANY_TARGET
    session: str | None = None
    strict: bool = False
    ttl: float | None = None
    wait: float = 0.0
    share: float | None = None  # the client's own lease_share / lease_rate (its token's); None: settings
    rate: float | None = None


@dataclass(frozen=True)
class LeaseGrant:
    leases: list[LeaseRecord]
    session: str | None = None
    rebound: bool = False
    previous_proxy: str | None = None
    users: Mapping[str, LeaseUser] = field(default_factory=dict)  # lease id -> its own user, when scoped


class DiscoveryService:
    def __init__(
        self,
        *,
        inventory: Inventory,
        store: Store,
        settings: DiscoverySettings,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        new_id: Callable[[], str] = lambda: os.urandom(16).hex(),  # as uuid4().hex looks, for less
        on_error_report: Callable[[str], None] | None = None,
        no_candidate_retry: float = 10.0,
        lease_users: LeaseUsers | None = None,
    ) -> None:
        self.inventory = inventory
        self.store = store
        self.settings = settings
        self._clock = clock
        self._rng = rng or random.Random()
        self._new_id = new_id
        self._no_candidate_retry = no_candidate_retry  # the health interval: when a proxy may turn healthy
        self._waiter = Waiter()
        self._candidates = Candidates(inventory)
        self.observer: DiscoveryObserver | None = None  # pools: hand-outs, unmet requests, ban reports
        self.lease_users = lease_users or LeaseUsers(
            inventory=inventory, enabled=settings.lease_scoped_credentials
        )
        inventory.add_listener(self._waiter.notify)
        self._reports = Reports(
            inventory=inventory,
            store=store,
            settings=settings,
            clock=clock,
            rng=self._rng,
            on_error=on_error_report,
            on_forgiven=self._waiter.notify,
        )

    async def lease(self, query: LeaseQuery) -> LeaseGrant:
        """Lease now, or wait up to `query.wait` seconds for a proxy to become eligible."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(query.wait, self.settings.max_wait_seconds)
        while True:
            generation = self._waiter.generation
            try:
                return await self._with_users(await self._lease_once(query))
            except NoProxyAvailable as exc:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    if self.observer is not None:
                        self.observer.unmet(query.pool)
                    raise
                timeout = min(remaining, max(exc.retry_after, 0.01), POLL_SECONDS)
                await self._waiter.wait(generation, seconds=timeout)

    async def _with_users(self, grant: LeaseGrant) -> LeaseGrant:
        """Each scoped lease with its own user on the proxy; a lease whose push failed is released (its
        cooldown keeps that proxy away from this client and target) and left out of the answer."""
        now = self._clock()
        users, failed = await self.lease_users.issue(grant.leases, now=now)
        if not users and not failed:  # no proxy of these gives leases their own users
            return grant
        for lease in failed:
            await self.store.release(lease.lease_id, now=now, cooldown=self.settings.cooldown_seconds)
        if not failed:
            return dataclasses.replace(grant, users=users)
        kept = [lease for lease in grant.leases if lease not in failed]
        if not kept:
            raise NoProxyAvailable(
                "the proxies picked did not accept a lease user in time; others are tried while `wait` lasts",
                reason="lease_user_failed",
                retry_after=POLL_SECONDS,
            )
        return dataclasses.replace(grant, leases=kept, users=users)

    async def _lease_once(self, query: LeaseQuery) -> LeaseGrant:
        now = self._clock()
        pool = self._candidates(
            pool=query.pool, provider=query.provider, labels=query.labels, protocol=query.protocol
        )
        if query.session is None:
            return LeaseGrant(leases=await self._acquire(query, pool=pool, now=now))
        outcome = await self._sticky(query, pool=pool, now=now)
        if isinstance(outcome, list):
            return LeaseGrant(leases=outcome, session=query.session)
        bound = outcome
        if bound is not None and query.strict:
            why = self._session_problem(bound, query=query, pool=pool, now=now) or "is not eligible"
            raise SessionLost(f"session {query.session!r} was bound to {bound.proxy}, which {why}")
        leases = await self._acquire(query, pool=pool, now=now)
        await self._bind(query, proxy=leases[0].proxy, now=now)
        previous = bound.proxy if bound is not None else None
        return LeaseGrant(
            leases=leases, session=query.session, rebound=bound is not None, previous_proxy=previous
        )

    async def _sticky(
        self, query: LeaseQuery, *, pool: Collection[str], now: float
    ) -> list[LeaseRecord] | BoundSession | None:
        """The session's lease in one step of the store (one round trip on Redis: a sticky lease waited for
        four before, which made the p99 of bench_discovery's Redis mix): the leases on its proxy, or None
        when the session is not bound, or the binding when its proxy left the pool or is banned for the
        target (nothing done then: the caller re-binds or refuses). A request that reaches the bound proxy
        renews the session whether or not it gets its lease (a 429)."""
        share = self._fair_share(query, pool)
        request = self._request(query, candidates=(), share=share, sticky=True)
        assert query.session is not None
        outcome = await self.store.sticky(
            request, session=query.session, idle=self.settings.session_idle_seconds, now=now
        )
        if isinstance(outcome, Acquired):
            return await self._taken(query, share, outcome, pool=pool, now=now)
        return outcome

    def _session_problem(
        self, bound: BoundSession, *, query: LeaseQuery, pool: Collection[str], now: float
    ) -> str | None:
        if self.inventory.get(bound.proxy) is None:
            return "is gone"
        if bound.proxy not in pool:
            return "is not healthy or no longer matches the filters"
        if bound.penalty_until > now:
            return f"is banned for {query.target}"
        return None

    async def _bind(self, query: LeaseQuery, *, proxy: str, now: float) -> None:
        assert query.session is not None
        await self.store.bind_session(
            client=query.client,
            session=query.session,
            proxy=proxy,
            now=now,
            idle=self.settings.session_idle_seconds,
        )

    def _fair_share(self, query: LeaseQuery, pool: Collection[str]) -> FairShare:
        share = self.settings.lease_share if query.share is None else query.share
        return FairShare(
            pool=pool,
            holding=holding_limit(share, len(pool)),
            rate=self.settings.lease_rate if query.rate is None else query.rate,
            burst=float(self.settings.lease_burst),
        )

    async def _acquire(self, query: LeaseQuery, *, pool: Collection[str], now: float) -> list[LeaseRecord]:
        share = self._fair_share(query, pool)
        request = self._request(query, candidates=pool, share=share, sticky=False)
        return await self._taken(query, share, await self.store.acquire(request, now=now), pool=pool, now=now)

    def _request(
        self, query: LeaseQuery, *, candidates: Collection[str], share: FairShare, sticky: bool
    ) -> AcquireRequest:
        return AcquireRequest(
            client=query.client,
            target=query.target,
            candidates=candidates,
            count=1 if query.session else query.count,
            ttl=lease_ttl(query.ttl, settings=self.settings),
            cooldown=self.settings.cooldown_seconds,
            lease_ids=[self._new_id() for _ in range(query.count)],
            ignore_cooldown=sticky,
            share=share,
        )

    async def _taken(
        self, query: LeaseQuery, share: FairShare, acquired: Acquired, *, pool: Collection[str], now: float
    ) -> list[LeaseRecord]:
        """The leases the store handed out, or the error that says why there are none."""
        if acquired.limited is not None:
            raise self._limited(query, share, acquired.limited, now=now)
        if acquired.leases:
            if self.observer is not None:
                self.observer.leased(acquired.leases)
            return acquired.leases
        if acquired.earliest is None:
            raise NoProxyAvailable(
                "no healthy proxy matches pool/provider/labels; health is re-probed every few seconds",
                reason="no_candidates",
                retry_after=self._no_candidate_retry,
            )
        message, retry_after = await self._cooling_down(query, pool, earliest=acquired.earliest, now=now)
        raise NoProxyAvailable(message, reason="all_cooling_down", retry_after=retry_after)

    async def _cooling_down(
        self, query: LeaseQuery, pool: Collection[str], *, earliest: float, now: float
    ) -> tuple[str, float]:
        """What a 503 `all_cooling_down` says, and its Retry-After. When the earliest proxy is one the
        client holds itself (a lease it has not released yet), Retry-After counts its release: then that
        proxy is eligible once the cooldown from its hand-out is over, which is usually at once."""
        message = f"every matching proxy is cooling down or banned for {query.target}"
        own = [
            lease
            for lease in await self.store.active_leases(query.client, now=now)
            if lease.target == query.target and lease.proxy in pool
        ]
        if not own or min(lease.expires_at for lease in own) > earliest + 1e-6:
            return message, max(earliest - now, 0.0)
        cooldown = self.settings.cooldown_seconds
        released = max(min(lease.handed_at for lease in own) + cooldown - now, 0.0)
        return (
            f"{message}; {len(own)} of them held by your own leases: Retry-After counts one being released "
            f"now (without a release, the first is free in {max(earliest - now, 0.0):.0f} s)",
            released,
        )

    def _limited(self, query: LeaseQuery, share: FairShare, limited: Limited, *, now: float) -> LeaseLimited:
        retry_after = max(limited.until - now, 0.0)
        if limited.reason == "lease_rate":
            message = (
                f"client {query.client!r} leases faster than its rate ({share.rate:g} leases per second, "
                f"{share.burst:g} at once: lease_rate, lease_burst); retry after Retry-After"
            )
        else:
            message = (
                f"client {query.client!r} holds leases on {share.holding} of the {len(share.pool)} proxies "
                "this request matches, its share (lease_share): release a lease or retry after Retry-After, "
                "when its first one ends"
            )
        return LeaseLimited(message, reason=limited.reason, retry_after=retry_after)

    async def release(self, *, client: str, lease_id: str) -> LeaseRecord:
        lease = await self.store.get_lease(lease_id, now=self._clock())
        if lease is None or lease.client != client:
            raise LeaseNotFound(f"no lease {lease_id!r} for client {client!r}")
        released = await self.store.release(
            lease_id, now=self._clock(), cooldown=self.settings.cooldown_seconds
        )
        if released is None:
            raise LeaseNotFound(f"lease {lease_id!r} already ended (expired or released)")
        await self.lease_users.revoke(released)
        self._waiter.notify()
        return released

    async def renew(self, *, client: str, lease_id: str, ttl: float | None) -> LeaseRecord:
        """Extend (or shorten) an active lease of `client` to end `ttl` from now, within the limits."""
        lease = await self.store.get_lease(lease_id, now=self._clock())
        if lease is None or lease.client != client:
            raise LeaseNotFound(f"no lease {lease_id!r} for client {client!r}")
        now = self._clock()
        allowed = lease_ttl(ttl, settings=self.settings)
        if self.inventory.is_draining(lease.proxy):  # a renewal never extends a lease past a drain
            allowed = min(allowed, max(lease.expires_at - now, 0.0))
        renewed = await self.store.renew(
            lease_id, now=now, ttl=allowed, cooldown=self.settings.cooldown_seconds
        )
        if renewed is None:
            raise LeaseNotFound(f"lease {lease_id!r} already ended (expired or released): lease again")
        await self.lease_users.extend(renewed, now=now)
        if self.observer is not None:
            self.observer.renewed(renewed)
        if renewed.expires_at < lease.expires_at:  # shortened: its hold may end sooner
            self._waiter.notify()
        return renewed

    async def report(
        self, *, client: str, outcome: str, target: str | None, lease_id: str | None, proxy: str | None
    ) -> ReportOutcome:
        """Apply a client's report within the rules of `reports.py`."""
        result = await self._reports(
            client=client, outcome=outcome, target=target, lease_id=lease_id, proxy=proxy
        )
        if result.effect == "penalised" and self.observer is not None:
            self.observer.banned(result.proxy, client)
        return result

    async def penalties(self, proxy: str) -> list[Penalty]:
        return await self.store.penalties(proxy, now=self._clock())

    async def reports_on(self, proxy: str) -> list[ReportEntry]:
        """Who reported what on the proxy (report_summary.py), the latest first."""
        return await self.store.reports_on(proxy, now=self._clock())

    def retry_after_header(self, seconds: float) -> str:
        return str(max(1, math.ceil(seconds)))

    def notify(self) -> None:
        self._waiter.notify()

    async def sweeper(self) -> None:
        """Until cancelled: revoke the users of leases that ended by expiry (the proxies end them too), and
        beside it add the live ones to proxy processes that do not have them (`LeaseUsers.follow`: its
        rounds wait on slow pods, the revokes do not wait for them)."""
        await asyncio.gather(self._every(SWEEP_SECONDS, self.lease_users.sweep, "sweep"),
                             self._every(FOLLOW_SECONDS, self.lease_users.follow, "follow"))  # fmt: skip

    async def _every(self, seconds: float, step: Callable[..., Awaitable[None]], what: str) -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                await step(now=self._clock(), lookup=self.store.get_lease)
            except Exception:  # a store hiccup: the next round retries; the proxies' own ends still hold
                log.exception("lease user %s failed", what)
