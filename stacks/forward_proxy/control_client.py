"""Kept connections to proxies' control channels: `ControlClient.call` is `control.call` without a new
connection per request.

A lease on a proxy with lease-scoped credentials pushes its user to the proxy's control channel before it is
answered. `control.call` opens a connection for that one request and closes it again: connect, write, read,
close, wait for the close, so several turns of the service's event loop per lease, and an accept and a
session of their own in the listener. Here each address (a unix socket, shared by every proxy of a shared
listener, or a pod's `tcp://` address) has one connection, kept open and pipelined: requests are written as
they come, and the channel answers a connection's requests one by one in order (`control._session`), so
the n-th answer line is the n-th request's.

- A connection is opened on first use and closed after IDLE_SECONDS unused (a `tcp://` one after
  TCP_IDLE_SECONDS: its listener closes a session idle for `control.IDLE_SECONDS`).
- A request written on a kept connection that turns out dead (the listener started again, or it closed the
  session as idle) is sent once more on a new connection. Every request of the protocol may be applied
  twice (an add sets the user and its end again, a revoke is idempotent, a hello only reads). A request on
  a new connection is not sent again.
- Each call has its own deadline; a call that gave up leaves its answer to be read and dropped, so the
  order of the rest holds.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import time
from typing import Any

from stacks.forward_proxy import control
from stacks.forward_proxy.control import MAX_LINE, ControlError, addressed, checked_answer

IDLE_SECONDS = 30.0  # a connection unused this long is closed (checked at most once per SWEEP_SECONDS)
TCP_IDLE_SECONDS = control.IDLE_SECONDS / 2  # a tcp listener closes a session idle for control.IDLE_SECONDS
SWEEP_SECONDS = 2.5

Address = str | tuple[str, int]


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.pending: collections.deque[asyncio.Future[bytes]] = collections.deque()
        self.used = time.monotonic()
        self.closed = False
        self.reading = asyncio.create_task(self._read(reader), name="control-connection")

    async def send(self, line: bytes) -> bytes:
        if self.closed:
            raise ConnectionResetError("the connection is closed")
        answer: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.pending.append(answer)
        self.used = time.monotonic()
        try:
            self.writer.write(line)
            await self.writer.drain()
        except BaseException:
            answer.cancel()  # its line may be half written: this connection is done
            self.close(ConnectionResetError("a request could not be written"))
            raise
        return await answer

    async def _read(self, reader: asyncio.StreamReader) -> None:
        why: Exception = ConnectionResetError("the channel closed the connection")
        try:
            while line := await reader.readline():
                if not self.pending:  # an answer to no request: the channel is not one we know
                    why = ConnectionResetError("an answer to no request")
                    break
                answer = self.pending.popleft()
                if not answer.done():  # done: its call gave up; its answer is dropped, the order holds
                    answer.set_result(line)
        except (OSError, ValueError) as exc:  # ValueError: a line past MAX_LINE
            why = ConnectionResetError(f"the connection failed: {str(exc) or type(exc).__name__}")
        finally:
            self.close(why)

    def close(self, why: Exception | None = None) -> None:
        self.closed = True
        while self.pending:
            answer = self.pending.popleft()
            if not answer.done():
                answer.set_exception(why or ConnectionResetError("the connection was closed"))
        self.writer.close()


class ControlClient:
    """`call` as `control.call` does it, over kept connections (the module docstring)."""

    def __init__(self, *, idle: float = IDLE_SECONDS) -> None:
        self._idle = idle
        self._connections: dict[Address, _Connection] = {}
        self._opening: dict[Address, asyncio.Future[_Connection]] = {}
        self._swept = time.monotonic()

    async def call(
        self, channel: str, request: dict[str, Any], *, wait: float, password: str | None = None
    ) -> dict[str, Any]:
        address, request = addressed(channel, request, password=password)
        line = json.dumps(request).encode() + b"\n"
        try:
            async with asyncio.timeout(wait):
                connection, kept = await self._connection(address)
                try:
                    answer = await connection.send(line)
                except (ConnectionError, OSError):
                    if not kept:
                        raise
                    connection, _ = await self._connection(address)  # a dead kept connection: once more
                    answer = await connection.send(line)
        except (OSError, TimeoutError) as exc:
            raise ControlError(f"control channel {channel}: {str(exc) or type(exc).__name__}") from exc
        return checked_answer(channel, answer)

    async def _connection(self, address: Address) -> tuple[_Connection, bool]:
        """The kept connection to `address`, or a new one: (connection, whether it was kept)."""
        self._sweep()
        kept = self._connections.get(address)
        if kept is not None and not kept.closed:
            return kept, True
        opening = self._opening.get(address)
        if opening is not None:  # another call is connecting: share its connection
            return await asyncio.shield(opening), False
        opening = asyncio.get_running_loop().create_future()
        self._opening[address] = opening
        try:
            if isinstance(address, str):
                reader, writer = await asyncio.open_unix_connection(address, limit=MAX_LINE)
            else:
                reader, writer = await asyncio.open_connection(*address, limit=MAX_LINE)
        except BaseException as exc:
            opening.set_exception(exc if isinstance(exc, Exception) else ConnectionAbortedError())
            opening.exception()  # retrieved: no "never retrieved" warning when no call shared it
            raise
        finally:
            self._opening.pop(address, None)
        connection = self._connections[address] = _Connection(reader, writer)
        opening.set_result(connection)
        return connection, False

    def _sweep(self) -> None:
        now = time.monotonic()
        if now - self._swept < SWEEP_SECONDS:
            return
        self._swept = now
        for address, connection in list(self._connections.items()):
            idle = self._idle if isinstance(address, str) else min(self._idle, TCP_IDLE_SECONDS)
            if connection.closed or (not connection.pending and now - connection.used > idle):
                connection.close()
                del self._connections[address]

    async def close(self) -> None:
        """Close every connection (a call still waiting gets a ControlError)."""
        connections = list(self._connections.values())
        self._connections.clear()
        for connection in connections:
            connection.close()
        for connection in connections:
            connection.reading.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await connection.reading
            with contextlib.suppress(OSError):
                await connection.writer.wait_closed()

    def __len__(self) -> int:
        return sum(1 for connection in self._connections.values() if not connection.closed)
