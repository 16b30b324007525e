"""The event loop the forward proxy runs on: uvloop where it is installed, else asyncio's own.

At 10,000 running `local` proxies probed every 10 s, the shared listeners relaying the probes used more CPU
than the service and the API server together (docs/operations.md, "10,000 running proxies"). uvloop (libuv)
accepts, reads and writes with a fraction of asyncio's Python overhead, and the forward proxy uses nothing
it lacks (streams, servers on given sockets, signal handlers). The service's image and virtual environment
have it (uvicorn runs on it); a guest or host without it runs asyncio's loop, as before.
`PROXY_OPERATOR_PROXY_LOOP=asyncio` asks for asyncio's loop where uvloop is installed.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["LOOP_ENV", "loop_factory", "run"]

LOOP_ENV = "PROXY_OPERATOR_PROXY_LOOP"
T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop factory when it is installed and not turned off; None: asyncio's default loop."""
    if os.environ.get(LOOP_ENV, "uvloop") == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on the loop `loop_factory` picks."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
