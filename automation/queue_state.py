"""What the work queue knows about one stack: the live record and the snapshot it shows to others."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from enum import StrEnum

from automation.backoff import BackoffPolicy
from automation.errors import PermanentError, ProxyOperatorError, Reason, TransientError

logger = logging.getLogger("automation.queue")  # failures are the queue's story: one logger name


class QueueState(StrEnum):
    """Where a stack is in the queue.

    - `idle`: nothing to do.
    - `queued`: a run is requested and waits for a free worker.
    - `running`: the handler runs now (at most one run per stack).
    - `backoff`: the last run failed transiently; a retry is scheduled at `next_retry_at`.
    - `failed`: the last run failed permanently; no retry until the input changes.
    - `stalled`: `stall_after` consecutive failures. A transient cause still retries (`next_retry_at` set),
      a permanent one waits for new input.
    """

    IDLE = "idle"
    QUEUED = "queued"
    RUNNING = "running"
    BACKOFF = "backoff"
    FAILED = "failed"
    STALLED = "stalled"


ACTIVE_STATES = frozenset({QueueState.QUEUED, QueueState.RUNNING})


@dataclass(frozen=True)
class StackQueueState:
    """A read-only snapshot of one stack, for status, metrics and logs."""

    stack: str
    state: QueueState = QueueState.IDLE
    consecutive_failures: int = 0
    last_error: ProxyOperatorError | None = None
    next_retry_at: float | None = None
    runs: int = 0
    follow_up: bool = False
    generation_hint: object | None = None

    @property
    def reason(self) -> str | None:
        """The last error's reason, the word a Stalled condition or a metric label shows."""
        return self.last_error.reason if self.last_error else None


@dataclass
class StackEntry:
    """The queue's live record of one stack (mutated by the queue only, on the event loop)."""

    stack: str
    state: QueueState = QueueState.IDLE
    consecutive_failures: int = 0
    last_error: ProxyOperatorError | None = None
    next_retry_at: float | None = None
    runs: int = 0
    follow_up: bool = False  # submitted while running: one more run after this one
    follow_up_changed: bool = False  # ...and with input that differs from the running one
    hint: object | None = None  # generation hint of the latest submit
    run_hint: object | None = None  # generation hint the latest run started with

    def start_run(self) -> None:
        self.follow_up = self.follow_up_changed = False
        self.run_hint = self.hint
        self.runs += 1

    def record_success(self) -> None:
        self.consecutive_failures = 0
        self.last_error = None

    def record_failure(self, error: ProxyOperatorError) -> None:
        self.consecutive_failures += 1
        self.last_error = error

    def input_changed(self, hint: object | None) -> bool:
        """Whether a submit carries new input compared with the latest run (no hint counts as new)."""
        return hint is None or hint != self.run_hint

    def snapshot(self) -> StackQueueState:
        return StackQueueState(
            stack=self.stack,
            state=self.state,
            consecutive_failures=self.consecutive_failures,
            last_error=self.last_error,
            next_retry_at=self.next_retry_at,
            runs=self.runs,
            follow_up=self.follow_up,
            generation_hint=self.hint,
        )


@dataclass(frozen=True)
class FailurePlan:
    """What follows a failed run: the next state, and the delay before a retry (None: no retry)."""

    state: QueueState
    retry_in: float | None = None


def plan_after_failure(
    entry: StackEntry,
    error: ProxyOperatorError,
    *,
    policy: BackoffPolicy,
    rng: random.Random,
    stall_after: int,
) -> FailurePlan:
    """Decide the next step for a stack whose run just failed (its failure already recorded)."""
    if entry.follow_up and entry.follow_up_changed:
        return FailurePlan(QueueState.QUEUED)  # the input changed during the failed run: try it now
    stalled = entry.consecutive_failures >= stall_after
    if isinstance(error, PermanentError):
        return FailurePlan(QueueState.STALLED if stalled else QueueState.FAILED)
    if isinstance(error, TransientError) and error.retry_after is not None:
        delay = error.retry_after
    else:
        delay = policy.delay(entry.consecutive_failures, rng)
    return FailurePlan(QueueState.STALLED if stalled else QueueState.BACKOFF, retry_in=delay)


def log_failure(entry: StackEntry, error: ProxyOperatorError) -> None:
    extra = {"stack": entry.stack, "reason": error.reason, "failures": entry.consecutive_failures}
    if error.reason == Reason.UNEXPECTED:
        # Not one of ours: a bug or an untranslated library error. Retried as transient, shown loudly.
        logger.error(
            "run failed unexpectedly: %s", error.message, extra={"fields": extra}, exc_info=error.__cause__
        )
    else:
        logger.warning("run failed (%s): %s", error.reason, error.message, extra={"fields": extra})
