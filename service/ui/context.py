"""What the page reads, passed in explicitly: the API's context plus the page's own parts."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from service.pools.history import PoolDecision
from service.ui.index import FleetIndex
from service.ui.probes import ProbeHistory
from service.ui.session import Sessions
from service.ui.settings import UiSettings
from stacks.models import ProxyPoolStatus


@dataclass(frozen=True)
class StackRow:
    """One stack as the page shows it, from what the service keeps (queue state, applied outputs, the
    reconciler's last update). Flat and JSON-friendly (str, int, float, None, tuples of str): a leader
    publishes these to its followers with `dataclasses.asdict`."""

    name: str
    owner: str
    state: str  # the queue's word: idle, queued, running, backoff, failed, stalled
    runs: int = 0
    consecutive_failures: int = 0
    reason: str | None = None
    error: str | None = None
    next_retry_at: float | None = None  # wall-clock seconds
    outputs: tuple[str, ...] = ()  # output names; values are never shown (they hold credentials)
    last_kind: str | None = None  # the last update: up or destroy (None: none since this process started)
    last_result: str | None = None  # succeeded, failed
    last_reason: str | None = None  # a failed update's reason (StackLocked, NetworkError, ...)
    last_started_at: float | None = None  # wall-clock seconds
    last_seconds: float | None = None
    last_changes: tuple[str, ...] = ()  # the engine's resource counts as words: ("create 2", "same 5")
    lock: str | None = None  # "held by this replica (running)", "held by root@pod-1 (pid 7)", or None


StacksSource = Callable[[], Sequence[StackRow]]
DesiredHash = Callable[[str], str | None]  # a proxy's spec hash as the control loop sees it now


@dataclass(frozen=True)
class HeldView:
    """A held deletion as the page shows it: the leader's own, or as it published it for the followers
    (`keys` may then be the first of `count`)."""

    change_id: str
    keys: tuple[str, ...]
    count: int
    fleet: int
    message: str


HeldSource = Callable[[], HeldView | None]


@dataclass(frozen=True)
class Forgotten:
    """A proxy skip-cleanup forgot: gone from state, its resources left running."""

    key: str
    message: str
    at: float  # wall time


@dataclass
class LoginLimiter:
    """At most `attempts` log in tries per source address per minute (a sliding window)."""

    attempts: int
    clock: Callable[[], float] = time.monotonic
    _tries: dict[str, deque[float]] = field(default_factory=dict)

    def allow(self, source: str) -> float | None:
        """None if this try may go on, else seconds until one may."""
        now = self.clock()
        tries = self._tries.setdefault(source, deque())
        while tries and tries[0] <= now - 60:
            tries.popleft()
        if len(tries) >= self.attempts:
            return 60 - (now - tries[0])
        tries.append(now)
        if len(self._tries) > 10_000:  # forget idle sources rather than grow
            self._tries = {k: v for k, v in self._tries.items() if v and v[-1] > now - 60}
        return None


@dataclass
class UiContext:
    settings: UiSettings
    sessions: Sessions
    index: FleetIndex
    limiter: LoginLimiter
    stacks: StacksSource | None = None
    probes: ProbeHistory | None = None
    pools: Callable[[], Mapping[str, ProxyPoolStatus]] | None = None
    leader: Callable[[], str | None] | None = None  # who leads, seen from a follower (None: this replica)
    held: HeldSource | None = None  # the held deletion (a follower's: from the leader's summary)
    decisions: Callable[[], Sequence[PoolDecision]] | None = None  # the pools' last, newest first
    forgotten: Callable[[], Sequence[Forgotten]] | None = None  # what skip-cleanup forgot, newest first
    # On a follower: where the leader-only views come from ("published by pod-0 at ..."), or why they are
    # missing; None on the leader (or with no leader election).
    provenance: Callable[[], str | None] | None = None
    desired: DesiredHash | None = None  # None: no control loop here (a follower, an API-only process)
