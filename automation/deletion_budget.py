"""The deletion budget: a change that would remove a large share of the running fleet stops and asks.

Evaluated on each read's whole set of declared deletions against the whole applied fleet, before any stack
is submitted. A change over budget removes nothing until someone allows exactly that change: its id is a
digest of the keys it removes, so an allowance covers that one change and no later one, and it is used up
once the change is applied. Emptying the fleet on purpose is that one explicit step. Deletions a pool decides
(rotation, scale-down) are bounded by the pool's own `maxUnavailable`, not by this budget.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from stacks.spec_hash import sha256_hex


@dataclass(frozen=True)
class DeletionBudget:
    """Over budget: more than `max_share` of the fleet AND more than `min_count` proxies at once."""

    max_share: float = 0.5
    min_count: int = 5

    def exceeded(self, removing: int, fleet: int) -> bool:
        return removing > self.min_count and removing > self.max_share * fleet


@dataclass(frozen=True)
class HeldDeletion:
    """A change the budget stopped: what it would remove, out of how many, and the id that allows it."""

    change_id: str
    keys: tuple[str, ...]
    fleet: int
    already: int = 0  # removals of the same deletion window that went before (service/deletions.py)

    def message(self, *, budget: DeletionBudget) -> str:
        earlier = (
            f" ({self.already} more already removed in this deletion window count toward the budget)"
            if self.already
            else ""
        )
        return (
            f"this change would remove {len(self.keys)} of {self.fleet} running proxies{earlier} (more than "
            f"{budget.max_share:.0%} and more than {budget.min_count}): nothing was removed. If you mean it, "
            f"allow change {self.change_id} once (`proxy-operator up --allow-deletions {self.change_id}`, or "
            f"POST /v1/deletions/{self.change_id}/allow on a running service); otherwise restore the Proxies"
        )


def change_id(keys: Iterable[str]) -> str:
    """A short, stable digest of the set of keys a change removes."""
    return sha256_hex(sorted(set(keys)))[:12]


def assess(
    removing: Iterable[str], *, fleet: int, budget: DeletionBudget, allowed: set[str]
) -> HeldDeletion | None:
    """None when the removal may go ahead (within budget, or allowed by its id); else what was held."""
    keys = tuple(sorted(set(removing)))
    if not budget.exceeded(len(keys), fleet):
        return None
    held = HeldDeletion(change_id=change_id(keys), keys=keys, fleet=fleet)
    return None if held.change_id in allowed else held
