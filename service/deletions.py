"""The deletion gate: declared deletions pass the deletion budget over a window, not one poll at a time.

A mass deletion reaches the service over many events and polls (`kubectl delete proxies --all`, a
namespace or CRD deletion, a folder emptied over several commits). Judged one poll at a time, 20 deletions
in one poll were held while the same 20 in five polls of four all went. So removals are judged together:

- A **window** opens at the first removal (a deletion of an applied proxy that is not skip-cleanup),
  recording the fleet as it stood then. It stays open while removals keep coming: until none has been
  declared for `horizon` seconds.
- Pending removals are judged at a **quiet point**: `quiet` seconds with no new deletion (or `longest`
  seconds after the oldest pending one, so a steady trickle is judged too). Every removal of the window
  counts, those already let through included, against the fleet at the window's opening: once the
  window's total is over budget, what is pending is held as one change with one id, and later
  deletions join it (a new id, reported again) until someone allows it.
- An allowance names one change id and is used up once that change's proxies are released. Allowances
  live in the `Allowances` the in-cluster mode keeps across terms, so a new leader honours the one given
  to the old. Only a held change can be allowed: an unknown id is refused and recorded nowhere.
- Deletions that remove nothing (skip-cleanup forgets, never applied) are not held, and do not count.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from automation.deletion_budget import DeletionBudget, HeldDeletion, change_id
from stacks.models import Proxy


@dataclass
class Allowances:
    """The change ids someone allowed (POST /v1/deletions/{id}/allow, `up --allow-deletions`), each with
    the proxies it still has to remove: an allowance is used up once the last of them is released, not
    when it is judged, so a handover between the allowance and the removal does not lose it."""

    remaining: dict[str, set[str] | None] = field(default_factory=dict)  # None: keys not known yet

    @property
    def ids(self) -> set[str]:
        return set(self.remaining)

    def grant(self, change_id: str, keys: tuple[str, ...] | None = None) -> None:
        self.remaining[change_id] = set(keys) if keys is not None else None

    def covers(self, change_id: str, keys: tuple[str, ...]) -> bool:
        if change_id not in self.remaining:
            return False
        if self.remaining[change_id] is None:
            self.remaining[change_id] = set(keys)
        return True

    def released(self, key: str) -> None:
        for allowed, keys in list(self.remaining.items()):
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self.remaining[allowed]


@dataclass
class Window:
    opened_at: float
    fleet: int  # applied proxies when the window opened
    last_declared: float
    removed: set[str] = field(default_factory=set)  # let through in this window


class DeletionGate:
    """Holds declared deletions until a quiet point, then lets them go or holds them (see the module)."""

    def __init__(
        self,
        budget: DeletionBudget,
        *,
        monotonic: Callable[[], float],
        allowances: Allowances | None = None,
        quiet: float = 2.0,
        longest: float = 30.0,
        horizon: float = 600.0,
    ) -> None:
        self.budget = budget
        self.allowances = allowances or Allowances()
        self._monotonic = monotonic
        self.quiet, self.longest, self.horizon = quiet, longest, horizon
        self.pending: dict[str, Proxy] = {}
        self._first_pending: float | None = None
        self.window: Window | None = None
        self.held: HeldDeletion | None = None

    def declare(self, proxies: Iterable[Proxy], *, fleet: int) -> None:
        now = self._monotonic()
        for proxy in proxies:
            self.pending[proxy.key] = proxy
            if self._first_pending is None:
                self._first_pending = now
            if self.window is None or now - self.window.last_declared > self.horizon:
                self.window = Window(opened_at=now, fleet=fleet, last_declared=now)
            self.window.last_declared = now

    def withdraw(self, key: str) -> None:
        """Declared again (a new object of that name): no longer leaving."""
        self.pending.pop(key, None)
        if not self.pending:
            self._first_pending = None

    def due_in(self) -> float | None:
        """Seconds until pending deletions are judged; None when nothing waits for a quiet point."""
        if not self.pending or self.window is None or self.held is not None:
            return None
        now = self._monotonic()
        quiet_at = self.window.last_declared + self.quiet
        oldest_at = (self._first_pending or now) + self.longest
        return max(0.0, min(quiet_at, oldest_at) - now)

    def judge(self, *, removes: Callable[[Proxy], bool]) -> tuple[list[Proxy], HeldDeletion | None]:
        """What may go now, and the change held (None when nothing is). `removes(proxy)`: does its deletion
        remove resources (applied, not skip-cleanup)? Those that do not go at once."""
        free = [proxy for proxy in self.pending.values() if not removes(proxy)]
        for proxy in free:
            self.pending.pop(proxy.key)
        removing = list(self.pending)
        if not removing:
            self._first_pending, self.held = None, None
            return free, None
        due = self.due_in()
        if due is not None and due > 0:
            return free, None  # still arriving: judged at the quiet point
        assert self.window is not None
        already = self.window.removed - set(removing)
        fleet = max(self.window.fleet, len(removing) + len(already))
        if self.budget.exceeded(len(removing) + len(already), fleet):
            held = HeldDeletion(
                change_id=change_id(removing), keys=tuple(sorted(removing)), fleet=fleet, already=len(already)
            )
            if not self.allowances.covers(held.change_id, held.keys):
                self.held = held
                return free, held
        self.held = None
        released = [self.pending[key] for key in removing]
        self.window.removed |= set(removing)
        self.pending.clear()
        self._first_pending = None
        return free + released, None

    def allow(self, change_id: str) -> bool:
        """Allow the held change with this id; False (nothing recorded) when no such change is held."""
        if self.held is None or self.held.change_id != change_id:
            return False
        self.allowances.grant(change_id, self.held.keys)
        self.held = None  # judged again at once: the allowance lets it through
        return True

    def tick(self) -> None:
        """Close a window idle for longer than its horizon (its removals no longer count)."""
        idle = self.window is not None and self._monotonic() - self.window.last_declared > self.horizon
        if idle and not self.pending:
            self.window = None
