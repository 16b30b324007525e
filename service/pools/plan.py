"""One pass over one pool: a pure function of (pool, members, signals, memory, clock) -> Decision.

Order: a pool whose placement names an unknown provider holds (`hold.py`: no decision at all); demand
adjusts the target; replacements in flight settle (drain or roll back); drained children finish; each
placement is brought to its share of the target; finally the rotation rules start replacements.

`maxUnavailable` bounds what may leave at once, one budget for all: replacements in flight, children
drained for a scale-down and those whose deletion is declared but not finished (`leaving`). A scale-down
drains at most the budget, oldest first, the next only once a removal finished; a child on a placement
that lost share (a placement change) is *replaced* on the placement that gained it, the rotation's
make-before-break: the new child first, the old one drained once the new one is healthy. A scale-up is not
bounded (nothing leaves). Without signals (a one-shot `up`, nothing probes or serves) only the shape is
kept, at once: no replacement, no demand, no budget.
"""

from __future__ import annotations

from collections.abc import Collection

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
    leaving: Collection[str] = (),
    held: str | None = None,
) -> Decision:
    """`leaving`: names of the pool's children whose deletion was declared and has not finished yet;
    `held`: why the pool holds (`hold.unknown_providers`), None when it does not."""
    decision = Decision()
    memory.forget_gone({m.name for m in members} | set(leaving))
    if memory.replicas_seen != pool.spec.replicas:  # an edit of replicas restarts demand's adjustment
        memory.replicas_seen, memory.extra = pool.spec.replicas, 0
    if held is not None:
        decision.desired = pool.spec.clamp(pool.spec.replicas + memory.extra)
        decision.held = held
        return decision
    if observe is not None and pool.spec.demand is not None:
        _demand(pool, members=members, observe=observe, memory=memory, now=now, unmet=unmet, into=decision)
    decision.desired = pool.spec.clamp(pool.spec.replicas + memory.extra)
    if observe is not None:
        rotation.settle(pool, members=members, observe=observe, memory=memory, now=now, into=decision)
        rotation.finish_drains(pool, members=members, observe=observe, memory=memory, now=now, into=decision)
    # A child deleted in this pass no longer counts; the replacement of a deleted child counts instead.
    live = [m for m in members if m.name not in decision.delete]
    counted = counted_members(live, memory)
    pairs = rotation.pairs_of(members)
    in_flight = len(pairs) - sum(1 for new in pairs if new in decision.delete)
    if observe is None:  # a one-shot run serves no leases: the shape at once, a scaled-down child goes
        _scale(pool, members=live, counted=counted, memory=memory, now=now, room=None, into=decision)
        decision.delete += decision.drain
        decision.drain = []
        return decision
    room = pool.spec.max_unavailable_count() - in_flight - len(memory.scaling_down)
    room = _scale(pool, members=live, counted=counted, memory=memory, now=now, room=room, into=decision)
    moving = {old for _, old in decision.create if old is not None}
    busy = set(pairs.values()) | set(memory.draining) | set(decision.delete) | moving
    rotation.start_replacements(
        pool,
        candidates=[m for m in counted if m.name not in busy],
        in_flight=pool.spec.max_unavailable_count() - room,
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


def _scale(
    pool: ProxyPool,
    *,
    members: list[Member],
    counted: list[Member],
    memory: PoolMemory,
    now: float,
    room: int | None,
    into: Decision,
) -> int:
    """Bring each placement to its share; returns what is left of the budget (`room`; None: unbounded).

    A child being replaced counts on its replacement's placement (a move under way). Places short where
    others have too many are filled by replacing those (make-before-break); the rest of the places short
    get new children; the rest of the surplus is drained, oldest first (a child already being replaced
    last, it is leaving anyway)."""
    shares = spread(pool.spec.placement, into.desired)
    by_name = {m.name: m for m in members}
    new_of = {old: new for new, old in rotation.pairs_of(members).items()}

    def where(m: Member) -> str:
        new = new_of.get(m.name)
        return by_name[new].placement if new is not None else m.placement

    short: list[str] = []
    surplus = sorted(
        (m for m in counted if where(m) not in shares), key=lambda m: (m.name in new_of, m.born, m.name)
    )
    for key, want in shares.items():
        here = sorted(
            (m for m in counted if where(m) == key), key=lambda m: (m.name in new_of, m.born, m.name)
        )
        short += [key] * max(want - len(here), 0)
        surplus += here[: max(len(here) - want, 0)]
    if room is None:
        into.create += [(key, None) for key in short]
        _scale_down(surplus, memory=memory, now=now, into=into)
        return 0
    movers = [m for m in surplus if m.name not in new_of]
    matched = min(len(short), len(movers))
    into.create += [(key, None) for key in short[matched:]]  # more places than leavers: nothing leaves
    for key, old in zip(short[:matched], movers[:matched], strict=True):
        if room > 0 and memory.retry_at.get(old.name, now) <= now:
            into.create.append((key, old.name))
            into.events.append(f"replacing {old.name} on {old.placement} by a child on {key}: placement")
            room -= 1
    rest = [*movers[matched:], *(m for m in surplus if m.name in new_of)]
    take = rest[: max(room, 0)]
    _scale_down(take, memory=memory, now=now, into=into)
    return room - len(take)


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
