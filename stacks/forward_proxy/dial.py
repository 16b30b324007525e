"""Resolve a destination, judge each address with the egress policy, connect to an allowed one.

Failures are `DialError`s that carry what each protocol answers: the HTTP status, the RFC 9209 error
token, and the SOCKS5 reply code. A port outside 1..65535 is refused before anything is resolved.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass

from stacks.egress import PROHIBITED, decide
from stacks.models import EgressSpec

CONNECT_TIMEOUT = 15.0


@dataclass
class DialError(Exception):
    status: int  # HTTP status for the client
    error: str  # RFC 9209 Proxy-Status error token
    socks_reply: int  # RFC 1928 REP field
    detail: str

    def __str__(self) -> str:
        return f"{self.error}: {self.detail}"


Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _resolve(host: str, port: int) -> list[str]:
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise DialError(502, "dns_error", 0x04, f"cannot resolve {host}: {exc}") from exc
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def valid_port(port: int) -> bool:
    return 0 < port < 65536


async def dial(host: str, port: int, policy: EgressSpec) -> Streams:
    """An open connection to `host`:`port` on an address the policy allows, else a DialError."""
    if not valid_port(port):
        raise DialError(400, "http_request_error", 0x01, f"{port} is no port (1 to 65535)")
    addresses = await _resolve(host.strip("[]"), port)
    allowed = [address for address in addresses if decide(policy, address, port).allowed]
    if not allowed:
        reason = decide(policy, addresses[0], port).reason if addresses else "no address"
        raise DialError(403, PROHIBITED, 0x02, f"{host}:{port} refused by the egress policy: {reason}")
    last: DialError | None = None
    for address in allowed:  # an IP literal: open_connection resolves nothing more
        try:
            return await asyncio.wait_for(asyncio.open_connection(address, port), CONNECT_TIMEOUT)
        except TimeoutError:
            last = DialError(504, "connection_timeout", 0x04, f"{host}:{port} did not answer in time")
        except ConnectionRefusedError:
            last = DialError(502, "connection_refused", 0x05, f"{host}:{port} refused the connection")
        except OSError as exc:
            last = DialError(502, "destination_unavailable", 0x04, f"{host}:{port}: {exc.strerror or exc}")
    assert last is not None
    raise last
