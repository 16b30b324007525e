"""A probe's connection: an asyncio Protocol with buffered reads, lighter than asyncio's streams.

A probe is short (connect, a request, one answer, close) and the prober makes a thousand a second, so what a
probe costs beyond the kernel's own work is the figure to keep small (`tests/bench/bench_probes.py`).
asyncio's streams put a StreamReaderProtocol, a StreamReader and a StreamWriter on every connection, and
waiting for their close takes a task; here one object is the protocol, the reader and the writer, reads wait
on one future, and a plain TCP close needs no wait (the transport is gone once its empty buffer is closed).
"""

from __future__ import annotations

import asyncio
import ssl
from typing import cast

from service.health.errors import ProbeFailed


class ProbeConnection(asyncio.Protocol):
    """One connection to a proxy. Reads raise ProbeFailed(`proxy_error`) when the peer closes early."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._eof = False
        self._lost: Exception | None = None
        self._closed: asyncio.Future[None] = loop.create_future()
        self._tls = False

    @classmethod
    async def open(cls, host: str, port: int) -> ProbeConnection:
        loop = asyncio.get_running_loop()
        _, connection = await loop.create_connection(lambda: cls(loop), host, port)
        return connection

    # --- asyncio.Protocol ---------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's are no subclasses of asyncio's

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        self._wake()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        self._lost = exc
        self._wake()
        if not self._closed.done():
            self._closed.set_result(None)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # --- reading and writing ------------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self._transport is None or self._transport.is_closing():
            raise ProbeFailed("proxy_error", "the proxy closed the connection")
        self._transport.write(data)

    async def _more(self) -> None:
        """Wait for more data; ProbeFailed if the peer has closed already."""
        if self._eof:
            cause = f": {self._lost}" if self._lost is not None else ""
            raise ProbeFailed("proxy_error", f"the proxy closed the connection{cause}")
        await self._wait()

    async def _wait(self) -> None:
        """Until data, the peer's end or the connection's loss."""
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def readuntil(self, separator: bytes, *, limit: int) -> bytes:
        """Up to and including `separator`, at most `limit` bytes before it."""
        start = 0
        while True:
            found = self._buffer.find(separator, start)
            if found >= 0:
                end = found + len(separator)
                data = bytes(self._buffer[:end])
                del self._buffer[:end]
                return data
            if len(self._buffer) > limit:
                raise ProbeFailed("bad_response", f"no end of the response head in {limit} bytes")
            start = max(0, len(self._buffer) - len(separator) + 1)
            await self._more()

    async def readexactly(self, n: int) -> bytes:
        while len(self._buffer) < n:
            await self._more()
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        return data

    async def read_to_end(self, limit: int) -> bytes:
        """What arrives until the peer closes, at most `limit` bytes."""
        while not self._eof and len(self._buffer) < limit:
            await self._wait()
        data = bytes(self._buffer[:limit])
        self._buffer.clear()
        return data

    async def start_tls(self, context: ssl.SSLContext, *, server_hostname: str) -> None:
        assert self._transport is not None
        self._buffer.clear()
        transport = await self._loop.start_tls(
            self._transport, self, context, server_hostname=server_hostname
        )
        if transport is None:
            raise ProbeFailed("proxy_error", "the TLS connection closed during its handshake")
        self._transport = cast(asyncio.Transport, transport)  # uvloop's are no subclasses of asyncio's
        self._tls = True

    async def close(self) -> None:
        """Close; a TLS close is a short exchange, waited for (at most 1 s) so no transport outlives its
        probe. A plain TCP transport with an empty buffer is gone at once."""
        if self._transport is None:
            return
        self._transport.close()
        if self._tls and not self._closed.done():
            try:
                async with asyncio.timeout(1.0):
                    await asyncio.shield(self._closed)
            except TimeoutError:
                self._transport.abort()
