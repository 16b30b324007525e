"""The server's limits on a lease request: values above them are lowered, never refused (docs/api.md#leases).

Every lease's lifetime, at hand-out and at each renewal, goes through `lease_ttl`: it is the one place a
later rule that shortens leases (draining a proxy or a replica) has to change.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from service.settings import DiscoverySettings


@dataclass(frozen=True)
class Granted:
    """What a request gets within the limits, and which of its values were lowered (name -> value used)."""

    count: int
    ttl: float
    wait: float
    lowered: dict[str, float] = field(default_factory=dict)


def lease_ttl(requested: float | None, *, settings: DiscoverySettings) -> float:
    """A lease's lifetime from now: the requested ttl (else the default), at most `lease_ttl_max_seconds`."""
    wanted = settings.lease_ttl_seconds if requested is None else requested
    return min(wanted, settings.lease_ttl_max_seconds)


def grant(*, count: int, ttl: float | None, wait: float, settings: DiscoverySettings) -> Granted:
    """`count`, `ttl` and `wait` lowered to `max_count`, the lease ttl limit and `max_wait_seconds`."""
    if (
        count <= settings.max_count
        and (ttl is None or ttl <= settings.lease_ttl_max_seconds)
        and wait <= settings.max_wait_seconds
    ):  # nothing to lower (the common request): what the general case gives, without its dicts
        return Granted(count=int(count), ttl=lease_ttl(ttl, settings=settings), wait=wait, lowered={})
    return lowering(count=count, ttl=ttl, wait=wait, settings=settings)


def lowering(*, count: int, ttl: float | None, wait: float, settings: DiscoverySettings) -> Granted:
    """`grant`'s general case: every value taken through its limit."""
    used = {
        "count": min(count, settings.max_count),
        "ttl": lease_ttl(ttl, settings=settings),
        "wait": min(wait, settings.max_wait_seconds),
    }
    asked = {"count": count, "ttl": ttl, "wait": wait}
    return Granted(count=int(used["count"]), ttl=used["ttl"], wait=used["wait"], lowered=lowered(asked, used))


def lowered(asked: Mapping[str, float | None], used: Mapping[str, float]) -> dict[str, float]:
    """The asked values that the limits lowered, each with the value used instead."""
    return {name: used[name] for name, value in asked.items() if value is not None and value > used[name]}
