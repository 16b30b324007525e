"""Benchmark of discovery (run by `make bench`, not by pytest). Prints figures; asserts nothing.

Leases: POST /v1/leases against a live uvicorn (a separate process) holding 10,000 healthy proxies, with
   cooldown, stickiness and penalties on: 100 targets, one in ten requests in a sticky session, and the first
   500 proxies of the LRU banned for every target. The same load against a bare FastAPI route that returns a
   constant, served the same way in the same round, is the baseline; the ratios are the figures. Memory store,
   then Redis when redis-server is installed. Each round starts fresh servers; the summary is the median of
   the rounds. The load comes from wrk when installed (a C generator) and from a minimal asyncio client;
   each generator's CPU is printed, since a saturated generator flatters the ratio (it cannot offer the bare
   route more than it can send).

The prober's benchmark is `bench_probes.py` (it starts this file's echo server: `serve echo PORT`).

Settings: BENCH_RUNS (5), BENCH_SECONDS (5) per measurement after a 1 s warm-up; BENCH_BANNED (500) and
BENCH_SESSIONS (10 of the 100 targets) set the mix (0 and 0: the plain lease loop of issue 9's first figures).
Every server, bare included, runs with the garbage collector as `serve` sets it (service/gc_tuning.py);
PROXY_OPERATOR_GC_SETTLE_SECONDS=0 leaves CPython's as it comes.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from loadgen import Load, bodies, run_python, run_wrk, wrk  # noqa: E402

from tests.ports import free_port  # noqa: E402

PROXIES = 10_000
BANNED = int(os.environ.get("BENCH_BANNED", "500"))  # the LRU's front (never used, by key), banned everywhere
TARGETS = 100
SESSIONS = int(os.environ.get("BENCH_SESSIONS", "10"))  # targets whose requests carry a sticky session
CLIENTS = 100
SECONDS = float(os.environ.get("BENCH_SECONDS", "5"))
RUNS = int(os.environ.get("BENCH_RUNS", "5"))
WARM_UP = 1.0
TOKEN = "bench-token"
PY = sys.executable
PAYLOADS = bodies(targets=TARGETS, sessions=SESSIONS)
SERVER = os.environ.get("BENCH_SERVER", "uvloop")  # "asyncio": asyncio's loop and h11, for comparison


# --- the servers (a child process: `bench_discovery.py serve <kind> <port> [redis-url [prefix]]`) ---
def serve(kind: str, port: int, redis_url: str | None, prefix: str) -> None:
    """`kind` on the server `serve` runs (service/api_server.py), or on uvicorn's plain asyncio loop and h11
    (BENCH_SERVER=asyncio, the server before issue 20)."""
    import uvicorn

    from service.api_server import server_config

    options: dict[str, Any] = {"log_level": "warning", "access_log": False}
    if SERVER == "asyncio":
        options.update(loop="asyncio", http="h11")
    config = server_config(_app(kind, redis_url, prefix), host="127.0.0.1", port=port, **options)
    if os.environ.get("PROXY_OPERATOR_GC_SETTLE_SECONDS") != "0":
        # what `serve` does once its parts are built (service/gc_tuning.py), for every kind, bare included:
        # the same setup; PROXY_OPERATOR_GC_SETTLE_SECONDS=0 measures CPython's collector as it comes
        from service import gc_tuning

        gc_tuning.tune()
    uvicorn.Server(config).run()


def _app(kind: str, redis_url: str | None, prefix: str = "bench"):  # type: ignore[no-untyped-def]
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
            key=f"bench/p{i:05d}",
            namespace="bench",
            name=f"p{i:05d}",
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
        health = Health(state=HealthState.healthy, egress_ip=f"10.0.{i // 250}.{i % 250}")
        inventory.set_health(f"bench/p{i:05d}", health)
    store = RedisStore.from_url(redis_url, prefix=prefix) if kind == "redis" else MemoryStore()
    settings = DiscoverySettings(lease_burst=100_000)  # 100 connections at once: no 429 lease_rate either
    discovery = DiscoveryService(inventory=inventory, store=store, settings=settings)
    # One client stands for the crawlers: its limits (and the burst above) let every lease through (the
    # bench measures leases, not 429s; the fair-share bookkeeping still runs on each one).
    entry = TokenEntry(
        name="bench", scopes={"lease"}, sha256=hash_token(TOKEN), lease_rate=100_000, lease_share=1.0
    )

    @asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        await _ban_the_front(store, settings=settings)
        yield
        await store.close()

    authenticator = TokenAuthenticator([entry])
    return create_app(
        inventory=inventory, discovery=discovery, authenticator=authenticator, lifespan=lifespan
    )


async def _ban_the_front(store: Any, *, settings: Any) -> None:
    now = time.time()
    base, cap = settings.penalty_base_seconds, settings.penalty_cap_seconds
    bans = [(f"bench/p{i:05d}", f"site{t}.example") for t in range(TARGETS) for i in range(BANNED)]
    for start in range(0, len(bans), 50):  # 50 at a time: a redis-py pool holds 100 connections at most
        await asyncio.gather(
            *(
                store.penalise(proxy=proxy, target=target, now=now, base=base, cap=cap, fraction=1.0)
                for proxy, target in bans[start : start + 50]
            )
        )


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


# --- leases ---
def _server_cpu(pid: int) -> float:
    """CPU seconds the process used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _generators() -> list[str]:
    return (["wrk"] if wrk() else []) + ["python"]


def _load(generator: str, port: int, seconds: float) -> Load:
    run = run_wrk if generator == "wrk" else run_python
    return run(port, token=TOKEN, payloads=PAYLOADS, seconds=seconds, connections=CLIENTS)


def one_round(kind: str, redis_url: str | None, round_no: int) -> dict[str, tuple[Load, float]]:
    """(load, server CPU microseconds per request) per generator, on a fresh server."""
    port = free_port()
    args = [PY, __file__, "serve", kind, str(port)] + ([redis_url, f"bench{round_no}"] if redis_url else [])
    process = subprocess.Popen(args)
    found = {}
    try:
        _wait_ready(port, process, f"{kind} server")
        _load(_generators()[0], port, WARM_UP)
        for generator in _generators():
            cpu = _server_cpu(process.pid)
            load = _load(generator, port, SECONDS)
            found[generator] = (load, (_server_cpu(process.pid) - cpu) / max(load.requests, 1) * 1e6)
    finally:
        _stop(process)
    return found


def _wait_ready(port: int, process: subprocess.Popen[bytes], what: str) -> None:
    _wait_listening(port, process, what)  # uvicorn listens once the lifespan (the bans) is done


def _line(kind: str, load: Load, cpu_us: float) -> str:
    return (
        f"  {kind:7s} {load.generator:6s} {load.rate:7.0f} req/s   p50 {load.p50_ms:6.1f} ms   "
        f"p99 {load.p99_ms:6.1f} ms   not 2xx {load.not_ok:5d}   server {cpu_us:4.0f} us CPU/req   "
        f"generator CPU {load.generator_cpu:4.0%}"
    )


def leases() -> None:
    redis = _redis()
    kinds = ["bare", "memory"] + (["redis"] if redis else [])
    print(
        f"discovery: {PROXIES} proxies ({BANNED} banned for every target), {TARGETS} targets, "
        f"{SESSIONS} of them in sticky sessions, {CLIENTS} keep-alive connections, {SECONDS:g} s per "
        f"measurement, {RUNS} rounds; generators: {', '.join(_generators())}"
    )
    results: dict[str, Rounds] = {k: [] for k in kinds}
    try:
        for round_no in range(RUNS):
            print(f" round {round_no + 1}")
            for kind in kinds:
                found = one_round(kind, redis[1] if redis and kind == "redis" else None, round_no)
                results[kind].append(found)
                for load, cpu_us in found.values():
                    print(_line(kind, load, cpu_us))
    finally:
        if redis:
            _stop(redis[0])
    _summary(results)


Rounds = list[dict[str, tuple[Load, float]]]  # per round: generator -> (load, server CPU us per request)


def _summary(results: dict[str, Rounds]) -> None:
    print(f" median of {RUNS} rounds (ratios taken within each round, against bare):")
    for generator in _generators():
        for kind, rounds in results.items():
            print(_median_line(kind, generator, rounds, bare=results["bare"]))
        busy = statistics.median(r[generator][0].generator_cpu for r in results["bare"])
        if busy > 0.9:
            print(
                f"  ({generator} used {busy:.0%} of a core against bare: the bare figure is the generator's "
                "limit, which flatters the ratios)"
            )


def _median_line(kind: str, generator: str, rounds: Rounds, *, bare: Rounds) -> str:
    def median(value: Any) -> float:
        return statistics.median(value(r[generator], b[generator]) for r, b in zip(rounds, bare, strict=True))

    line = (
        f"  {kind:7s} {generator:6s} {median(lambda r, b: r[0].rate):7.0f} req/s   "
        f"p99 {median(lambda r, b: r[0].p99_ms):6.1f} ms   "
        f"server {median(lambda r, b: r[1]):4.0f} us CPU/req   "
        f"generator CPU {median(lambda r, b: r[0].generator_cpu):4.0%}"
    )
    if kind == "bare":
        return line
    ratio = median(lambda r, b: r[0].rate / b[0].rate)
    p99 = median(lambda r, b: r[0].p99_ms / b[0].p99_ms)
    cpu = median(lambda r, b: b[1] / r[1])
    return line + f"   => {ratio:.2f} of bare, p99 x{p99:.2f} bare's; bare/ours CPU per request {cpu:.2f}"


def _redis() -> tuple[subprocess.Popen[bytes], str] | None:
    binary = shutil.which("redis-server")
    if binary is None:
        return None
    port = free_port()
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    _wait_listening(port, process, "redis-server")
    return process, f"redis://127.0.0.1:{port}/0"


def main() -> None:
    leases()


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "serve":
        extra = sys.argv[4:]
        serve(
            sys.argv[2],
            int(sys.argv[3]),
            extra[0] if extra else None,
            extra[1] if len(extra) > 1 else "bench",
        )
    else:
        main()
