"""The shared listener: one process serving many proxies of one `local` provider entry, each on its own
port with its own configuration (`processModel: shared`, docs/providers.md).

Run as `python -m stacks.forward_proxy --shared CONTROL.sock`. It starts serving nothing: the `local`
provider adds each proxy over the control socket (0600 in the 0700 state folder, like a proxy's own
channel), which also carries the lease users of every proxy it serves, each request naming its proxy
(`namespace/name`; the service's channel for it is `shared:NAMESPACE/NAME@CONTROL.sock`, channel.py):

    {"op": "serve", "proxy": K, "config": PATH} -> {"ok": true, "port": P}   listening once answered; a proxy
        already served from the same PATH takes PATH's settings in place (an interrupted create again)
    {"op": "reload", "proxy": K}                -> {"ok": true}   PATH read again, applied in place
    {"op": "drop", "proxy": K}                  -> {"ok": true, "remaining": N}   listener closed, its
        connections cut (N: proxies still served; the provider stops the process at 0)
    {"op": "status", "proxy": K}                -> {"ok": true, "served": {"bind", "port", "protocol"} | null}
    {"op": "hello"}                             -> {"ok": true, "instance": ID, "proxies": N}
    add / renew / revoke / hello (control.py) with "proxy": K  -> that proxy's own lease users

A refusal is `{"ok": false, "error": ...}` (a port in use, an edit that needs a new listener, an unknown
proxy). Nothing is kept on disk: a listener started again serves nothing until the provider adds its
proxies again (the next `up` after a refresh found them gone), and knows no lease users.

Descriptors: the soft limit is raised to the hard one at start. Every port holds one, every connection two,
and the connections of all proxies together are capped to what is left after the ports and a reserve (503
or closed past it), on top of each proxy's own caps (`config.Limits`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from stacks.forward_proxy import control, http
from stacks.forward_proxy import loop as proxy_loop
from stacks.forward_proxy.config import ProxyConfig
from stacks.forward_proxy.connection import Shared
from stacks.forward_proxy.occupancy import PER_CONNECTION, RESERVE, Occupancy, raise_to_hard
from stacks.forward_proxy.reload import needs_new_process
from stacks.forward_proxy.session import new_shared, session
from stacks.forward_proxy.users import Gate

FLAG = "--shared"
Answer = dict[str, Any]


def _refused(error: str) -> Answer:
    return {"ok": False, "error": error}


@dataclass
class Served:
    config_file: Path
    shared: Shared
    server: asyncio.Server


class Listener:
    """The proxies this process serves, by key, and the answers of its control socket."""

    def __init__(self, *, descriptors: int) -> None:
        self.instance = secrets.token_hex(8)
        self._proxies: dict[str, Served] = {}
        self._descriptors = descriptors
        self._overall = Occupancy(per_source=1, total=1)  # one key: the cap of every proxy together
        self._fit()
        self._ops: dict[str, Callable[[str, dict[str, Any]], Awaitable[Answer]]] = {
            "serve": self._serve,
            "reload": self._reload,
            "drop": self._drop,
            "status": self._status,
        }

    async def answer(self, request: dict[str, Any]) -> Answer:
        op, proxy = request.get("op"), request.get("proxy")
        if op == "hello" and proxy is None:
            return {"ok": True, "instance": self.instance, "proxies": len(self._proxies)}
        if not isinstance(proxy, str) or not proxy:
            return _refused("name the proxy: a shared listener serves many")
        handler = self._ops.get(str(op))
        if handler is not None:
            return await handler(proxy, request)
        served = self._proxies.get(proxy)
        if served is None:
            return _refused(f"no proxy {proxy} is served here")
        if served.shared.gate.open:
            return _refused(f"{proxy} has no authentication: no lease users to scope")
        return control.apply(served.shared.gate.users, request)

    def close(self) -> None:
        for served in self._proxies.values():
            served.server.close()

    def _fit(self) -> None:
        """Connections of all proxies together: what the descriptors leave after the ports and a reserve."""
        room = max(1, (self._descriptors - RESERVE - len(self._proxies)) // PER_CONNECTION)
        self._overall.total = self._overall.per_source = room

    async def _serve(self, proxy: str, request: dict[str, Any]) -> Answer:
        path = request.get("config")
        if not isinstance(path, str):
            return _refused("serve: the proxy's config file as `config`")
        try:
            config = ProxyConfig.read(Path(path))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return _refused(f"cannot use {path}: {exc}")
        served = self._proxies.get(proxy)
        if served is not None:
            if served.config_file != Path(path):
                return _refused(f"{proxy} is served from {served.config_file}, not {path}")
            return self._apply(served, config) | {"port": served.server.sockets[0].getsockname()[1]}
        shared = new_shared(config, total=config.limits.total)
        try:
            server = await asyncio.start_server(
                partial(session, shared=shared, overall=self._overall),
                config.bind,
                config.port,
                limit=http.MAX_HEAD,
                reuse_address=True,
            )
        except OSError as exc:
            return _refused(f"cannot listen on {config.bind}:{config.port}: {exc}")
        self._proxies[proxy] = Served(config_file=Path(path), shared=shared, server=server)
        self._fit()
        port = server.sockets[0].getsockname()[1]  # the port bound (0 in the config: one the kernel chose)
        print(f"{proxy}: listening on {config.bind}:{port} ({config.protocol})", flush=True)
        return {"ok": True, "port": port}

    async def _reload(self, proxy: str, _request: dict[str, Any]) -> Answer:
        served = self._proxies.get(proxy)
        if served is None:
            return _refused(f"no proxy {proxy} is served here")
        try:
            config = ProxyConfig.read(served.config_file)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return _refused(f"cannot use {served.config_file}: {exc}")
        return self._apply(served, config)

    @staticmethod
    def _apply(served: Served, config: ProxyConfig) -> Answer:
        blocked = needs_new_process(served.shared.gate.config, config)
        if blocked:
            return _refused(f"{', '.join(blocked)} need a new listener")
        served.shared.gate = Gate(config=config, users=served.shared.gate.users)
        return {"ok": True}

    async def _drop(self, proxy: str, _request: dict[str, Any]) -> Answer:
        served = self._proxies.pop(proxy, None)
        if served is not None:
            served.server.close()  # the listening socket closes now; then its open connections go
            for connection in list(served.shared.connections):
                connection.cut()
            self._fit()
            print(f"{proxy}: dropped", flush=True)
        return {"ok": True, "remaining": len(self._proxies)}

    async def _status(self, proxy: str, _request: dict[str, Any]) -> Answer:
        served = self._proxies.get(proxy)
        if served is None:
            return {"ok": True, "served": None}
        config = served.shared.gate.config
        return {"ok": True, "served": {"bind": config.bind, "port": config.port, "protocol": config.protocol}}


async def run(control_path: str, *, descriptors: int) -> None:
    listener = Listener(descriptors=descriptors)
    server = await control.start_unix(control_path, listener.answer)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"shared listener on {control_path} ({descriptors} descriptors)", flush=True)
    try:
        await stop.wait()
    finally:
        server.close()
        listener.close()
        with contextlib.suppress(OSError):
            os.unlink(control_path)


def main(control_path: str) -> None:
    descriptors = raise_to_hard()
    with contextlib.suppress(KeyboardInterrupt):
        proxy_loop.run(run(control_path, descriptors=descriptors))
