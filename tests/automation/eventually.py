"""Waiting in real-engine tests: poll a condition on the event loop until it holds or a deadline passes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def eventually(condition: Callable[[], object], *, within: float, what: str) -> None:
    """Return as soon as `condition()` is true; fail naming `what` if it is still false after `within` s."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"after {within:.0f}s still waiting for {what}")
        await asyncio.sleep(0.01)


def wait_until(condition: Callable[[], object], *, within: float, what: str) -> None:
    """As `eventually`, in a thread that may block."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"after {within:.0f}s still waiting for {what}")
        time.sleep(0.02)
