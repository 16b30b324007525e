"""`python -m stacks.forward_proxy CONFIG.json`: serve until SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from functools import partial
from pathlib import Path

from stacks.forward_proxy import http, socks
from stacks.forward_proxy.config import ProxyConfig


async def _session(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, config: ProxyConfig) -> None:
    handler = socks.handle if config.protocol == "socks5" else http.handle
    try:
        peer = writer.get_extra_info("peername")
        if not peer or not config.admits(peer[0]):
            return  # not an allowed source: closed without a word
        await handler(reader, writer, config)
        await writer.drain()
    except (ConnectionError, OSError, asyncio.IncompleteReadError, UnicodeError):
        pass  # the client went away or spoke nonsense: nothing to answer
    finally:
        writer.close()


async def serve(config: ProxyConfig) -> None:
    server = await asyncio.start_server(
        partial(_session, config=config), config.bind, config.port, limit=http.MAX_HEAD, reuse_address=True
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        print(f"listening on {config.bind}:{config.port} ({config.protocol})", flush=True)
        await stop.wait()


def main(argv: list[str]) -> None:
    config = ProxyConfig.read(Path(argv[1]))
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(config))


if __name__ == "__main__":
    main(sys.argv)
