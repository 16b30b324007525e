"""Prometheus metrics of the health engine, on a registry passed in (one per app, so tests do not collide)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from service.health.egress import shared_egress
from service.inventory import Health, HealthState

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class HealthMetrics:
    def __init__(self, registry: CollectorRegistry, *, health: Callable[[], Mapping[str, Health]]) -> None:
        self.probe_seconds = Histogram(
            "proxy_operator_probe_duration_seconds",
            "Probe latency (connect + fetch through the proxy).",
            ["provider"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.probe_results = Counter(
            "proxy_operator_probe_results_total",
            "Probe results by outcome.",
            ["provider", "outcome"],
            registry=registry,
        )
        self.transitions = Counter(
            "proxy_operator_health_transitions_total",
            "Health state changes, by new state.",
            ["state"],
            registry=registry,
        )
        self._health = health
        proxies = Gauge("proxy_operator_proxies", "Proxies by health state.", ["state"], registry=registry)
        for state in HealthState:
            proxies.labels(state.value).set_function(self._count_state(state))
        Gauge(
            "proxy_operator_shared_egress_proxies",
            "Proxies whose egress IP another proxy also uses.",
            registry=registry,
        ).set_function(lambda: sum(len(keys) for keys in shared_egress(self._health()).values()))
        Gauge(
            "proxy_operator_shared_egress_ips", "Egress IPs used by more than one proxy.", registry=registry
        ).set_function(lambda: len(shared_egress(self._health())))

    def _count_state(self, state: HealthState) -> Callable[[], float]:
        return lambda: sum(1 for h in self._health().values() if h.state is state)

    def observe(self, *, provider: str, outcome: str, latency: float | None) -> None:
        """One result; `latency` None: nothing was sent (an unverified listener), no latency to count."""
        if latency is not None:
            self.probe_seconds.labels(provider).observe(latency)
        self.probe_results.labels(provider, outcome).inc()
