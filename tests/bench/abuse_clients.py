"""The clients of bench_abuse.py, run as child processes: `abuse_clients.py crawlers|hostile WORLD.json`.

Each prints one JSON object: per crawler its leases and pages inside the measured window and the latency of
its report and release calls (they never wait for a proxy); per hostile client the count of each answer
(`lease 429 lease_rate`, ...). They speak HTTP/1.1 over plain asyncio streams, without an HTTP library, so
that their own CPU, which competes with the server's for the same cores, stays small.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

SECONDS = float(os.environ.get("BENCH_SECONDS", "6"))  # a whole number of cooldowns
COOLDOWN = float(os.environ.get("BENCH_COOLDOWN", "2"))
HOSTILE_CONNECTIONS = int(os.environ.get("BENCH_HOSTILE_CONNECTIONS", "4"))
CRAWLERS = 18
WARM_UP = max(1.0, COOLDOWN)  # every crawler past its first round of the proxies
WAIT = 5.0  # the crawlers' `wait`: the API answers as soon as one of their proxies is out of its cooldown
HOARDER, SLANDERER = "hostile-hoarder", "hostile-slanderer"
Result = dict[str, Any]


class Api:
    """One keep-alive connection to the API with one client's token."""

    def __init__(self, port: int, token: str) -> None:
        self.port, self.token = port, token
        self.streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else b""
        head = f"{method} {path} HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer {self.token}\r\n"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        try:
            if self.streams is None:
                self.streams = await asyncio.open_connection("127.0.0.1", self.port)
            reader, writer = self.streams
            writer.write(head.encode() + b"\r\n" + data)
            answer = (await reader.readuntil(b"\r\n\r\n")).lower()
            _, found, rest = answer.partition(b"\r\ncontent-length:")
            raw = await reader.readexactly(int(rest.split(b"\r\n", 1)[0]) if found else 0)
        except (OSError, asyncio.IncompleteReadError):
            self.streams = None  # the server closed it: connect again next time
            return 0, None
        return int(answer[9:12]), json.loads(raw) if raw else None


def reason(kind: str, status: int, body: Any) -> str:
    error = body.get("error") if isinstance(body, dict) and status != 200 else None
    return f"{kind} {status}" + (f" {error}" if error else "")


async def fetch(lease: dict[str, Any], *, site: int, path: str) -> int:
    """GET http://127.0.0.1:site/path through the leased proxy with the lease's own user: the status."""
    credentials = base64.b64encode(f"{lease['username']}:{lease['password']}".encode()).decode()
    try:
        reader, writer = await asyncio.open_connection(lease["host"], lease["port"])
        writer.write(
            f"GET http://127.0.0.1:{site}{path} HTTP/1.1\r\nHost: 127.0.0.1:{site}\r\n"
            f"Proxy-Authorization: Basic {credentials}\r\nConnection: close\r\n\r\n".encode()
        )
        answer = await reader.read()
        writer.close()
    except OSError:
        return 0
    return int(answer[9:12]) if answer.startswith(b"HTTP/") else 0


class Window:
    """The measured seconds: WARM_UP after the common start, for SECONDS."""

    def __init__(self, start: float) -> None:
        self.start, self.end = start + WARM_UP, start + WARM_UP + SECONDS

    def inside(self) -> bool:
        return self.start <= time.time() < self.end

    def running(self) -> bool:
        return time.time() < self.end


async def crawler(n: int, world: dict[str, Any], window: Window) -> Result:
    """Lease for its own target (waiting for a proxy), fetch a page through it, report ok, release.

    A crawler takes its proxies in bursts, one cooldown apart; the crawlers start spread over one cooldown,
    so that their bursts are out of step and the window's edges cut as many of them short in every run."""
    await asyncio.sleep(n * COOLDOWN / CRAWLERS)
    api, target = Api(world["api"], world["tokens"][f"crawler-{n}"]), f"site-{n}.example"
    leases = pages = 0
    latencies: list[float] = []
    statuses: Counter[str] = Counter()
    while window.running():
        wait = min(WAIT, max(window.end - time.time(), 0.0))  # no waiting past the window
        status, body = await api.call("POST", "/v1/leases", {"target": target, "wait": wait})
        inside = window.inside()
        statuses[reason("lease", status, body)] += inside
        if status != 200:
            await asyncio.sleep(0 if status == 503 else 1.0)  # 503: `wait` ran out, ask again
            continue
        lease = body["leases"][0]
        page = await fetch(lease, site=world["site"], path=f"/{target}/{leases}")
        leases, pages = leases + inside, pages + (inside and page == 200)
        outcome = {"outcome": "ok", "statusCode": 200} if page == 200 else {"outcome": "error"}
        started = time.perf_counter()
        await api.call("POST", "/v1/reports", {"lease": lease["leaseId"], **outcome})
        await api.call("DELETE", f"/v1/leases/{lease['leaseId']}")
        if inside:
            latencies.append((time.perf_counter() - started) / 2)
    return {"leases": leases, "pages": pages, "latencies": latencies, "statuses": +statuses}


async def hoarder(worker: int, world: dict[str, Any], window: Window, got: Counter[str]) -> None:
    """Lease all it can: count 100 for an hour, a new target each time (the crawlers' first), never
    released, Retry-After ignored."""
    api, n = Api(world["api"], world["tokens"][HOARDER]), worker
    while window.running():
        body = {"target": f"site-{n}.example", "count": 100, "ttl": 3600}
        status, answer = await api.call("POST", "/v1/leases", body)
        n += HOSTILE_CONNECTIONS
        if window.inside():
            got[reason("lease", status, answer)] += 1
            got["proxies leased"] += len(answer["leases"]) if status == 200 else 0


async def slanderer(
    worker: int, world: dict[str, Any], window: Window, got: Counter[str], owned: list[str]
) -> None:
    """`banned` for the crawlers' targets, never leased for them: by proxy key, and on its own leases
    (taken for hostile.example, one more every 50 reports; `owned` is shared by its connections) naming
    their targets."""
    api, n = Api(world["api"], world["tokens"][SLANDERER]), worker
    while window.running():
        if not owned or n % 50 == 0:
            status, answer = await api.call("POST", "/v1/leases", {"target": "hostile.example"})
            owned += [answer["leases"][0]["leaseId"]] if status == 200 else []
            got[reason("own lease", status, answer)] += window.inside()
        by_key = not owned or n % 2 == 0
        report = (
            {"proxy": world["keys"][n % len(world["keys"])]} if by_key else {"lease": owned[n % len(owned)]}
        )
        report |= {"target": f"site-{n % CRAWLERS}.example", "outcome": "banned"}
        status, answer = await api.call("POST", "/v1/reports", report)
        n += 1
        got[reason("report by key" if by_key else "report on own lease", status, answer)] += window.inside()


async def run(role: str, world: dict[str, Any]) -> Result:
    window = Window(world["start"])
    await asyncio.sleep(max(world["start"] - time.time(), 0))
    if role == "crawlers":
        return {"crawlers": await asyncio.gather(*(crawler(n, world, window) for n in range(CRAWLERS)))}
    hoarded: Counter[str] = Counter()
    slandered: Counter[str] = Counter()
    owned: list[str] = []
    await asyncio.gather(
        *(hoarder(w, world, window, hoarded) for w in range(HOSTILE_CONNECTIONS)),
        *(slanderer(w, world, window, slandered, owned) for w in range(HOSTILE_CONNECTIONS)),
    )
    return {"hoarder": +hoarded, "slanderer": +slandered}  # +: without the zero counts


if __name__ == "__main__":
    print(json.dumps(asyncio.run(run(sys.argv[1], json.loads(Path(sys.argv[2]).read_text())))))
