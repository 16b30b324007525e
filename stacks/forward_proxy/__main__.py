"""`python -m stacks.forward_proxy CONFIG.json`: serve until SIGTERM; SIGHUP applies an edited CONFIG.json in
place where it can (`reload.py`). How each connection is judged: `session.py`.

`python -m stacks.forward_proxy --shared CONTROL.sock` is the shared listener instead
(`shared_listener.py`): one process serving many proxies, each on its own port, added and removed over that
control socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from functools import partial
from pathlib import Path

from stacks.forward_proxy import control, http, shared_listener
from stacks.forward_proxy import loop as proxy_loop
from stacks.forward_proxy.channel import tcp_address
from stacks.forward_proxy.config import ProxyConfig
from stacks.forward_proxy.connection import Shared
from stacks.forward_proxy.reload import reload
from stacks.forward_proxy.session import new_shared, session
from stacks.forward_proxy.users import Gate


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
        users.hold(config.limits.lease_hold_seconds)  # followed: the service brings this instance its users
    print(f"lease users on {config.control}", flush=True)
    return server


def _reload(shared: Shared, config_file: Path) -> None:
    config = reload(shared.gate.config, config_file)
    if config is not shared.gate.config:
        shared.gate = Gate(config=config, users=shared.gate.users)


async def serve(config: ProxyConfig, config_file: Path | None = None) -> None:
    shared = new_shared(config)
    channel = await _control(shared)  # before the proxy listens: ready means both are
    server = await asyncio.start_server(
        partial(session, shared=shared), config.bind, config.port, limit=http.MAX_HEAD, reuse_address=True
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
    if len(argv) == 3 and argv[1] == shared_listener.FLAG:
        shared_listener.main(argv[2])
        return
    config_file = Path(argv[1])
    try:
        config = ProxyConfig.read(config_file)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        sys.exit(f"cannot use {config_file}: {exc}")
    with contextlib.suppress(KeyboardInterrupt):
        proxy_loop.run(serve(config, config_file))


def entry() -> None:
    """The `proxy-operator-forward-proxy CONFIG.json` console script (the image's proxy daemon)."""
    if len(sys.argv) != 2:
        sys.exit("usage: proxy-operator-forward-proxy CONFIG.json")
    main(sys.argv)


if __name__ == "__main__":
    main(sys.argv)
