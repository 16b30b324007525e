"""A pool's status: desired and ready children, children per placement, replacements, conditions.

Conditions: `Degraded` (True while a replacement was rolled back and not yet retried successfully, with the
reason; or, reason UnknownProvider, while a placement names a provider the catalogue lacks: the pool holds)
and `Ready` (every place filled by a healthy child). In directory mode the status is logged on each change
and served by `PoolSource.status`; in a cluster it belongs on the ProxyPool's status subresource."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from service.pools.hold import UNKNOWN_PROVIDER
from service.pools.memory import PoolMemory
from service.pools.naming import Member
from service.pools.plan import counted_members
from stacks.models import Condition, ProxyPool, ProxyPoolStatus

DEGRADED = "Degraded"
READY = "Ready"
REPLACEMENT_FAILED = "ReplacementFailed"


def pool_status(
    pool: ProxyPool,
    *,
    members: list[Member],
    memory: PoolMemory,
    desired: int,
    healthy: Callable[[str], bool] | None,
    held: str | None = None,
) -> ProxyPoolStatus:
    counted = counted_members(members, memory)
    ready = sum(1 for m in counted if healthy is not None and healthy(m.key))
    placements = Counter(m.placement for m in counted)
    return ProxyPoolStatus(
        desired=desired,
        ready=ready,
        placements={p.key: placements.get(p.key, 0) for p in pool.spec.placement},
        replacing=sum(1 for m in members if m.replaces in {n.name for n in members}),
        conditions=[_degraded(memory, held), _ready(desired=desired, ready=ready, counted=len(counted))],
    )


def _degraded(memory: PoolMemory, held: str | None) -> Condition:
    if held is not None:
        return Condition(type=DEGRADED, status="True", reason=UNKNOWN_PROVIDER, message=held)
    if memory.degraded:
        reasons = "; ".join(memory.degraded[name] for name in sorted(memory.degraded))
        return Condition(type=DEGRADED, status="True", reason=REPLACEMENT_FAILED, message=reasons)
    return Condition(type=DEGRADED, status="False", reason="AsDesired")


def _ready(*, desired: int, ready: int, counted: int) -> Condition:
    if ready >= desired:
        return Condition(type=READY, status="True", reason="AllReady", message=f"{ready}/{desired} ready")
    return Condition(
        type=READY,
        status="False",
        reason="Scaling" if counted != desired else "NotHealthy",
        message=f"{ready}/{desired} ready",
    )
