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
from datetime import UTC, datetime, timedelta
from typing import Protocol

from stacks.compact import STATUS_PACKER
from stacks.models import Address, Condition, LastOperation, ProxyStatus
from stacks.models.conditions import ConditionType, Operation, Reason, phase_of, ready_of

__all__ = ["Event", "Operation", "Reason", "StatusBoard", "StatusReader"]

log = logging.getLogger("service.events")


@dataclass(frozen=True)
class Event:
    key: str
    reason: str
    message: str
    warning: bool
    at: datetime


class StatusReader(Protocol):
    """What the API and the fleet page read of a status board (service/status_view.py: a follower's)."""

    def subscribe(self, listener: Callable[[str], None]) -> None: ...
    def get(self, key: str) -> ProxyStatus: ...
    def published(self, key: str) -> ProxyStatus | None: ...
    def tracked(self) -> list[str]: ...
    def has(self, key: str) -> bool: ...
    def all(self) -> dict[str, ProxyStatus]: ...
    def held(self) -> dict[str, Condition]: ...
    def events(self, key: str | None = None) -> list[Event]: ...


@dataclass
class StatusBoard:
    """The status of every proxy. Each is kept as deflated JSON (`_pack`), a tenth of a model's size (a
    cluster has 10,000 Proxies), and decoded where it is read or changed: callers get their own copy. The
    derived Ready condition is derived again where it is shown; only its status and time are kept."""

    now: Callable[[], datetime] = lambda: datetime.now(UTC)
    _status: dict[str, bytes] = field(default_factory=dict)  # key -> ProxyStatus
    _deleting: set[str] = field(default_factory=set)
    # key -> the derived Ready condition's status and the time it took it, as one int (`_ready_entry`)
    _ready: dict[str, int] = field(default_factory=dict)
    _held: set[str] = field(default_factory=set)  # keys with Held=True
    _events: deque[Event] = field(default_factory=lambda: deque(maxlen=1000))
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _listeners: list[Callable[[str], None]] = field(default_factory=list)
    _event_listeners: list[Callable[[Event], None]] = field(default_factory=list)
    # A condition as another writer (a previous leader) left it in the cluster, by key and type: the first
    # set_condition of a key's condition that agrees with it takes it over (see set_condition).
    previous: Callable[[str, str], Condition | None] = lambda _key, _type: None

    def subscribe(self, listener: Callable[[str], None]) -> None:
        """Call `listener(key)` after every change of that key's status (a drop included)."""
        self._listeners.append(listener)

    def subscribe_events(self, listener: Callable[[Event], None]) -> None:
        """Call `listener(event)` after every recorded event."""
        self._event_listeners.append(listener)

    def get(self, key: str) -> ProxyStatus:
        with self._lock:
            packed = self._status.get(key)
        return ProxyStatus() if packed is None else _unpack_status(packed)

    def published(self, key: str) -> ProxyStatus | None:
        """The status as the cluster shows it: with the derived Ready condition; None once dropped."""
        with self._lock:
            packed, ready = self._status.get(key), self._ready.get(key)
            deleting = key in self._deleting
        if packed is None or ready is None:
            return None
        shown = _unpack_status(packed)
        condition = _ready(shown, deleting=deleting)
        condition.last_transition_time = _ready_since(ready)
        shown.conditions.append(condition)
        return shown

    def tracked(self) -> list[str]:
        """The keys that have a status."""
        with self._lock:
            return list(self._status)

    def has(self, key: str) -> bool:
        with self._lock:
            return key in self._status

    def all(self) -> dict[str, ProxyStatus]:
        with self._lock:
            packed = dict(self._status)
        return {key: _unpack_status(text) for key, text in packed.items()}

    def held(self) -> dict[str, Condition]:
        """Proxies running their last applied version instead of the declared one, with the Held condition."""
        with self._lock:
            packed = {key: self._status[key] for key in self._held}
        return held_conditions({key: _unpack_status(text) for key, text in packed.items()})

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
        """Set one condition; returns True (and records an event) only on a transition. A condition this
        board does not hold yet that the cluster already shows alike (`previous`: a new leader taking over)
        is no transition: it is taken with its transition time, and no event is recorded again."""
        wanted = "True" if true else "False"
        with self._lock:
            packed = self._status.get(key)
            status = ProxyStatus() if packed is None else _unpack_status(packed)
            current = next((c for c in status.conditions if c.type == type_), None)
            if current and (current.status, current.reason, current.message) == (wanted, reason, message):
                return False
            earlier = self.previous(key, type_) if current is None else None
            taken = earlier is not None and (earlier.status, earlier.reason, earlier.message) == (
                wanted,
                reason,
                message,
            )
            status.conditions = [c for c in status.conditions if c.type != type_]
            status.conditions.append(
                earlier
                if taken and earlier is not None
                else Condition(
                    type=type_, status=wanted, reason=reason, message=message, last_transition_time=self.now()
                )
            )
            self._store(key, status)
        self._changed(key)
        if taken:
            return False
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
            packed = self._status.get(key)
            if packed is not None or deleting:
                self._store(key, ProxyStatus() if packed is None else _unpack_status(packed))
        self._changed(key)

    def drop(self, key: str) -> None:
        with self._lock:
            existed = self._status.pop(key, None) is not None
            self._ready.pop(key, None)
            self._deleting.discard(key)
            self._held.discard(key)
        if existed:
            self._changed(key)

    def _update(self, key: str, change: Callable[[ProxyStatus], None], *, create: bool) -> None:
        """Apply `change` to the key's status; derive and tell the listeners only when something changed."""
        with self._lock:
            packed = self._status.get(key)
            if packed is None and not create:
                return
            status = ProxyStatus() if packed is None else _unpack_status(packed)
            change(status)
            if packed is not None and _pack(status) == packed:
                return
            self._store(key, status)
        self._changed(key)

    def _store(self, key: str, status: ProxyStatus) -> None:
        """Derive phase and Ready from the conditions and keep both (under the lock); Ready's time moves
        with its status only."""
        deleting = key in self._deleting
        status.phase = phase_of(_statuses(status), running=_running(status), deleting=deleting)
        ready = _ready(status, deleting=deleting).status == "True"
        old = self._ready.get(key)
        if old is None or (old > 0) != ready:
            self._ready[key] = _ready_entry(ready, self.now())
        self._status[key] = _pack(status)
        if _statuses(status).get(ConditionType.HELD) == "True":
            self._held.add(key)
        else:
            self._held.discard(key)

    def _changed(self, key: str) -> None:
        for listener in self._listeners:
            listener(key)


def held_conditions(statuses: dict[str, ProxyStatus]) -> dict[str, Condition]:
    """The Held=True condition of each status that has one (a board's, or the cluster's copy)."""
    return {
        key: condition
        for key, status in statuses.items()
        for condition in status.conditions
        if condition.type == ConditionType.HELD and condition.status == "True"
    }


def _pack(status: ProxyStatus) -> bytes:
    # Deflated with a dictionary of what every status repeats (stacks/compact.py): about a fifth.
    return STATUS_PACKER.pack(status.model_dump_json(by_alias=True, exclude_defaults=True).encode())


def _unpack_status(packed: bytes) -> ProxyStatus:
    return ProxyStatus.model_validate_json(STATUS_PACKER.unpack(packed))


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _ready_entry(true: bool, since: datetime) -> int:
    """Ready's status and the time it took it as one int: 1 + microseconds since the epoch, negative while
    False (exact; a tuple of the status and a datetime was about 100 bytes a proxy, this is 32)."""
    micros = 1 + (since - _EPOCH) // _MICROSECOND
    return micros if true else -micros


def _ready_since(entry: int) -> datetime:
    return _EPOCH + (abs(entry) - 1) * _MICROSECOND


def _running(status: ProxyStatus) -> bool:
    return status.last_operation is not None and status.last_operation.result == Operation.IN_PROGRESS


def _statuses(status: ProxyStatus) -> dict[str, str]:
    return {c.type: c.status for c in status.conditions}


def _ready(status: ProxyStatus, *, deleting: bool) -> Condition:
    """The derived Ready condition (its time is the board's); when False it borrows the reason and message
    of what stands in the way."""
    true, reason = ready_of(_statuses(status), running=_running(status), deleting=deleting)
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
