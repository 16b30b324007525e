"""How long to wait before the next try when the API cannot be reached: data, not code."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """Exponential with equal jitter: try n (0, 1, ...) waits between half and all of
    min(cap, base * 2**n) seconds, so many clients that lost the API together come back spread out."""

    base: float = 0.5
    cap: float = 8.0

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        ceiling = min(self.cap, self.base * 2 ** min(attempt, 32))
        return ceiling / 2 + (rng or random).uniform(0, ceiling / 2)
