"""One Redis connection shared by all requests; a command is written without waiting for earlier replies.

Redis answers the commands of one connection in order, so replies go to callers first in, first out. Commands
issued in the same turn of the event loop leave together (up to `FLUSH_AT` per write), and replies arriving
together are read at once.
Under load this costs a small fraction of a redis-py call (connection pool, retry and script wrappers, one
write and one read per command), which was most of a lease's CPU with the Redis store (docs/operations.md,
"Bench").

It speaks RESP2 over TCP, with the host, port, credentials and database of the redis-py client it is built
from; for other connections (TLS, Unix sockets) `for_client` returns None and the store keeps using redis-py.
Errors are redis-py's: a reply error is a `ResponseError` (`NoScriptError` for NOSCRIPT), a lost or silent
connection a `ConnectionError` or `TimeoutError` for every command waiting on it (each also a
`StoreUnavailable`, which the API answers with a 503), and the next command connects again.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any, cast

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from service.discovery.errors import StoreUnavailable

REPLY_TIMEOUT_SECONDS = 10.0  # a reply slower than this means the connection is gone
# Commands leave at the end of the event loop's turn, or as soon as this many wait: Redis then starts on them
# while this process goes on with other requests (measured: +5-10 % leases/s against flushing once a turn).
FLUSH_AT = 8
_INCOMPLETE = object()


class StoreConnectionError(RedisConnectionError, StoreUnavailable):
    """No connection to Redis: redis-py's error, and the API's 503."""


class StoreTimeoutError(RedisTimeoutError, StoreUnavailable):
    """No reply from Redis in time: redis-py's error, and the API's 503."""


class RedisPipe:
    def __init__(
        self, *, host: str, port: int, db: int = 0, username: str | None = None, password: str | None = None
    ) -> None:
        self._address = (host, port)
        self._hello: list[tuple[str, ...]] = []
        if password is not None:
            self._hello.append(("AUTH", username, password) if username else ("AUTH", password))
        if db:
            self._hello.append(("SELECT", str(db)))
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Future[_Protocol] | None = None

    @classmethod
    def for_client(cls, client: aioredis.Redis) -> RedisPipe | None:
        """A pipe to where `client` connects, or None when that is not plain TCP."""
        pool = client.connection_pool
        if pool.connection_class is not aioredis.Connection:
            return None
        kw = pool.connection_kwargs
        return cls(
            host=kw.get("host", "localhost"),
            port=int(kw.get("port", 6379)),
            db=int(kw.get("db", 0) or 0),
            username=kw.get("username"),
            password=kw.get("password"),
        )

    async def call(self, *args: str) -> Any:
        protocol = self._protocol
        if protocol is None or protocol.closed or protocol.loop is not asyncio.get_running_loop():
            protocol = await self._connect()
        return await protocol.send(args)

    async def script(self, sha: str, source: str, keys: list[str], args: list[str]) -> Any:
        """EVALSHA, loading the script once when Redis does not know it (a restart, a flush)."""
        try:
            return await self.call("EVALSHA", sha, str(len(keys)), *keys, *args)
        except NoScriptError:
            await self.call("SCRIPT", "LOAD", source)
            return await self.call("EVALSHA", sha, str(len(keys)), *keys, *args)

    async def close(self) -> None:
        protocol, self._protocol = self._protocol, None
        if protocol is not None and protocol.loop is asyncio.get_running_loop():
            protocol.abort(StoreConnectionError("closed"))

    async def _connect(self) -> _Protocol:
        if self._connecting is None or self._connecting.get_loop() is not asyncio.get_running_loop():
            self._connecting = asyncio.ensure_future(self._open())
        connecting = self._connecting
        try:
            protocol = await asyncio.shield(connecting)
        finally:
            if self._connecting is connecting and connecting.done():
                self._connecting = None
        return protocol

    async def _open(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        try:
            _, protocol = await asyncio.wait_for(
                loop.create_connection(_Protocol, *self._address), REPLY_TIMEOUT_SECONDS
            )
        except (OSError, TimeoutError) as exc:
            raise StoreConnectionError(f"cannot connect to Redis at {self._address}: {exc}") from exc
        for command in self._hello:
            await protocol.send(command)
        old, self._protocol = self._protocol, protocol
        if old is not None and old.loop is loop:
            old.abort(StoreConnectionError("replaced"))
        return protocol


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.closed = False
        self._transport: asyncio.Transport | None = None
        self._outgoing: list[bytes] = []
        self._waiting: deque[tuple[asyncio.Future[Any], float]] = deque()
        self._buffer = b""
        self._watchdog: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is one without the subclass

    def send(self, args: tuple[str | None, ...]) -> asyncio.Future[Any]:
        if self.closed:
            raise StoreConnectionError("the connection to Redis is closed")
        future: asyncio.Future[Any] = self.loop.create_future()
        if not self._outgoing:
            self.loop.call_soon(self._flush)
        self._outgoing.append(_pack(args))
        if len(self._outgoing) >= FLUSH_AT:
            self._flush()
        self._waiting.append((future, time.monotonic()))
        if self._watchdog is None:
            self._watchdog = self.loop.call_later(REPLY_TIMEOUT_SECONDS, self._check)
        return future

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer + data if self._buffer else data
        position = 0
        while self._waiting:
            parsed = _parse(buffer, position)
            if parsed is None:
                break
            reply, position = parsed
            future = self._waiting.popleft()[0]
            if future.done():
                continue  # its caller was cancelled
            if isinstance(reply, ResponseError):
                future.set_exception(reply)
            else:
                future.set_result(reply)
        self._buffer = buffer[position:]

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(StoreConnectionError(f"connection to Redis lost: {exc or 'closed by the server'}"))

    def abort(self, error: Exception) -> None:
        self._fail(error)
        if self._transport is not None:
            self._transport.abort()

    def _flush(self) -> None:
        if self._outgoing and self._transport is not None and not self.closed:
            self._transport.write(b"".join(self._outgoing))
        self._outgoing.clear()

    def _check(self) -> None:
        self._watchdog = None
        if not self._waiting:
            return
        waited = time.monotonic() - self._waiting[0][1]
        if waited >= REPLY_TIMEOUT_SECONDS:
            self.abort(StoreTimeoutError(f"no reply from Redis in {waited:.0f} s"))
        else:
            self._watchdog = self.loop.call_later(REPLY_TIMEOUT_SECONDS - waited, self._check)

    def _fail(self, error: Exception) -> None:
        self.closed = True
        while self._waiting:
            future = self._waiting.popleft()[0]
            if not future.done():
                future.set_exception(error)
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None


def _pack(args: tuple[str | None, ...]) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = (arg or "").encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def _parse(buffer: bytes, position: int) -> tuple[Any, int] | None:
    """One RESP2 reply from `position`: (reply, next position), or None until more bytes arrive."""
    end = buffer.find(b"\r\n", position)
    if end < 0:
        return None
    kind, line, position = buffer[position], buffer[position + 1 : end], end + 2
    if kind == 36:  # $ bulk string
        size = int(line)
        if size < 0:
            return None, position
        if len(buffer) < position + size + 2:
            return None
        return buffer[position : position + size].decode(), position + size + 2
    if kind == 42:  # * array
        items = []
        for _ in range(max(int(line), 0)):
            parsed = _parse(buffer, position)
            if parsed is None:
                return None
            item, position = parsed
            items.append(item)
        return (items if int(line) >= 0 else None), position
    if kind == 43:  # + simple string
        return line.decode(), position
    if kind == 58:  # : integer
        return int(line), position
    if kind == 45:  # - error
        message = line.decode()
        error = NoScriptError if message.startswith("NOSCRIPT") else ResponseError
        return error(message), position
    raise StoreConnectionError(f"unexpected reply from Redis: {bytes(buffer[position - 2 :])[:40]!r}")
