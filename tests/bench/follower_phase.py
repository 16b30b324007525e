"""bench_incluster's follower phase and its measures: the event loop's lag, a paced lease load, CPU.

The follower: `serve --kubeconfig` as a second replica that never leads (the bench holds its Lease for an
hour as `bench-leader`), over the same 10,000 Proxies, each given a status as a leader writes it (address,
stack, egress IP, Healthy True) and the credentials Secret a leader writes for each: its inventory is then
the whole fleet. Measured, one window each: the time to its first lease, the lag and CPU while quiet, a paced
lease load, the same load while the bench flips the Healthy condition of `BENCH_CHURN` Proxies a second (a
leader's probe transitions). The baseline is the same lease load on the same route over a static inventory
of 10,000 healthy proxies (bench_discovery.py's server, what the folder mode serves from, without a control
loop or a watch), in the same run.

The lag is the service's own histogram `proxy_operator_event_loop_lag_seconds` (service/loop_lag.py): the
p99 of the window, interpolated inside its bucket as Prometheus' histogram_quantile does. The lease load is
open-loop: `BENCH_LEASE_RATE` requests a second (200) on 8 keep-alive connections, each latency measured from
when the request was due, so a frozen loop shows in full (no coordinated omission).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from kubernetes.client import ApiClient

from service.kube.client import request_json
from service.kube.credentials import Credentials, CredentialsWriter
from service.kube.lease import LeaseRecord, write_lease
from service.kube.refs import ProxyRef
from tests.ports import free_port

LoadFn = Callable[[float], tuple[list[float], int]]  # seconds -> (latencies, answers not 2xx)
LEASE_RATE = float(os.environ.get("BENCH_LEASE_RATE", "200"))
CHURN = float(os.environ.get("BENCH_CHURN", "50"))
WINDOW = float(os.environ.get("BENCH_WINDOW", "15"))
CONNECTIONS = 8
LEADER, LEASE = "bench-leader", "bench-held"
TARGETS = [f'{{"target": "site{i}.example"}}' for i in range(100)]
LEASE_ENV = {  # one client leasing at 200/s: the fair-share limits are not what is measured here
    "PROXY_OPERATOR_DISCOVERY_LEASE_RATE": "100000",
    "PROXY_OPERATOR_DISCOVERY_LEASE_BURST": "100000",
    "PROXY_OPERATOR_DISCOVERY_LEASE_SHARE": "1",
}


# --- what is read from a process -------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy() -> float:
    """CPU seconds the machine's cores spent on anything but idling (/proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def lag_buckets(url: str, metric: str = "proxy_operator_event_loop_lag_seconds") -> dict[float, float]:
    """A histogram's cumulative buckets (le -> count) from /metrics: the loop's lag unless `metric` says."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    found = {}
    for line in text.splitlines():
        if line.startswith(f"{metric}_bucket"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            found[float("inf") if le == "+Inf" else float(le)] = float(line.rsplit(" ", 1)[1])
    return found


def quantile(before: dict[float, float], after: dict[float, float], q: float = 0.99) -> float:
    """The q-quantile of what was observed between two scrapes, in seconds (linear within a bucket)."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1]
    if total <= 0:
        return float("nan")
    rank, lower, below = q * total, 0.0, 0.0
    for bound, count in zip(bounds, counts, strict=True):
        if count >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / max(count - below, 1e-9)
        lower, below = bound, count
    return lower


@dataclass
class Window:
    """One measured window of a process: its lag p99 and max bucket, CPU per second, and leases."""

    label: str
    seconds: float
    lag_p99_ms: float
    cpu: float  # CPU seconds per second of the window
    lease_p50_ms: float | None = None
    lease_p99_ms: float | None = None
    leases: int = 0
    not_ok: int = 0

    def line(self) -> str:
        lag = f"lag p99 {self.lag_p99_ms:6.1f} ms" if self.lag_p99_ms == self.lag_p99_ms else "lag -"
        text = f"  {self.label:34s} {lag}   CPU {self.cpu:4.2f} s/s"
        if self.lease_p99_ms is not None:
            text += (
                f"   leases {self.leases / self.seconds:5.0f}/s p50 {self.lease_p50_ms:6.1f} ms "
                f"p99 {self.lease_p99_ms:7.1f} ms, not 2xx {self.not_ok}"
            )
        return text


def measure(
    label: str,
    *,
    url: str | None,
    pid: int,
    seconds: float,
    load: LoadFn | None = None,
) -> Window:
    """Lag and CPU of `pid` over `seconds`, with `load(seconds)` run meanwhile when given."""
    before = lag_buckets(url) if url else {}
    cpu, started = cpu_seconds(pid), time.monotonic()
    latencies, not_ok = load(seconds) if load is not None else ([], 0)
    if load is None:
        time.sleep(seconds)
    wall = time.monotonic() - started
    lag = quantile(before, lag_buckets(url)) * 1000 if url else float("nan")
    window = Window(label, wall, lag, (cpu_seconds(pid) - cpu) / wall)
    if latencies:
        q = statistics.quantiles(latencies, n=100)
        window.lease_p50_ms, window.lease_p99_ms = q[49] * 1000, q[98] * 1000
        window.leases, window.not_ok = len(latencies), not_ok
    return window


# --- a paced lease load ------------------------------------------------------------------------------------


def paced_leases(
    port: int, token: str, *, rate: float = LEASE_RATE, connections: int = CONNECTIONS
) -> LoadFn:
    """Leases due at `rate` a second, over `connections` keep-alive connections (each sends its next lease
    when it is due and the last was answered: fewer connections bound the rate by the answers' latency)."""

    def run(seconds: float) -> tuple[list[float], int]:
        return asyncio.run(_paced(port, token, rate=rate, seconds=seconds, connections=connections))

    return run


async def _paced(
    port: int, token: str, *, rate: float, seconds: float, connections: int
) -> tuple[list[float], int]:
    latencies: list[float] = []
    failed = [0]
    start = time.perf_counter() + 0.05
    every = connections / rate
    count = int(seconds * rate / connections)

    async def connection(n: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for i in range(count):
                due = start + (i + n / connections) * every
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                writer.write(_request(TARGETS[(i * connections + n) % len(TARGETS)], token))
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                latencies.append(time.perf_counter() - due)
                if not head.startswith(b"HTTP/1.1 2"):
                    failed[0] += 1
        finally:
            writer.close()

    await asyncio.gather(*(connection(n) for n in range(connections)))
    return latencies, failed[0]


def _request(body: str, token: str) -> bytes:
    data = body.encode()
    head = (
        f"POST /v1/leases HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    return head.encode() + data


# --- the cluster's side --------------------------------------------------------------------------------


def hold_lease(api: ApiClient, namespace: str) -> None:
    """The Lease the follower watches, held for an hour by a leader that is not running."""
    record = LeaseRecord.first(LEADER, now=datetime.now(UTC), duration=3600)
    write_lease(api, namespace=namespace, name=LEASE, current=None, record=record, timeout=10)


def status_of(port: int, *, healthy: bool) -> dict[str, object]:
    condition = {
        "type": "Healthy",
        "status": "True" if healthy else "False",
        "reason": "ProbeSucceeded" if healthy else "ProbeFailed",
        "message": "",
        "lastTransitionTime": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
    }
    return {
        "phase": "Ready",
        "address": {"host": "127.0.0.1", "port": port},
        "stack": "local",
        "egressIP": "127.0.0.1",
        "conditions": [condition],
    }


def write_statuses(
    client: Callable[[], ApiClient], path: str, names: list[tuple[str, int]], *, healthy: bool = True
) -> float:
    """A leader's status on each (name, port), 16 threads; seconds taken."""
    local = threading.local()

    def write(item: tuple[str, int]) -> None:
        if not hasattr(local, "api"):
            local.api = client()
        name, port = item
        body = {"status": status_of(port, healthy=healthy)}
        request_json(
            local.api,
            "PATCH",
            f"{path}/{name}/status",
            body=body,
            content_type="application/merge-patch+json",
        )

    started = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(write, names))
    return time.monotonic() - started


def write_secrets(client: Callable[[], ApiClient], path: str, namespace: str) -> float:
    """The credentials Secret a leader writes for each Proxy (owned by it), 16 threads; seconds taken."""
    local = threading.local()
    uids, token = [], None
    api = client()
    while True:
        query: list[tuple[str, Any]] = [("limit", 500)] + ([("continue", token)] if token else [])
        page = request_json(api, "GET", path, query=query, timeout=(10, 60))
        uids += [(o["metadata"]["name"], o["metadata"]["uid"], o["spec"]["port"]) for o in page["items"]]
        token = page["metadata"].get("continue")
        if not token:
            break

    def write(item: tuple[str, str, int]) -> None:
        if not hasattr(local, "writer"):
            local.writer = CredentialsWriter(client())
        name, uid, port = item
        ref = ProxyRef(namespace=namespace, name=name, uid=uid, generation=1)
        local.writer.write(
            ref, Credentials(host="127.0.0.1", port=port, protocol="http", username="u", password="p")
        )

    started = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(write, uids))
    return time.monotonic() - started


def churn(
    client: Callable[[], ApiClient], path: str, names: list[tuple[str, int]]
) -> Callable[[LoadFn], LoadFn]:
    """`load` with the Healthy condition of `CHURN` Proxies a second flipped meanwhile (a leader's probe
    transitions as the follower sees them)."""

    def around(load: LoadFn) -> LoadFn:
        def run(seconds: float) -> tuple[list[float], int]:
            stop = threading.Event()
            thread = threading.Thread(
                target=_flip, args=(client(), path, names, stop), name="churn", daemon=True
            )
            thread.start()
            try:
                return load(seconds)
            finally:
                stop.set()
                thread.join(10)

        return run

    return around


def _flip(api: ApiClient, path: str, names: list[tuple[str, int]], stop: threading.Event) -> None:
    n, started = 0, time.monotonic()
    while not stop.is_set():
        name, port = names[n % len(names)]
        body = {"status": status_of(port, healthy=(n // len(names)) % 2 == 1)}
        patch = "application/merge-patch+json"
        request_json(api, "PATCH", f"{path}/{name}/status", body=body, content_type=patch)
        n += 1
        stop.wait(max(0.0, started + n / CHURN - time.monotonic()))


# --- the baseline: the lease route over a static inventory ---------------------------------------------


def static_server(root: Path) -> tuple[subprocess.Popen[bytes], int]:
    """bench_discovery.py's server of 10,000 healthy proxies (no bans, no sessions), its own process."""
    port = free_port()
    env = {**os.environ, **LEASE_ENV, "BENCH_BANNED": "0", "BENCH_SESSIONS": "0"}
    script = root / "tests" / "bench" / "bench_discovery.py"
    process = subprocess.Popen([sys.executable, str(script), "serve", "memory", str(port)], env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
            return process, port
        except httpx.HTTPError:
            time.sleep(0.1)
    process.kill()
    raise SystemExit("the static lease server did not start")


# --- the phase -----------------------------------------------------------------------------------------


@dataclass
class FollowerRun:
    """How the bench starts the follower (bench_incluster's `service`) and finds its URL and token."""

    start: Callable[[dict[str, str]], AbstractContextManager[Any]]  # env -> a running Service
    url: Callable[[Any], str]
    token: Callable[[], str]
    root: Path


def follower_phase(
    api: ApiClient,
    client: Callable[[], ApiClient],
    *,
    namespace: str,
    names: list[tuple[str, int]],
    run: FollowerRun,
) -> list[Window]:
    path = f"/apis/crawl.example.com/v1alpha1/namespaces/{namespace}/proxies"
    took = write_statuses(client, path, names)
    print(f"follower phase: a leader's status written on {len(names)} Proxies in {took:.1f} s")
    took = write_secrets(client, path, namespace)
    print(f"  and their credentials Secrets in {took:.1f} s")
    hold_lease(api, namespace)
    env = {
        **LEASE_ENV,
        "PROXY_OPERATOR_KUBE_NAMESPACES": f'["{namespace}"]',
        "PROXY_OPERATOR_KUBE_NAMESPACE": namespace,
        "PROXY_OPERATOR_KUBE_IDENTITY": "bench-follower",
        "PROXY_OPERATOR_KUBE_LEASE_NAME": LEASE,
    }
    windows = []
    with run.start(env) as svc:
        url = run.url(svc)
        port, pid = int(url.rsplit(":", 1)[1]), svc.process.pid
        token = run.token()
        started = time.monotonic()
        while _lease_status(port, token) != 200:
            svc.alive()
            if time.monotonic() - started > 300:
                raise SystemExit("the follower served no lease within 300 s")
            time.sleep(0.2)
        print(f"  follower: first lease {time.monotonic() - svc.started:.1f} s after its start")
        startup = quantile({}, lag_buckets(url)) * 1000
        windows.append(Window("follower, start to first lease", time.monotonic() - svc.started, startup, 0.0))
        windows.append(measure("follower, quiet", url=url, pid=pid, seconds=WINDOW))
        print(f"  follower RSS after the quiet window: {_rss_mib(pid):.1f} MiB (its own process)")
        leases = paced_leases(port, token)
        windows.append(
            measure(f"follower, {LEASE_RATE:.0f} leases/s", url=url, pid=pid, seconds=WINDOW, load=leases)
        )
        flipping = churn(client, path, names)(leases)
        label = f"follower, leases + {CHURN:.0f} flips/s"
        windows.append(measure(label, url=url, pid=pid, seconds=WINDOW, load=flipping))
    process, port = static_server(run.root)
    try:
        paced_leases(port, "bench-token")(2.0)  # warm-up
        label = f"static inventory, {LEASE_RATE:.0f} leases/s"
        windows.append(
            measure(label, url=None, pid=process.pid, seconds=WINDOW, load=paced_leases(port, "bench-token"))
        )
    finally:
        process.terminate()
        process.wait(timeout=20)
    return windows


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _lease_status(port: int, token: str) -> int:
    try:
        answer = httpx.post(
            f"http://127.0.0.1:{port}/v1/leases",
            json={"target": "warmup.example"},
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        )
    except httpx.HTTPError:
        return 0
    return answer.status_code


def report(windows: list[Window]) -> None:
    print("event-loop lag (p99 of the service's 20 ms sleep's overshoot), CPU and leases, per window:")
    for window in windows:
        print(window.line())
    follower = next(
        (
            w
            for w in windows
            if w.label.startswith("follower, ") and "flips" not in w.label and w.lease_p99_ms
        ),
        None,
    )
    static = next((w for w in windows if w.label.startswith("static") and w.lease_p99_ms), None)
    if follower and static and follower.lease_p99_ms and static.lease_p99_ms:
        print(
            f"  => lease p99 on the follower / over the static inventory: "
            f"{follower.lease_p99_ms / static.lease_p99_ms:.2f} (goal at most 2)"
        )
