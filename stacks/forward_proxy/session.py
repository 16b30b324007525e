"""One accepted client connection, judged and handled: shared by the one-proxy process (`__main__.py`) and
the shared listener (`shared_listener.py`), which serves many proxies' ports from one process.

Each accepted connection is judged in this order: an allowed source (else closed without a word), room
under the per-source and total caps (else refused by the protocol: 429 / 503 for HTTP), then its handler.
"""

from __future__ import annotations

import asyncio
from types import ModuleType

from stacks.forward_proxy import http, socks
from stacks.forward_proxy.config import ProxyConfig
from stacks.forward_proxy.connection import Connection, Shared, linger
from stacks.forward_proxy.occupancy import Full, Occupancy, fit_descriptors, source_of
from stacks.forward_proxy.tethers import Tethers
from stacks.forward_proxy.users import Gate, LeaseUsers

ALL = "*"  # the one key of a shared listener's overall cap


def protocol_of(shared: Shared) -> ModuleType:
    """The handler module (`http` or `socks`) of the proxy's protocol."""
    return socks if shared.gate.config.protocol == "socks5" else http


async def session(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    shared: Shared,
    overall: Occupancy | None = None,
) -> None:
    """Judge and handle one connection; `overall` is the shared listener's cap on its proxies together."""
    protocol = protocol_of(shared)
    peer = writer.get_extra_info("peername")
    if not peer or not shared.gate.config.admits(peer[0]):
        writer.close()  # not an allowed source: closed without a word
        return
    source = source_of(peer[0])
    full = _enter(shared.occupancy, overall, source)
    if full is not None:
        protocol.refuse(writer, full)
        linger(writer)
        return
    connection = Connection(reader, writer, shared)
    shared.connections.add(connection)
    try:
        await protocol.handle(connection)
        await writer.drain()
    except (ConnectionError, OSError, asyncio.IncompleteReadError, UnicodeError):
        pass  # the client went away or spoke nonsense: nothing to answer
    except asyncio.CancelledError:
        pass  # the proxy stops; ended, not cancelled: Python 3.11 logs a traceback per cancelled session
    finally:
        shared.connections.discard(connection)
        connection.close()
        shared.occupancy.leave(source)
        if overall is not None:
            overall.leave(ALL)


def _enter(own: Occupancy, overall: Occupancy | None, source: str) -> Full | None:
    full = own.enter(source)
    if full is None and overall is not None and overall.enter(ALL) is not None:
        own.leave(source)
        return Full.TOTAL
    return full


def new_shared(config: ProxyConfig, *, total: int | None = None) -> Shared:
    """What the connections of one proxy share. `total` caps its connections; None: as many as the
    descriptor limit allows for one proxy alone (raised towards the hard limit as far as that needs)."""
    users = LeaseUsers()
    if total is None:
        total = fit_descriptors(config.limits.total)
        if total < config.limits.total:
            print(f"at most {total} connections: the descriptor limit allows no more", flush=True)
    return Shared(
        gate=Gate(config=config, users=users),
        tethers=Tethers(users),
        occupancy=Occupancy(per_source=config.limits.per_source, total=total),
    )
