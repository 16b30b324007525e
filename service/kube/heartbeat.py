"""The operations heartbeat: a Lease per replica, renewed while that replica has Pulumi operations running.

A stack lock names the replica that took it (its identity is the lock's host). Another replica may cancel
that lock only on evidence that its owner cannot be running Pulumi any more (`service.kube.holder`). The
heartbeat is that evidence: the Lease `<lease_name>-ops-<identity>` in the service's namespace, written
before the replica's first operation of a term starts (`ensure`, the term's `before_operation`), renewed
every retry period while any of its operations runs, and released (no holder) once its term ended with no
child left. Its duration is the leader Lease's plus the watchdog's grace plus a margin, and the term's
children are never allowed to run past `covers_until()` (see ClusterMode), so:

- renewed and not expired: the owner may still run an operation: its locks stay;
- expired: the owner has not renewed for longer than any child of its may run: its locks are stale;
- released: the owner ended its term with no operation left: its locks are stale.

Blocking calls (run from worker threads and the keeper's thread).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from kubernetes.client import ApiClient

from automation.errors import TransientError
from service.kube.client import ApiException
from service.kube.lease import API_ERRORS, LeaseRecord, read_lease, utcnow, write_lease
from service.kube.settings import KubeSettings

__all__ = ["HeartbeatError", "OperationsHeartbeat", "heartbeat_name"]

log = logging.getLogger(__name__)
MARGIN_SECONDS = 5.0  # beyond the leader Lease and the grace: clock skew between nodes, a slow write


def heartbeat_name(settings: KubeSettings, identity: str) -> str:
    return f"{settings.lease_name}-ops-{identity}"[:253]


def heartbeat_seconds(settings: KubeSettings, grace: float) -> float:
    return settings.lease_duration_seconds + grace + MARGIN_SECONDS


class HeartbeatError(TransientError):
    """The heartbeat could not be recorded: no operation may start (its lock would carry no evidence)."""

    default_reason = "HeartbeatFailed"


class OperationsHeartbeat:
    def __init__(
        self,
        api: ApiClient,
        settings: KubeSettings,
        *,
        grace: float,
        busy: Callable[[], bool],
        on_renewed: Callable[[], None] = lambda: None,
    ) -> None:
        self.api, self.settings = api, settings
        self.name = heartbeat_name(settings, settings.identity)
        self.duration = heartbeat_seconds(settings, grace)
        self._grace = grace
        self._busy = busy
        self._on_renewed = on_renewed
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._renewed: float | None = None  # monotonic time of the last renewal sent
        self._stop = threading.Event()
        self._keeper: threading.Thread | None = None

    def covers_until(self) -> float:
        """The monotonic time until which this replica's children may run on the heartbeat's word: the
        last renewal, plus its duration, less the grace a watchdog takes to kill a child and the margin."""
        if self._renewed is None:
            return 0.0
        return self._renewed + self.duration - self._grace - MARGIN_SECONDS

    def ensure(self) -> None:
        """Before an operation starts: the heartbeat is on record and fresh (renewed within one retry
        period), else renewed now. Raises HeartbeatError when it cannot be."""
        fresh = (
            self._renewed is not None
            and time.monotonic() - self._renewed < self.settings.retry_period_seconds
        )
        if not fresh:
            self._renew(holder=self.settings.identity)
        self._start_keeper()

    def release(self) -> None:
        """The term ended and no child of it is left: say so, so another replica may take the locks over."""
        self._stop.set()
        if self._keeper is not None:
            self._keeper.join(self.settings.retry_period_seconds + 5)
            self._keeper = None
        if self._renewed is None:
            return
        try:
            self._renew(holder=None)
        except HeartbeatError as exc:  # it expires on its own
            log.warning("%s (it expires on its own)", exc)
        self._renewed = None

    def _start_keeper(self) -> None:
        with self._lock:
            if self._keeper is not None and self._keeper.is_alive():
                return
            self._stop.clear()
            self._keeper = threading.Thread(target=self._keep, name="operations heartbeat", daemon=True)
            self._keeper.start()

    def _keep(self) -> None:
        """Renew every retry period while operations run; stop when none does."""
        while not self._stop.wait(self.settings.retry_period_seconds):
            if not self._busy():
                return
            try:
                self._renew(holder=self.settings.identity)
            except HeartbeatError as exc:
                log.warning("%s: its operations stop when what the last renewal covers ends", exc)

    def _renew(self, *, holder: str | None) -> None:
        """Read and write at the read resourceVersion; the keeper and an operation's `ensure` may renew at
        the same moment (serialised here), and a 409 (changed since read) reads again."""
        with self._write_lock:
            for attempt in range(3):
                try:
                    self._write(holder)
                    return
                except ApiException as exc:
                    if exc.status != 409 or attempt == 2:
                        raise self._error(exc) from exc
                except API_ERRORS as exc:
                    raise self._error(exc) from exc

    def _error(self, exc: BaseException) -> HeartbeatError:
        namespace = self.settings.own_namespace()
        return HeartbeatError(f"cannot write the operations heartbeat {namespace}/{self.name}: {exc}")

    def _write(self, holder: str | None) -> None:
        namespace, timeout = self.settings.own_namespace(), self.settings.retry_period_seconds
        sent = time.monotonic()
        current = read_lease(self.api, namespace=namespace, name=self.name, timeout=timeout)
        now = utcnow()
        if holder is None:
            if current is None:
                return
            record = current.record.released(now)
        elif current is None:
            record = LeaseRecord.first(holder, now=now, duration=self.duration)
        else:
            record = current.record.taken_by(holder, now=now, duration=self.duration)
        write_lease(
            self.api, namespace=namespace, name=self.name, current=current, record=record, timeout=timeout
        )
        if holder is not None:
            self._renewed = sent
            self._on_renewed()
