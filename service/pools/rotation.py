"""Replacement: a new child first, the old one drained once the new one is healthy, then deleted.

At most `maxUnavailable` replacements run at once. A new child that is not healthy within `readyTimeout`
is deleted again (rolled back), the pool shows `Degraded` with the reason, and the next attempt for that
child waits `backoff * 2**(failures-1)`, at most an hour.
"""

from __future__ import annotations

from collections.abc import Callable

from service.pools.memory import Decision, Observed, PoolMemory
from service.pools.naming import Member
from stacks.models import ProxyPool
from stacks.models.pool import seconds

BACKOFF_CAP = 3600.0
Observe = Callable[[Member], Observed]


def pairs_of(members: list[Member]) -> dict[str, str]:
    """new child -> the child it replaces, while that one is still a member."""
    names = {m.name for m in members}
    return {m.name: m.replaces for m in members if m.replaces is not None and m.replaces in names}


def settle(
    pool: ProxyPool,
    *,
    members: list[Member],
    observe: Observe,
    memory: PoolMemory,
    now: float,
    into: Decision,
) -> None:
    """Each replacement in flight: healthy -> drain the old child; too late -> roll back."""
    by_name = {m.name: m for m in members}
    ready_timeout = seconds(pool.spec.rotation.ready_timeout)
    for new, old in pairs_of(members).items():
        if old in memory.draining:
            continue
        fresh = by_name[new]
        if observe(fresh).healthy:
            memory.draining[old] = now
            memory.degraded.pop(old, None)
            memory.failures.pop(old, None)
            into.drain.append(old)
            into.events.append(f"{new} is healthy: draining {old}, which it replaces")
        elif now - fresh.born >= ready_timeout:
            _roll_back(pool, new=new, old=old, memory=memory, now=now, into=into)


def _roll_back(
    pool: ProxyPool, *, new: str, old: str, memory: PoolMemory, now: float, into: Decision
) -> None:
    failures = memory.failures.get(old, 0) + 1
    memory.failures[old] = failures
    wait = min(BACKOFF_CAP, seconds(pool.spec.rotation.backoff) * 2 ** (failures - 1))
    memory.retry_at[old] = now + wait
    reason = (
        f"replacement {new} of {old} was not healthy within readyTimeout "
        f"{pool.spec.rotation.ready_timeout}: rolled back ({failures} failure(s)); "
        f"{old} keeps serving, next attempt in {wait:g}s"
    )
    memory.degraded[old] = reason
    into.delete.append(new)
    into.events.append(reason)


def finish_drains(
    pool: ProxyPool,
    *,
    members: list[Member],
    observe: Observe,
    memory: PoolMemory,
    now: float,
    into: Decision,
) -> None:
    """A drained child goes once its leases ended, or at the drain timeout."""
    timeout = seconds(pool.spec.rotation.drain_timeout)
    for member in members:
        began = memory.draining.get(member.name)
        if began is None:
            continue
        ends = observe(member).leases_end
        if ends is None or ends <= now or now - began >= timeout:
            into.delete.append(member.name)
            into.events.append(f"{member.name} drained: its deletion is declared by the pool")


def why_replace(pool: ProxyPool, member: Member, seen: Observed, *, now: float) -> tuple[int, str] | None:
    """(priority, reason) when the rotation rules want `member` replaced; lower priority goes first."""
    rotation = pool.spec.rotation
    sick_for = None if seen.unhealthy_since is None else now - seen.unhealthy_since
    if (
        rotation.unhealthy_after is not None
        and sick_for is not None
        and sick_for >= seconds(rotation.unhealthy_after)
    ):
        return 0, f"unhealthy for more than {rotation.unhealthy_after}"
    rule = rotation.replace_after_bans
    if rule is not None and seen.ban_clients >= rule.count:
        return 0, f"banned by {seen.ban_clients} distinct clients within {rule.window}"
    if rotation.max_age is not None and now - member.born >= seconds(rotation.max_age):
        return 1, f"older than maxAge {rotation.max_age}"
    return None


def start_replacements(
    pool: ProxyPool,
    *,
    candidates: list[Member],
    in_flight: int,
    observe: Observe,
    memory: PoolMemory,
    now: float,
    into: Decision,
) -> None:
    """Replace the children the rules name, most urgent then oldest first, within maxUnavailable."""
    room = pool.spec.max_unavailable_count() - in_flight
    wanted: list[tuple[int, float, Member, str]] = []
    for member in candidates:
        if memory.retry_at.get(member.name, now) > now:
            continue
        why = why_replace(pool, member, observe(member), now=now)
        if why is not None:
            wanted.append((why[0], member.born, member, why[1]))
    for _, _, member, reason in sorted(wanted, key=lambda w: (w[0], w[1], w[2].name))[: max(room, 0)]:
        into.create.append((member.placement, member.name))
        into.events.append(f"replacing {member.name}: {reason}")
