"""SOCKS5 (RFC 1928) CONNECT with username/password authentication (RFC 1929) when credentials are set.

The handshake (greeting, login, request) must be over within `limits.handshake_seconds` of the accept, else
the connection is closed without a word. A request for port 0 is answered 0x01 (general failure: RFC 1928
has no code for a malformed request, and "refused" would blame the site).
"""

from __future__ import annotations

import asyncio
import ipaddress
import struct

from stacks.forward_proxy.connection import Connection
from stacks.forward_proxy.dial import DialError
from stacks.forward_proxy.occupancy import Full

NO_AUTH, USER_PASS, NO_METHOD = 0x00, 0x02, 0xFF
SUCCEEDED, COMMAND_NOT_SUPPORTED, ADDRESS_NOT_SUPPORTED = 0x00, 0x07, 0x08
Destination = tuple[int, str | None, int]  # command, host (None: an address type we do not know), port


def _reply(writer: asyncio.StreamWriter, code: int) -> None:
    writer.write(bytes([5, code, 0, 1, 0, 0, 0, 0, 0, 0]))


def refuse(writer: asyncio.StreamWriter, full: Full) -> None:
    """A connection past a cap: closed without a word (a reply needs the greeting read first)."""


async def _authenticate(conn: Connection) -> bool:
    reader, writer = conn.reader, conn.writer
    version, count = await reader.readexactly(2)
    methods = await reader.readexactly(count)
    wanted = NO_AUTH if conn.open else USER_PASS
    if version != 5 or wanted not in methods:
        writer.write(bytes([5, NO_METHOD]))
        return False
    writer.write(bytes([5, wanted]))
    if wanted == NO_AUTH:
        return True
    _, user_length = await reader.readexactly(2)
    user = await reader.readexactly(user_length)
    password = await reader.readexactly((await reader.readexactly(1))[0])
    good = await conn.admit(user, password)
    writer.write(bytes([1, 0 if good else 1]))
    return good


async def _destination(reader: asyncio.StreamReader) -> Destination:
    _, command, _, kind = await reader.readexactly(4)
    if kind == 1:
        host: str | None = str(ipaddress.IPv4Address(await reader.readexactly(4)))
    elif kind == 4:
        host = str(ipaddress.IPv6Address(await reader.readexactly(16)))
    elif kind == 3:
        host = (await reader.readexactly((await reader.readexactly(1))[0])).decode("idna")
    else:
        host = None
    (port,) = struct.unpack("!H", await reader.readexactly(2)) if host is not None else (0,)
    return command, host, port


async def _handshake(conn: Connection) -> Destination | None:
    """Greeting, login and request within the deadline; None when refused, too slow, or gone."""
    try:
        async with asyncio.timeout(conn.config.limits.handshake_seconds):
            if not await _authenticate(conn):
                return None
            return await _destination(conn.reader)
    except TimeoutError:
        return None


async def handle(conn: Connection) -> None:
    writer = conn.writer
    request = await _handshake(conn)
    if request is None:
        return
    command, host, port = request
    if host is None:
        _reply(writer, ADDRESS_NOT_SUPPORTED)
        return
    if command != 1:
        _reply(writer, COMMAND_NOT_SUPPORTED)
        return
    try:
        upstream = await conn.dial(host, port)
    except DialError as exc:
        print(f"refused {host}:{port}: {exc}", flush=True)
        _reply(writer, exc.socks_reply)
        return
    _reply(writer, SUCCEEDED)
    await conn.relay(upstream)
