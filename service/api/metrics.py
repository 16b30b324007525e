"""Prometheus metrics of the discovery API (the registry is the app's, shared with the health engine)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from service.api.loop_metrics import LoopCounter, LoopHistogram


class ApiMetrics:
    """The lease path's three (counted on every lease) are plain-number ones (loop_metrics.py)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.leases = LoopCounter(
            "proxy_operator_lease_requests_total",
            "Lease requests by outcome (ok, rebound, or the error reason).",
            ["outcome"],
            registry=registry,
        )
        self.leases_ok, self.leases_rebound = self.leases.labels("ok"), self.leases.labels("rebound")
        self.leased = LoopCounter(
            "proxy_operator_leased_proxies_total", "Proxies handed out.", registry=registry
        )
        self.releases = Counter(
            "proxy_operator_lease_releases_total", "Leases ended early by their client.", registry=registry
        )
        self.renewals = Counter("proxy_operator_lease_renewals_total", "Leases renewed.", registry=registry)
        self.lease_seconds = LoopHistogram(
            "proxy_operator_lease_duration_seconds",
            "Time to answer a lease request (waiting included).",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1, 5, 30),
            registry=registry,
        )
        self.reports = Counter(
            "proxy_operator_reports_total", "Client reports by outcome.", ["outcome"], registry=registry
        )
