"""Benchmark: a lease's push of its user to the proxy's control channel, a new connection per push
(`control.call`, before) against one kept connection per channel (`ControlClient.call`, now).

The channel is the real one of a `local` proxy (`control.start` over the proxy's `LeaseUsers`) in a process
of its own, as a listener is; this process is the service's side, on uvloop as `serve` runs. Each round
sends BENCH_CALLS `add`s (a user and its ttl, what a lease sends), BENCH_CONCURRENCY at a time, through each
client in turn; printed per client: CPU microseconds per push in this process and in the listener, and the
pushes per second. Ratios (now / before) are of the same run. Printed, never asserted. About 20 seconds.

BENCH_CALLS (4000), BENCH_CONCURRENCY (64), BENCH_ROUNDS (3).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import uvloop  # noqa: E402

from stacks.forward_proxy import control  # noqa: E402
from stacks.forward_proxy.control_client import ControlClient  # noqa: E402

CALLS = int(os.environ.get("BENCH_CALLS", "4000"))
CONCURRENCY = int(os.environ.get("BENCH_CONCURRENCY", "64"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))

LISTENER = """
import asyncio, sys, uvloop
from stacks.forward_proxy import control
from stacks.forward_proxy.users import LeaseUsers

async def main():
    server = await control.start(sys.argv[1], LeaseUsers())
    print("ready", flush=True)
    await asyncio.Event().wait()

uvloop.run(main())
"""

Call = Callable[..., Awaitable[dict[str, Any]]]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def pushes(call: Call, path: str, round_: int) -> None:
    limit = asyncio.Semaphore(CONCURRENCY)

    async def one(i: int) -> None:
        async with limit:
            request = {"op": "add", "user": f"lease-{round_}-{i}", "password": "p" * 22, "ttl": 60}
            await call(path, request, wait=10)

    await asyncio.gather(*(one(i) for i in range(CALLS)))


def measure(call: Call, path: str, listener: int, round_: int) -> tuple[float, float, float]:
    """(our CPU us per push, the listener's CPU us per push, pushes per second)"""
    ours, theirs, wall = time.process_time(), cpu_seconds(listener), time.perf_counter()
    uvloop.run(pushes(call, path, round_))
    wall = time.perf_counter() - wall
    ours, theirs = time.process_time() - ours, cpu_seconds(listener) - theirs
    return ours / CALLS * 1e6, theirs / CALLS * 1e6, CALLS / wall


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-control-") as tmp:
        path = str(Path(tmp) / "proxy.ctl")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with subprocess.Popen(
            [sys.executable, "-c", LISTENER, path], stdout=subprocess.PIPE, text=True, env=env
        ) as listener:
            try:
                assert listener.stdout is not None
                assert listener.stdout.readline() == "ready\n"
                figures: dict[str, list[tuple[float, float, float]]] = {"before": [], "now": []}
                for r in range(ROUNDS):
                    figures["before"].append(measure(control.call, path, listener.pid, 2 * r))
                    client = ControlClient()
                    figures["now"].append(measure(client.call, path, listener.pid, 2 * r + 1))
                    uvloop.run(client.close())
            finally:
                listener.kill()
    print(f"{CALLS} pushes of a lease user, {CONCURRENCY} at a time, {ROUNDS} rounds (medians):")
    medians = {
        name: [statistics.median(f[i] for f in rows) for i in range(3)] for name, rows in figures.items()
    }
    for name, label in (("before", "a connection per push"), ("now", "a kept connection")):
        ours, theirs, rate = medians[name]
        print(f"  {label:22s} service {ours:6.1f} us/push, listener {theirs:6.1f} us/push, {rate:7.0f}/s")
    before, now = medians["before"], medians["now"]
    print(
        f"  now / before: service CPU {now[0] / before[0]:.2f}x, listener CPU {now[1] / before[1]:.2f}x, "
        f"rate {now[2] / before[2]:.2f}x"
    )


if __name__ == "__main__":
    main()
