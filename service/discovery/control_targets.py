"""Where one lease user goes: every listener of a proxy's control channel (lease_users.py).

A unix socket path is one target. `tcp://NAME:PORT` (a proxy pod's) is one target per address NAME resolves
to now: the headless Service of a proxy's pods names each pod, and during a rollout an old and a new pod
both serve the proxy, so a lease's user must be on each. A name that does not resolve (within the push's
bound) has no targets: the lease is not answered.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable

from stacks.forward_proxy.channel import tcp_address, tcp_channel

Resolve = Callable[[str, int], Awaitable[list[str]]]


async def resolve_addresses(host: str, port: int) -> list[str]:
    """Every address `host` resolves to (the loop's getaddrinfo, in its executor), in its order, once."""
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        pass
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:  # socket.gaierror: no such name (yet), or no DNS answer
        return []
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


async def targets(channel: str, *, resolve: Resolve, wait: float) -> list[str]:
    """The channels to send one request to: `channel` itself, or one `tcp://ADDRESS:PORT` per address."""
    try:
        address = tcp_address(channel)
    except ValueError:
        return []
    if address is None:
        return [channel]
    host, port = address
    try:
        async with asyncio.timeout(wait):
            found = await resolve(host, port)
    except TimeoutError:
        return []
    return [tcp_channel(item, port) for item in found]
