"""Benchmark: how long the lead is vacant when the leader stops cleanly, and when it crashes.

Prints figures and ratios against the baseline (the configured lease duration, what a follower waits at most
for an expired Lease); asserts nothing about time. Against the tests' etcd + kube-apiserver
(tests/kube/apiserver.py). Each round, the leader is a separate process running `LeaderElector` (settings
from PROXY_OPERATOR_KUBE_*, as the service reads them), the follower an elector in this process; handover =
from the signal to the leader until the follower's `on_started`. Clean stop: SIGTERM (the leader runs
`on_stopped`, then releases the Lease). Crash: SIGKILL (no release: the follower waits for the Lease to
expire). BENCH_LEASE (seconds, default 5; renew deadline 0.7x, retry period 0.2x) and BENCH_ROUNDS (3).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kubernetes.client import ApiClient  # noqa: E402

from service.kube.client import request_json  # noqa: E402
from service.kube.leader import LeaderElector  # noqa: E402
from service.kube.settings import KubeSettings  # noqa: E402
from tests.kube.apiserver import running_apiserver  # noqa: E402

NAMESPACE = "bench-leader"
LEASE = float(os.environ.get("BENCH_LEASE", "5"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
TIMING = {
    "lease_duration_seconds": LEASE,
    "renew_deadline_seconds": round(LEASE * 0.7, 2),
    "retry_period_seconds": round(LEASE * 0.2, 2),
}

LEADER = """
import asyncio, signal
from service.kube.client import api_client
from service.kube.leader import LeaderElector
from service.kube.settings import KubeSettings

async def main() -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    settings = KubeSettings()
    async def started() -> None:
        print("leading", flush=True)
    async def stopped() -> None:
        pass
    elector = LeaderElector(api_client(settings.kubeconfig), settings, on_started=started, on_stopped=stopped)
    await elector.run(stop)

asyncio.run(main())
"""


def start_leader(kubeconfig: Path, lease: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.update(
        {
            "PROXY_OPERATOR_KUBE_KUBECONFIG": str(kubeconfig),
            "PROXY_OPERATOR_KUBE_NAMESPACE": NAMESPACE,
            "PROXY_OPERATOR_KUBE_IDENTITY": "leader",
            "PROXY_OPERATOR_KUBE_LEASE_NAME": lease,
        }
    )
    env.update({f"PROXY_OPERATOR_KUBE_{key.upper()}": str(value) for key, value in TIMING.items()})
    process = subprocess.Popen([sys.executable, "-c", LEADER], env=env, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    if process.stdout.readline().strip() != "leading":
        process.kill()
        raise SystemExit("the leader process did not become leader")
    return process


async def handover(api: ApiClient, kubeconfig: Path, *, lease: str, signum: int) -> float:
    """Seconds from `signum` to the leader until the follower leads."""
    leader = await asyncio.to_thread(start_leader, kubeconfig, lease)
    took: asyncio.Future[float] = asyncio.get_running_loop().create_future()

    async def started() -> None:
        took.set_result(time.monotonic())

    async def stopped() -> None:
        pass

    settings = KubeSettings(namespace=NAMESPACE, lease_name=lease, identity="follower", **TIMING)
    follower = LeaderElector(api, settings, on_started=started, on_stopped=stopped)
    stop = asyncio.Event()
    task = asyncio.create_task(follower.run(stop))
    try:
        # The follower has seen the leader; then a random phase against both renewal and poll schedules.
        retry = TIMING["retry_period_seconds"]
        await asyncio.sleep(retry * 2 + random.uniform(0, retry))
        assert follower.holder() == "leader", follower.holder()
        assert not took.done()
        signalled = time.monotonic()
        leader.send_signal(signum)
        return await asyncio.wait_for(took, LEASE * 3) - signalled
    finally:
        stop.set()
        await task
        await asyncio.to_thread(leader.wait, 10)


async def measure(api: ApiClient, kubeconfig: Path) -> dict[str, list[float]]:
    figures: dict[str, list[float]] = {"clean stop (SIGTERM)": [], "crash (SIGKILL)": []}
    for n in range(ROUNDS):
        for seconds, signum in zip(figures.values(), (signal.SIGTERM, signal.SIGKILL), strict=True):
            seconds.append(await handover(api, kubeconfig, lease=f"bench-{n}-{signum}", signum=signum))
    return figures


def main() -> None:
    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp, running_apiserver(Path(tmp)) as kube, kube.client() as api:
        request_json(api, "POST", "/api/v1/namespaces", body={"metadata": {"name": NAMESPACE}})
        figures = asyncio.run(measure(api, kube.kubeconfig))
    print(
        f"baseline: lease {LEASE:g} s, renew deadline {TIMING['renew_deadline_seconds']:g} s, "
        f"retry period {TIMING['retry_period_seconds']:g} s; {ROUNDS} rounds each"
    )
    for label, seconds in figures.items():
        median = statistics.median(seconds)
        spread = f"min {min(seconds):.2f}, max {max(seconds):.2f}"
        ratio = median / LEASE
        print(f"handover after a {label}: median {median:.2f} s ({spread}); ratio to the lease {ratio:.2f}")


if __name__ == "__main__":
    main()
