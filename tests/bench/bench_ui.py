"""Benchmark: the fleet page over 10,000 proxies in 20 stacks, rendered server side.

Prints figures; asserts nothing about time. The first view builds the page's index (a status decode per
proxy, once); then a view with a filter (pool and phase) and a sort (by stack), page 2 of 50 rows, is
rendered 50 times after one status change each (what a refresh costs while the fleet moves): median and
p95 milliseconds, the page's size, and what the index holds in memory (tracemalloc). Then lease answer
times (lease + release, in process, on one event loop as in serve) for a few seconds without the page and
with the page rendered every second: p50 and p99 of each, in the same run.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from prometheus_client import CollectorRegistry  # noqa: E402

from service.api.deps import ApiContext  # noqa: E402
from service.api.metrics import ApiMetrics  # noqa: E402
from service.auth import TokenAuthenticator  # noqa: E402
from service.discovery.memory import MemoryStore  # noqa: E402
from service.discovery.service import DiscoveryService, LeaseQuery  # noqa: E402
from service.inventory import Health, HealthState, Inventory, ProxyEndpoint  # noqa: E402
from service.settings import DiscoverySettings  # noqa: E402
from service.status import StatusBoard  # noqa: E402
from service.status_view import ClusterStatus  # noqa: E402
from service.ui.fleet import FleetQuery, render_fleet  # noqa: E402
from service.ui.index import FleetIndex  # noqa: E402
from stacks.models import Address  # noqa: E402

PROXIES, STACKS, POOLS = 10_000, 20, 10


def make_context() -> ApiContext:
    inventory, board = Inventory(), StatusBoard()
    endpoints = [
        ProxyEndpoint(
            key=f"crawl/p{i}",
            namespace="crawl",
            name=f"p{i}",
            provider=f"site-{i % STACKS}",
            pool=f"pool-{i % POOLS}",
            host="10.0.0.1",
            port=20000 + i,
            username="u",
            password="secret",
            stack=f"site-{i % STACKS}",
        )
        for i in range(PROXIES)
    ]
    inventory.replace_all(endpoints)
    for i, ep in enumerate(endpoints):
        inventory.set_health(
            ep.key,
            Health(
                state=HealthState.healthy,
                egress_ip=f"10.1.{i // 250}.{i % 250}",
                last_latency_seconds=0.004,
                last_probe_at=time.time(),
            ),
        )
        board.set_applied(
            ep.key,
            stack=ep.stack or "",
            spec_hash=f"{i:064x}",
            address=Address(host="10.0.0.1", port=ep.port or 1),
        )
        board.set_condition(ep.key, type_="Provisioned", true=True, reason="Provisioned", message="applied")
        board.set_condition(
            ep.key,
            type_="Healthy",
            true=i % 7 != 0,
            reason="ProbeSucceeded" if i % 7 else "ProbeFailed",
            message="probe",
        )
    registry = CollectorRegistry()
    return ApiContext(
        inventory=inventory,
        discovery=DiscoveryService(inventory=inventory, store=MemoryStore(), settings=DiscoverySettings()),
        authenticator=TokenAuthenticator([]),
        registry=registry,
        metrics=ApiMetrics(registry),
        status=board,
    )


async def bench() -> None:
    ctx = make_context()
    assert ctx.status is not None
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    index = FleetIndex(inventory=ctx.inventory, board=ctx.status)
    started = time.perf_counter()
    rows = index.rows()
    first = time.perf_counter() - started
    held = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename"))
    tracemalloc.stop()
    query = FleetQuery(pool="pool-3", phase="Ready", sort="stack", page=2)
    times, size = [], 0
    for n in range(50):
        ctx.status.set_condition(
            f"crawl/p{n}", type_="Healthy", true=n % 2 == 0, reason="ProbeFailed", message=str(n)
        )
        started = time.perf_counter()
        html = await render_fleet(ctx, index.rows(), query, root="", size=50)
        times.append(time.perf_counter() - started)
        size = len(html.encode())
    times.sort()
    print(f"fleet page, {PROXIES} proxies: first view (index built) {first * 1000:.0f} ms, {len(rows)} rows")
    print(f"  index in memory: {held / 1024 / 1024:.1f} MiB ({held / PROXIES:.0f} B per proxy)")
    print("  filtered (pool, phase) + sorted (stack), page 2 of 50 rows, one status changed before each:")
    median, p95 = statistics.median(times) * 1000, times[int(len(times) * 0.95)] * 1000
    print(f"  median {median:.1f} ms, p95 {p95:.1f} ms, {size / 1024:.0f} KiB per page")
    assert "secret" not in html
    cluster_status_memory(ctx.status)


def cluster_status_memory(board: StatusBoard) -> None:
    """What a follower keeps to show the leader's status (service/status_view.py): every Proxy's status as
    the cluster has it (camelCase JSON, as a watch reads it), here the board's own statuses."""
    raws = [
        {
            "metadata": {"namespace": key.split("/")[0], "name": key.split("/")[1]},
            "status": status.model_dump(mode="json", by_alias=True, exclude_none=True),
        }
        for key in board.tracked()
        if (status := board.published(key)) is not None
    ]
    started = time.perf_counter()
    for raw in raws:
        ClusterStatus().observe(raw)
    took = time.perf_counter() - started  # untraced: tracemalloc slows every allocation
    cluster = ClusterStatus()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for raw in raws:
        cluster.observe(raw)
    held = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename"))
    tracemalloc.stop()
    print(
        f"  a follower's copy of {len(raws)} cluster statuses: {held / 1024 / 1024:.1f} MiB "
        f"({held / max(len(raws), 1):.0f} B per proxy), {took / max(len(raws), 1) * 1e6:.0f} us to take each"
    )


async def lease_times(ctx: ApiContext, *, seconds: float, page_every: float | None) -> list[float]:
    """Lease-and-release round trips for `seconds`, with the fleet page rendered every `page_every` s."""
    index = FleetIndex(inventory=ctx.inventory, board=ctx.status)
    index.rows()
    query = FleetQuery(pool="pool-3", phase="Ready", sort="stack", page=2)
    stop = time.perf_counter() + seconds

    async def refresher() -> None:
        while page_every is not None and time.perf_counter() < stop:
            await render_fleet(ctx, index.rows(), query, root="", size=50)
            await asyncio.sleep(page_every)

    async def client(n: int) -> list[float]:
        took = []
        while time.perf_counter() < stop:
            started = time.perf_counter()
            grant = await ctx.discovery.lease(LeaseQuery(client=f"c{n}", target=f"t{len(took)}.example"))
            await ctx.discovery.release(client=f"c{n}", lease_id=grant.leases[0].lease_id)
            took.append(time.perf_counter() - started)
            await asyncio.sleep(0.002)  # 8 clients at a few hundred leases a second in all
        return took

    results = await asyncio.gather(refresher(), *(client(n) for n in range(8)))
    return sorted(t for times in results[1:] if times for t in times)


async def bench_leases() -> None:
    ctx = make_context()
    ctx.discovery.settings = ctx.discovery.settings.model_copy(
        update={"lease_share": 1.0, "lease_rate": 100_000.0, "lease_burst": 100_000, "cooldown_seconds": 0}
    )
    for label, every in (("without the page", None), ("page every 1 s", 1.0)):
        times = await lease_times(ctx, seconds=5, page_every=every)
        p50, p99 = times[len(times) // 2] * 1000, times[int(len(times) * 0.99)] * 1000
        print(f"  leases {label}: {len(times)} round trips, p50 {p50:.2f} ms, p99 {p99:.2f} ms")


if __name__ == "__main__":
    asyncio.run(bench())
    asyncio.run(bench_leases())
