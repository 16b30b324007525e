"""Backoff policy, error taxonomy and the injectable clocks: pure units, no wall-clock timing."""

from __future__ import annotations

import asyncio
import dataclasses
import random

import pytest

from automation.backoff import BackoffPolicy
from automation.clock import FakeClock, MonotonicClock
from automation.errors import (
    CredentialsError,
    InvalidInputError,
    PermanentError,
    ProxyOperatorError,
    Reason,
    StackLockedError,
    TransientError,
    UnknownProviderError,
    classify,
)

# -- backoff ---------------------------------------------------------------------------------------------


def test_ceiling_grows_by_factor_up_to_cap() -> None:
    policy = BackoffPolicy(base=10, cap=100)
    assert [policy.ceiling(n) for n in range(1, 7)] == [10, 20, 40, 80, 100, 100]
    assert [BackoffPolicy(base=1, cap=50, factor=3).ceiling(n) for n in range(1, 5)] == [1, 3, 9, 27]


def test_ceiling_of_a_huge_failure_count_is_the_cap_not_an_overflow() -> None:
    assert BackoffPolicy(base=5, cap=300).ceiling(100_000) == 300
    assert BackoffPolicy(base=5, cap=300, factor=1).ceiling(100_000) == 5


def test_delay_is_full_jitter_below_the_ceiling_and_reproducible_with_a_seed() -> None:
    policy = BackoffPolicy(base=10, cap=100)
    samples = [policy.delay(3, random.Random(seed)) for seed in range(2000)]
    assert all(0 <= s <= 40 for s in samples)
    # Full jitter: spread over the whole range, not bunched near the ceiling.
    assert min(samples) < 4
    assert max(samples) > 36
    assert 0.45 * 40 < sum(samples) / len(samples) < 0.55 * 40
    assert policy.delay(3, random.Random(7)) == policy.delay(3, random.Random(7))


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"base": 0}, "base"), ({"base": 10, "cap": 5}, "cap"), ({"factor": 0.5}, "factor")],
)
def test_invalid_policy_names_the_field(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        BackoffPolicy(**kwargs)


def test_policy_is_frozen_data_and_failures_start_at_one() -> None:
    policy = BackoffPolicy()
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.base = 1  # type: ignore[misc]
    with pytest.raises(ValueError, match="failures"):
        policy.delay(0, random.Random(1))


# -- errors ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "kind", "reason"),
    [
        (InvalidInputError("bad port"), PermanentError, Reason.INVALID_INPUT),
        (UnknownProviderError("no gcp-eu"), PermanentError, Reason.UNKNOWN_PROVIDER),
        (CredentialsError("403"), PermanentError, Reason.CREDENTIALS_REJECTED),
        (StackLockedError("locked by pid 1"), TransientError, Reason.STACK_LOCKED),
        (TransientError("timeout", reason=Reason.NETWORK), TransientError, Reason.NETWORK),
        (InvalidInputError("no kvm-9", reason=Reason.MISSING_KVM_HOST), PermanentError, "MissingKvmHost"),
    ],
)
def test_errors_are_sorted_by_what_happens_next(error: ProxyOperatorError, kind: type, reason: str) -> None:
    assert isinstance(error, kind)
    assert isinstance(error, ProxyOperatorError)
    assert error.reason == reason
    assert error.message == str(error)


def test_transient_error_carries_a_non_negative_retry_after() -> None:
    assert StackLockedError("locked", retry_after=12.5).retry_after == 12.5
    assert TransientError("x").retry_after is None
    with pytest.raises(ValueError, match="retry_after"):
        TransientError("x", retry_after=-1)


def test_classify_keeps_our_errors_and_wraps_others_as_unexpected_transient() -> None:
    ours = CredentialsError("denied")
    assert classify(ours) is ours
    cause = KeyError("proxies")
    wrapped = classify(cause)
    assert isinstance(wrapped, TransientError)
    assert wrapped.reason == Reason.UNEXPECTED
    assert wrapped.__cause__ is cause
    assert "KeyError" in wrapped.message


# -- clocks ----------------------------------------------------------------------------------------------


def test_fake_clock_wakes_sleepers_in_deadline_order_at_their_own_time() -> None:
    async def scenario() -> None:
        clock = FakeClock(start=100.0)
        woke: list[tuple[str, float]] = []

        async def sleeper(name: str, seconds: float) -> None:
            await clock.sleep(seconds)
            woke.append((name, clock.now()))

        tasks = [asyncio.create_task(sleeper(n, s)) for n, s in [("late", 30), ("early", 10), ("never", 99)]]
        await clock.wait_for_sleepers(3)
        assert clock.sleepers == [110.0, 130.0, 199.0]
        await clock.advance(5)
        assert woke == []
        await clock.advance(45)
        assert woke == [("early", 110.0), ("late", 130.0)]
        assert clock.now() == 150.0
        tasks[2].cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert clock.sleepers == []
        await clock.advance(100)  # the cancelled sleeper's deadline passes without effect
        assert len(woke) == 2

    asyncio.run(scenario())


def test_fake_clock_refuses_to_go_back_and_zero_sleep_just_yields() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        await clock.sleep(0)
        assert clock.sleepers == []
        with pytest.raises(ValueError, match="backwards"):
            await clock.advance(-1)

    asyncio.run(scenario())


def test_monotonic_clock_follows_the_loop() -> None:
    async def scenario() -> None:
        clock = MonotonicClock()
        before = clock.now()
        await clock.sleep(0)
        assert clock.now() >= before

    asyncio.run(scenario())
