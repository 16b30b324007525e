"""Benchmark: do two hostile clients slow 18 well-behaved crawlers down? (`make bench`; asserts nothing.)

Real parts on loopback: 8 forward proxies (`python -m stacks.forward_proxy`, egress allowing the site's port
on 127.0.0.1, lease users on), a small asyncio site (one 1 KB page per request; `loopback_site.py`'s
threaded server listens with a backlog of 5), and the real app (`create_app`, memory store, the tokens file
of 20 clients) under uvicorn in its own process. Default DiscoverySettings except `cooldown_seconds`
= BENCH_COOLDOWN (2 s instead of 10: with 10, 8 proxies give a crawler 0.8 leases/s for its target, too few
to measure in seconds; with 2, at most 4/s, the "cooldown cap").

The clients (abuse_clients.py, two processes): 18 crawlers, each its own token and target, lease -> fetch a
page through the proxy with the lease's user -> report `ok` -> release, in a loop; a hoarder (count 100 for
an hour, a new target each time, never released, Retry-After ignored) and a slanderer (`banned` for the
crawlers' targets by proxy key, and on leases of its own naming them), each as fast as the API answers on
BENCH_HOSTILE_CONNECTIONS (4) connections.

Runs: A the 18 alone; B the 18 and the two; B with the fair-share limits off (lease_share 1, lease_rate and
lease_burst 100,000). Each run starts a fresh server (so a fresh store: leases, holds, penalties, buckets),
then one cooldown of warm-up and BENCH_SECONDS (6, a whole number of cooldowns) measured. The proxies are
started once per round (BENCH_PROXIES, 8): their only state, lease users, is revoked at each release, and the
hoarder's leftover users are inert entries of a dict. BENCH_RUNS (3) rounds of the three; the figures are
medians, ratios taken within each round (the 2-core machine is shared with other work). Each run prints
the CPU of each process over the window, all the machine's busy CPU, and how long the server was runnable
but waiting for a core: the hostile generator and the proxies compete with the server for the same cores.
Figures and what they mean: docs/operations.md, "Two hostile clients among 18 crawlers".
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from abuse_clients import (  # noqa: E402
    COOLDOWN,
    CRAWLERS,
    HOARDER,
    HOSTILE_CONNECTIONS,
    SECONDS,
    SLANDERER,
    WAIT,
    WARM_UP,
)

from tests.bench.follower_phase import machine_busy  # noqa: E402
from tests.ports import free_port  # noqa: E402

PY = sys.executable
CLIENTS = str(Path(__file__).resolve().parent / "abuse_clients.py")
RUNS = int(os.environ.get("BENCH_RUNS", "3"))
PROXIES = int(os.environ.get("BENCH_PROXIES", "8"))
LIMITS_OFF = {"lease_share": 1.0, "lease_rate": 100_000.0, "lease_burst": 100_000}
RUN_KINDS: dict[str, dict[str, Any] | None] = {"A": None, "B": {}, "B, limits off": LIMITS_OFF}
PAGE = b"<html>" + b"x" * 1000 + b"</html>"
Result = dict[str, Any]
Process = subprocess.Popen[bytes]


# --- the servers (child processes: `bench_abuse.py site PORT`, `bench_abuse.py serve WORLD.json`) ---
async def site(port: int) -> None:
    async def page(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(PAGE))
            writer.write(PAGE)
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(page, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


def serve(world: dict[str, Any]) -> None:
    import uvicorn

    from service.api import create_app
    from service.auth import TokenAuthenticator
    from service.discovery.memory import MemoryStore
    from service.discovery.service import DiscoveryService
    from service.inventory import Health, HealthState, Inventory, ProxyEndpoint
    from service.settings import DiscoverySettings

    inventory = Inventory()
    endpoints = [
        ProxyEndpoint(
            key=p["key"], namespace="bench", name=p["key"].split("/")[1], provider="local", pool="main",
            host="127.0.0.1", port=p["port"], username="static", password=p["password"], control=p["control"],
        )
        for p in world["proxies"]
    ]  # fmt: skip
    inventory.replace_all(endpoints)
    for endpoint in endpoints:
        inventory.set_health(endpoint.key, Health(state=HealthState.healthy, egress_ip="127.0.0.1"))
    settings = DiscoverySettings(cooldown_seconds=COOLDOWN, **world["settings"])
    discovery = DiscoveryService(inventory=inventory, store=MemoryStore(), settings=settings)
    authenticator = TokenAuthenticator(path=Path(world["tokens_file"]))
    app = create_app(inventory=inventory, discovery=discovery, authenticator=authenticator)
    uvicorn.run(app, host="127.0.0.1", port=world["api"], log_level="warning", access_log=False)


# --- processes and what they cost ---
def _child(*args: str, output: bool = False) -> Process:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # the BENCH_* knobs reach the children too
    return subprocess.Popen(
        [PY, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE if output else subprocess.DEVNULL
    )


def _wait_listening(port: int, process: Process, what: str, path: Path | None = None) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            if path is None or path.exists():
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not start")


def _stop(*processes: Process) -> None:
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _cpu(pid: int) -> float:
    """CPU seconds the process used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _waited(pid: int) -> float:
    """Seconds the process's threads were runnable but waiting for a core (/proc/PID/task/*/schedstat)."""
    return sum(int(t.read_text().split()[1]) for t in Path(f"/proc/{pid}/task").glob("*/schedstat")) / 1e9


def _sample(watched: dict[str, list[Process]]) -> dict[str, float]:
    found = {name: sum(_cpu(p.pid) for p in group) for name, group in watched.items()}
    return found | {
        "server waiting for a core": _waited(watched["server"][0].pid),
        "machine": machine_busy(),
    }


# --- one run ---
@dataclass(frozen=True)
class Round:
    """What a round of runs shares: the tokens file, the site, the proxies (started once per round)."""

    folder: Path
    site: int
    tokens: dict[str, str]
    proxies: list[dict[str, Any]]
    processes: list[Process]


def _proxies(folder: Path, site_port: int) -> tuple[list[dict[str, Any]], list[Process]]:
    """The forward proxies, listening, with their control sockets, allowed to reach the site."""
    return start_proxies(folder, [{"cidr": "127.0.0.1/32", "ports": [site_port]}])


def start_proxies(folder: Path, allow: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[Process]]:
    """PROXIES forward proxies whose egress allows `allow`, listening, with their control sockets (the
    Scrapy bench starts its own with this)."""
    from stacks.forward_proxy.config import ProxyConfig
    from stacks.models import EgressSpec

    egress = EgressSpec.model_validate({"allow": allow})
    described: list[dict[str, Any]] = []
    started: list[Process] = []
    for i in range(PROXIES):
        port, password, control = free_port(), secrets.token_urlsafe(12), folder / f"p{i}.ctl"
        config = ProxyConfig(
            bind="127.0.0.1", port=port, protocol="http", egress=egress, username="static",
            password=password, control=str(control),
        )  # fmt: skip
        config.write(folder / f"p{i}.json")
        started.append(_child("-m", "stacks.forward_proxy", str(folder / f"p{i}.json")))
        described.append({"key": f"bench/p{i}", "port": port, "password": password, "control": str(control)})
    try:
        for proxy, process in zip(described, started, strict=True):
            _wait_listening(proxy["port"], process, "forward proxy", Path(proxy["control"]))
    except BaseException:
        _stop(*started)
        raise
    return described, started


def one_run(kind: str, bench: Round) -> Result:
    """A fresh API server (and so a fresh store) for one run; the clients; what they and it measured."""
    settings, world_file = RUN_KINDS[kind], bench.folder / "world.json"
    world: dict[str, Any] = {"api": free_port(), "site": bench.site, "settings": settings or {}}
    world |= {"tokens": bench.tokens, "tokens_file": str(bench.folder / "tokens.json")}
    world |= {"proxies": bench.proxies, "keys": [p["key"] for p in bench.proxies]}
    world_file.write_text(json.dumps(world))
    server = _child(__file__, "serve", str(world_file))
    try:
        _wait_listening(world["api"], server, "API server")
        world["start"] = time.time() + 1.0  # the client processes are up within it
        world_file.write_text(json.dumps(world))
        roles = ["crawlers"] + (["hostile"] if settings is not None else [])
        loads = {role: _child(CLIENTS, role, str(world_file), output=True) for role in roles}
        watched = {"server": [server], "proxies": bench.processes, **{r: [p] for r, p in loads.items()}}
        time.sleep(max(world["start"] + WARM_UP - time.time(), 0))
        before = _sample(watched)
        time.sleep(max(world["start"] + WARM_UP + SECONDS - time.time(), 0))
        after = _sample(watched)
        found: Result = {"cpu": {name: (after[name] - before[name]) / SECONDS for name in after}}
        for process in loads.values():
            found |= json.loads(process.communicate(timeout=WAIT + 30)[0])
    finally:
        _stop(server)
    return found


# --- figures ---
def _figures(run: Result) -> dict[str, float]:
    rates = sorted(c["leases"] / SECONDS for c in run["crawlers"])
    latencies = sorted(x for c in run["crawlers"] for x in c["latencies"]) or [0.0]
    return {
        "total": sum(rates),
        "median": statistics.median(rates),
        "min": rates[0],
        "pages": sum(c["pages"] for c in run["crawlers"]) / SECONDS,
        "p50": latencies[len(latencies) // 2] * 1000,
        "p99": latencies[int(len(latencies) * 0.99)] * 1000,
    }


def _line(kind: str, f: dict[str, float]) -> str:
    return (
        f"  {kind:14s} crawlers' leases {f['total']:6.1f}/s, per crawler median {f['median']:4.2f}/s, min "
        f"{f['min']:4.2f}/s; pages {f['pages']:6.1f}/s; report/release p50 {f['p50']:5.1f} ms, p99 "
        f"{f['p99']:6.1f} ms"
    )


def _counts(counts: dict[str, float]) -> str:
    return ", ".join(f"{what} {n / SECONDS:.0f}/s" for what, n in sorted(counts.items()))


def _print_run(kind: str, run: Result) -> None:
    print(_line(kind, _figures(run)))
    print(f"{'':17s}CPU (of one core): " + ", ".join(f"{k} {v:.0%}" for k, v in run["cpu"].items()))
    for who in ("hoarder", "slanderer") if kind != "A" else ():
        print(f"{'':17s}{who}: {_counts(run[who])}")


def _summary(rounds: list[dict[str, Result]]) -> None:
    print(f" median of {len(rounds)} rounds (ratios taken within each round; the machine is shared):")
    for kind in RUN_KINDS:
        figures = [_figures(r[kind]) for r in rounds]
        line = _line(kind, {k: statistics.median(f[k] for f in figures) for k in figures[0]})
        if kind == "A":
            line += f" (cooldown cap {PROXIES / COOLDOWN:.2f}/s per crawler)"
        else:
            base = [_figures(r["A"]) for r in rounds]
            total = statistics.median(f["total"] / a["total"] for f, a in zip(figures, base, strict=True))
            each = statistics.median(f["median"] / a["median"] for f, a in zip(figures, base, strict=True))
            line += f"\n{'':17s}=> {kind} / A: total {total:.2f}, per-crawler median {each:.2f}"
        print(line)
        for who in ("hoarder", "slanderer") if kind != "A" else ():
            whats = {w for r in rounds for w in r[kind][who]}
            median = {w: statistics.median(r[kind][who].get(w, 0) for r in rounds) for w in whats}
            print(f"{'':17s}{who}: {_counts(median)}")


def main() -> None:
    began = time.monotonic()
    print(
        f"abuse: {CRAWLERS} crawlers (lease, fetch, report ok, release; one target each) alone (A), with a "
        f"hoarder and a slanderer (B), and B with the fair-share limits off; {PROXIES} forward proxies, "
        f"cooldown {COOLDOWN:g} s, {HOSTILE_CONNECTIONS} connections per hostile client, {SECONDS:g} s "
        f"measured after {WARM_UP:g} s of warm-up, {RUNS} rounds"
    )
    from service.auth import hash_token

    tokens = {name: secrets.token_urlsafe(24) for name in [f"crawler-{n}" for n in range(CRAWLERS)]}
    tokens |= {HOARDER: secrets.token_urlsafe(24), SLANDERER: secrets.token_urlsafe(24)}
    entries = [{"name": n, "scopes": ["lease", "report"], "sha256": hash_token(t)} for n, t in tokens.items()]
    rounds: list[dict[str, Result]] = []
    site_port = free_port()
    site_process = _child(__file__, "site", str(site_port))
    try:
        _wait_listening(site_port, site_process, "site")
        with tempfile.TemporaryDirectory(prefix="bench-abuse-") as tmp:
            (Path(tmp) / "tokens.json").write_text(json.dumps(entries))
            for round_no in range(RUNS):
                print(f" round {round_no + 1}")
                bench = Round(Path(tmp), site_port, tokens, *_proxies(Path(tmp), site_port))
                try:
                    rounds.append({kind: one_run(kind, bench) for kind in RUN_KINDS})
                finally:
                    _stop(*bench.processes)
                for kind, run in rounds[-1].items():
                    _print_run(kind, run)
    finally:
        _stop(site_process)
    _summary(rounds)
    print(f" ({time.monotonic() - began:.0f} s in all)")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "site":
        asyncio.run(site(int(sys.argv[2])))
    elif len(sys.argv) == 3 and sys.argv[1] == "serve":
        serve(json.loads(Path(sys.argv[2]).read_text()))
    else:
        main()
