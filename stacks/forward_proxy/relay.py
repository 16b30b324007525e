"""Copy bytes both ways between a client and its upstream, until both are done or the pair falls quiet.

Half-closes are passed on (a client that shuts its sending side still gets the answer). A relay in which
no byte was read either way for `idle` seconds is aborted on both sides: a silent pair would otherwise hold
two descriptors for ever. Quiet is measured by one timer per relay, set for the idle limit and set again
only when it fires early (bytes moved meanwhile), so a busy relay pays a clock read per chunk, no timer.
"""

from __future__ import annotations

import asyncio

from stacks.forward_proxy.dial import Streams

CHUNK = 65536


class _Quiet:
    """Aborts `writers` once nothing was read for `idle` seconds."""

    def __init__(self, idle: float, writers: tuple[asyncio.StreamWriter, ...]) -> None:
        self._loop = asyncio.get_running_loop()
        self._idle = idle
        self._writers = writers
        self.last = self._loop.time()
        self._timer = self._loop.call_later(idle, self._check)

    def moved(self) -> None:
        self.last = self._loop.time()

    def stop(self) -> None:
        self._timer.cancel()

    def _check(self) -> None:
        due = self.last + self._idle
        if self._loop.time() < due:
            self._timer = self._loop.call_at(due, self._check)
            return
        for writer in self._writers:
            writer.transport.abort()  # not close(): a peer that reads nothing must not keep it open


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, quiet: _Quiet) -> None:
    try:
        while data := await reader.read(CHUNK):
            quiet.moved()
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.close()


async def relay(client: Streams, upstream: Streams, *, idle: float) -> None:
    """Copy both ways until both sides are done or `idle` seconds pass without a byte, then close both."""
    quiet = _Quiet(idle, (client[1], upstream[1]))
    try:
        await asyncio.gather(_copy(client[0], upstream[1], quiet), _copy(upstream[0], client[1], quiet))
    finally:
        quiet.stop()
        for writer in (client[1], upstream[1]):
            writer.close()
