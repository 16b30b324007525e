"""Retry delays as data: full-jitter exponential backoff with a cap."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class BackoffPolicy:
    """Delay before retry n (n >= 1) is `uniform(0, min(cap, base * factor ** (n - 1)))` seconds.

    Full jitter spreads the retries of many stacks that failed together (a network blip) instead of
    sending them back in lockstep.
    """

    base: float = 5.0
    cap: float = 300.0
    factor: float = 2.0

    def __post_init__(self) -> None:
        if self.base <= 0:
            raise ValueError(f"backoff base must be > 0 seconds, got {self.base}")
        if self.cap < self.base:
            raise ValueError(f"backoff cap ({self.cap}) must be >= base ({self.base})")
        if self.factor < 1:
            raise ValueError(f"backoff factor must be >= 1, got {self.factor}")

    def ceiling(self, failures: int) -> float:
        """The largest delay after `failures` consecutive failures."""
        if failures < 1:
            raise ValueError(f"failures must be >= 1, got {failures}")
        # Compare exponents in log space: factor ** n overflows a float long before n is absurd.
        if self.factor > 1 and (failures - 1) * math.log(self.factor) >= math.log(self.cap / self.base):
            return self.cap
        return min(self.cap, self.base * self.factor ** (failures - 1))

    def delay(self, failures: int, rng: random.Random) -> float:
        """A random delay in [0, ceiling(failures)]; the rng is injected so tests can seed it."""
        return rng.uniform(0, self.ceiling(failures))
