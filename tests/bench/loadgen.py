"""Load generators for bench_discovery.py: wrk (C, from Debian) when installed, and a minimal asyncio client.

Both send the same POST bodies over `connections` keep-alive connections for `seconds` and report requests,
latency percentiles, answers that were not 2xx, and their own CPU as a fraction of one core, so that a
saturated generator (which would flatter the server it measures) shows.
"""

from __future__ import annotations

import asyncio
import json
import random
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

PATH = "/v1/leases"


@dataclass(frozen=True)
class Load:
    generator: str
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    not_ok: int  # answers other than 2xx, plus socket errors
    generator_cpu: float  # CPU seconds of the generator per wall second (1.0 = one core busy)

    @property
    def rate(self) -> float:
        return self.requests / self.seconds


def bodies(*, targets: int, sessions: int) -> list[str]:
    """One body per target; the first `sessions` targets also carry a sticky session."""
    found = []
    for i in range(targets):
        body: dict[str, str] = {"target": f"site{i}.example"}
        if i < sessions:
            body["session"] = f"s{i}"
        found.append(json.dumps(body))
    return found


def wrk() -> str | None:
    return shutil.which("wrk")


_LUA = """
wrk.method = "POST"
wrk.headers["Authorization"] = "Bearer %(token)s"
wrk.headers["Content-Type"] = "application/json"
local bodies = {%(bodies)s}
request = function() return wrk.format(nil, nil, nil, bodies[math.random(#bodies)]) end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT %%d %%.6f %%.3f %%.3f %%d\\n", summary.requests, summary.duration / 1e6,
    latency:percentile(50) / 1e3, latency:percentile(99) / 1e3,
    e.status + e.connect + e.read + e.write + e.timeout))
end
"""


def run_wrk(port: int, *, token: str, payloads: list[str], seconds: float, connections: int) -> Load:
    binary = wrk()
    assert binary is not None
    lua = _LUA % {"token": token, "bodies": ", ".join(_lua_string(b) for b in payloads)}
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "lease.lua"
        script.write_text(lua)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run(
            [binary, "-t1", f"-c{connections}", f"-d{seconds:g}s", "-s", str(script), _url(port)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    line = next(x for x in out.splitlines() if x.startswith("RESULT "))
    requests, wall, p50, p99, not_ok = line.split()[1:]
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Load("wrk", int(requests), float(wall), float(p50), float(p99), int(not_ok), cpu / float(wall))


def _lua_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _url(port: int) -> str:
    return f"http://127.0.0.1:{port}{PATH}"


def run_python(port: int, *, token: str, payloads: list[str], seconds: float, connections: int) -> Load:
    requests = [_request(b, token) for b in payloads]
    started, cpu = time.perf_counter(), time.process_time()
    latencies, not_ok = asyncio.run(_python_load(port, requests, seconds, connections))
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    q = statistics.quantiles(latencies, n=100)
    return Load("python", len(latencies), wall, q[49] * 1000, q[98] * 1000, not_ok, cpu / wall)


def _request(body: str, token: str) -> bytes:
    data = body.encode()
    head = (
        f"POST {PATH} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    return head.encode() + data


async def _python_load(
    port: int, requests: list[bytes], seconds: float, connections: int
) -> tuple[list[float], int]:
    latencies: list[float] = []
    statuses: list[int] = []
    until = time.perf_counter() + seconds
    clients = (
        _client(port, requests, until=until, latencies=latencies, statuses=statuses)
        for _ in range(connections)
    )
    await asyncio.gather(*clients)
    return latencies, sum(1 for s in statuses if not 200 <= s < 300)


async def _client(
    port: int, requests: list[bytes], *, until: float, latencies: list[float], statuses: list[int]
) -> None:
    while time.perf_counter() < until:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.perf_counter() < until:
                start = time.perf_counter()
                writer.write(random.choice(requests))
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                latencies.append(time.perf_counter() - start)
                statuses.append(int(head.split(b" ", 2)[1]))
        except (OSError, asyncio.IncompleteReadError):
            statuses.append(0)  # the server closed the connection (after a 500, say): count it, connect again
        finally:
            writer.close()
