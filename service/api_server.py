"""The API's HTTP server: uvicorn on uvloop's event loop, parsing HTTP with httptools.

Both are pinned runtime dependencies (pyproject.toml), named here explicitly and never left to uvicorn's
"auto" (which falls back to asyncio's loop and h11 without a word when they are missing): on asyncio and
h11 a request costs 40-60 % more CPU (docs/decisions.md, "Leases and our `up`"). There is no fallback:
every platform the service runs on (Linux and macOS, where the Pulumi CLI and the `local` proxies run) has
wheels of both, and a service that silently lost a third of its capacity is worse than one that does not
start. `serve` logs what actually serves (`describe`), and a test reads that line from the running process.

The loop is made by whoever runs the coroutine: `run` gives `serve` the loop this config names (asyncio.run
would make a plain asyncio loop, whatever the config says).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import uvicorn

LOOP = "uvloop"
HTTP = "httptools"
# No route of the API is a WebSocket: uvicorn's "auto" would import a WebSocket implementation (wsproto and
# h11 here, about 0.5 MiB of every replica's RSS) to upgrade connections nothing accepts.
WS = "none"

T = TypeVar("T")


def server_config(
    app: Any, *, host: str, port: int, loop: str = LOOP, http: str = HTTP, **options: Any
) -> uvicorn.Config:
    """uvicorn's config for `app` on LOOP and HTTP, without WebSockets (WS; a benchmark may name others to
    compare); `options` as uvicorn.Config takes them."""
    return uvicorn.Config(app, host=host, port=port, loop=loop, http=http, **{"ws": WS, **options})


def run(main: Coroutine[Any, Any, T], config: uvicorn.Config) -> T:
    """Run `main` to its end on a new event loop of the kind `config` names (LOOP)."""
    with asyncio.Runner(loop_factory=config.get_loop_factory()) as runner:
        return runner.run(main)


def describe(config: uvicorn.Config) -> str:
    """What serves, as the running process sees it: the running loop's class and the HTTP protocol class
    uvicorn builds each connection with (the config is loaded here if uvicorn has not done it yet)."""
    if not config.loaded:
        config.load()
    loop = type(asyncio.get_running_loop())
    protocol = config.http_protocol_class
    return f"{loop.__module__}.{loop.__qualname__}, HTTP by {protocol.__module__}.{protocol.__qualname__}"
