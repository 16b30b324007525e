"""Each stack's last update as the reconciler ran it: kind, result, when, how long, resource counts.

Kept by the reconciler in memory (one small record per stack, replaced at each `up` or `destroy`), so a
page or a log can say how the last update went without a Pulumi CLI call. The counts are the engine's
`summary.resource_changes` (create, same, update, delete, replace...); a failed update has none (the CLI
raised before it wrote a summary), its reason and message instead, and the lock holders when a stack lock
held elsewhere stopped it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from automation.engine import OperationResult
from automation.errors import Reason, StackLockedError

SUCCEEDED = "succeeded"
FAILED = "failed"


@dataclass(frozen=True)
class LastUpdate:
    """`kind`: `up` or `destroy`, the reconciler's words (a drift check previews and is not an update)."""

    kind: str
    result: str  # succeeded, failed
    started_at: float  # wall-clock seconds
    seconds: float
    changes: Mapping[str, int] = field(default_factory=dict)
    reason: str | None = None  # a failure's reason (automation/errors.py)
    message: str | None = None
    lock_holders: tuple[str, ...] = ()  # a failure on a stack lock: who holds it, as the engine reports

    @property
    def counts(self) -> tuple[str, ...]:
        """The non-zero counts as words, by operation name: ("create 2", "same 5")."""
        return tuple(f"{op} {n}" for op, n in sorted(self.changes.items()) if n)


@dataclass
class UpdateLog:
    """The last update per stack. `clock`: wall-clock seconds (injected, so tests control time)."""

    clock: Callable[[], float] = time.time
    _last: dict[str, LastUpdate] = field(default_factory=dict)

    def get(self, stack: str) -> LastUpdate | None:
        return self._last.get(stack)

    def start(self) -> float:
        return self.clock()

    def succeeded(self, stack: str, *, kind: str, started_at: float, result: OperationResult | None) -> None:
        self._last[stack] = LastUpdate(
            kind=kind,
            result=SUCCEEDED,
            started_at=started_at,
            seconds=max(0.0, self.clock() - started_at),
            changes=dict(result.changes) if result is not None else {},
        )

    def failed(self, stack: str, *, kind: str, started_at: float, error: BaseException) -> None:
        self._last[stack] = LastUpdate(
            kind=kind,
            result=FAILED,
            started_at=started_at,
            seconds=max(0.0, self.clock() - started_at),
            reason=getattr(error, "reason", None) or Reason.UNEXPECTED,
            message=getattr(error, "message", None) or str(error) or type(error).__name__,
            lock_holders=error.holders if isinstance(error, StackLockedError) else (),
        )

    def forget(self, stack: str) -> None:
        self._last.pop(stack, None)
