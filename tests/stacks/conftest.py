"""Pulumi's mocks create futures on the current event loop when `set_mocks` runs.

`asyncio.run` (used by other suites) leaves the main thread with no current loop, so without this fixture a
mocked program test would fail or pass depending on which tests ran before it. It restores what the main
thread has by default: one loop that lives for the session.
"""

from __future__ import annotations

import asyncio
import warnings

import pytest

_session_loop: asyncio.AbstractEventLoop | None = None


@pytest.fixture(autouse=True)
def current_event_loop() -> asyncio.AbstractEventLoop:
    global _session_loop
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            # kept here as well: a later `asyncio.run` unsets it, and a loop nobody holds is collected with
            # its self-pipe socket open (a ResourceWarning that fails whichever test it lands in)
            _session_loop = asyncio.get_event_loop()
            return _session_loop
        except RuntimeError:
            pass
    if _session_loop is None or _session_loop.is_closed():
        _session_loop = asyncio.new_event_loop()
    asyncio.set_event_loop(_session_loop)
    return _session_loop
