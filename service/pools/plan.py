"""One pass over one pool: a pure function of (pool, members, signals, memory, clock) -> Decision.

Order: demand adjusts the target; replacements in flight settle (drain or roll back); drained children
finish; each placement is brought to its share of the target (new children, or the oldest drained and then
deleted); finally the rotation rules start replacements within `maxUnavailable`. Without signals (a one-shot
`up`, nothing probes) only the shape is kept: no replacement, no demand.
"""

from __future__ import annotations

from service.pools import rotation
from service.pools.expand import spread
from service.pools.memory import Decision, PoolMemory
from service.pools.naming import Member
from service.pools.rotation import Observe
from stacks.models import ProxyPool
from stacks.models.pool import seconds


def decide(
    pool: ProxyPool,
    *,
    members: list[Member],
    memory: PoolMemory,
    now: float,
    observe: Observe | None,
    unmet: int = 0,
) -> Decision:
    decision = Decision()
    memory.forget_gone({m.name for m in members})
    if memory.replicas_seen != pool.spec.replicas:  # an edit of replicas restarts demand's adjustment
        memory.replicas_seen, memory.extra = pool.spec.replicas, 0
    if observe is not None and pool.spec.demand is not None:
        _demand(pool, members=members, observe=observe, memory=memory, now=now, unmet=unmet, into=decision)
    decision.desired = pool.spec.clamp(pool.spec.replicas + memory.extra)
    if observe is not None:
        rotation.settle(pool, members=members, observe=observe, memory=memory, now=now, into=decision)
        rotation.finish_drains(pool, members=members, observe=observe, memory=memory, now=now, into=decision)
    # A child deleted in this pass no longer counts; the replacement of a deleted child counts instead.
    counted = counted_members([m for m in members if m.name not in decision.delete], memory)
    _scale(pool, counted=counted, memory=memory, now=now, into=decision)
    if observe is None:  # a one-shot run serves no leases: a scaled-down child goes at once
        decision.delete += decision.drain
        decision.drain = []
    if observe is not None:
        pairs = rotation.pairs_of(members)
        busy = set(pairs.values()) | set(memory.draining) | set(decision.delete)
        rotation.start_replacements(
            pool,
            candidates=[m for m in counted if m.name not in busy],
            in_flight=len(pairs) - sum(1 for new in pairs if new in decision.delete),
            observe=observe,
            memory=memory,
            now=now,
            into=decision,
        )
    return decision


def counted_members(members: list[Member], memory: PoolMemory) -> list[Member]:
    """The children that fill the pool's places: a replacement counts once (the old child, until it
    goes) and a child drained for a scale-down no longer counts."""
    pairs = rotation.pairs_of(members)
    return [m for m in members if m.name not in pairs and m.name not in memory.scaling_down]


def _scale(pool: ProxyPool, *, counted: list[Member], memory: PoolMemory, now: float, into: Decision) -> None:
    shares = spread(pool.spec.placement, into.desired)
    replaced = {m.replaces for m in counted}
    for key, want in shares.items():
        here = [m for m in counted if m.placement == key]
        into.create += [(key, None)] * max(want - len(here), 0)
        # Oldest first; a child whose replacement is under way goes last (it is leaving anyway).
        surplus = sorted(here, key=lambda m: (m.name in replaced, m.born, m.name))[: max(len(here) - want, 0)]
        _scale_down(surplus, memory=memory, now=now, into=into)
    _scale_down([m for m in counted if m.placement not in shares], memory=memory, now=now, into=into)


def _scale_down(members: list[Member], *, memory: PoolMemory, now: float, into: Decision) -> None:
    for member in members:
        memory.scaling_down.add(member.name)
        if member.name not in memory.draining:
            memory.draining[member.name] = now
            into.drain.append(member.name)
            into.events.append(f"scaling down: draining {member.name}")


def _demand(
    pool: ProxyPool,
    *,
    members: list[Member],
    observe: Observe,
    memory: PoolMemory,
    now: float,
    unmet: int,
    into: Decision,
) -> None:
    """Unmet lease requests over the window add a child; a share idle over the idle window removes one."""
    demand = pool.spec.demand
    assert demand is not None
    current = pool.spec.clamp(pool.spec.replicas + memory.extra)
    since = None if memory.demand_changed_at is None else now - memory.demand_changed_at
    if unmet >= demand.unmet_requests and (since is None or since >= seconds(demand.window)):
        if pool.spec.clamp(pool.spec.replicas + memory.extra + 1) > current:
            memory.extra += 1
            memory.demand_changed_at = now
            into.events.append(f"{unmet} lease requests found no proxy within {demand.window}: scaling up")
        return
    counted = counted_members(members, memory)
    idle_for = seconds(demand.idle_window)
    idle = [m for m in counted if now - (observe(m).last_leased or m.born) >= idle_for]
    if not counted or len(idle) / len(counted) < demand.idle_share:
        return
    if since is not None and since < idle_for:
        return
    if pool.spec.clamp(pool.spec.replicas + memory.extra - 1) < current:
        memory.extra -= 1
        memory.demand_changed_at = now
        into.events.append(
            f"{len(idle)} of {len(counted)} children idle for {demand.idle_window}: scaling down"
        )
