"""Pacing: a client that keeps asking after it was refused waits for its answer, at no cost to others.

A refusal is cheap in discovery but not in the server (docs/operations.md, "Two hostile clients"): a client
that ignores `Retry-After` and sends as fast as the API answers, on many connections, takes the event loop
from everyone else even while every answer is a 429. So, per client name and replica: after a refusal
(any 4xx of the lease and report routes) the client's next requests are held (an `asyncio.sleep`: no CPU)
until their slot: one `SPACING` apart while the client goes on being refused, however many connections it
uses; and after a refusal of the client as a whole (429 `lease_rate`, `too_many_reports`: the error
handler marks them with `STATE_PACE`) until its `Retry-After` ends (at most `MAX_HOLD`). A 429
`lease_share` or a 503 is about a pool or a target, which another worker of the same token may not be
asking for, so those hold nobody for their `Retry-After`. Its first
answer that is not a refusal lifts the pacing. A client that waits as told never meets it.

Only requests whose client is known before the route runs are paced (those with a body: leases, reports,
renewals; `BodyGuard` authenticated them). A release carries no body and is never held.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.body_guard import STATE_CLIENT
from service.auth import Client

STATE_PACE = "pace_seconds"  # set by the error handler on a refusal for the client as a whole

MAX_HOLD = 5.0  # seconds a request is held at most, whatever Retry-After said
SPACING = 0.05  # a client that goes on being refused is answered at most this often
MAX_CLIENTS = 100_000  # bounded memory: the oldest paced clients are forgotten first
PACED = ("/v1/leases", "/v1/reports")


class Pacer:
    """The pacing state, per client name: shared by `ClientPacing` and the lease fast path (fast_lease.py),
    which answers its requests itself, exactly as `ClientPacing` would."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._next: dict[str, float] = {}  # client -> when its next request may be served

    def paces(self, name: str) -> bool:
        """Whether the client's next request may be held."""
        return name in self._next

    async def wait(self, name: str) -> None:
        slot = self._next.get(name)
        if slot is None:
            return
        now = self._clock()
        start = max(slot, now)
        self._next[name] = start + SPACING  # the next request of this client queues behind this one
        if start > now:
            await asyncio.sleep(start - now)

    def answered(self, name: str, status: int, pace: float | None) -> None:
        if status < 400 or status >= 500:
            self._next.pop(name, None)  # served (or our failure, not the client's): no pacing
            return
        now = self._clock()
        hold = min(pace, MAX_HOLD) if pace is not None else SPACING
        self._next[name] = max(self._next.get(name, 0.0), now + hold)
        if len(self._next) > MAX_CLIENTS:
            self._next.pop(next(iter(self._next)))


class ClientPacing:
    def __init__(self, app: ASGIApp, *, pacer: Pacer | None = None) -> None:
        self.app = app
        self.pacer = pacer or Pacer()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        client = scope.get("state", {}).get(STATE_CLIENT) if scope["type"] == "http" else None
        if not isinstance(client, Client) or not str(scope.get("path", "")).startswith(PACED):
            await self.app(scope, receive, send)
            return
        await self.pacer.wait(client.name)
        await self.app(scope, receive, self._watching(client.name, scope, send))

    def _watching(self, name: str, scope: Scope, send: Send) -> Send:
        async def watched(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.pacer.answered(name, int(message["status"]), scope.get("state", {}).get(STATE_PACE))
            await send(message)

        return watched
