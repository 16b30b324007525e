"""Leader election by a `coordination.k8s.io/v1` Lease, with client-go's semantics, on asyncio.

One attempt reads the Lease and writes it back at the resourceVersion it read: created when absent, taken
when it is free (no holder, or renewTime + leaseDurationSeconds is past), renewed when it is ours. A 409
means another candidate wrote first: the Lease is read again and decided afresh. A leader renews every
retry period; when it has not renewed for renew_deadline (< lease_duration, checked by the settings) or
sees another holder, it stops leading: `on_stopped` runs to completion before it campaigns again, and it
starts before the renew deadline, so the work stops before the Lease can expire for the others. A clean stop
runs `on_stopped`, then releases the Lease (no holder) so the next candidate takes it within one retry period.

Renew times are compared with this replica's wall clock, as client-go's record does: keep node clocks in
sync (NTP); a skew longer than the lease duration makes a follower take a live leader's Lease, which the
leader then notices at its next renewal (its write gets a 409) and steps down.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from kubernetes.client import ApiClient

from service.kube.client import ApiException
from service.kube.lease import API_ERRORS, Lease, LeaseRecord, read_lease, utcnow, write_lease
from service.kube.settings import KubeSettings

__all__ = ["ElectionFigures", "LeaderElector"]

log = logging.getLogger(__name__)

Callback = Callable[[], Awaitable[None]]
T = TypeVar("T")


class Outcome(enum.Enum):
    OURS = "ours"  # acquired or renewed
    HELD = "held"  # another live holder
    FAILED = "failed"  # the apiserver could not be asked, or refused; nothing known


@dataclass(frozen=True)
class ElectionFigures:
    """For a metric or a log line: who leads, how often the Lease changed hands, and when it last did."""

    identity: str
    is_leader: bool
    holder: str | None
    transitions: int
    last_handover: datetime | None  # the current holder's acquireTime


class LeaderElector:
    """Campaigns for the Lease until stopped; calls `on_started` on becoming leader (it must return
    promptly: start the work, do not run it) and `on_stopped` on losing or giving up the lead."""

    def __init__(
        self,
        api: ApiClient,
        settings: KubeSettings,
        *,
        on_started: Callback,
        on_stopped: Callback,
        on_renewed: Callable[[float], None] = lambda _deadline: None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self._api, self._settings, self._clock = api, settings, clock
        self._on_started, self._on_stopped = on_started, on_stopped
        self._on_renewed = on_renewed  # given the new work deadline (monotonic) after each renewal
        self._namespace = settings.own_namespace()
        self._observed: LeaseRecord | None = None
        self._leading = False
        self.renewed_at: float | None = None  # loop time when the last successful renewal was sent
        # The Lease's calls get threads of their own: in the default executor they queued behind the
        # engine's operations and reads (`asyncio.to_thread`: 6 threads on 2 cores), and a leader taking
        # 10,000 running proxies in stepped down every few minutes with "no renewal for 10 s" while its
        # process was busy but alive (operations.md). Two: one attempt left hanging until its own request
        # times out does not hold up the next.
        self._calls = ThreadPoolExecutor(max_workers=2, thread_name_prefix=f"lease-{settings.identity}")

    @property
    def identity(self) -> str:
        return self._settings.identity

    @property
    def is_leader(self) -> bool:
        return self._leading

    def holder(self) -> str | None:
        """The holder of the Lease as last observed (None: nobody, or not read yet)."""
        return self._observed.holder if self._observed else None

    def figures(self) -> ElectionFigures:
        record = self._observed or LeaseRecord()
        return ElectionFigures(
            identity=self.identity,
            is_leader=self._leading,
            holder=record.holder,
            transitions=record.transitions,
            last_handover=record.acquired,
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Campaign, lead and renew until `stop` is set; then stop leading and release the Lease."""
        log.info("leader election for Lease %s/%s as %s", self._namespace, self._lease_name, self.identity)
        try:
            while not stop.is_set():
                pause = await (self._renew() if self._leading else self._campaign())
                await _wait(stop, pause)
        finally:
            try:
                if self._leading:
                    await self._step_down("stopping", level=logging.INFO)
                    await self._release()
            finally:
                self._calls.shutdown(wait=False, cancel_futures=True)

    # --- one step each -------------------------------------------------------------------------------

    async def _campaign(self) -> float:
        now = _loop_time()
        if await self._attempt(timeout=self._settings.retry_period_seconds) is Outcome.OURS:
            self.renewed_at, self._leading = now, True
            log.info("%s became the leader (transition %d)", self.identity, self.figures().transitions)
            try:
                await self._on_started()
            except Exception:
                log.exception("starting the leader's work failed; giving the lead up")
                await self._step_down("its work did not start")
                await self._release()
        return self._settings.retry_period_seconds

    async def _renew(self) -> float:
        """One renewal; steps down on another holder, or when the next try could not beat the deadline."""
        retry = self._settings.retry_period_seconds
        started = _loop_time()
        budget = self._deadline() - started
        outcome = await self._attempt(timeout=budget) if budget > 0 else Outcome.FAILED
        if outcome is Outcome.OURS:
            self.renewed_at = started
            self._on_renewed(self.work_deadline())
        elif outcome is Outcome.HELD:
            await self._step_down(f"the Lease is held by {self.holder()}")
        elif _loop_time() + retry >= self._deadline():
            await self._step_down(f"no renewal for {self._settings.renew_deadline_seconds:g} s")
        return retry if self._leading else 0.0

    def work_deadline(self) -> float:
        """Monotonic time by which this leader's work must have stopped unless it renews (0: not leading).
        The loop's clock is time.monotonic, the clock the term's watchdogs compare with."""
        return self._deadline() if self._leading and self.renewed_at is not None else 0.0

    def _deadline(self) -> float:
        """Loop time by which the leader must have stopped its work unless it renews: renew_deadline
        after its last renewal, less a margin for the loop to get to `on_stopped`."""
        assert self.renewed_at is not None
        margin = min(0.1, self._settings.retry_period_seconds / 4)
        return self.renewed_at + self._settings.renew_deadline_seconds - margin

    async def _step_down(self, why: str, *, level: int = logging.WARNING) -> None:
        self._leading = False
        log.log(level, "%s stops leading: %s", self.identity, why)
        try:
            await self._on_stopped()
        except Exception:
            log.exception("stopping the leader's work failed")

    async def _release(self) -> None:
        try:
            await asyncio.wait_for(self._in_thread(self._release_sync), self._settings.retry_period_seconds)
        except API_ERRORS as exc:
            log.warning("could not release Lease %s (it expires on its own): %s", self._lease_name, exc)

    # --- blocking calls, in a thread -----------------------------------------------------------------

    async def _attempt(self, *, timeout: float) -> Outcome:  # noqa: ASYNC109 (bounds a thread, not a coroutine)
        """One try, abandoned after `timeout` (the thread's own request times out soon after)."""
        try:
            return await asyncio.wait_for(self._in_thread(self._try_acquire_or_renew, timeout), timeout)
        except API_ERRORS as exc:
            log.warning("%s could not reach Lease %s: %s", self.identity, self._lease_name, _brief(exc))
            return Outcome.FAILED

    def _in_thread(self, call: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        return asyncio.get_running_loop().run_in_executor(self._calls, call, *args)

    def _try_acquire_or_renew(self, timeout: float) -> Outcome:
        """Read, decide, write at the read resourceVersion; on a 409 read once more and decide again."""
        for _ in range(2):
            current = self._read(timeout)
            if current is not None and self._held_by_another(current.record):
                return Outcome.HELD
            try:
                self._observe(self._write(current, timeout))
                return Outcome.OURS
            except ApiException as exc:
                if exc.status != 409:
                    raise
                log.info(
                    "%s lost a race for Lease %s (409); reading it again", self.identity, self._lease_name
                )
        return Outcome.FAILED

    def _held_by_another(self, record: LeaseRecord) -> bool:
        return record.holder != self.identity and not record.free(self._clock())

    def _release_sync(self) -> None:
        current = self._read(self._settings.retry_period_seconds)
        if current is None or current.record.holder != self.identity:
            return
        released = current.record.released(self._clock())
        lease = write_lease(
            self._api,
            namespace=self._namespace,
            name=self._lease_name,
            current=current,
            record=released,
            timeout=self._settings.retry_period_seconds,
        )
        self._observe(lease)
        log.info("%s released Lease %s", self.identity, self._lease_name)

    def _read(self, timeout: float) -> Lease | None:
        lease = read_lease(self._api, namespace=self._namespace, name=self._lease_name, timeout=timeout)
        if lease is not None:
            self._observe(lease)
        return lease

    def _write(self, current: Lease | None, timeout: float) -> Lease:
        now, duration = self._clock(), self._settings.lease_duration_seconds
        record = (
            current.record.taken_by(self.identity, now=now, duration=duration)
            if current is not None
            else LeaseRecord.first(self.identity, now=now, duration=duration)
        )
        return write_lease(
            self._api,
            namespace=self._namespace,
            name=self._lease_name,
            current=current,
            record=record,
            timeout=timeout,
        )

    def _observe(self, lease: Lease) -> None:
        previous = self.holder()
        self._observed = lease.record
        if lease.record.holder != previous and lease.record.holder not in (None, self.identity):
            log.info("Lease %s is held by %s", self._lease_name, lease.record.holder)

    @property
    def _lease_name(self) -> str:
        return self._settings.lease_name


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    if seconds <= 0:
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


def _loop_time() -> float:
    return asyncio.get_running_loop().time()


def _brief(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        return f"{exc.status} {exc.reason}"
    return str(exc) or type(exc).__name__
