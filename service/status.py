"""Proxy status and events as the service saw them: only transitions are recorded.

In a cluster, listeners (`subscribe`, `subscribe_events`) carry it to each Proxy's status subresource and to
Kubernetes Events (service/kube); in directory mode it is kept in memory and shown by the CLI and the API.
A listener is called after the change, outside the board's lock, on the caller's thread: it must be quick.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from stacks.models import Address, Condition, LastOperation, ProxyStatus
from stacks.models.conditions import ConditionType, Operation, Reason, phase_of, ready_of

__all__ = ["Event", "Operation", "Reason", "StatusBoard"]

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
    _deleting: set[str] = field(default_factory=set)
    _ready: dict[str, Condition] = field(default_factory=dict)  # the derived Ready condition per key
    _events: deque[Event] = field(default_factory=lambda: deque(maxlen=1000))
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _listeners: list[Callable[[str], None]] = field(default_factory=list)
    _event_listeners: list[Callable[[Event], None]] = field(default_factory=list)

    def subscribe(self, listener: Callable[[str], None]) -> None:
        """Call `listener(key)` after every change of that key's status (a drop included)."""
        self._listeners.append(listener)

    def subscribe_events(self, listener: Callable[[Event], None]) -> None:
        """Call `listener(event)` after every recorded event."""
        self._event_listeners.append(listener)

    def get(self, key: str) -> ProxyStatus:
        with self._lock:
            return self._status.get(key, ProxyStatus()).model_copy(deep=True)

    def published(self, key: str) -> ProxyStatus | None:
        """The status as the cluster shows it: with the derived Ready condition; None once dropped."""
        with self._lock:
            status = self._status.get(key)
            if status is None:
                return None
            shown = status.model_copy(deep=True)
            shown.conditions.append(self._ready[key].model_copy())
            return shown

    def tracked(self) -> list[str]:
        """The keys that have a status."""
        with self._lock:
            return list(self._status)

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
        recorded = Event(key=key, reason=reason, message=message, warning=warning, at=self.now())
        with self._lock:
            self._events.append(recorded)
        log.log(
            logging.WARNING if warning else logging.INFO,
            "%s %s: %s",
            key,
            reason,
            message,
            extra={"fields": {"proxy": key, "reason": reason}},
        )
        for listener in self._event_listeners:
            listener(recorded)

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
            self._derive(key, status)
        self._changed(key)
        self.event(key, reason=reason, message=message or f"{type_}={wanted}", warning=warning)
        return True

    def seed_condition(self, key: str, condition: Condition) -> None:
        """Take a condition as another writer left it (a previous leader), transition time kept, no event:
        a new leader continues from the cluster's status instead of overwriting it."""

        def seed(status: ProxyStatus) -> None:
            status.conditions = [c for c in status.conditions if c.type != condition.type]
            status.conditions.append(condition.model_copy())

        self._update(key, seed, create=True)

    def set_applied(
        self, key: str, *, stack: str, spec_hash: str, address: Address | None, generation: int | None = None
    ) -> None:
        """What its stack applied; `generation` is the Proxy's metadata.generation that was planned."""

        def apply(status: ProxyStatus) -> None:
            status.stack, status.observed_spec_hash, status.address = stack, spec_hash, address
            if generation is not None:
                status.observed_generation = generation

        self._update(key, apply, create=True)

    def observe(self, key: str, *, generation: int) -> None:
        """The control loop has taken in this metadata.generation of the Proxy (`observedGeneration`)."""
        self._update(key, lambda status: setattr(status, "observed_generation", generation), create=True)

    def set_egress(self, key: str, egress_ip: str | None) -> None:
        self._update(key, lambda status: setattr(status, "egress_ip", egress_ip), create=False)

    def operation_started(self, key: str, *, type_: str, message: str = "") -> None:
        """A run of this proxy's stack (`Operation.UP`, ...) began: Provisioning while nothing is applied."""
        started = LastOperation(
            type=type_, result=Operation.IN_PROGRESS, started_at=self.now(), message=message
        )
        self._update(key, lambda status: setattr(status, "last_operation", started), create=True)

    def operation_finished(self, key: str, *, type_: str, succeeded: bool, message: str = "") -> None:
        """That run ended; record only runs that concern this proxy (see docs/decisions.md)."""

        def finish(status: ProxyStatus) -> None:
            last = status.last_operation
            started = last.started_at if last is not None and last.type == type_ else None
            status.last_operation = LastOperation(
                type=type_,
                result=Operation.SUCCEEDED if succeeded else Operation.FAILED,
                started_at=started,
                finished_at=self.now(),
                message=message,
            )

        self._update(key, finish, create=True)

    def set_deleting(self, key: str, deleting: bool = True) -> None:
        """Its deletion is declared (phase Deleting until `drop`)."""
        with self._lock:
            if (key in self._deleting) == deleting:
                return
            (self._deleting.add if deleting else self._deleting.discard)(key)
            status = self._status.setdefault(key, ProxyStatus()) if deleting else self._status.get(key)
            if status is not None:
                self._derive(key, status)
        self._changed(key)

    def drop(self, key: str) -> None:
        with self._lock:
            existed = self._status.pop(key, None) is not None
            self._ready.pop(key, None)
            self._deleting.discard(key)
        if existed:
            self._changed(key)

    def _update(self, key: str, change: Callable[[ProxyStatus], None], *, create: bool) -> None:
        """Apply `change` to the key's status; derive and tell the listeners only when something changed."""
        with self._lock:
            status = self._status.get(key)
            if status is None and not create:
                return
            before = status.model_copy(deep=True) if status is not None else None
            status = self._status.setdefault(key, ProxyStatus())
            change(status)
            if status == before:
                return
            self._derive(key, status)
        self._changed(key)

    def _derive(self, key: str, status: ProxyStatus) -> None:
        """Phase and Ready from the conditions (under the lock); Ready's time moves with its status only."""
        running = status.last_operation is not None and status.last_operation.result == Operation.IN_PROGRESS
        deleting = key in self._deleting
        status.phase = phase_of(_statuses(status), running=running, deleting=deleting)
        ready = _ready(status, running=running, deleting=deleting)
        old = self._ready.get(key)
        if old is not None and old.status == ready.status:
            ready.last_transition_time = old.last_transition_time
        else:
            ready.last_transition_time = self.now()
        self._ready[key] = ready

    def _changed(self, key: str) -> None:
        for listener in self._listeners:
            listener(key)


def _statuses(status: ProxyStatus) -> dict[str, str]:
    return {c.type: c.status for c in status.conditions}


def _ready(status: ProxyStatus, *, running: bool, deleting: bool) -> Condition:
    """The derived Ready condition; when False it borrows the reason and message of what stands in the way."""
    true, reason = ready_of(_statuses(status), running=running, deleting=deleting)
    cause = next((c for c in status.conditions if c.type == _CAUSES.get(reason)), None)
    if cause is not None:
        reason, message = cause.reason, cause.message
    else:
        message = _READY_MESSAGES.get(reason, "")
    return Condition(
        type=ConditionType.READY, status="True" if true else "False", reason=reason, message=message
    )


# Which condition explains a Ready=False reason of `ready_of`.
_CAUSES = {
    Reason.STALLED: ConditionType.STALLED,
    ConditionType.HELD: ConditionType.HELD,
    Reason.NOT_PROVISIONED: ConditionType.PROVISIONED,
    Reason.PROBE_FAILED: ConditionType.HEALTHY,
}
_READY_MESSAGES = {
    Reason.READY: "applied as declared and answering its probes (or not probed yet)",
    Reason.PROVISIONING: "a run of its stack is in progress",
    Reason.NOT_PROVISIONED: "not applied yet",
    Reason.DELETING: "its deletion is declared: its resources are being removed",
}
