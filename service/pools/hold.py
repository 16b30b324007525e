"""When a pool holds: a placement names a provider the catalogue does not have (a typo, or an entry not
added yet). Its children could never be provisioned, so the pool takes no decision at all until it is
fixed: nothing is created, drained or deleted, children already running keep running, and the status
(Degraded, reason UnknownProvider) says which placement names which provider and how to fix it."""

from __future__ import annotations

from stacks.models import ProviderCatalogue, ProxyPool

UNKNOWN_PROVIDER = "UnknownProvider"


def unknown_providers(pool: ProxyPool, catalogue: ProviderCatalogue | None) -> str | None:
    """Why the pool holds, or None when every placement names a provider of the catalogue."""
    if catalogue is None:
        return (
            "no provider catalogue has been read, so the placements cannot be checked: the pool holds "
            "(nothing is created, drained or deleted) until the catalogue is there"
        )
    bad = [(i, p.provider) for i, p in enumerate(pool.spec.placement) if catalogue.get(p.provider) is None]
    if not bad:
        return None
    named = "; ".join(f"spec.placement[{i}] names provider '{provider}'" for i, provider in bad)
    known = ", ".join(catalogue.names()) or "none"
    return (
        f"{named}, which the catalogue does not have (known: {known}): correct the placement's provider "
        "or add that provider to the catalogue; until then the pool holds (nothing is created, drained "
        "or deleted; running children keep running)"
    )
