"""What a pool remembers between polls that its children's labels do not record.

Kept in memory only: after a restart a drain starts again (its leases are bounded by the drain timeout
anyway), a rollback's backoff starts afresh, and demand's adjustment returns to `spec.replicas`.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Observed:
    """What the signals say about one child now."""

    healthy: bool | None = None  # None: not probed yet
    unhealthy_since: float | None = None
    ban_clients: int = 0  # distinct clients that reported it banned within the rule's window
    last_leased: float | None = None
    leases_end: float | None = None  # when its last lease ends (a renewal never passes a drain)


@dataclass
class PoolMemory:
    draining: dict[str, float] = field(default_factory=dict)  # child -> when its drain began
    scaling_down: set[str] = field(default_factory=set)  # drained for a scale-down, until gone for good
    failures: dict[str, int] = field(default_factory=dict)  # child -> replacements of it rolled back
    retry_at: dict[str, float] = field(default_factory=dict)  # child -> earliest next replacement
    degraded: dict[str, str] = field(default_factory=dict)  # child -> why its replacement failed
    extra: int = 0  # demand's adjustment to spec.replicas
    demand_changed_at: float | None = None
    replicas_seen: int | None = None

    def forget_gone(self, names: set[str]) -> None:
        """Drop what concerns children that are no longer members."""
        for table in (self.draining, self.failures, self.retry_at, self.degraded):
            for name in set(table) - names:
                del table[name]
        self.scaling_down &= names


@dataclass
class Decision:
    """What one pass over a pool decided: children to create (placement key, the child it replaces),
    children to drain (discovery stops handing them out) and children whose deletion the pool declares.
    A held pool decides nothing (`held` says why)."""

    create: list[tuple[str, str | None]] = field(default_factory=list)
    drain: list[str] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    desired: int = 0
    held: str | None = None  # why the pool holds (service/pools/hold.py): nothing was decided
