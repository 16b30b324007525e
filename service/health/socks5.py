"""The client side of a SOCKS5 CONNECT (RFC 1928) with username/password auth (RFC 1929)."""

from __future__ import annotations

import asyncio
import ipaddress
import struct
from typing import Protocol

NO_AUTH, USER_PASS, NO_ACCEPTABLE = 0x00, 0x02, 0xFF


class Stream(Protocol):
    """What the handshake needs of a connection (asyncio's streams have it, and the prober's connection)."""

    async def readexactly(self, n: int) -> bytes: ...

    def write(self, data: bytes) -> None: ...


class Socks5Error(Exception):
    def __init__(self, outcome: str, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome


async def socks5_connect(
    reader: Stream,
    writer: Stream,
    *,
    host: str,
    port: int,
    username: str | None,
    password: str | None,
) -> None:
    """Ask the proxy on (reader, writer) to connect to host:port; raise Socks5Error if it will not."""
    methods = bytes([USER_PASS]) if username is not None else bytes([NO_AUTH])
    writer.write(bytes([5, len(methods)]) + methods)
    version, method = await _read(reader, 2)
    if version != 5 or method == NO_ACCEPTABLE:
        raise Socks5Error("auth_failed", "the SOCKS5 proxy accepts none of our auth methods")
    if method == USER_PASS:
        await _authenticate(reader, writer, username=username or "", password=password or "")
    writer.write(b"\x05\x01\x00" + _address(host) + struct.pack("!H", port))
    _, reply, _, atyp = await _read(reader, 4)
    if reply != 0:
        raise Socks5Error("proxy_error", f"the SOCKS5 proxy refused CONNECT (reply {reply})")
    await _skip_bound_address(reader, atyp)


async def _authenticate(reader: Stream, writer: Stream, *, username: str, password: str) -> None:
    user, secret = username.encode(), password.encode()
    writer.write(bytes([1, len(user)]) + user + bytes([len(secret)]) + secret)
    _, status = await _read(reader, 2)
    if status != 0:
        raise Socks5Error("auth_failed", "the SOCKS5 proxy refused its credentials")


def _address(host: str) -> bytes:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        name = host.encode("idna")
        return bytes([3, len(name)]) + name
    return (b"\x01" if ip.version == 4 else b"\x04") + ip.packed


async def _skip_bound_address(reader: Stream, atyp: int) -> None:
    if atyp == 1:
        await _read(reader, 4 + 2)
    elif atyp == 4:
        await _read(reader, 16 + 2)
    elif atyp == 3:
        (length,) = await _read(reader, 1)
        await _read(reader, length + 2)
    else:
        raise Socks5Error("proxy_error", f"the SOCKS5 proxy sent an unknown address type {atyp}")


async def _read(reader: Stream, n: int) -> bytes:
    try:
        return await reader.readexactly(n)
    except (asyncio.IncompleteReadError, OSError) as exc:
        raise Socks5Error("proxy_error", f"the SOCKS5 proxy closed the connection: {exc}") from exc
