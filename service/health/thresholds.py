"""Health thresholds as a pure function: previous health + one result -> next health (no I/O, no clock)."""

from __future__ import annotations

from dataclasses import dataclass

from service.inventory import Health, HealthState


@dataclass(frozen=True)
class Thresholds:
    """Unhealthy after `unhealthy` consecutive failures, healthy after `healthy` consecutive successes.

    A proxy never probed (`unknown`) is decided by its first result, so a new proxy serves after one probe.
    A `decisive` failure (no retry would make it safe to serve) is unhealthy at once.
    """

    unhealthy: int = 3
    healthy: int = 2

    def apply(
        self,
        previous: Health,
        *,
        ok: bool,
        at: float,
        latency: float | None = None,
        egress_ip: str | None = None,
        error: str | None = None,
        decisive: bool = False,
    ) -> Health:
        if ok:
            successes, failures = previous.consecutive_successes + 1, 0
            turn = previous.state is HealthState.unknown or successes >= self.healthy
            state = HealthState.healthy if turn else previous.state
        else:
            successes, failures = 0, previous.consecutive_failures + 1
            turn = decisive or previous.state is HealthState.unknown or failures >= self.unhealthy
            state = HealthState.unhealthy if turn else previous.state
        return Health(
            state=state,
            egress_ip=egress_ip if ok and egress_ip else previous.egress_ip,
            consecutive_failures=failures,
            consecutive_successes=successes,
            last_probe_at=at,
            last_latency_seconds=latency if latency is not None else previous.last_latency_seconds,
            last_error=None if ok else error,
        )
