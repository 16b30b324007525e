"""Which proxies a lease may choose from: healthy, addressed, and matching the request's filters."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from service.inventory import Inventory, ProxyEndpoint


def matches(
    endpoint: ProxyEndpoint, *, pool: str | None, provider: str | None, labels: Mapping[str, str]
) -> bool:
    if pool is not None and endpoint.pool != pool:
        return False
    if provider is not None and endpoint.provider != provider:
        return False
    return all(endpoint.labels.get(k) == v for k, v in labels.items())


def candidates(
    inventory: Inventory, *, pool: str | None, provider: str | None, labels: Mapping[str, str]
) -> Collection[str]:
    """The healthy keys matching the filters. Without filters: the inventory's own cached set (no copy)."""
    healthy = inventory.healthy_keys()
    if pool is None and provider is None and not labels:
        return healthy
    found = set()
    for key in healthy:
        endpoint = inventory.get(key)
        if endpoint is not None and matches(endpoint, pool=pool, provider=provider, labels=labels):
            found.add(key)
    return found
