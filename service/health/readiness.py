"""Readiness for leases: `/readyz` says 200 only once a lease can be served (docs/operations.md, "Probes").

Right after a start every proxy's health is unknown until its first probe (or, on a follower, until the
leader's status reaches it), and a lease would get 503 `no_candidates`. So while there are addressed proxies,
none of them healthy and some not probed yet, the replica is not ready; it is as soon as one is healthy, or
once every one was probed (a fleet that is all unhealthy is the fleet's state, not this replica's: a
replica kept out of its Service for it would hide the API that says why).
"""

from __future__ import annotations

from service.inventory import HealthState, Inventory


def leases_not_ready(inventory: Inventory) -> str | None:
    """Why a lease cannot be served yet, or None."""
    health = inventory.health_snapshot()
    addressed = unknown = 0
    for endpoint in inventory.endpoints():
        if not endpoint.has_address:
            continue
        state = health.get(endpoint.key)
        if state is not None and state.state is HealthState.healthy:
            return None
        addressed += 1
        unknown += state is None or state.state is HealthState.unknown
    if unknown:
        probed = addressed - unknown
        return f"first health probes running: {probed} of {addressed} proxies probed, none healthy yet"
    return None
