"""Benchmark: the memory store's CPU a lease for one client at its fair share (issue 20).

A client whose share is taken may only lease proxies it holds already; when it holds many, the store walks
the LRU for them. Walked from the front, a client at a share of 0.5 of 10,000 proxies passed the 5,000 it no
longer held on every request. The walk now starts at the first proxy handed out since the client's oldest
running lease (`HandOutOrder.since`, `LeaseTable.oldest_handed`), as the Redis scripts start at `ptake`'s
lowest score (bench_share_counts.py measures those).

This drives `MemoryStore` directly on a simulated clock (no server): 10,000 proxies, one client, BENCH_RATE
(500) leases a second of 60 s over 50 targets with a 10-s cooldown, for 120 simulated seconds, the second
60 timed (the process's CPU a request), with no share limit (the baseline), a share of 1 and of 0.5.
Printed, never asserted: each figure with its ratio to the baseline. About 20 seconds.

Reproduce: PYTHONPATH=$PWD .venv/bin/python tests/bench/bench_share_walk.py
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

PROXIES = int(os.environ.get("BENCH_PROXIES", "10000"))
RATE = int(os.environ.get("BENCH_RATE", "500"))
SECONDS = int(os.environ.get("BENCH_SECONDS", "120"))
TARGETS = [f"site-{t:02d}.example" for t in range(50)]


async def phase(share: float | None) -> tuple[float, int, int]:
    """(CPU us a request, leases handed out, requests) over the second half."""
    store = MemoryStore()
    candidates = frozenset(f"bench/p{i:05d}" for i in range(PROXIES))
    fair = None
    if share is not None:
        fair = FairShare(pool=candidates, holding=holding_limit(share, PROXIES), rate=None, burst=1)
    total, timed_from = SECONDS * RATE, SECONDS * RATE // 2
    handed, started = 0, 0.0
    for i in range(total):
        if i == timed_from:
            started, handed = time.process_time(), 0
        request = AcquireRequest(
            client="crawler",
            target=TARGETS[i % len(TARGETS)],
            candidates=candidates,
            count=1,
            ttl=60,
            cooldown=10,
            lease_ids=[f"l{i}"],
            share=fair,
        )
        got = await store.acquire(request, now=1 + i / RATE)
        handed += len(got.leases)
    requests = total - timed_from
    return (time.process_time() - started) / requests * 1e6, handed, requests


async def main() -> None:
    print(
        f"{PROXIES} proxies, one client, {RATE} leases/s of 60 s over {len(TARGETS)} targets, cooldown 10 s"
    )
    base = None
    for share in (None, 1.0, 0.5):
        us, handed, requests = await phase(share)
        base = base or us
        label = "no share limit" if share is None else f"share {share}"
        print(
            f"  {label:15s} {us:8.1f} us CPU a request ({us / base:.2f}x),"
            f" {handed:,} of {requests:,} handed out"
        )


if __name__ == "__main__":
    asyncio.run(main())
