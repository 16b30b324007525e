"""`python -m stacks.forward_proxy CONFIG.json`: serve until SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from functools import partial
from pathlib import Path

from stacks.forward_proxy import control, http, socks
from stacks.forward_proxy.config import ProxyConfig
from stacks.forward_proxy.users import Gate, LeaseUsers


async def _session(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, gate: Gate) -> None:
    handler = socks.handle if gate.config.protocol == "socks5" else http.handle
    try:
        peer = writer.get_extra_info("peername")
        if not peer or not gate.config.admits(peer[0]):
            return  # not an allowed source: closed without a word
        await handler(reader, writer, gate)
        await writer.drain()
    except (ConnectionError, OSError, asyncio.IncompleteReadError, UnicodeError):
        pass  # the client went away or spoke nonsense: nothing to answer
    finally:
        writer.close()


async def _control(config: ProxyConfig, users: LeaseUsers) -> asyncio.Server | None:
    """The lease users' control channel, when configured and the proxy authenticates at all."""
    if config.control is None or config.username is None:
        return None
    server = await control.start(config.control, users)
    print(f"lease users on {config.control}", flush=True)
    return server


async def serve(config: ProxyConfig) -> None:
    gate = Gate(config=config, users=LeaseUsers())
    channel = await _control(config, gate.users)  # before the proxy listens: ready means both are
    server = await asyncio.start_server(
        partial(_session, gate=gate), config.bind, config.port, limit=http.MAX_HEAD, reuse_address=True
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with server:
            print(f"listening on {config.bind}:{config.port} ({config.protocol})", flush=True)
            await stop.wait()
    finally:
        if channel is not None:
            channel.close()
            with contextlib.suppress(OSError):
                os.unlink(str(config.control))


def main(argv: list[str]) -> None:
    config = ProxyConfig.read(Path(argv[1]))
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(config))


if __name__ == "__main__":
    main(sys.argv)
