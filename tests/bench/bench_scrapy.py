"""Benchmark: does a banned site slow an unrelated one in a Scrapy crawl? (`make bench`; asserts nothing.)

Issue 23: "a banned site does not slow an unrelated one by more than 10 %". The middleware before the
add-on waited inside process_request for a banned site, holding Scrapy's global concurrency: the unrelated
site fell from 18 to 6-12 pages/min while the first was penalised.

Real parts on loopback: BENCH_PROXIES (8) forward proxies (`python -m stacks.forward_proxy`, lease users on),
two sites in one asyncio process, and the real app (bench_abuse.py's `serve`: `create_app`, memory store,
default DiscoverySettings except `cooldown_seconds` = BENCH_COOLDOWN, 2 s instead of 10, so that U's
cooldown cap, proxies / cooldown = 4 pages/s, gives enough pages to count in seconds) under uvicorn in its
own process, one token. The add-on leases for the request's *hostname* (the port is not part of the
target, nor of Scrapy's download slot), so the two sites are two loopback addresses: U (unrelated) on
127.0.0.1 answers 200 to every page, B (banned) on 127.0.0.2 answers 403 to every page; the proxies' egress
allows each address on its site's port. The spider (scrapy_two_sites.py, its own process, the asyncio
reactor, Scrapy's default concurrency and retries) crawls /page/N endlessly until CLOSESPIDER_TIMEOUT.

Run 1: U alone. Run 2: U and B interleaved (U0, B0, U1, B1, ...). Each run a fresh API (so a fresh store:
cooldowns, penalties, holdings); the proxies are started once per round. U's pages are counted in the
window from one cooldown after the spider opened (the first hand-out is a burst of every proxy) for
BENCH_SECONDS (12). BENCH_RUNS (3) rounds; the figures are medians, the ratio taken within each round (the
2-core machine is shared with other work). Figures and what they mean: docs/operations.md, "A banned site
beside an unrelated one (Scrapy)".
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from abuse_clients import COOLDOWN  # noqa: E402
from bench_abuse import PROXIES, Process, _child, _stop, _wait_listening, start_proxies  # noqa: E402

from tests.ports import free_port  # noqa: E402

SECONDS = float(os.environ.get("BENCH_SECONDS", "8"))
RUNS = int(os.environ.get("BENCH_RUNS", "3"))
WARM_UP = COOLDOWN
BENCH = str(Path(__file__).resolve().parent / "bench_abuse.py")
SPIDER = str(Path(__file__).resolve().parent / "scrapy_two_sites.py")
U_HOST, B_HOST = "127.0.0.1", "127.0.0.2"
PAGE = b"<html>" + b"x" * 1000 + b"</html>"
Result = dict[str, Any]
# name -> (B crawled too, the API's settings, the spider's config); the last two only explain the second
# (BENCH_SCRAPY_EXPLAIN=1; docs/operations.md): the API's fair share off, the add-on's share gate per site.
Kind = tuple[bool, dict[str, Any], dict[str, Any]]
RUN_KINDS: dict[str, Kind] = {"U alone": (False, {}, {}), "U and B": (True, {}, {})}
if os.environ.get("BENCH_SCRAPY_EXPLAIN") == "1":
    RUN_KINDS["U+B, lease_share 1"] = (True, {"lease_share": 1.0}, {})
    RUN_KINDS["U+B, share gate per site"] = (True, {}, {"share_gate_per_site": True})


# --- the sites (a child process: `bench_scrapy.py sites U_PORT B_PORT`) ---
async def sites(u_port: int, b_port: int) -> None:
    def answering(status: bytes) -> Any:
        async def page(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                await reader.readuntil(b"\r\n\r\n")
                head = b"HTTP/1.1 %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % (status, len(PAGE))
                writer.write(head + PAGE)
                await writer.drain()
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                writer.close()

        return page

    u = await asyncio.start_server(answering(b"200 OK"), U_HOST, u_port, backlog=1024)
    b = await asyncio.start_server(answering(b"403 Forbidden"), B_HOST, b_port, backlog=1024)
    async with u, b:
        await asyncio.gather(u.serve_forever(), b.serve_forever())


# --- the parts ---
@dataclass(frozen=True)
class Round:
    folder: Path
    ports: dict[str, int]  # "U", "B" -> the site's port
    token: str
    proxies: list[dict[str, Any]]
    processes: list[Process]


def _proxies(folder: Path, ports: dict[str, int]) -> tuple[list[dict[str, Any]], list[Process]]:
    allow = [{"cidr": f"{U_HOST}/32", "ports": [ports["U"]]}, {"cidr": f"{B_HOST}/32", "ports": [ports["B"]]}]
    return start_proxies(folder, allow)


def one_run(kind: str, bench: Round) -> Result:
    """A fresh API server; the spider over U (and B); what it saw."""
    with_banned, settings, spider_config = RUN_KINDS[kind]
    api, world_file = free_port(), bench.folder / "world.json"
    world = {"api": api, "settings": settings, "tokens_file": str(bench.folder / "tokens.json")}
    world_file.write_text(json.dumps(world | {"proxies": bench.proxies}))
    server = _child(BENCH, "serve", str(world_file))
    try:
        _wait_listening(api, server, "API server")
        urls = [f"http://{U_HOST}:{bench.ports['U']}"] + (
            [f"http://{B_HOST}:{bench.ports['B']}"] * with_banned
        )
        config = {"api": f"http://127.0.0.1:{api}", "token": bench.token, "sites": urls, **spider_config}
        (bench.folder / "spider.json").write_text(json.dumps(config | {"seconds": WARM_UP + SECONDS}))
        spider = _child(SPIDER, str(bench.folder / "spider.json"), output=True)
        out, _ = spider.communicate(timeout=WARM_UP + SECONDS + 60)
    finally:
        _stop(server)
    return dict(json.loads(out.decode().strip().splitlines()[-1]))


# --- figures ---
def _u_rate(run: Result, port: int) -> float:
    times = run["answers"][f"{U_HOST}:{port}"].get("200", [])
    return sum(WARM_UP <= t < WARM_UP + SECONDS for t in times) / SECONDS


def _b_line(run: Result, port: int) -> str:
    stats, b = run["stats"], run["answers"].get(f"{B_HOST}:{port}", {})
    parked = {k.rsplit("/", 1)[1]: v for k, v in stats.items() if k.startswith("proxy_operator/parked/")}
    refused = {
        k.rsplit("/", 1)[1]: v for k, v in stats.items() if k.startswith("proxy_operator/lease_refused/")
    }
    return (
        f"B: bans reported {stats.get('proxy_operator/reports/banned', 0)}, given up (403 to the spider "
        f"after its retries) {sum(len(v) for v in b.values())}, parked {parked}, "
        f"lease calls refused {refused}, "
        f"parked at close {stats.get('proxy_operator/parked_at_close', 0)}"
    )


def _print_round(rounds: list[dict[str, Result]], ports: dict[str, int]) -> None:
    alone = _u_rate(rounds[-1]["U alone"], ports["U"])
    for kind, run in rounds[-1].items():
        rate, stats = _u_rate(run, ports["U"]), run["stats"]
        times = run["answers"][f"{U_HOST}:{ports['U']}"].get("200", [0.0])
        print(
            f"  {kind:24s} U {rate:5.2f} pages/s ({rate * 60:4.0f}/min), last U page at {max(times):5.2f} s; "
            f"leases {stats.get('proxy_operator/leases', 0)}, "
            f"reports ok {stats.get('proxy_operator/reports/ok', 0)}"
        )
        if RUN_KINDS[kind][0]:
            print(f"{'':27s}{_b_line(run, ports['B'])}")
            print(f"{'':27s}=> U here / U alone: {rate / alone if alone else 0:.2f}")


def _summary(rounds: list[dict[str, Result]], ports: dict[str, int]) -> None:
    rates = {kind: [_u_rate(r[kind], ports["U"]) for r in rounds] for kind in RUN_KINDS}
    print(f" median of {len(rounds)} rounds (ratios taken within each round; the machine is shared):")
    for kind, found in rates.items():
        rate = statistics.median(found)
        print(
            f"  {kind:24s} U {rate:5.2f} pages/s ({rate * 60:4.0f}/min); "
            f"cooldown cap {PROXIES / COOLDOWN:.2f}/s"
        )
        if kind != "U alone":
            ratios = [b / a if a else 0.0 for a, b in zip(rates["U alone"], found, strict=True)]
            print(f"{'':27s}=> U here / U alone: {statistics.median(ratios):.2f} (rounds: "
                  + ", ".join(f"{r:.2f}" for r in ratios) + ")")  # fmt: skip


def main() -> None:
    began = time.monotonic()
    print(
        f"scrapy: one spider with the add-on over U (200s on {U_HOST}) alone, then U and B (403s on {B_HOST})"
        f" interleaved; {PROXIES} forward proxies, cooldown {COOLDOWN:g} s, U counted {SECONDS:g} s after "
        f"{WARM_UP:g} s, {RUNS} rounds"
    )
    from service.auth import hash_token

    token = secrets.token_urlsafe(24)
    entries = [{"name": "crawler", "scopes": ["lease", "report"], "sha256": hash_token(token)}]
    ports = {"U": free_port(), "B": free_port()}
    site_process = _child(__file__, "sites", str(ports["U"]), str(ports["B"]))
    rounds: list[dict[str, Result]] = []
    try:
        _wait_listening(ports["U"], site_process, "sites")
        with tempfile.TemporaryDirectory(prefix="bench-scrapy-") as tmp:
            (Path(tmp) / "tokens.json").write_text(json.dumps(entries))
            for round_no in range(RUNS):
                print(f" round {round_no + 1}")
                bench = Round(Path(tmp), ports, token, *_proxies(Path(tmp), ports))
                try:
                    rounds.append({kind: one_run(kind, bench) for kind in RUN_KINDS})
                finally:
                    _stop(*bench.processes)
                _print_round(rounds, ports)
    finally:
        _stop(site_process)
    _summary(rounds, ports)
    print(f" ({time.monotonic() - began:.0f} s in all)")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "sites":
        asyncio.run(sites(int(sys.argv[2]), int(sys.argv[3])))
    else:
        main()
