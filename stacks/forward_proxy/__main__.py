"""`python -m stacks.forward_proxy CONFIG.json`: serve until SIGTERM; SIGHUP applies an edited CONFIG.json in
place where it can (`reload.py`).

Each accepted connection is judged in this order: an allowed source (else closed without a word), room
under the per-source and total caps (else refused by the protocol: 429 / 503 for HTTP), then its handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from functools import partial
from pathlib import Path

from stacks.forward_proxy import control, http, socks
from stacks.forward_proxy.channel import tcp_address
from stacks.forward_proxy.config import ProxyConfig
from stacks.forward_proxy.connection import Connection, Shared, linger
from stacks.forward_proxy.occupancy import Occupancy, fit_descriptors, source_of
from stacks.forward_proxy.reload import reload
from stacks.forward_proxy.tethers import Tethers
from stacks.forward_proxy.users import Gate, LeaseUsers


async def _session(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, shared: Shared) -> None:
    protocol = socks if shared.gate.config.protocol == "socks5" else http
    peer = writer.get_extra_info("peername")
    if not peer or not shared.gate.config.admits(peer[0]):
        writer.close()  # not an allowed source: closed without a word
        return
    source = source_of(peer[0])
    full = shared.occupancy.enter(source)
    if full is not None:
        protocol.refuse(writer, full)
        linger(writer)
        return
    connection = Connection(reader, writer, shared)
    try:
        await protocol.handle(connection)
        await writer.drain()
    except (ConnectionError, OSError, asyncio.IncompleteReadError, UnicodeError):
        pass  # the client went away or spoke nonsense: nothing to answer
    except asyncio.CancelledError:
        pass  # the proxy stops; ended, not cancelled: Python 3.11 logs a traceback per cancelled session
    finally:
        connection.close()
        shared.occupancy.leave(source)


def _shared(config: ProxyConfig) -> Shared:
    users = LeaseUsers()
    total = fit_descriptors(config.limits.total)
    if total < config.limits.total:
        print(f"at most {total} connections: the descriptor limit allows no more", flush=True)
    return Shared(
        gate=Gate(config=config, users=users),
        tethers=Tethers(users),
        occupancy=Occupancy(per_source=config.limits.per_source, total=total),
    )


async def _control(shared: Shared) -> asyncio.Server | None:
    """The lease users' control channel, when configured and the proxy authenticates at all: a unix socket,
    or `tcp://HOST:PORT` whose requests carry the token of the proxy's password (as a reload leaves it)."""
    config = shared.gate.config
    if config.control is None or config.username is None:
        return None
    address = tcp_address(config.control)
    if address is None:
        server = await control.start(config.control, shared.gate.users)
    else:
        users, host, port = shared.gate.users, *address
        server = await control.start_tcp(host, port, users, password=lambda: shared.gate.config.password)
    print(f"lease users on {config.control}", flush=True)
    return server


def _reload(shared: Shared, config_file: Path) -> None:
    config = reload(shared.gate.config, config_file)
    if config is not shared.gate.config:
        shared.gate = Gate(config=config, users=shared.gate.users)


async def serve(config: ProxyConfig, config_file: Path | None = None) -> None:
    shared = _shared(config)
    channel = await _control(shared)  # before the proxy listens: ready means both are
    server = await asyncio.start_server(
        partial(_session, shared=shared), config.bind, config.port, limit=http.MAX_HEAD, reuse_address=True
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if config_file is not None:  # an edit the `local` provider applies in place
        loop.add_signal_handler(signal.SIGHUP, _reload, shared, config_file)
    try:
        async with server:
            print(f"listening on {config.bind}:{config.port} ({config.protocol})", flush=True)
            await stop.wait()
    finally:
        if channel is not None:
            channel.close()
            if tcp_address(str(config.control)) is None:
                with contextlib.suppress(OSError):
                    os.unlink(str(config.control))


def main(argv: list[str]) -> None:
    config_file = Path(argv[1])
    try:
        config = ProxyConfig.read(config_file)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        sys.exit(f"cannot use {config_file}: {exc}")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(config, config_file))


def entry() -> None:
    """The `proxy-operator-forward-proxy CONFIG.json` console script (the image's proxy daemon)."""
    if len(sys.argv) != 2:
        sys.exit("usage: proxy-operator-forward-proxy CONFIG.json")
    main(sys.argv)


if __name__ == "__main__":
    main(sys.argv)
