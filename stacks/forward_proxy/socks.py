"""SOCKS5 (RFC 1928) CONNECT with username/password authentication (RFC 1929) when credentials are set."""

from __future__ import annotations

import asyncio
import ipaddress
import struct

from stacks.forward_proxy.dial import DialError, dial, relay
from stacks.forward_proxy.users import Gate

NO_AUTH, USER_PASS, NO_METHOD = 0x00, 0x02, 0xFF
SUCCEEDED, COMMAND_NOT_SUPPORTED, ADDRESS_NOT_SUPPORTED = 0x00, 0x07, 0x08


def _reply(writer: asyncio.StreamWriter, code: int) -> None:
    writer.write(bytes([5, code, 0, 1, 0, 0, 0, 0, 0, 0]))


async def _authenticate(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, gate: Gate) -> bool:
    version, count = await reader.readexactly(2)
    methods = await reader.readexactly(count)
    wanted = NO_AUTH if gate.open else USER_PASS
    if version != 5 or wanted not in methods:
        writer.write(bytes([5, NO_METHOD]))
        return False
    writer.write(bytes([5, wanted]))
    if wanted == NO_AUTH:
        return True
    _, user_length = await reader.readexactly(2)
    user = await reader.readexactly(user_length)
    password = await reader.readexactly((await reader.readexactly(1))[0])
    good = gate.admits(user, password)
    writer.write(bytes([1, 0 if good else 1]))
    return good


async def _destination(reader: asyncio.StreamReader) -> tuple[int, str | None, int]:
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


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, gate: Gate) -> None:
    if not await _authenticate(reader, writer, gate):
        return
    command, host, port = await _destination(reader)
    if host is None:
        _reply(writer, ADDRESS_NOT_SUPPORTED)
        return
    if command != 1:
        _reply(writer, COMMAND_NOT_SUPPORTED)
        return
    try:
        upstream = await dial(host, port, gate.config.egress)
    except DialError as exc:
        print(f"refused {host}:{port}: {exc}", flush=True)
        _reply(writer, exc.socks_reply)
        return
    _reply(writer, SUCCEEDED)
    await relay((reader, writer), upstream)
