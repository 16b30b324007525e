"""Benchmark: what the memory store keeps of leases over an hour of steady leasing (issue 20).

The in-cluster bench leases for 30 s; a service leases for days. The memory store keeps every lease while
it runs and, after it ends, for late reports (docs/api.md, "Leases"): at 500 leases a second that is the
lease records of an hour, unless a bound forgets the oldest ended ones first. This drives `MemoryStore`
directly on a simulated clock (no server, no sockets): BENCH_PROXIES proxies, BENCH_CLIENTS clients
taking turns over BENCH_TARGETS targets, BENCH_RATE leases a second of BENCH_TTL seconds, one in
BENCH_RELEASE_EVERY (2; 0: none) released after BENCH_HOLD seconds, for BENCH_SECONDS simulated seconds, a
report (a ban) on one lease in 50, each client held to BENCH_SHARE of the proxies when set (as a
token's `leaseShare`). It prints,
at each checkpoint, the leases the store keeps (live and ended), the (client, proxy) pairs it keeps for
reports by proxy (for the service's report window) and the process's RSS above its start
(the store is all this process holds) and the store's CPU a lease. Printed, never asserted. About a
minute at the defaults.

Reproduce: PYTHONPATH=$PWD .venv/bin/python tests/bench/bench_lease_memory.py; bench_running.py's lease
load (one token, 100 targets, none released): BENCH_CLIENTS=1 BENCH_TARGETS=100 BENCH_RELEASE_EVERY=0
BENCH_SHARE=1 BENCH_SECONDS=300.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from service.discovery.fair_share import holding_limit  # noqa: E402
from service.discovery.memory import MemoryStore  # noqa: E402
from service.discovery.store import AcquireRequest, FairShare  # noqa: E402
from service.memory import trim  # noqa: E402
from service.settings import DiscoverySettings  # noqa: E402

PROXIES = int(os.environ.get("BENCH_PROXIES", "10000"))
CLIENTS = int(os.environ.get("BENCH_CLIENTS", "20"))
RATE = int(os.environ.get("BENCH_RATE", "500"))
TTL = float(os.environ.get("BENCH_TTL", "60"))
HOLD = float(os.environ.get("BENCH_HOLD", "5"))
SECONDS = int(os.environ.get("BENCH_SECONDS", "3600"))
TARGETS = int(os.environ.get("BENCH_TARGETS", "50"))
RELEASE_EVERY = int(os.environ.get("BENCH_RELEASE_EVERY", "2"))
SHARE = float(os.environ["BENCH_SHARE"]) if os.environ.get("BENCH_SHARE") else None
CHECKPOINTS = (60, 300, 900, 1800, 3600, 7200)


def rss_mib() -> float:
    return int(Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0]) / 1024


def mix(issued: int) -> int:
    """The client of the `issued`-th lease: every client in turn, in an order that drifts by one client
    every 10,007 leases. Plain turns (`issued % CLIENTS`) with the LRU's turns over the proxies gave each
    proxy the same client every time (10,000 (client, proxy) pairs); clients of a real fleet lease every
    proxy in time (here all 200,000 pairs within minutes), and the store keeps each pair for reports."""
    return (issued * 7 + issued // 10_007) % CLIENTS


async def main() -> None:
    settings = DiscoverySettings()  # the service's defaults (PROXY_OPERATOR_DISCOVERY_* change them)
    store = MemoryStore(ended_kept=settings.ended_leases_kept, report_keep=settings.report_keep_seconds)
    candidates = frozenset(f"bench/p{i:05d}" for i in range(PROXIES))
    clients = [f"client-{c:02d}" for c in range(CLIENTS)]
    targets = [f"site-{t:02d}.example" for t in range(TARGETS)]
    share = (
        None
        if SHARE is None
        else FairShare(pool=candidates, holding=holding_limit(SHARE, PROXIES), rate=None, burst=1.0)
    )
    trim()
    start_rss = rss_mib()
    releases: list[tuple[float, str]] = []
    issued = 0
    started, cpu = time.perf_counter(), time.process_time()
    released = f"one in {RELEASE_EVERY} released after {HOLD:.0f} s" if RELEASE_EVERY else "none released"
    print(f"{PROXIES} proxies, {CLIENTS} clients over {TARGETS} targets, {RATE} leases/s of {TTL:.0f} s,")
    print(f"{released}, a ban report on one in 50; RSS at the start {start_rss:.1f} MiB")
    for second in range(1, SECONDS + 1):
        for n in range(RATE):
            now = second + n / RATE
            lease_id = os.urandom(16).hex()
            request = AcquireRequest(
                client=clients[mix(issued)],
                target=targets[issued % len(targets)],
                candidates=candidates,
                count=1,
                ttl=TTL,
                cooldown=1.0,
                lease_ids=[lease_id],
                share=share,
            )
            got = await store.acquire(request, now=now)
            issued += 1
            if not got.leases:
                continue
            lease = got.leases[0]
            if RELEASE_EVERY and issued % RELEASE_EVERY == 1 % RELEASE_EVERY:
                releases.append((now + HOLD, lease.lease_id))
            if issued % 50 == 0:
                await store.penalise(
                    proxy=lease.proxy,
                    target=lease.target,
                    now=now,
                    base=10,
                    cap=60,
                    fraction=1.0,
                    lease_id=lease.lease_id,
                )
        while releases and releases[0][0] <= second:
            await store.release(releases.pop(0)[1], now=second, cooldown=1.0)
        if second in CHECKPOINTS:
            trim()
            live, ended = store.kept_leases(now=second)
            grown, took = rss_mib() - start_rss, time.perf_counter() - started
            print(
                f"  at {second:5d} s: {issued:,} leased, the store keeps {live:,} live and {ended:,} ended,"
                f" {store.kept_pairs():,} (client, proxy) pairs;"
                f" RSS +{grown:.1f} MiB ({took:.0f} s of real time,"
                f" {(time.process_time() - cpu) / issued * 1e6:.1f} us of CPU a lease)"
            )


if __name__ == "__main__":
    asyncio.run(main())
