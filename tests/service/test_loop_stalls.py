"""Where the event loop was when it ran late (service/loop_stalls.py): a real loop, a real watcher thread."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest
from prometheus_client import CollectorRegistry

from service import loop_stalls
from service.loop_lag import LoopLag
from service.loop_stalls import StallWatch, stack_of


@pytest.fixture(autouse=True)
def _every_stall_warned(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each stall its own warning: a stall of the test machine's own (a busy CI) is then a warning apart
    from the one a test looks for, not one that holds it back."""
    monkeypatch.setattr(loop_stalls, "REPORT_EVERY", 0.0)


def _held_by(caplog: pytest.LogCaptureFixture, what: str) -> str:
    found = [r.getMessage() for r in caplog.records if "event loop held" in r.getMessage()]
    mine = [m for m in found if f"{what} (service/test_loop_stalls.py:" in m.split("; busy threads")[0]]
    assert len(mine) == 1, found
    return mine[0]


def _stalls(registry: CollectorRegistry) -> float:
    return registry.get_sample_value("proxy_operator_event_loop_stalls_total") or 0.0


def _run(scenario_steps, *, threshold: float = 0.1):  # type: ignore[no-untyped-def]
    registry = CollectorRegistry()
    lag = LoopLag(registry, every=0.01)
    watch = StallWatch(registry, threshold=threshold, period=lag.every, beat=lambda: lag.last_wake)

    async def scenario() -> None:
        task = asyncio.create_task(lag.run())
        watch.start()
        try:
            await scenario_steps()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            watch.stop()

    asyncio.run(scenario())
    return registry


def _hold_the_loop_in_a_parse(seconds: float) -> None:
    """Pure Python work on the loop's thread (a pass over the fleet did this)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(range(1000))


def test_a_held_loop_is_reported_with_where_its_thread_was(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="service.loop_stalls")

    async def steps() -> None:
        await asyncio.sleep(0.1)
        _hold_the_loop_in_a_parse(0.5)
        await asyncio.sleep(0.2)  # the loop beats again: the watcher reports

    registry = _run(steps)
    assert _stalls(registry) >= 1
    message = _held_by(caplog, "_hold_the_loop_in_a_parse")
    assert "steps (service/test_loop_stalls.py:" in message
    assert "base_events" not in message, "the loop's own frames are the same in every stall: left out"
    assert "runners" not in message
    assert "1 time(s)" in message
    held_ms = float(message.split("longest ")[1].split(" ms")[0])
    assert 350 <= held_ms <= 1500, message  # the hold, give or take the watcher's and the beat's steps
    # a thread that computes is on a CPU or waiting for one (a loaded machine): never asleep through it
    on_cpu = float(message.split("on a CPU ")[1].split(" ms")[0])
    waiting = float(message.split("waiting for one ")[1].split(" ms")[0])
    assert on_cpu + waiting >= 0.5 * held_ms, message


def test_a_loop_asleep_in_a_blocking_call_is_told_from_one_that_computes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A blocking call on the loop (the thread asleep in the kernel): neither on a CPU nor waiting for one."""
    caplog.set_level(logging.WARNING, logger="service.loop_stalls")

    async def steps() -> None:
        await asyncio.sleep(0.1)
        time.sleep(0.5)  # noqa: ASYNC251  # a blocking call on the loop
        await asyncio.sleep(0.2)

    _run(steps)
    message = _held_by(caplog, "steps")
    held_ms = float(message.split("longest ")[1].split(" ms")[0])
    on_cpu = float(message.split("on a CPU ")[1].split(" ms")[0])
    waiting = float(message.split("waiting for one ")[1].split(" ms")[0])
    assert on_cpu + waiting < 0.3 * held_ms, message
    assert "steps (service/test_loop_stalls.py:" in message


def test_a_busy_thread_beside_the_loop_is_named(caplog: pytest.LogCaptureFixture) -> None:
    """A thread holding the GIL in Python while the loop waits for it shows among the busy threads."""
    caplog.set_level(logging.WARNING, logger="service.loop_stalls")
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(1000))

    async def steps() -> None:
        hog = threading.Thread(target=spin, name="the-hog")
        hog.start()
        try:
            await asyncio.sleep(0.1)
            _hold_the_loop_in_a_parse(0.5)
            await asyncio.sleep(0.2)
        finally:
            stop.set()
            hog.join()

    _run(steps)
    assert "the-hog in spin (service/test_loop_stalls.py:" in _held_by(caplog, "_hold_the_loop_in_a_parse")


def test_a_loop_that_keeps_its_beat_reports_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """Short steps (30 ms, under the 400-ms threshold) for half a second: no stall."""
    caplog.set_level(logging.WARNING, logger="service.loop_stalls")

    async def steps() -> None:
        for _ in range(15):
            _hold_the_loop_in_a_parse(0.03)
            await asyncio.sleep(0.005)

    registry = _run(steps, threshold=0.4)
    assert _stalls(registry) == 0
    assert not [r for r in caplog.records if "event loop held" in r.getMessage()]


def test_stalls_between_two_warnings_go_into_the_next_one(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three stalls within REPORT_EVERY: the first is warned of at once, the next two together in the
    warning after the period, each counted on /metrics as it ends."""
    caplog.set_level(logging.WARNING, logger="service.loop_stalls")
    monkeypatch.setattr(loop_stalls, "REPORT_EVERY", 1.5)  # over the autouse fixture's

    async def steps() -> None:
        for _ in range(3):
            await asyncio.sleep(0.1)
            _hold_the_loop_in_a_parse(0.25)
        await asyncio.sleep(1.5)
        _hold_the_loop_in_a_parse(0.25)  # ends the period: its warning carries the two before it too
        await asyncio.sleep(0.2)

    registry = _run(steps)
    warnings = [r.getMessage() for r in caplog.records if "event loop held" in r.getMessage()]
    assert len(warnings) == 2, warnings
    assert "1 time(s)" in warnings[0]
    assert "3 time(s)" in warnings[1]
    assert _stalls(registry) == 4


def test_a_deep_stack_names_our_call_below_a_library_s_frames() -> None:
    """A blocking call deep inside a library (here json's encoder, called through a chain of our frames):
    the innermost frames, then ours, not the library's middle (the loop once blocked 30 s in urllib3's
    read under a credentials write, and the eight innermost frames were all urllib3's and ssl's)."""
    import json
    import sys

    seen: list[str] = []

    def default(_obj: object) -> object:
        seen.append(stack_of(sys._getframe(), depth=5))
        return None

    def ours_outer() -> str:
        return ours_inner()

    def ours_inner() -> str:
        return json.dumps({"a": [[[[object()]]]]}, default=default)

    ours_outer()
    [stack] = seen
    frames = stack.split(" < ")
    assert frames[0].startswith("default (service/test_loop_stalls.py:"), stack
    assert frames[2] == "...", stack
    assert frames[3].startswith("ours_inner (service/test_loop_stalls.py:"), stack
    assert frames[4].startswith("ours_outer (service/test_loop_stalls.py:"), stack


def test_a_stack_reads_innermost_first() -> None:
    def inner() -> str:
        import sys

        return stack_of(sys._getframe(), depth=2)

    def outer() -> str:
        return inner()

    assert outer().startswith("inner (service/test_loop_stalls.py:")
    assert " < outer (service/test_loop_stalls.py:" in outer()
