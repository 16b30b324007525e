"""Wakes lease requests that wait for a proxy, when something that may free one happens.

`notify` may come from any thread (a source updating the inventory); the wake-up is handed to the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading


class Waiter:
    def __init__(self) -> None:
        self._event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self.generation = 0

    async def wait(self, generation: int, *, seconds: float) -> None:
        """Return after `seconds`, or earlier once anything was notified since `generation` was read."""
        if generation != self.generation:
            return
        with self._lock:
            self._loop = asyncio.get_running_loop()
            if self._event is None:
                self._event = asyncio.Event()
            event = self._event
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), seconds)

    def notify(self) -> None:
        with self._lock:
            self.generation += 1
            loop, event = self._loop, self._event
            self._event = None
        if loop is None or event is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            event.set()
        else:
            loop.call_soon_threadsafe(event.set)
