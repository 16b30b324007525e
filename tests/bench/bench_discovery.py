"""Benchmark of discovery and health (run by `make bench`, not by pytest). Prints figures; asserts nothing.

1. Leases: 10,000 healthy proxies, 100 concurrent keep-alive clients against a live uvicorn (a separate
   process), leases/s and p50/p99 latency, against a bare FastAPI route that returns a constant, served and
   loaded the same way in the same run. The ratio is the figure. Memory store, then Redis if installed.
2. Probes: the prober on one core (one event loop) through real pproxy listeners to the echo route, probes/s,
   against plain asyncio TCP connects to the same listeners.

The load generator is a minimal asyncio HTTP/1.1 client, so that it is not the bottleneck it measures.
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

PROXIES = 10_000
CLIENTS = 100
SECONDS = 5.0
TOKEN = "bench-token"
PY = sys.executable


# --- the servers (a child process: `bench_discovery.py serve <kind> <port> [redis-url]`) ---
def serve(kind: str, port: int, redis_url: str | None) -> None:
    import uvicorn

    uvicorn.run(_app(kind, redis_url), host="127.0.0.1", port=port, log_level="warning", access_log=False)


def _app(kind: str, redis_url: str | None):  # type: ignore[no-untyped-def]
    from fastapi import FastAPI

    if kind == "bare":
        bare = FastAPI()

        @bare.post("/v1/leases")
        async def constant() -> dict[str, bool]:
            return {"ok": True}

        return bare
    from service.api import create_app
    from service.auth import TokenAuthenticator, TokenEntry, hash_token
    from service.discovery.memory import MemoryStore
    from service.discovery.redis_store import RedisStore
    from service.discovery.service import DiscoveryService
    from service.inventory import Health, HealthState, Inventory, ProxyEndpoint
    from service.settings import DiscoverySettings

    inventory = Inventory()
    inventory.replace_all(
        ProxyEndpoint(
            key=f"bench/p{i}",
            namespace="bench",
            name=f"p{i}",
            provider="local",
            pool="main",
            host="127.0.0.1",
            port=20000 + i % 10000,
            username="u",
            password="p",
        )
        for i in range(PROXIES)
    )
    for i in range(PROXIES):
        inventory.set_health(
            f"bench/p{i}", Health(state=HealthState.healthy, egress_ip=f"10.0.{i // 250}.{i % 250}")
        )
    store = RedisStore.from_url(redis_url, prefix="bench") if kind == "redis" else MemoryStore()
    discovery = DiscoveryService(inventory=inventory, store=store, settings=DiscoverySettings())
    entry = TokenEntry(name="bench", scopes={"lease"}, sha256=hash_token(TOKEN))
    return create_app(inventory=inventory, discovery=discovery, authenticator=TokenAuthenticator([entry]))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_listening(port: int, process: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not start")


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


# --- the load generator ---
def _request(target: str) -> bytes:
    body = json.dumps({"target": target}).encode()
    head = (
        f"POST /v1/leases HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _client(port: int, *, until: float, latencies: list[float], statuses: dict[int, int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    requests = [_request(f"site{i}.example") for i in range(100)]
    try:
        while time.perf_counter() < until:
            start = time.perf_counter()
            writer.write(random.choice(requests))
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            latencies.append(time.perf_counter() - start)
            status = int(head.split(b" ", 2)[1])
            statuses[status] = statuses.get(status, 0) + 1
    finally:
        writer.close()


async def _load(port: int) -> tuple[float, list[float], dict[int, int]]:
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    until = time.perf_counter() + SECONDS
    started = time.perf_counter()
    await asyncio.gather(
        *(_client(port, until=until, latencies=latencies, statuses=statuses) for _ in range(CLIENTS))
    )
    return len(latencies) / (time.perf_counter() - started), latencies, statuses


def measure(kind: str, redis_url: str | None = None) -> float:
    port = _free_port()
    args = [PY, __file__, "serve", kind, str(port)] + ([redis_url] if redis_url else [])
    process = subprocess.Popen(args)
    try:
        _wait_listening(port, process, f"{kind} server")
        rate, latencies, statuses = asyncio.run(_load(port))
    finally:
        _stop(process)
    q = statistics.quantiles(latencies, n=100)
    p50, p99 = q[49] * 1000, q[98] * 1000
    print(f"  {kind:7s} {rate:8.0f} req/s   p50 {p50:6.2f} ms   p99 {p99:6.2f} ms   {statuses}")
    return rate


# --- probes ---
async def _probe_rate(listeners: list[int], echo_url: str, count: int) -> tuple[float, float]:
    from prometheus_client import CollectorRegistry

    from service.health.engine import HealthEngine
    from service.health.metrics import HealthMetrics
    from service.health.probe import ProxyProber
    from service.health.thresholds import Thresholds
    from service.inventory import Inventory, ProxyEndpoint

    inventory = Inventory()
    inventory.replace_all(
        ProxyEndpoint(
            key=f"b/p{i}",
            namespace="b",
            name=f"p{i}",
            provider="local",
            host="127.0.0.1",
            port=listeners[i % len(listeners)],
            username="user",
            password="pass",
        )
        for i in range(count)
    )
    engine = HealthEngine(
        inventory=inventory,
        prober=ProxyProber(probe_url=echo_url),
        thresholds=Thresholds(),
        concurrency=100,
        metrics=HealthMetrics(CollectorRegistry(), health=lambda: {}),
    )
    started, cpu = time.perf_counter(), time.process_time()
    await engine.probe_all()
    probe_rate = count / (time.perf_counter() - started)
    probe_cpu = count / (time.process_time() - cpu)
    healthy = len(inventory.healthy_keys())
    semaphore = asyncio.Semaphore(100)

    async def connect(port: int) -> None:
        async with semaphore:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            await writer.wait_closed()

    started, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(connect(listeners[i % len(listeners)]) for i in range(count)))
    connect_rate = count / (time.perf_counter() - started)
    connect_cpu = count / (time.process_time() - cpu)
    print(
        f"  probes   {probe_rate:8.0f} /s wall ({healthy}/{count} healthy)   {probe_cpu:8.0f} per CPU-second"
    )
    print(f"  connects {connect_rate:8.0f} /s wall                      {connect_cpu:8.0f} per CPU-second")
    print(f"  => per CPU-second of the one prober core: probes / connects = {probe_cpu / connect_cpu:.2f}")
    return probe_rate / connect_rate


def probes() -> float:
    echo_port = _free_port()
    processes = [subprocess.Popen([PY, __file__, "serve", "echo", str(echo_port)])]
    listeners = [_free_port() for _ in range(4)]
    for port in listeners:
        processes.append(
            subprocess.Popen(
                [PY, "-m", "pproxy", "-l", f"http://127.0.0.1:{port}#user:pass"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    try:
        _wait_listening(echo_port, processes[0], "echo server")
        for port, process in zip(listeners, processes[1:], strict=True):
            _wait_listening(port, process, "pproxy")
        return asyncio.run(_probe_rate(listeners, f"http://127.0.0.1:{echo_port}/v1/echo", 3000))
    finally:
        for process in processes:
            _stop(process)


def _redis() -> tuple[subprocess.Popen[bytes], str] | None:
    binary = shutil.which("redis-server")
    if binary is None:
        return None
    port = _free_port()
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    _wait_listening(port, process, "redis-server")
    return process, f"redis://127.0.0.1:{port}/0"


def main() -> None:
    print(f"discovery: {PROXIES} proxies, {CLIENTS} concurrent clients, {SECONDS:g} s each")
    bare = measure("bare")
    lease = measure("memory")
    print(f"  => leases / bare constant route = {lease / bare:.2f}")
    redis = _redis()
    if redis is not None:
        try:
            on_redis = measure("redis", redis[1])
            print(f"  => leases on Redis / bare constant route = {on_redis / bare:.2f}")
        finally:
            _stop(redis[0])
    print("health: 3000 probes through 4 pproxy listeners to the echo route, 100 in flight, one event loop")
    print(f"  => wall clock (proxies and echo server included): probes / plain TCP connects = {probes():.2f}")


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "serve":
        serve(sys.argv[2], int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else None)
    else:
        main()
