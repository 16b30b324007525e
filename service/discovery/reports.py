"""Reports: what a target did with a proxy, taken only from a client that leased it, and weighed.

The rules (docs/security.md, "The discovery API"):
1. A client may send `report_rate_limit` reports per `report_rate_period_seconds` (429 past it).
2. A report is about a proxy the client holds a lease on, or held one on less than `report_window_seconds`
   ago (403 `not_a_leaseholder` otherwise): a client cannot touch the proxies other clients use.
3. `banned` and `ok` are about a target, so they name the lease they are about (422 `lease_required` by
   proxy key) and count for that lease's target only (409 `target_not_leased` when they name another): a
   client can say nothing about a site it did not lease for.
4. `banned` penalises the proxy for the lease's target, for everyone (the site blocks the IP, not the
   client), at most once per lease: a repeated ban on one lease is `already_counted`.
5. `ok` resets the strikes of a proxy whose penalty has run out; it never lifts a running one, which would
   let one client undo another's ban.
6. `error` counts against the proxy's health only once `error_quorum` distinct clients agree within
   `error_window_seconds`; each of them counts once. The prober's own probes count on their own.
7. Every accepted report is counted in the proxy's report summary (service/discovery/report_summary.py:
   per target, client and kind), which people read on the fleet page; it decides nothing.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from service.discovery.backoff import FullJitter
from service.discovery.errors import (
    LeaseNotFound,
    LeaseRequired,
    NotALeaseholder,
    ProxyNotFound,
    TargetNotLeased,
    TooManyReports,
)
from service.discovery.store import Penalty, Store
from service.inventory import Inventory
from service.settings import DiscoverySettings

ANY_TARGET = "*"
Effect = Literal[
    "penalised", "strikes_reset", "penalty_runs", "counted", "awaiting_quorum", "already_counted"
]


@dataclass(frozen=True)
class ReportOutcome:
    proxy: str
    target: str
    effect: Effect
    penalty: Penalty | None = None


class Reports:
    def __init__(
        self,
        *,
        inventory: Inventory,
        store: Store,
        settings: DiscoverySettings,
        clock: Callable[[], float],
        rng: random.Random,
        on_error: Callable[[str], None] | None,
        on_forgiven: Callable[[], None],
    ) -> None:
        self._inventory, self._store, self._settings = inventory, store, settings
        self._clock, self._rng = clock, rng
        self._on_error, self._on_forgiven = on_error, on_forgiven
        self._backoff = FullJitter(base=settings.penalty_base_seconds, cap=settings.penalty_cap_seconds)

    async def __call__(
        self, *, client: str, outcome: str, target: str | None, lease_id: str | None, proxy: str | None
    ) -> ReportOutcome:
        now = self._clock()
        await self._within_rate(client, now=now)
        if lease_id is None and outcome in ("banned", "ok"):
            raise LeaseRequired(
                f"an {outcome!r} report is about a target: send the lease it is about (`lease`), not the "
                "proxy; it counts for the target that lease was taken for"
            )
        key, target = await self._subject(
            client=client, target=target, lease_id=lease_id, proxy=proxy, now=now
        )
        if outcome == "banned":
            assert lease_id is not None
            taken = await self._ban(key, target=target, lease_id=lease_id, now=now)
        elif outcome == "ok":
            taken = await self._forgive(key, target=target, now=now)
        else:
            taken = await self._error(key, target=target, client=client, now=now)
        # Who said what, for people (the fleet page); an accepted report only.
        await self._store.note_report(proxy=key, target=target, client=client, kind=outcome, now=now)
        return taken

    async def _within_rate(self, client: str, *, now: float) -> None:
        period = self._settings.report_rate_period_seconds
        count, ends = await self._store.count_report(client=client, now=now, period=period)
        if count > self._settings.report_rate_limit:
            raise TooManyReports(
                f"client {client!r} sent more than {self._settings.report_rate_limit} reports in "
                f"{period:g} s (report_rate_limit)",
                retry_after=max(ends - now, 0.0),
            )

    async def _subject(
        self, *, client: str, target: str | None, lease_id: str | None, proxy: str | None, now: float
    ) -> tuple[str, str]:
        window = self._settings.report_window_seconds
        if lease_id is not None:
            lease = await self._store.get_lease(lease_id, now=now)
            if lease is None or lease.client != client:
                raise LeaseNotFound(
                    f"no lease {lease_id!r} for client {client!r}; report by proxy and target"
                )
            if lease.expires_at + window < now:
                raise NotALeaseholder(
                    f"lease {lease_id!r} ended more than {window:g} s ago (report_window_seconds): "
                    "reports are taken while a lease runs and shortly after"
                )
            if target is not None and target != lease.target:
                taken = "without a target" if lease.target == ANY_TARGET else f"for {lease.target!r}"
                raise TargetNotLeased(
                    f"lease {lease_id!r} was taken {taken}; a report counts only for its lease's target: "
                    f"leave `target` out, or lease for {target!r} to report on it"
                )
            return lease.proxy, lease.target
        assert proxy is not None
        if self._inventory.get(proxy) is None:
            raise ProxyNotFound(f"no proxy {proxy!r}; use the key namespace/name from /v1/proxies")
        held = await self._store.last_held(client=client, proxy=proxy)
        if held is None or held + window < now:
            raise NotALeaseholder(
                f"client {client!r} holds no lease on {proxy} and held none in the last {window:g} s "
                "(report_window_seconds): only a client that leased a proxy may report on it"
            )
        return proxy, target or ANY_TARGET

    async def _ban(self, proxy: str, *, target: str, lease_id: str, now: float) -> ReportOutcome:
        penalty = await self._store.penalise(
            lease_id=lease_id,
            proxy=proxy,
            target=target,
            now=now,
            base=self._backoff.base,
            cap=self._backoff.cap,
            fraction=self._rng.random(),
        )
        if penalty is None:  # this lease's ban was counted already
            return ReportOutcome(proxy, target, "already_counted")
        return ReportOutcome(proxy, target, "penalised", penalty)

    async def _forgive(self, proxy: str, *, target: str, now: float) -> ReportOutcome:
        if not await self._store.forgive(proxy=proxy, target=target, now=now):
            return ReportOutcome(proxy, target, "penalty_runs")
        self._on_forgiven()
        return ReportOutcome(proxy, target, "strikes_reset")

    async def _error(self, proxy: str, *, target: str, client: str, now: float) -> ReportOutcome:
        quorum = self._settings.error_quorum
        votes = await self._store.vote_error(
            proxy=proxy, client=client, now=now, window=self._settings.error_window_seconds
        )
        if votes.voters < quorum:
            return ReportOutcome(proxy, target, "awaiting_quorum")
        if not votes.new:
            return ReportOutcome(proxy, target, "already_counted")
        # Reaching the quorum counts every voter so far; each later new voter counts once.
        for _ in range(votes.voters if votes.voters == quorum else 1):
            if self._on_error is not None:
                self._on_error(proxy)
        return ReportOutcome(proxy, target, "counted")
