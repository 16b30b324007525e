"""A long-running role (the prober) that never dies silently: a crash is logged and the role restarts."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass
class Supervised:
    """Runs `role()` until it returns or is cancelled; an exception is logged with its traceback and the
    role starts again after `pause` seconds. `error` says why it is down meanwhile (for /readyz)."""

    name: str
    role: Callable[[], Awaitable[None]]
    pause: float = 1.0
    error: str | None = None
    restarts: int = 0

    async def run(self) -> None:
        while True:
            try:
                await self.role()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.error = f"the {self.name} failed: {type(exc).__name__}: {exc}"
                self.restarts += 1
                log.exception("%s (restarting in %.0f s)", self.error, self.pause)
            await asyncio.sleep(self.pause)
            self.error = None

    async def ready(self) -> str | None:
        return self.error
