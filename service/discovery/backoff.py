"""Ban penalties: full-jitter exponential backoff, the schedule as data."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FullJitter:
    """Penalty after the (n+1)-th ban in a row: uniform(0, min(cap, base * 2**n)) seconds."""

    base: float = 300.0
    cap: float = 3600.0

    def ceiling(self, strikes_before: int) -> float:
        return min(self.cap, self.base * 2 ** min(strikes_before, 40))

    def delay(self, strikes_before: int, fraction: float) -> float:
        """`fraction` is a uniform draw in [0, 1) from the injected random source."""
        return fraction * self.ceiling(strikes_before)
