"""Pulumi's mocks create futures on the current event loop when `set_mocks` runs.

`asyncio.run` (used by other suites) leaves the main thread with no current loop, so without this fixture a
mocked program test would fail or pass depending on which tests ran before it. It restores what the main
thread has by default: one loop that lives for the session.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Iterator

import pytest

_session_loop: asyncio.AbstractEventLoop | None = None
_loops: list[asyncio.AbstractEventLoop] = []  # the loops these tests ran on


@pytest.fixture(autouse=True)
def current_event_loop() -> asyncio.AbstractEventLoop:
    global _session_loop
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            _loops.append(asyncio.get_event_loop())  # it may make one: closed at the session's end too
            return _loops[-1]
        except RuntimeError:
            pass
    if _session_loop is None or _session_loop.is_closed():
        _session_loop = asyncio.new_event_loop()
    asyncio.set_event_loop(_session_loop)
    return _session_loop


@pytest.fixture(scope="session", autouse=True)
def close_the_session_loop() -> Iterator[None]:
    """The loop made above is closed when the session ends: left open, it is an unclosed-socket warning
    (an error here) whenever the tests after these leave no loop of their own to replace it."""
    yield
    for loop in {*_loops, *([_session_loop] if _session_loop else [])}:
        if not loop.is_closed() and not loop.is_running():
            loop.close()
