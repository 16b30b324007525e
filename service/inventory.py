"""The inventory: every proxy endpoint the sources know, annotated with health by the health engine.

Sources (directory of manifests, Kubernetes controller) replace or update the endpoints; the health engine
writes one `Health` per key; discovery reads both. All methods take one lock, so threads (a Kubernetes watch)
and the event loop can share it. Reads return immutable values or copies, never live internals.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType


class HealthState(StrEnum):
    unknown = "unknown"
    healthy = "healthy"
    unhealthy = "unhealthy"


NO_LABELS: Mapping[str, str] = MappingProxyType({})  # one shared value for the many proxies with no labels


def interned(value: str | None) -> str | None:
    """One string object per value across the fleet: what an endpoint holds and other copies of the same
    value (the credentials Secrets', the watched copy's) share it (issue 20)."""
    return sys.intern(value) if type(value) is str else value  # anything else (None) as it is


@dataclass(frozen=True, slots=True)
class ProxyEndpoint:
    """One proxy as discovery serves it. `host`/`port` are None until the stack publishes an address."""

    key: str
    namespace: str
    name: str
    provider: str
    pool: str | None = None
    labels: Mapping[str, str] = field(default_factory=lambda: NO_LABELS)
    protocol: str = "http"
    host: str | None = None
    port: int | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    stack: str | None = None
    control: str | None = None  # the proxy's lease-user control channel; None: leases share its credentials
    instance_id: str | None = None  # what the stack recorded as the instance serving it
    # A process on this machine (the local provider): probed only while the process its instance id names
    # holds the port, so no other local user's listener gets its credentials (service/health/listener.py).
    local: bool = False

    @property
    def has_address(self) -> bool:
        return bool(self.host) and self.port is not None


@dataclass(frozen=True, slots=True)
class Health:
    """What the health engine last concluded about one proxy."""

    state: HealthState = HealthState.unknown
    egress_ip: str | None = None
    consecutive_failures: int = 0
    consecutive_successes: int = 0
    last_probe_at: float | None = None
    last_latency_seconds: float | None = None
    last_error: str | None = None

    @property
    def healthy(self) -> bool:
        return self.state is HealthState.healthy


_UNKNOWN = Health()


class Inventory:
    """Thread-safe map key -> endpoint (+ health). `version` grows on every change to the set of endpoints."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._endpoints: dict[str, ProxyEndpoint] = {}
        self._health: dict[str, Health] = {}
        self._healthy: frozenset[str] | None = frozenset()  # None: rebuild on the next read
        self._draining: set[str] = set()  # never handed out again (a pool replaces or removes them)
        self._loaded = False
        self._version = 0
        self._listeners: list[Callable[[], None]] = []

    # --- written by sources -------------------------------------------------------------------------------
    def replace_all(self, endpoints: Iterable[ProxyEndpoint]) -> None:
        """Replace the whole set (a source's full resync). Health of keys that stay is kept."""
        new = {ep.key: ep for ep in endpoints}
        with self._lock:
            self._endpoints = new
            self._health = {k: h for k, h in self._health.items() if k in new}
            self._loaded = True
            self._changed()

    def upsert(self, endpoint: ProxyEndpoint) -> None:
        with self._lock:
            old = self._endpoints.get(endpoint.key)
            if old == endpoint:
                # The same as served: no change, nothing rebuilt, no waiter woken. A drift check or an
                # `up` reports each proxy of its stack again, 500 at a time, and each upsert used to drop
                # the healthy set (10,000 endpoints, rebuilt by the next lease) and wake every waiter.
                return
            self._endpoints[endpoint.key] = endpoint
            if old is not None and _address(old) != _address(endpoint):
                self._health.pop(endpoint.key, None)  # a new address must prove itself again
            self._changed()

    def remove(self, key: str) -> None:
        with self._lock:
            self._draining.discard(key)
            if self._endpoints.pop(key, None) is not None:
                self._health.pop(key, None)
                self._changed()

    def mark_loaded(self) -> None:
        """A source says the desired state is loaded even if it holds no proxy."""
        with self._lock:
            self._loaded = True

    # --- written by the health engine ---------------------------------------------------------------------
    def set_health(self, key: str, health: Health) -> None:
        with self._lock:
            if key not in self._endpoints:
                return  # removed while its probe was in flight
            was = self._health.get(key, _UNKNOWN).healthy
            self._health[key] = health
            if was != health.healthy:
                self._changed()

    # --- written by pools ----------------------------------------------------------------------------------
    def drain(self, key: str) -> None:
        """Stop handing `key` out; its leases run to their end (a renewal cannot pass it, see discovery)."""
        with self._lock:
            if key not in self._draining:
                self._draining.add(key)
                self._changed()

    def undrain(self, key: str) -> None:
        with self._lock:
            if key in self._draining:
                self._draining.discard(key)
                self._changed()

    def is_draining(self, key: str) -> bool:
        return key in self._draining

    # --- reads --------------------------------------------------------------------------------------------
    @property
    def loaded(self) -> bool:
        return self._loaded

    @property
    def version(self) -> int:
        return self._version

    def get(self, key: str) -> ProxyEndpoint | None:
        return self._endpoints.get(key)

    def health(self, key: str) -> Health:
        return self._health.get(key, _UNKNOWN)

    def endpoints(self) -> list[ProxyEndpoint]:
        with self._lock:
            return list(self._endpoints.values())

    def healthy_keys(self) -> frozenset[str]:
        """The keys currently eligible by health: one shared snapshot, rebuilt lazily after a change."""
        healthy = self._healthy
        if healthy is None:
            with self._lock:
                healthy = self._healthy = frozenset(
                    k
                    for k, h in self._health.items()
                    if h.healthy and self._endpoints[k].has_address and k not in self._draining
                )
        return healthy

    def health_snapshot(self) -> Mapping[str, Health]:
        with self._lock:
            return MappingProxyType(dict(self._health))

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Called after every change, from the changing thread; used to wake lease waiters."""
        self._listeners.append(listener)

    def __len__(self) -> int:
        return len(self._endpoints)

    def _changed(self) -> None:
        # O(1) per change, so the health engine can mark 10,000 proxies healthy without O(n^2) work.
        self._version += 1
        self._healthy = None
        for listener in self._listeners:
            listener()


def _address(endpoint: ProxyEndpoint) -> tuple[str | None, int | None, str]:
    return (endpoint.host, endpoint.port, endpoint.protocol)
