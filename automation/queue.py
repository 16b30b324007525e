"""The work queue: one run per stack at a time, coalesced requests, parallel stacks, retries with backoff.

The queue never sees desired state: it calls `handler(stack)`, which reads the latest desired state itself
when it runs. That is what makes coalescing safe: ten requests that arrive during a run need one more run.
`submit` must be called on the event loop's thread (from another thread use `loop.call_soon_threadsafe`).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable

from automation.backoff import BackoffPolicy
from automation.clock import Clock, MonotonicClock
from automation.errors import ProxyOperatorError, classify
from automation.queue_state import (
    ACTIVE_STATES,
    QueueState,
    StackEntry,
    StackQueueState,
    log_failure,
    plan_after_failure,
)

logger = logging.getLogger(__name__)

Handler = Callable[[str], Awaitable[None]]
StateListener = Callable[[StackQueueState], None]


class WorkQueue:
    """Runs `handler(stack)` for submitted stacks on `max_parallel` workers (tasks named `worker:<n>`)."""

    def __init__(
        self,
        handler: Handler,
        *,
        policy: BackoffPolicy | None = None,
        max_parallel: int = 4,
        stall_after: int = 3,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        on_state_change: StateListener | None = None,
    ) -> None:
        if max_parallel < 1 or stall_after < 1:
            raise ValueError(f"max_parallel ({max_parallel}) and stall_after ({stall_after}) must be >= 1")
        self._handler = handler
        self._policy = policy or BackoffPolicy()
        self._max_parallel = max_parallel
        self._stall_after = stall_after
        self._clock: Clock = clock or MonotonicClock()
        self._rng = rng or random.Random()
        self._on_state_change = on_state_change
        self._entries: dict[str, StackEntry] = {}
        self._ready: asyncio.Queue[str | None] = asyncio.Queue()
        self._workers: list[asyncio.Task[None]] = []
        self._retries: dict[str, asyncio.Task[None]] = {}
        self._active: set[str] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._closed = False

    # -- requests -------------------------------------------------------------------------------------

    def submit(self, stack: str, *, generation_hint: object | None = None) -> None:
        """Request a run; a hint equal to the failed run's does not wake a failed or backing-off stack."""
        if self._closed:
            logger.debug("queue closed; ignoring a request", extra={"fields": {"stack": stack}})
            return
        self._start_workers()
        entry = self._entries.setdefault(stack, StackEntry(stack))
        changed = entry.input_changed(generation_hint)
        entry.hint = generation_hint
        if entry.state is QueueState.QUEUED:
            return  # the queued run will read the latest input
        if entry.state is QueueState.RUNNING:
            entry.follow_up = True
            entry.follow_up_changed |= changed
        elif entry.state is QueueState.IDLE or changed:
            self._enqueue(entry)  # new input beats a pending retry
        else:
            logger.debug(
                "input unchanged since the failed run; still waiting", extra={"fields": {"stack": stack}}
            )

    def status(self, stack: str) -> StackQueueState:
        entry = self._entries.get(stack)
        return entry.snapshot() if entry else StackQueueState(stack=stack)

    def states(self) -> dict[str, StackQueueState]:
        return {stack: entry.snapshot() for stack, entry in self._entries.items()}

    def discard(self, stack: str) -> bool:
        """Forget a stack that is gone (destroyed and removed); refused while it is queued or running."""
        entry = self._entries.get(stack)
        if entry is None or entry.state in ACTIVE_STATES:
            return entry is None
        self._cancel_retry(stack)
        del self._entries[stack]
        return True

    async def drain(self) -> None:
        """Wait until no stack is queued or running (scheduled retries do not count), as this returns: a
        retry or a submit can start a run between the idle moment and this task's resumption."""
        await self._idle.wait()
        while not self._idle.is_set():
            await self._idle.wait()

    # -- runs -----------------------------------------------------------------------------------------

    def _start_workers(self) -> None:
        if not self._workers:
            for n in range(self._max_parallel):
                self._workers.append(asyncio.create_task(self._work(), name=f"worker:{n}"))

    async def _work(self) -> None:
        while (stack := await self._ready.get()) is not None:
            await self._run(self._entries[stack])

    async def _run(self, entry: StackEntry) -> None:
        entry.start_run()
        self._set(entry, QueueState.RUNNING)
        try:
            await self._handler(entry.stack)
        except asyncio.CancelledError:
            self._set(entry, QueueState.IDLE)
            raise
        except Exception as exc:
            self._failed(entry, classify(exc))
        else:
            self._succeeded(entry)

    def _succeeded(self, entry: StackEntry) -> None:
        entry.record_success()
        if entry.follow_up:
            self._enqueue(entry)
        else:
            self._set(entry, QueueState.IDLE)

    def _failed(self, entry: StackEntry, error: ProxyOperatorError) -> None:
        entry.record_failure(error)
        log_failure(entry, error)
        plan = plan_after_failure(
            entry, error, policy=self._policy, rng=self._rng, stall_after=self._stall_after
        )
        if plan.state is QueueState.QUEUED:
            self._enqueue(entry)
            return
        if plan.retry_in is not None:
            self._schedule_retry(entry, plan.retry_in)
        self._set(entry, plan.state)

    def _schedule_retry(self, entry: StackEntry, delay: float) -> None:
        if self._closed:
            return  # a run that failed during shutdown: nobody is left to retry it
        at = entry.next_retry_at = self._clock.now() + delay
        task = asyncio.create_task(self._retry_at(entry, at), name=f"retry:{entry.stack}")
        self._retries[entry.stack] = task

    async def _retry_at(self, entry: StackEntry, at: float) -> None:
        # Sleep to an absolute time: the task starts a little after it was scheduled.
        await self._clock.sleep(max(0.0, at - self._clock.now()))
        del self._retries[entry.stack]  # before enqueueing, so the retry does not cancel itself
        self._enqueue(entry)

    def _enqueue(self, entry: StackEntry) -> None:
        self._cancel_retry(entry.stack)
        entry.next_retry_at = None
        if self._closed:  # a follow-up of a run that ended during shutdown: dropped like queued work
            self._set(entry, QueueState.IDLE)
            return
        self._set(entry, QueueState.QUEUED)
        self._ready.put_nowait(entry.stack)

    def _cancel_retry(self, stack: str) -> None:
        task = self._retries.pop(stack, None)
        if task is not None:
            task.cancel()

    def _set(self, entry: StackEntry, state: QueueState) -> None:
        entry.state = state
        if state in ACTIVE_STATES:
            self._active.add(entry.stack)
            self._idle.clear()
        else:
            self._active.discard(entry.stack)
            if not self._active:
                self._idle.set()
        if self._on_state_change is not None:
            try:
                self._on_state_change(entry.snapshot())
            except Exception:  # a broken listener must not stop the queue
                logger.exception("on_state_change failed", extra={"fields": {"stack": entry.stack}})

    # -- shutdown -------------------------------------------------------------------------------------

    async def close(self, *, grace: float = 30.0) -> None:
        """Stop accepting work, drop queued runs and retries, give running handlers `grace` seconds.

        Handlers still running then are cancelled (the engine turns that into SIGINT for its `pulumi`
        children) and awaited, so no task of the queue outlives this call.
        """
        if self._closed:
            return
        self._closed = True
        retries = list(self._retries.values())
        for stack in list(self._retries):
            self._cancel_retry(stack)
            self._entries[stack].next_retry_at = None
        self._drop_queued()
        await self._stop_workers(grace)
        await asyncio.gather(*retries, return_exceptions=True)

    def _drop_queued(self) -> None:
        while not self._ready.empty():
            stack = self._ready.get_nowait()
            if stack is not None:
                self._set(self._entries[stack], QueueState.IDLE)
        for _ in self._workers:
            self._ready.put_nowait(None)  # one stop signal per worker, after its current run

    async def _stop_workers(self, grace: float) -> None:
        # The grace period runs on the injected clock (not asyncio.timeout) so tests can move it.
        timer = asyncio.create_task(self._clock.sleep(grace), name="close-timer")
        waiting = set(self._workers)
        while waiting and not timer.done():
            done, _ = await asyncio.wait({*waiting, timer}, return_when=asyncio.FIRST_COMPLETED)
            waiting -= done
        timer.cancel()
        for worker in waiting:
            logger.warning("handler still running after %.0fs; cancelling it", grace)
            worker.cancel()
        results = await asyncio.gather(timer, *self._workers, return_exceptions=True)
        for result in results:
            if isinstance(result, Exception):
                logger.error("worker died", exc_info=result)
