"""Who else wants to know what discovery did: pools count hand-outs, unmet requests and ban reports.

An observer is optional (`DiscoveryService.observer`); discovery never waits on it and never fails for it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from service.discovery.store import LeaseRecord


class DiscoveryObserver(Protocol):
    def leased(self, leases: Iterable[LeaseRecord]) -> None:
        """Leases were handed out."""

    def renewed(self, lease: LeaseRecord) -> None:
        """A lease was renewed (its new end)."""

    def unmet(self, pool: str | None) -> None:
        """A lease request was answered 503: no eligible proxy (per pool, for demand scaling)."""

    def banned(self, proxy: str, client: str) -> None:
        """A leaseholder (a token name) reported the proxy banned."""
