"""The last decisions of the pools (replacements, scaling, drains) with their reasons, for the fleet page.

Each pass's decision events are logged (and, in a cluster, Warning Events say what failed); this keeps the
last `size` of them in memory, newest last, so the Pools view can show what was replaced and why without a
log search. About 200 bytes an entry (40 KiB at the default size).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class PoolDecision:
    at: float  # wall time
    pool: str  # namespace/name
    message: str


@dataclass
class PoolHistory:
    size: int = 200
    clock: Callable[[], float] = time.time
    _entries: deque[PoolDecision] = field(init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._entries = deque(maxlen=self.size)

    def record(self, pool: str, messages: list[str]) -> None:
        if not messages:
            return
        at = self.clock()
        with self._lock:
            self._entries.extend(PoolDecision(at=at, pool=pool, message=m) for m in messages)

    def recent(self, limit: int = 50) -> list[PoolDecision]:
        """Newest first."""
        with self._lock:
            return list(reversed(self._entries))[:limit]
