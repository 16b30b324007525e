"""Leader election by a `coordination.k8s.io/v1` Lease, with client-go's semantics, on asyncio.

One attempt reads the Lease and writes it back at the resourceVersion it read: created when absent, taken
when it is free (no holder, or renewTime + leaseDurationSeconds is past), renewed when it is ours. A 409
means another candidate wrote first: the Lease is read again and decided afresh. A leader renews every
retry period; when it has not renewed for renew_deadline (< lease_duration, checked by the settings) or
sees another holder, it stops leading: `on_stopped` runs to completion before it campaigns again, and it
starts before the renew deadline, so the work stops before the Lease can expire for the others. A clean stop
runs `on_stopped`, then releases the Lease (no holder) so the next candidate takes it within one retry period.

A leader renews from a thread of its own, not from the event loop: on a saturated machine (10,000 running
proxies on two cores) the loop came back to its renewal after the deadline and the leader stepped down every
few minutes while every renewal it did try succeeded. The thread renews while the loop shows life (it stamps
twice a retry period); a loop that has not run for loop_stall_seconds (30 s: about when the kubelet's
liveness probe, which the loop answers, would restart the pod) is taken as stuck and the thread stops
renewing, so a wedged process loses the lead as a dead one would. What a late loop may still do is bounded by
the term: every `pulumi` child's watchdog kills it at the work deadline, which only a renewal extends.

Renew times are compared with this replica's wall clock, as client-go's record does: keep node clocks in
sync (NTP); a skew longer than the lease duration makes a follower take a live leader's Lease, which the
leader then notices at its next renewal (its write gets a 409) and steps down.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import threading
import time
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
        self._leading = False  # on_started ran and on_stopped has not yet: the term is open
        self._lost: str | None = None  # why the renewer thread gave the lead up (the loop steps down)
        self._state = threading.Lock()  # the renewer's success against the loop's step-down
        self._loop_seen = 0.0  # time.monotonic() when the loop last stamped, while leading
        self.renewed_at: float | None = None  # time.monotonic() when the last successful renewal was sent
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
        return self._leading and self._lost is None

    def holder(self) -> str | None:
        """The holder of the Lease as last observed (None: nobody, or not read yet)."""
        return self._observed.holder if self._observed else None

    def figures(self) -> ElectionFigures:
        record = self._observed or LeaseRecord()
        return ElectionFigures(
            identity=self.identity,
            is_leader=self.is_leader,
            holder=record.holder,
            transitions=record.transitions,
            last_handover=record.acquired,
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Campaign, lead and renew until `stop` is set; then stop leading and release the Lease."""
        log.info("leader election for Lease %s/%s as %s", self._namespace, self._lease_name, self.identity)
        try:
            while not stop.is_set():
                if not self._leading:
                    await self._campaign()
                if self._leading:
                    why = await self._hold(stop)
                    if why is not None:
                        await self._step_down(why)
                        continue  # campaign again at once: the Lease may still name us
                await _wait(stop, self._settings.retry_period_seconds)
        finally:
            try:
                if self._leading:
                    await self._step_down("stopping", level=logging.INFO)
                    await self._release()
            finally:
                self._calls.shutdown(wait=False, cancel_futures=True)

    # --- one step each -------------------------------------------------------------------------------

    async def _campaign(self) -> None:
        now = time.monotonic()
        if await self._attempt(timeout=self._settings.retry_period_seconds) is Outcome.OURS:
            self.renewed_at, self._lost, self._leading = now, None, True
            log.info("%s became the leader (transition %d)", self.identity, self.figures().transitions)
            try:
                await self._on_started()
            except Exception:
                log.exception("starting the leader's work failed; giving the lead up")
                await self._step_down("its work did not start")
                await self._release()

    async def _hold(self, stop: asyncio.Event) -> str | None:
        """Lead while the renewer thread keeps the Lease: returns why it gave the lead up, or None when
        `stop` was set. Stamps the loop's life twice per retry period for the thread."""
        loop, lost, halt = asyncio.get_running_loop(), asyncio.Event(), threading.Event()
        self._loop_seen = time.monotonic()
        renewer = threading.Thread(
            target=self._renewing,
            args=(lambda: loop.call_soon_threadsafe(lost.set), halt),
            name=f"lease-renewer-{self.identity}",
            daemon=True,
        )
        renewer.start()
        try:
            while not stop.is_set() and not lost.is_set():
                self._loop_seen = time.monotonic()
                waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(lost.wait())]
                try:
                    await asyncio.wait(
                        waits,
                        timeout=self._settings.retry_period_seconds / 2,
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                finally:
                    for waiting in waits:
                        waiting.cancel()
            return self._lost if lost.is_set() else None
        finally:
            halt.set()
            # An attempt in flight ends within its own timeout; the release must not race it.
            await asyncio.get_running_loop().run_in_executor(
                self._calls, renewer.join, self._settings.renew_deadline_seconds
            )

    # --- the renewer thread --------------------------------------------------------------------------

    def _renewing(self, tell_lost: Callable[[], None], halt: threading.Event) -> None:
        """Renew every retry period until the lead is lost (then tell the loop) or `halt` is set."""
        retry = self._settings.retry_period_seconds
        while not halt.wait(retry):
            why = self._renew_once(halt)
            if why is not None:
                self._lost = why  # is_leader is False from here on, for every thread
                tell_lost()
                return

    def _renew_once(self, halt: threading.Event) -> str | None:
        """One renewal; the reason to step down (another holder, or the next try could not beat the
        deadline), or None."""
        settings = self._settings
        started = time.monotonic()
        budget = self._deadline() - started
        quiet = started - self._loop_seen
        if quiet > settings.loop_stall_seconds:
            log.warning("%s: the event loop has not run for %.1f s; not renewing", self.identity, quiet)
            outcome = Outcome.FAILED
        else:
            outcome = self._attempt_sync(timeout=budget) if budget > 0 else Outcome.FAILED
        if outcome is Outcome.OURS:
            with self._state:
                if self._leading and not halt.is_set():
                    self.renewed_at = started
                    self._on_renewed(self.work_deadline())
            return None
        if outcome is Outcome.HELD:
            return f"the Lease is held by {self.holder()}"
        if time.monotonic() + settings.retry_period_seconds >= self._deadline():
            return f"no renewal for {settings.renew_deadline_seconds:g} s"
        return None

    def work_deadline(self) -> float:
        """Monotonic time by which this leader's work must have stopped unless it renews (0: not leading):
        the clock the term's watchdogs compare with."""
        return self._deadline() if self.is_leader and self.renewed_at is not None else 0.0

    def _deadline(self) -> float:
        """Monotonic time by which the leader must have stopped its work unless it renews: renew_deadline
        after its last renewal, less a margin for the loop to get to `on_stopped`."""
        assert self.renewed_at is not None
        margin = min(0.1, self._settings.retry_period_seconds / 4)
        return self.renewed_at + self._settings.renew_deadline_seconds - margin

    async def _step_down(self, why: str, *, level: int = logging.WARNING) -> None:
        with self._state:
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

    def _attempt_sync(self, *, timeout: float) -> Outcome:
        """`_attempt` for the renewer thread: the call runs on the Lease's executor, abandoned after
        `timeout` (its own request times out soon after)."""
        try:
            return self._calls.submit(self._try_acquire_or_renew, timeout).result(timeout)
        except API_ERRORS as exc:  # TimeoutError included: the result did not come in time
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


def _brief(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        return f"{exc.status} {exc.reason}"
    return str(exc) or type(exc).__name__
