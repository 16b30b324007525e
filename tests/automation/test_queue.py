"""The work queue against an in-memory handler double and a FakeClock: no engine, no wall-clock timing.

Every scenario ends with `close_and_check`, which fails the test if any task outlives the queue.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from collections.abc import Awaitable, Callable

import pytest

from automation.backoff import BackoffPolicy
from automation.clock import FakeClock
from automation.errors import (
    InvalidInputError,
    Reason,
    StackLockedError,
    TransientError,
)
from automation.queue import WorkQueue
from automation.queue_state import QueueState, StackQueueState

POLICY = BackoffPolicy(base=10, cap=80)


class HandlerDouble:
    """Records calls, blocks a stack on a gate, raises scripted errors in order, measures concurrency."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.cancelled: list[str] = []
        self.errors: dict[str, list[BaseException | None]] = {}
        self.gates: dict[str, asyncio.Event] = {}
        self.running: Counter[str] = Counter()
        self.max_per_stack: Counter[str] = Counter()
        self.max_total = 0
        self._new_call: asyncio.Event | None = None
        self.then: dict[str, Callable[[], object]] = {}  # called soon after the stack's run returns

    def fail(self, stack: str, *outcomes: BaseException | None) -> None:
        self.errors[stack] = list(outcomes)

    def block(self, *stacks: str) -> asyncio.Event:
        gate = asyncio.Event()
        for stack in stacks:
            self.gates[stack] = gate
        return gate

    async def wait_for_calls(self, count: int) -> None:
        while len(self.calls) < count:
            self._new_call = asyncio.Event()
            await self._new_call.wait()

    async def __call__(self, stack: str) -> None:
        self.calls.append(stack)
        if self._new_call is not None:
            self._new_call.set()
        self.running[stack] += 1
        self.max_per_stack[stack] = max(self.max_per_stack[stack], self.running[stack])
        self.max_total = max(self.max_total, sum(self.running.values()))
        try:
            if stack in self.gates:
                await self.gates[stack].wait()
            outcomes = self.errors.get(stack)
            if outcomes and (error := outcomes.pop(0)) is not None:
                raise error
        except asyncio.CancelledError:
            self.cancelled.append(stack)
            raise
        finally:
            self.running[stack] -= 1
            if (then := self.then.pop(stack, None)) is not None:
                asyncio.get_running_loop().call_soon(then)


Scenario = Callable[[WorkQueue, HandlerDouble, FakeClock], Awaitable[None]]


def run(scenario: Scenario, **settings: object) -> None:
    """Run a scenario on a fresh loop with a seeded rng, then close the queue and check for leaked tasks."""

    async def main() -> None:
        double, clock = HandlerDouble(), FakeClock()
        queue = WorkQueue(double, clock=clock, rng=random.Random(42), **settings)  # type: ignore[arg-type]
        try:
            await scenario(queue, double, clock)
        finally:
            await close_and_check(queue)

    asyncio.run(main())


async def close_and_check(queue: WorkQueue, *, grace: float = 0) -> None:
    await queue.close(grace=grace)
    assert asyncio.all_tasks() == {asyncio.current_task()}


def retry_in(queue: WorkQueue, clock: FakeClock, stack: str) -> float:
    at = queue.status(stack).next_retry_at
    assert at is not None, f"no retry scheduled for {stack}"
    return at - clock.now()


async def settle(turns: int = 20) -> None:
    """Let every runnable task take its next steps (loop turns, not time)."""
    for _ in range(turns):
        await asyncio.sleep(0)


def test_drain_returns_only_when_idle_as_it_returns_not_when_idle_was_set_once() -> None:
    """In CI a retry (or a poll's submit) started between the idle moment and the drainer's resumption, and
    `proxy-operator up` and the tests read a stack that was running again as settled."""

    async def scenario(queue: WorkQueue, double: HandlerDouble, clock: FakeClock) -> None:
        gate_a, gate_b = double.block("a"), double.block("b")
        queue.submit("a")
        await double.wait_for_calls(1)
        drainer = asyncio.create_task(queue.drain())
        await settle()
        double.then["a"] = lambda: queue.submit("b")  # runs before the drainer resumes
        gate_a.set()
        await settle()
        assert queue.status("b").state is QueueState.RUNNING
        assert not drainer.done(), "drain returned while b runs"
        gate_b.set()
        await drainer
        assert queue.status("b").state is QueueState.IDLE

    run(scenario)


# -- one run per stack, coalescing, parallelism ------------------------------------------------------


def test_ten_submits_while_running_make_exactly_one_follow_up_run() -> None:
    async def scenario(queue: WorkQueue, double: HandlerDouble, clock: FakeClock) -> None:
        gate = double.block("a")
        queue.submit("a")
        await double.wait_for_calls(1)
        for _ in range(10):
            queue.submit("a")
        assert queue.status("a").state is QueueState.RUNNING
        assert queue.status("a").follow_up
        gate.set()
        await queue.drain()
        assert double.calls == ["a", "a"]
        assert double.max_per_stack["a"] == 1
        assert queue.status("a") == StackQueueState(stack="a", runs=2)

    run(scenario)


def test_submits_while_queued_coalesce_into_the_queued_run() -> None:
    async def scenario(queue: WorkQueue, double: HandlerDouble, clock: FakeClock) -> None:
        for n in range(10):
            queue.submit("a", generation_hint=n)
        assert queue.status("a").state is QueueState.QUEUED
        assert queue.status("a").generation_hint == 9
        await queue.drain()
        assert double.calls == ["a"]

    run(scenario)


@pytest.mark.parametrize("max_parallel", [1, 2, 4])
def test_stacks_run_in_parallel_up_to_max_parallel(max_parallel: int) -> None:
    stacks = [f"s{n}" for n in range(6)]

    async def scenario(queue: WorkQueue, double: HandlerDouble, clock: FakeClock) -> None:
        gate = double.block(*stacks)
        for stack in stacks:
            queue.submit(stack)
        await double.wait_for_calls(max_parallel)
        await settle()
        assert len(double.calls) == max_parallel
        states = Counter(queue.status(s).state for s in stacks)
        assert states == {QueueState.RUNNING: max_parallel, QueueState.QUEUED: 6 - max_parallel}
        gate.set()
        await queue.drain()
        assert sorted(double.calls) == stacks
        assert double.max_total == max_parallel

    run(scenario, max_parallel=max_parallel)


def test_default_parallelism_is_four() -> None:
    async def scenario(queue: WorkQueue, double: HandlerDouble, clock: FakeClock) -> None:
        gate = double.block(*"abcdef")
        for stack in "abcdef":
            queue.submit(stack)
        await settle()
        gate.set()
        await queue.drain()
        assert double.max_total == 4

    run(scenario)


def test_invalid_settings_are_refused() -> None:
    async def noop(stack: str) -> None:
        return None

    with pytest.raises(ValueError, match="max_parallel"):
        WorkQueue(noop, max_parallel=0)
    with pytest.raises(ValueError, match="stall_after"):
        WorkQueue(noop, stall_after=0)


# -- failures, backoff, stall ------------------------------------------------------------------------


def test_transient_failures_retry_after_the_policy_delay_and_success_resets() -> None:
    reference = random.Random(42)  # the same seed as the queue's rng: the same delays, in order
    d1, d2 = POLICY.delay(1, reference), POLICY.delay(2, reference)

    async def scenario(queue: WorkQueue, double: HandlerDouble, clock: FakeClock) -> None:
        double.fail("a", TransientError("timeout"), TransientError("timeout again"), None)
        queue.submit("a")
        await queue.drain()
        state = queue.status("a")
        assert (state.state, state.consecutive_failures, state.next_retry_at) == (QueueState.BACKOFF, 1, d1)
        assert 0 <= d1 <= 10
        await clock.wait_for_sleepers(1)
        assert clock.sleepers == [d1]
        await clock.advance(d1 / 2)
        assert double.calls == ["a"]
        await clock.advance(d1 / 2)
        await queue.drain()
        state = queue.status("a")
        assert (state.consecutive_failures, state.next_retry_at) == (2, d1 + d2)
        assert 0 <= d2 <= 20
        await clock.advance(d2)
        await queue.drain()
        assert double.calls == ["a", "a", "a"]
        assert queue.status("a") == StackQueueState(stack="a", runs=3)
        assert clock.sleepers == []

    run(scenario, policy=POLICY)


def test_retry_after_of_the_error_overrides_the_policy() -> None:
    async def scenario(queue: WorkQueue, double: HandlerDouble, clock: FakeClock) -> None:
        double.fail("a", StackLockedError("locked by pid 4242", retry_after=42))
        queue.submit("a")
        await queue.drain()
        state = queue.status("a")
        assert (state.state, state.next_retry_at) == (QueueState.BACKOFF, 42)
        assert state.reason == Reason.STACK_LOCKED
        await clock.advance(42)
        await queue.drain()
        assert queue.status("a").state is QueueState.IDLE
        assert double.calls == ["a", "a"]

    run(scenario, policy=POLICY)


def test_a_new_submit_during_backoff_runs_at_once_and_drops_the_retry() -> None:
    async def scenario(queue: WorkQueue, double: HandlerDouble, clock: FakeClock) -> None:
        double.fail("a", TransientError("timeout"))
        queue.submit("a")
        await queue.drain()
        assert queue.status("a").state is QueueState.BACKOFF
        queue.submit("a")
        await queue.drain()
        assert double.calls == ["a", "a"]
        assert clock.now() == 0
        assert clock.sleepers == []
        assert queue.status("a").next_retry_at is None

    run(scenario, policy=POLICY)


def test_a_submit_with_the_failed_runs_hint_keeps_the_backoff() -> None:
    async def scenario(queue: WorkQueue, double: HandlerDouble, clock: FakeClock) -> None:
        double.fail("a", TransientError("timeout"))
        queue.submit("a", generation_hint="h1")
        await queue.drain()
        retry_at = queue.status("a").next_retry_at
        queue.submit("a", generation_hint="h1")  # e.g. a resync: same input, keep backing off
        await settle()
        assert double.calls == ["a"]
        assert queue.status("a").next_retry_at == retry_at
        queue.submit("a", generation_hint="h2")
        await queue.drain()
        assert double.calls == ["a", "a"]

    run(scenario, policy=POLICY)


def test_a_permanent_error_does_not_retry_until_the_input_changes() -> None:
    async def scenario(queue: WorkQueue, double: HandlerDouble, clock: FakeClock) -> None:
        error = InvalidInputError("spec.port: 70000 is not in 1-65535")
        double.fail("a", error, None)
        queue.submit("a", generation_hint="h1")
        await queue.drain()
        state = queue.status("a")
        assert (state.state, state.last_error, state.next_retry_at) == (QueueState.FAILED, error, None)
        assert clock.sleepers == []
        await clock.advance(1_000_000)
        queue.submit("a", generation_hint="h1")
        await settle()
        assert double.calls == ["a"]
        queue.submit("a", generation_hint="h2")
        await queue.drain()
        assert double.calls == ["a", "a"]
        assert queue.status("a").state is QueueState.IDLE

    run(scenario, policy=POLICY)


def test_stalled_after_n_consecutive_failures_with_the_last_error_then_success_resets() -> None:
    errors = [TransientError(f"timeout {n}") for n in range(3)]

    async def scenario(queue: WorkQueue, double: HandlerDouble, clock: FakeClock) -> None:
        double.fail("a", *errors, None)
        queue.submit("a")
        for _ in range(2):
            await queue.drain()
            assert queue.status("a").state is QueueState.BACKOFF
            await clock.advance(retry_in(queue, clock, "a"))
        await queue.drain()
        state = queue.status("a")
        assert (state.state, state.consecutive_failures) == (QueueState.STALLED, 3)
        assert state.last_error is errors[2]
        assert state.next_retry_at is not None  # a transient cause keeps retrying while stalled
        await clock.advance(retry_in(queue, clock, "a"))
        await queue.drain()
        assert queue.status("a") == StackQueueState(stack="a", runs=4)

    run(scenario, policy=POLICY, stall_after=3)


def test_permanent_failures_stall_without_a_retry() -> None:
    async def scenario(queue: WorkQueue, double: HandlerDouble, clock: FakeClock) -> None:
        double.fail("a", InvalidInputError("one"), InvalidInputError("two"))
        for hint in ("h1", "h2"):
            queue.submit("a", generation_hint=hint)
            await queue.drain()
        state = queue.status("a")
        assert (state.state, state.consecutive_failures, state.next_retry_at) == (QueueState.STALLED, 2, None)
        assert state.last_error is not None
        assert state.last_error.message == "two"

    run(scenario, stall_after=2)


def test_an_unexpected_exception_is_retried_as_transient_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    boom = ZeroDivisionError("division by zero")

    async def scenario(queue: WorkQueue, double: HandlerDouble, clock: FakeClock) -> None:
        double.fail("a", boom)
        queue.submit("a")
        await queue.drain()
        state = queue.status("a")
        assert state.state is QueueState.BACKOFF
        assert isinstance(state.last_error, TransientError)
        assert state.last_error.reason == Reason.UNEXPECTED
        assert state.last_error.__cause__ is boom

    with caplog.at_level(logging.WARNING, logger="automation.queue"):
        run(scenario, policy=POLICY)
    [record] = caplog.records
    assert record.levelno == logging.ERROR
    assert record.exc_info is not None
    assert record.exc_info[1] is boom
    assert record.fields["stack"] == "a"  # type: ignore[attr-defined]


def test_input_that_changes_during_a_failed_run_is_tried_at_once() -> None:
    async def scenario(queue: WorkQueue, double: HandlerDouble, clock: FakeClock) -> None:
        gate = double.block("a")
        double.fail("a", TransientError("timeout"), None)
        queue.submit("a", generation_hint="h1")
        await double.wait_for_calls(1)
        queue.submit("a", generation_hint="h2")
        gate.set()
        await queue.drain()
        assert double.calls == ["a", "a"]
        assert clock.now() == 0
        assert queue.status("a").state is QueueState.IDLE

    run(scenario, policy=POLICY)


def test_unchanged_input_during_a_failed_run_waits_for_the_backoff() -> None:
    async def scenario(queue: WorkQueue, double: HandlerDouble, clock: FakeClock) -> None:
        gate = double.block("a")
        double.fail("a", TransientError("timeout"))
        queue.submit("a", generation_hint="h1")
        await double.wait_for_calls(1)
        queue.submit("a", generation_hint="h1")
        gate.set()
        await queue.drain()
        assert double.calls == ["a"]
        assert queue.status("a").state is QueueState.BACKOFF

    run(scenario, policy=POLICY)


# -- observation, discard, shutdown ------------------------------------------------------------------


def test_state_changes_are_reported_and_a_broken_listener_does_not_stop_the_queue() -> None:
    seen: list[tuple[str, QueueState]] = []

    def listener(state: StackQueueState) -> None:
        seen.append((state.stack, state.state))
        raise RuntimeError("listener bug")

    async def scenario(queue: WorkQueue, double: HandlerDouble, clock: FakeClock) -> None:
        double.fail("a", TransientError("timeout"))
        queue.submit("a")
        await queue.drain()
        await clock.advance(retry_in(queue, clock, "a"))
        await queue.drain()

    run(scenario, policy=POLICY, on_state_change=listener)
    states = [s for _, s in seen]
    assert states == ["queued", "running", "backoff", "queued", "running", "idle"]


def test_discard_forgets_a_resting_stack_but_not_an_active_one() -> None:
    async def scenario(queue: WorkQueue, double: HandlerDouble, clock: FakeClock) -> None:
        double.fail("a", TransientError("timeout"))
        queue.submit("a")
        queue.submit("b")
        assert not queue.discard("b")  # queued
        await queue.drain()
        assert queue.discard("a")  # in backoff: its retry goes too
        assert clock.sleepers == []
        assert set(queue.states()) == {"b"}
        assert queue.discard("never-seen")

    run(scenario, policy=POLICY)


def test_close_drops_queued_work_and_waits_for_the_running_handler() -> None:
    async def scenario(queue: WorkQueue, double: HandlerDouble, clock: FakeClock) -> None:
        gate = double.block("a")
        queue.submit("a")
        queue.submit("b")
        await double.wait_for_calls(1)
        closing = asyncio.create_task(queue.close(grace=30))
        await clock.wait_for_sleepers(1)  # the grace timer
        queue.submit("c")  # refused: the queue is closing
        gate.set()
        await closing
        assert double.calls == ["a"]
        assert double.cancelled == []
        assert queue.status("b").state is QueueState.IDLE

    run(scenario, max_parallel=1)


def test_close_cancels_a_handler_still_running_after_the_grace_period() -> None:
    async def scenario(queue: WorkQueue, double: HandlerDouble, clock: FakeClock) -> None:
        double.block("a")  # never released
        queue.submit("a")
        await double.wait_for_calls(1)
        closing = asyncio.create_task(queue.close(grace=30))
        await clock.wait_for_sleepers(1)
        await clock.advance(29)
        assert double.cancelled == []
        await clock.advance(1)
        await closing
        assert double.cancelled == ["a"]
        assert queue.status("a").state is QueueState.IDLE

    run(scenario)


def test_close_cancels_pending_retries_and_ignores_later_submits() -> None:
    async def scenario(queue: WorkQueue, double: HandlerDouble, clock: FakeClock) -> None:
        double.fail("a", TransientError("timeout"))
        queue.submit("a")
        await queue.drain()
        await close_and_check(queue)
        assert clock.sleepers == []
        assert queue.status("a").next_retry_at is None
        queue.submit("a")
        await settle()
        assert double.calls == ["a"]
        assert asyncio.all_tasks() == {asyncio.current_task()}

    run(scenario, policy=POLICY)


@pytest.mark.parametrize(
    ("outcome", "follow_up", "expected"),
    [
        (None, True, QueueState.IDLE),
        (TransientError("timeout"), True, QueueState.IDLE),
        (TransientError("timeout"), False, QueueState.BACKOFF),
    ],
)
def test_a_run_ending_during_close_schedules_no_follow_up_or_retry(
    outcome: BaseException | None, follow_up: bool, expected: QueueState
) -> None:
    async def scenario(queue: WorkQueue, double: HandlerDouble, clock: FakeClock) -> None:
        gate = double.block("a")
        double.fail("a", outcome)
        queue.submit("a")
        await double.wait_for_calls(1)
        if follow_up:
            queue.submit("a")
        closing = asyncio.create_task(queue.close(grace=30))
        await clock.wait_for_sleepers(1)
        gate.set()
        await closing
        assert asyncio.all_tasks() == {asyncio.current_task()}
        state = queue.status("a")
        assert (state.state, state.next_retry_at) == (expected, None)
        await queue.drain()
        assert double.calls == ["a"]

    run(scenario, policy=POLICY)
