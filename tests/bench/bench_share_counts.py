"""Benchmark: what a lease costs Redis when its client is at its fair share (issue 20, run 19's finding).

Run 19 (docs/operations.md) found the acquire script reading every running lease of a client at its share:
5.1 ms of Redis a lease at 30,000 leases, 137 of 500 leases/s through. The scripts now keep per-client
counts (redis_share_scripts.COUNTS). This drives `RedisStore` directly, on a simulated clock, against a
redis-server of its own, at `bench_running.py`'s lease load: one client, BENCH_RATE (500) leases a second
of 60 s, never released, over BENCH_PROXIES (10,000) proxies and 100 targets, for BENCH_SECONDS (120)
simulated seconds; the second half (the steady state: 30,000 running leases) is measured. Three phases,
each in keys of its own:
- **share off**: no holding limit (the baseline: what a lease costs without the share);
- **share 1**: the bench_running client, `lease_share` 1 (it holds all 10,000 proxies: its share is taken);
- **share 0.5**: a client holding 5,000, the others at the front of the LRU;
- **share 1, health churn**: as share 1, with the candidate set changing every BENCH_CHURN (100) leases,
  one proxy in turn leaving it and coming back, as a probe that fails and then passes makes it (run 22's
  lead: each new set is sorted, hashed and uploaded whole).
It prints for each the Redis time a lease (`INFO commandstats`, EVALSHA, the scripts' own commands
included), the round trip a lease as the store sees it, this process's CPU a lease (the service's side),
the running leases at the end, and each phase's ratios to the baseline. Printed, never asserted. About
two minutes.

Reproduce: PYTHONPATH=$PWD .venv/bin/python tests/bench/bench_share_counts.py
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import redis.asyncio as aioredis

from service.discovery.fair_share import holding_limit
from service.discovery.redis_store import RedisStore
from service.discovery.store import AcquireRequest, FairShare
from service.settings import DiscoverySettings
from tests.bench.bench_discovery import _redis

PROXIES = int(os.environ.get("BENCH_PROXIES", "10000"))
RATE = int(os.environ.get("BENCH_RATE", "500"))
TTL = 60.0
SECONDS = int(os.environ.get("BENCH_SECONDS", "120"))
TARGETS = [f"site{i}.example" for i in range(100)]
CHURN = int(os.environ.get("BENCH_CHURN", "100"))
PHASES: dict[str, tuple[float | None, int]] = {
    "share off": (None, 0),
    "share 1": (1.0, 0),
    "share 0.5": (0.5, 0),
    "share 1, churn": (1.0, CHURN),
}


async def _evalsha(redis: aioredis.Redis) -> tuple[int, int]:
    stats = await redis.info("commandstats")
    entry = stats.get("cmdstat_evalsha", {"calls": 0, "usec": 0})
    return int(entry["calls"]), int(entry["usec"])


async def phase(
    url: str, share: float | None, cooldown: float, churn: int = 0
) -> tuple[float, float, float, int, int]:
    """(Redis us a lease, round trip us a lease, this process's CPU us a lease, leases handed out, running
    leases at the end), the second half measured; the candidates change every `churn` leases (0: never)."""
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    store = RedisStore.from_url(url, prefix=prefix)
    redis = aioredis.Redis.from_url(url, decode_responses=True)
    names = [f"bench/p{i:05d}" for i in range(PROXIES)]
    candidates = frozenset(names)
    holding = None if share is None else holding_limit(share, len(candidates))
    fair = FairShare(pool=candidates, holding=holding, rate=None, burst=1)
    handed = issued = changes = 0
    calls0 = usec0 = 0
    took = cpu0 = 0.0
    try:
        for second in range(SECONDS):
            if second == SECONDS // 2:
                calls0, usec0 = await _evalsha(redis)
                cpu0 = time.process_time()
            for n in range(RATE):
                if churn and issued and issued % churn == 0:  # one proxy leaves the set, then comes back
                    changes += 1
                    gone = (changes // 2) % len(names)
                    candidates = (
                        frozenset(names[:gone] + names[gone + 1 :]) if changes % 2 else frozenset(names)
                    )
                    fair = FairShare(pool=candidates, holding=holding, rate=None, burst=1)
                request = AcquireRequest(
                    client="bench",
                    target=TARGETS[issued % len(TARGETS)],
                    candidates=candidates,
                    count=1,
                    ttl=TTL,
                    cooldown=cooldown,
                    lease_ids=[uuid.uuid4().hex],
                    share=fair,
                )
                issued += 1
                start = time.perf_counter()
                got = await store.acquire(request, now=1_800_000_000.0 + second + n / RATE)
                if second >= SECONDS // 2:
                    took += time.perf_counter() - start
                    handed += len(got.leases)
        cpu = time.process_time() - cpu0
        calls, usec = await _evalsha(redis)
        running = int(await redis.zcard(f"{prefix}:running:bench"))
        measured = (SECONDS - SECONDS // 2) * RATE
        per = (usec - usec0) / max(calls - calls0, 1)
        return per, took / measured * 1e6, cpu / measured * 1e6, handed, running
    finally:
        await store.close()
        await redis.aclose()


async def main() -> None:
    started = _redis()
    if started is None:
        sys.exit("redis-server is not installed (scripts/install-system-deps.sh installs it)")
    process, url = started
    cooldown = DiscoverySettings().cooldown_seconds
    print(
        f"one client, {RATE} leases/s of {TTL:.0f} s (cooldown {cooldown:.0f} s), {PROXIES} proxies, "
        f"{len(TARGETS)} targets, {SECONDS} simulated s (the second half measured)"
    )
    try:
        results = {}
        for name, (share, churn) in PHASES.items():
            results[name] = redis_us, trip_us, cpu_us, handed, running = await phase(
                url, share, cooldown, churn
            )
            measured = (SECONDS - SECONDS // 2) * RATE
            print(
                f"  {name:15s} Redis {redis_us:7.1f} us a lease, round trip {trip_us:7.1f} us, this process"
                f" {cpu_us:6.1f} us CPU; {handed:,} of {measured:,} handed out; {running:,} running"
            )
        base = results["share off"]
        for name in ("share 1", "share 0.5", "share 1, churn"):
            redis_us, trip_us, cpu_us = results[name][:3]
            print(
                f"  {name} / share off: Redis {redis_us / base[0]:.2f}x, round trip {trip_us / base[1]:.2f}x,"
                f" CPU {cpu_us / base[2]:.2f}x"
            )
    finally:
        process.terminate()
        process.wait()


if __name__ == "__main__":
    asyncio.run(main())
