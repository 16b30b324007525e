"""The event loop the forward proxy runs on: uvloop where it is installed, else asyncio's own.

At 10,000 running `local` proxies probed every 10 s, the shared listeners relaying the probes used more CPU
than the service and the API server together (docs/operations.md, "10,000 running proxies"). uvloop (libuv)
accepts, reads and writes with a fraction of asyncio's Python overhead, and the forward proxy uses nothing
it lacks (streams, servers on given sockets, signal handlers). The service's image and virtual environment
have it (uvicorn runs on it); a guest or host without it runs asyncio's loop, as before.
`PROXY_OPERATOR_PROXY_LOOP=asyncio` asks for asyncio's loop where uvloop is installed.

`PROXY_OPERATOR_PROXY_SCHED=batch` (set by the `local` provider for the processes it starts) runs the
process under Linux's SCHED_BATCH policy. A `local` proxy shares its host's cores with the service that
probes it and pushes its lease users: each probe's `connect()` and `send()` wakes the proxy's process, and a
woken process under the normal policy may preempt the service inside that call. At 10,000 running proxies
the service's event loop was busy 80 % of the wall time at 0.42 of a core, most of it in those calls
(docs/operations.md, run 33). Under SCHED_BATCH a process keeps its share of the CPU (the same nice value)
but does not preempt on wake-up. A pod or a VM, where the proxy has its cores to itself, runs as it comes.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["LOOP_ENV", "NICE_ENV", "SCHED_ENV", "loop_factory", "run", "schedule"]

LOOP_ENV = "PROXY_OPERATOR_PROXY_LOOP"
SCHED_ENV = "PROXY_OPERATOR_PROXY_SCHED"
# The nice value of the process that lowered its own priority before starting Pulumi (the engine host:
# automation/engine/host.py): the `local` proxies an `up` starts go back to it where allowed
# (stacks/programs/local_process.py), since they carry crawler traffic.
NICE_ENV = "PROXY_OPERATOR_PROXY_NICE"
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


def schedule() -> None:
    """Take the scheduling policy SCHED_ENV asks for (`batch`); any other value, or none, changes nothing."""
    if os.environ.get(SCHED_ENV) != "batch" or not hasattr(os, "SCHED_BATCH"):
        return
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except OSError as exc:  # a seccomp profile or an old kernel: run as before, and say so
        print(f"forward proxy: SCHED_BATCH refused ({exc}); the normal policy stays", file=sys.stderr)


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on the loop `loop_factory` picks, under the policy `schedule` takes."""
    schedule()
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
