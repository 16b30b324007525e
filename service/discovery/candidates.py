"""Which proxies a lease may choose from: healthy, addressed, and matching the request's filters.

Results are frozensets cached per inventory version and filter, so repeated leases share one object: the
memory store then skips re-learning it and the Redis store uploads it once (by digest).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from service.inventory import Inventory, ProxyEndpoint

MAX_CACHED_FILTERS = 256


def matches(
    endpoint: ProxyEndpoint,
    *,
    pool: str | None,
    provider: str | None,
    labels: Mapping[str, str],
    protocol: str | None = None,
) -> bool:
    if protocol is not None and endpoint.protocol != protocol:
        return False
    if pool is not None and endpoint.pool != pool:
        return False
    if provider is not None and endpoint.provider != provider:
        return False
    return all(endpoint.labels.get(k) == v for k, v in labels.items())


class Candidates:
    def __init__(self, inventory: Inventory) -> None:
        self._inventory = inventory
        self._lock = threading.Lock()
        self._version = -1
        self._cache: dict[tuple[object, ...], frozenset[str]] = {}

    def __call__(
        self,
        *,
        pool: str | None,
        provider: str | None,
        labels: Mapping[str, str],
        protocol: str | None = None,
    ) -> frozenset[str]:
        """The healthy keys matching the filters (no filters: the inventory's own snapshot)."""
        version = self._inventory.version  # read before the snapshot: a race can only make a stale entry miss
        healthy = self._inventory.healthy_keys()
        if pool is None and provider is None and protocol is None and not labels:
            return healthy
        filters = {"pool": pool, "provider": provider, "labels": labels, "protocol": protocol}
        key = (pool, provider, protocol, tuple(sorted(labels.items())))
        with self._lock:
            if self._version != version or len(self._cache) > MAX_CACHED_FILTERS:
                self._cache.clear()
                self._version = version
            found = self._cache.get(key)
        if found is None:
            found = frozenset(k for k in healthy if self._matches(k, filters))
            with self._lock:
                if self._version == version:
                    self._cache[key] = found
        return found

    def _matches(self, key: str, filters: dict[str, Any]) -> bool:
        endpoint = self._inventory.get(key)
        return endpoint is not None and matches(endpoint, **filters)
