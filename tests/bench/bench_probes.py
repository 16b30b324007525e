"""Benchmark of the prober (run by `make bench`, not by pytest). Prints figures; asserts nothing.

1. Cost: the health engine's probes (`HealthEngine.probe_all`: connect, a GET through the proxy to the echo
   route, the answer read and judged, the result applied) through real pproxy listeners, against plain TCP
   connects to the same listeners made two ways (asyncio's streams, as the first figure of issue 20 was
   taken, and a bare Protocol, the cheapest connect the loop can make), and against the floor of a probe (a
   Protocol that sends the request and reads to the end, parsing nothing). All on one event loop and
   counted in that process's CPU seconds, so the listeners' and the echo server's work is not in them. On
   uvloop (the loop `serve` runs, service/api_server.py) and on asyncio's own loop.
2. Paced: the engine's own scheduler (`HealthEngine.run`) over BENCH_PROBE_PROXIES (10,000) proxies every
   10 s, the design's 1,000 probes a second, through 4 of the project's forward proxies (`local`'s proxy) to
   the echo route: probes done per second, the prober's CPU (its process: nothing else runs there), the CPU of
   each other process, the machine's busy cores, probe latency and the event loop's lag. Two cores cannot
   hold everything at that rate: the line says which process was at a core.

Settings: BENCH_RUNS (5) rounds of BENCH_PROBES (3000) in part 1, medians of the ratios taken within each
round; BENCH_PACED_SECONDS (30) measured after one interval of warm-up (the engine spreads a new fleet's first
probes over it). Reproduce: `PYTHONPATH=$PWD .venv/bin/python tests/bench/bench_probes.py`.
"""

from __future__ import annotations

import asyncio
import base64
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_discovery as discovery  # noqa: E402
import uvloop  # noqa: E402
from bench_abuse import _machine_busy  # noqa: E402

from tests.ports import free_port  # noqa: E402
from tests.pproxy_command import PPROXY  # noqa: E402

RUNS = int(os.environ.get("BENCH_RUNS", "5"))
PROBES = int(os.environ.get("BENCH_PROBES", "3000"))
PACED_PROXIES = int(os.environ.get("BENCH_PROBE_PROXIES", "10000"))
PACED_SECONDS = float(os.environ.get("BENCH_PACED_SECONDS", "30"))
INTERVAL = 10.0
LISTENERS = 4
IN_FLIGHT = 100
USER, PASSWORD = "user", "pass"


def _engine(ports: list[int], url: str, count: int, **options: Any) -> Any:
    from prometheus_client import CollectorRegistry

    from service.health.engine import HealthEngine
    from service.health.metrics import HealthMetrics
    from service.health.probe import ProxyProber
    from service.health.thresholds import Thresholds
    from service.inventory import Inventory, ProxyEndpoint

    inventory = Inventory()
    inventory.replace_all(
        ProxyEndpoint(
            key=f"b/p{i}", namespace="b", name=f"p{i}", provider="local", host="127.0.0.1",
            port=ports[i % len(ports)], username=USER, password=PASSWORD,
        )
        for i in range(count)
    )  # fmt: skip
    registry = CollectorRegistry()
    engine = HealthEngine(
        inventory=inventory,
        prober=ProxyProber(probe_url=url),
        thresholds=Thresholds(),
        metrics=HealthMetrics(registry, health=lambda: {}),
        **options,
    )
    return engine, inventory, registry


# --- 1. what a probe costs against a connect ---
class _Floor(asyncio.Protocol):
    def __init__(self, request: bytes, done: asyncio.Future[None]) -> None:
        self.request, self.done = request, done

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.done.set_result(None)


async def _per_cpu_second(make: Callable[[int], Awaitable[object]], count: int) -> float:
    semaphore = asyncio.Semaphore(IN_FLIGHT)

    async def limited(i: int) -> None:
        async with semaphore:
            await make(i)

    began = time.process_time()
    await asyncio.gather(*(limited(i) for i in range(count)))
    return count / (time.process_time() - began)


async def _cost_round(ports: list[int], url: str) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    engine, inventory, _ = _engine(ports, url, PROBES, concurrency=IN_FLIGHT)
    began = time.process_time()
    await engine.probe_all()
    rates = {"probes": PROBES / (time.process_time() - began)}
    if len(inventory.healthy_keys()) != PROBES:
        raise RuntimeError(f"only {len(inventory.healthy_keys())} of {PROBES} probes succeeded")
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    request = (
        f"GET {url} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        f"Proxy-Authorization: Basic {token}\r\n\r\n"
    ).encode()

    async def floor(i: int) -> None:
        done = loop.create_future()
        await loop.create_connection(lambda: _Floor(request, done), "127.0.0.1", ports[i % len(ports)])
        await done

    async def stream_connect(i: int) -> None:
        _, writer = await asyncio.open_connection("127.0.0.1", ports[i % len(ports)])
        writer.close()
        await writer.wait_closed()

    async def protocol_connect(i: int) -> None:
        transport, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1", ports[i % len(ports)])
        transport.close()

    rates["floor"] = await _per_cpu_second(floor, PROBES)
    rates["stream connects"] = await _per_cpu_second(stream_connect, PROBES)
    rates["protocol connects"] = await _per_cpu_second(protocol_connect, PROBES)
    return rates


def cost(ports: list[int], url: str) -> None:
    for name, run in (("uvloop", uvloop.run), ("asyncio", asyncio.run)):
        rounds = [run(_cost_round(ports, url)) for _ in range(RUNS)]

        def med(key: str, rounds: list[dict[str, float]] = rounds) -> float:
            return statistics.median(r[key] for r in rounds)

        def ratio(over: str, under: str, rounds: list[dict[str, float]] = rounds) -> float:
            return statistics.median(r[over] / r[under] for r in rounds)

        print(f"  {name}: per CPU-second of the prober's process (median of {RUNS} rounds of {PROBES})")
        for key in ("probes", "floor", "stream connects", "protocol connects"):
            print(f"    {key:18} {med(key):8.0f}   ({1e6 / med(key):4.0f} us each)")
        print(
            f"    => probes / stream connects {ratio('probes', 'stream connects'):.2f}, / protocol connects "
            f"{ratio('probes', 'protocol connects'):.2f}; the floor / protocol connects "
            f"{ratio('floor', 'protocol connects'):.2f}; probes / the floor {ratio('probes', 'floor'):.2f}"
        )


# --- 2. the engine's own pace: 1,000 probes a second ---
async def _paced(ports: list[int], url: str, others: dict[str, int]) -> None:
    engine, inventory, registry = _engine(ports, url, PACED_PROXIES, interval=INTERVAL)
    lags: list[float] = []
    lag_task = asyncio.create_task(_lag(lags))
    task = asyncio.create_task(engine.run())
    await asyncio.sleep(INTERVAL)  # every proxy's first probe, spread over one interval
    done_before = _probes_done(registry)
    cpu_before, others_before, machine_before = time.process_time(), _cpu(others), _machine_busy()
    lags.clear()
    began = time.monotonic()
    await asyncio.sleep(PACED_SECONDS)
    seconds = time.monotonic() - began
    done = _probes_done(registry) - done_before
    cpu = time.process_time() - cpu_before
    others_used = {name: used - others_before[name] for name, used in _cpu(others).items()}
    machine = _machine_busy() - machine_before
    task.cancel()
    lag_task.cancel()
    await asyncio.gather(task, lag_task, return_exceptions=True)
    healthy = len(inventory.healthy_keys())
    print(
        f"  {PACED_PROXIES} proxies every {INTERVAL:.0f} s (due {PACED_PROXIES / INTERVAL:.0f}/s): "
        f"{done / seconds:.0f} probes/s done, {healthy} healthy at the end"
    )
    print(
        f"    prober CPU {cpu / seconds:.2f} s/s ({1e6 * cpu / max(done, 1):.0f} us a probe); event loop lag "
        f"p99 {1000 * statistics.quantiles(lags, n=100)[98]:.1f} ms (20 ms sleeps)"
    )
    shares = ", ".join(f"{name} {used / seconds:.2f}" for name, used in others_used.items())
    print(f"    other processes, CPU s/s: {shares}; the machine's cores busy {machine / seconds:.2f} of 2")
    at_core = [name for name, used in others_used.items() if used / seconds > 0.9]
    if cpu / seconds > 0.9:
        at_core.insert(0, "the prober")
    print(f"    at a core: {', '.join(at_core) or 'none'}")


async def _lag(into: list[float]) -> None:
    """The overshoot of 20 ms sleeps, as service/loop_lag.py measures it for /metrics."""
    while True:
        due = time.monotonic() + 0.02
        await asyncio.sleep(0.02)
        into.append(max(0.0, time.monotonic() - due))


def _probes_done(registry: Any) -> float:
    value = registry.get_sample_value
    return sum(
        value("proxy_operator_probe_results_total", {"provider": "local", "outcome": outcome}) or 0.0
        for outcome in ("ok", "connect_error", "timeout", "proxy_error", "auth_failed", "bad_status",
                        "bad_response")
    )  # fmt: skip


def _cpu(processes: dict[str, int]) -> dict[str, float]:
    return {name: discovery._server_cpu(pid) for name, pid in processes.items()}


def _our_proxy(folder: Path, echo: int) -> tuple[int, subprocess.Popen[bytes]]:
    from stacks.forward_proxy.config import Limits, ProxyConfig
    from stacks.models import EgressSpec

    port = free_port()
    config = ProxyConfig(
        bind="127.0.0.1", port=port, protocol="http", username=USER, password=PASSWORD,
        egress=EgressSpec.model_validate({"allow": [{"cidr": "127.0.0.1/32", "ports": [echo]}]}),
        control=str(folder / f"{port}.ctl"), limits=Limits(total=4096),
    )  # fmt: skip
    config.write(folder / f"{port}.json")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "stacks.forward_proxy", str(folder / f"{port}.json")]
    quiet = subprocess.DEVNULL
    return port, subprocess.Popen(command, cwd=ROOT, env=env, stdout=quiet, stderr=quiet)


def main() -> None:
    echo = free_port()
    processes = [subprocess.Popen([sys.executable, discovery.__file__, "serve", "echo", str(echo)])]
    try:
        discovery._wait_listening(echo, processes[0], "echo server")
        url = f"http://127.0.0.1:{echo}/v1/echo"
        pproxies = [free_port() for _ in range(LISTENERS)]
        for port in pproxies:
            command = [*PPROXY, "-l", f"http://127.0.0.1:{port}#{USER}:{PASSWORD}"]
            processes.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            discovery._wait_listening(port, processes[-1], "pproxy")
        print(
            f"probes: {LISTENERS} pproxy listeners, the echo route in its own process, {IN_FLIGHT} in flight"
        )
        cost(pproxies, url)
        for process in processes[1:]:
            discovery._stop(process)
        del processes[1:]
        with tempfile.TemporaryDirectory() as folder:
            ours = []
            for _ in range(LISTENERS):
                port, process = _our_proxy(Path(folder), echo)
                processes.append(process)
                discovery._wait_listening(port, process, "forward proxy")
                ours.append(port)
            others = {"echo": processes[0].pid} | {
                f"proxy{i}": p.pid for i, p in enumerate(processes[1:], start=1)
            }
            print(f"paced: {LISTENERS} of the project's forward proxies (local's), the same echo process")
            uvloop.run(_paced(ours, url, others))
    finally:
        for process in processes:
            discovery._stop(process)


if __name__ == "__main__":
    main()
