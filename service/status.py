"""Proxy status and events as the service saw them: only transitions are recorded.

In a cluster this is what the Kubernetes source writes to each Proxy's status subresource and posts as
events; in directory mode it is kept in memory and shown by the CLI and the API.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from stacks.models import Address, Condition, ProxyStatus
from stacks.models.conditions import ConditionType, Reason, phase_of

__all__ = ["Event", "Reason", "StatusBoard"]

log = logging.getLogger("service.events")


@dataclass(frozen=True)
class Event:
    key: str
    reason: str
    message: str
    warning: bool
    at: datetime


@dataclass
class StatusBoard:
    now: Callable[[], datetime] = lambda: datetime.now(UTC)
    _status: dict[str, ProxyStatus] = field(default_factory=dict)
    _events: deque[Event] = field(default_factory=lambda: deque(maxlen=1000))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, key: str) -> ProxyStatus:
        with self._lock:
            return self._status.get(key, ProxyStatus()).model_copy(deep=True)

    def all(self) -> dict[str, ProxyStatus]:
        with self._lock:
            return {key: status.model_copy(deep=True) for key, status in self._status.items()}

    def held(self) -> dict[str, Condition]:
        """Proxies running their last applied version instead of the declared one, with the Held condition."""
        with self._lock:
            return {
                key: condition.model_copy()
                for key, status in self._status.items()
                for condition in status.conditions
                if condition.type == ConditionType.HELD and condition.status == "True"
            }

    def events(self, key: str | None = None) -> list[Event]:
        with self._lock:
            return [e for e in self._events if key is None or e.key == key]

    def event(self, key: str, *, reason: str, message: str, warning: bool = False) -> None:
        with self._lock:
            self._events.append(
                Event(key=key, reason=reason, message=message, warning=warning, at=self.now())
            )
        log.log(
            logging.WARNING if warning else logging.INFO,
            "%s %s: %s",
            key,
            reason,
            message,
            extra={"fields": {"proxy": key, "reason": reason}},
        )

    def set_condition(
        self, key: str, *, type_: str, true: bool, reason: str, message: str = "", warning: bool = False
    ) -> bool:
        """Set one condition; returns True (and records an event) only on a transition."""
        wanted = "True" if true else "False"
        with self._lock:
            status = self._status.setdefault(key, ProxyStatus())
            current = next((c for c in status.conditions if c.type == type_), None)
            if current and (current.status, current.reason, current.message) == (wanted, reason, message):
                return False
            status.conditions = [c for c in status.conditions if c.type != type_]
            status.conditions.append(
                Condition(
                    type=type_, status=wanted, reason=reason, message=message, last_transition_time=self.now()
                )
            )
            status.phase = _phase(status)
        self.event(key, reason=reason, message=message or f"{type_}={wanted}", warning=warning)
        return True

    def set_applied(self, key: str, *, stack: str, spec_hash: str, address: Address | None) -> None:
        with self._lock:
            status = self._status.setdefault(key, ProxyStatus())
            status.stack, status.observed_spec_hash, status.address = stack, spec_hash, address
            status.phase = _phase(status)

    def set_egress(self, key: str, egress_ip: str | None) -> None:
        with self._lock:
            if key in self._status:
                self._status[key].egress_ip = egress_ip

    def drop(self, key: str) -> None:
        with self._lock:
            self._status.pop(key, None)


def _phase(status: ProxyStatus) -> str:
    return phase_of({c.type: c.status for c in status.conditions})
