"""One client connection as the protocol handlers (`http`, `socks`) see it: its streams and settings, the
login, the dial and the relay; and the cut that ends it when its lease user ends.

A login as a lease user tethers the connection to that user (`tethers.py`). The connection keeps its
upstream side once dialed, so a cut aborts both sockets at once (nothing more is sent either way, buffered
bytes included). Whatever the handler waits for then ends on its own: a read sees the end of the stream, a
relay stops, and a dial still under way is closed as soon as it connects. A connection cut in the middle of
a request simply closes; no task is cancelled (the cut comes from the control channel or a timer).

At the end a socket is closed gracefully (what was written is still sent), but a peer that reads nothing
cannot keep it: past `LINGER` seconds it is aborted, since it no longer counts against any cap.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from stacks.forward_proxy.config import ProxyConfig
from stacks.forward_proxy.dial import Streams, dial
from stacks.forward_proxy.occupancy import Occupancy
from stacks.forward_proxy.relay import relay
from stacks.forward_proxy.tethers import Tethers
from stacks.forward_proxy.users import Gate, Login

LINGER = 10.0  # seconds a closed connection may take to hand its last bytes to a slow reader


@dataclass
class Shared:
    """What every connection of one proxy shares: who may log in, whose connections follow which lease
    user, and which are open. `gate` is replaced when an edited configuration is applied in place
    (`reload.py`); a connection reads it at each step, so what it judges next follows the edit."""

    gate: Gate
    tethers: Tethers
    occupancy: Occupancy
    connections: set[Connection] = field(default_factory=set)  # open now: a shared listener cuts them


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, shared: Shared) -> None:
        self.reader = reader
        self.writer = writer
        self._shared = shared
        self._cut = False
        self._upstream: asyncio.StreamWriter | None = None
        self._user: bytes | None = None  # the lease user it logged in as

    @property
    def config(self) -> ProxyConfig:
        return self._shared.gate.config

    @property
    def open(self) -> bool:
        """No authentication at all: every client is admitted without a login."""
        return self._shared.gate.open

    def login(self, user: bytes, password: bytes) -> bool:
        """Is `user`:`password` admitted? A lease user's connection ends with the user from now on."""
        login = self._shared.gate.login(user, password)
        if login is Login.LEASE and self._user is None:
            self._user = user
            self._shared.tethers.attach(user, self)
        return login is not Login.REFUSED

    async def admit(self, user: bytes, password: bytes) -> bool:
        """`login`, or, refused as a lease user a new instance has not been given yet (`LeaseUsers.hold`),
        `login` again once that user arrives or the hold ends."""
        if self.login(user, password):
            return True
        users = self._shared.gate.users
        if not users.holds(user):
            return False
        await users.arrival(user)
        return self.login(user, password)

    async def dial(self, host: str, port: int) -> Streams:
        """`dial.dial` under the proxy's egress policy; the upstream side is kept for a cut. A
        ConnectionError when the connection was cut while dialing."""
        upstream = await dial(host, port, self.config.egress)
        self._upstream = upstream[1]
        if self._cut:
            upstream[1].transport.abort()
            raise ConnectionError("cut while dialing: its lease user ended")
        return upstream

    async def relay(self, upstream: Streams) -> None:
        await relay((self.reader, self.writer), upstream, idle=self.config.limits.idle_seconds)

    def cut(self) -> None:
        """Its lease user ended: abort both sides now."""
        self._cut = True
        for writer in (self.writer, self._upstream):
            if writer is not None:
                writer.transport.abort()

    def close(self) -> None:
        """The handler is done (or was cut): let go of the user and close both sides."""
        if self._user is not None:
            self._shared.tethers.detach(self._user, self)
        for writer in (self.writer, self._upstream):
            if writer is not None:
                linger(writer)


def linger(writer: asyncio.StreamWriter) -> None:
    """Close `writer` once its buffer is sent, or abort it `LINGER` seconds from now if it is not."""
    writer.close()
    if writer.transport.get_write_buffer_size():
        asyncio.get_running_loop().call_later(LINGER, writer.transport.abort)
