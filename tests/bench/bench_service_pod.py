"""Benchmark: the service's own pods (deploy/ as it is, the image from `make image`) watching 10,000 Proxies,
then the `up` of a kubernetes stack inside the leader pod: the service process's RSS and the containers'
working sets against deploy/'s memory limit.

On the test node (tests/kube/node.py; one node per machine: this waits for another session's), the service
deployed by `deployed_service` (tests/kube/service_pods.py: two replicas, moto's S3 as the state backend,
the sample catalogue). BENCH_PROXIES (default 10000) Proxies are created in `crawl`, the namespace deploy/
watches, on a provider the catalogue does not hold (`elsewhere`, as bench_incluster's: each is watched,
validated, planned, Stalled with its status, finalizer and Event written, and no Pulumi runs for it). When the
intake is done, one Proxy on the catalogue's `in-cluster` (kubernetes) entry is applied, whose `up` (Pulumi
CLI, language host, program, Kubernetes plugin) runs inside the leader's container, and it is waited for
Ready; then BENCH_QUIET seconds (default 60) of quiet are sampled.

Every 2 s both replicas are sampled from the host: the service process's RSS and peak RSS (VmHWM) from
/proc, the container's cgroup usage less inactive file pages (the working set as the kubelet counts it) and
its peak (max_usage_in_bytes, page cache included); every 10 s the kubelet's summary API (/stats/summary)
gives its own working set. Asserts nothing; prints a table. Restarts (an OOM kill) are told.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client import CustomObjectsApi

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from service.kube.watch import Watcher  # noqa: E402
from stacks.models import DEFAULT_KUBERNETES_IMAGE  # noqa: E402
from tests.bench import bench_incluster as incluster  # noqa: E402
from tests.bench.bench_incluster import create_proxies  # noqa: E402
from tests.kube.cluster_fleet import BASE  # noqa: E402
from tests.kube.node import running_node  # noqa: E402
from tests.kube.operator_image import build_archive  # noqa: E402
from tests.kube.service_pods import (  # noqa: E402
    DEPLOY,
    PROXY_NAMESPACE,
    ServiceInNode,
    ServiceUnavailable,
    deployed_service,
)
from tests.kube.test_service_pods import proxy_manifest  # noqa: E402

PROXIES = int(os.environ.get("BENCH_PROXIES", "10000"))
QUIET = float(os.environ.get("BENCH_QUIET", "60"))
REAL = "pod-1"  # the kubernetes Proxy whose `up` runs in the leader pod
PATH = f"{BASE}/namespaces/{PROXY_NAMESPACE}/proxies"
INTAKE_TIMEOUT, UP_TIMEOUT, SETTLE, EVERY = 1800.0, 600.0, 10.0, 2.0
MIB = 1 << 20


def say(part: str) -> Any:
    return lambda line: print(f"[{part}] {line}", flush=True)


# --- what the bench's own watch sees of the Proxies -------------------------------------------------------


Seen = incluster.Seen  # what the bench's own watch saw: per name, phase and finalizer


def counts(seen: Seen) -> tuple[int, int]:
    """Proxies of the unknown provider Stalled; Proxies finalized (REAL left out of both)."""
    with seen.lock:
        stalled = sum(1 for n, p in seen.phase.items() if p == "Stalled" and n != REAL)
        return stalled, len(seen.finalized - {REAL})


def watch(service: ServiceInNode, seen: Seen) -> Watcher:
    on_event = lambda _, obj: seen.take(obj, write=True)  # noqa: E731
    watcher = Watcher(service.api, PATH, on_list=seen.take_all, on_event=on_event, name="bench")
    watcher.start()
    watcher.synced.wait(120)
    return watcher


# --- memory of both replicas, sampled in a thread ---------------------------------------------------------


@dataclass
class Replica:
    name: str
    now: dict[str, int] = field(default_factory=dict)
    top: dict[str, int] = field(default_factory=dict)  # the largest of each figure sampled
    kubelet: int = 0  # the kubelet summary's working set, last read
    kubelet_top: int = 0
    cpu: float = 0.0  # CPU seconds of the service process (utime + stime)
    throttled: int = 0  # CFS periods the container was throttled in

    def take(self, figures: dict[str, int]) -> None:
        self.now = figures
        self.top = {k: max(v, self.top.get(k, 0)) for k, v in figures.items()}


@dataclass
class Sampler:
    service: ServiceInNode
    replicas: dict[str, Replica] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        rounds = 0
        while not self.stop.wait(EVERY):
            for pod in self.service.pods():
                replica = self.replicas.setdefault(pod.metadata.name, Replica(pod.metadata.name))
                try:
                    replica.take(self.service.memory(pod))
                    replica.cpu, replica.throttled = cpu_figures(pod.metadata.uid)
                except (ServiceUnavailable, OSError, StopIteration):
                    continue  # a replica restarting
            if rounds % 5 == 0:
                self.kubelet()
            rounds += 1

    def kubelet(self) -> None:
        try:
            summary = self.service.summary()
        except Exception as exc:  # the summary is an extra: the cgroup figures stand without it
            print(f"  (kubelet summary unavailable: {exc})", flush=True)
            return
        for pod in summary.get("pods", []):
            replica = self.replicas.get(pod["podRef"]["name"])
            for container in pod.get("containers", []) if replica else []:
                if container["name"] == "proxy-operator" and replica:
                    replica.kubelet = int(container["memory"].get("workingSetBytes", 0))
                    replica.kubelet_top = max(replica.kubelet_top, replica.kubelet)

    def line(self, leader: str | None) -> str:
        parts = []
        for name, r in sorted(self.replicas.items()):
            role = "leader" if name == leader else "follower"
            rss, working_set = (r.now.get(k, 0) // MIB for k in ("rss", "working_set"))
            parts.append(f"{role} RSS {rss} MiB, working set {working_set} MiB")
        return "; ".join(parts)


def cpu_figures(uid: str) -> tuple[float, int]:
    """CPU seconds used by the service process of the pod with this uid (utime + stime), and how many CFS
    periods its container was throttled in (cpu.stat nr_throttled; deploy/ sets no CPU limit: 0 expected)."""
    ticks = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        cgroup = _read(entry / "cgroup") if entry.name.isdigit() else ""
        if uid in cgroup and b"serve" in _cmdline(entry):
            fields = _read(entry / "stat").rsplit(")", 1)[-1].split()
            cpu = next(
                line.split(":", 2)[2] for line in cgroup.splitlines() if ":cpu," in line or ":cpu:" in line
            )
            stat = _read(Path("/sys/fs/cgroup/cpu") / cpu.lstrip("/") / "cpu.stat").split()
            throttled = int(stat[stat.index("nr_throttled") + 1]) if "nr_throttled" in stat else 0
            return (int(fields[11]) + int(fields[12])) / ticks, throttled
    return 0.0, 0


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _cmdline(entry: Path) -> bytes:
    try:
        return (entry / "cmdline").read_bytes()
    except OSError:
        return b""


# --- the run ------------------------------------------------------------------------------------------------


def deploy_limit() -> str:
    documents = list(yaml.safe_load_all((DEPLOY / "deployment.yaml").read_text()))
    [deployment] = [d for d in documents if d and d["kind"] == "Deployment"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return str(container["resources"]["limits"]["memory"])


def wait_intake(service: ServiceInNode, seen: Seen, sampler: Sampler, started: float) -> float:
    """Until every Proxy is finalized and Stalled and nothing was written for SETTLE s; seconds from the
    first POST to the last write seen."""
    last_report = time.monotonic()
    while True:
        stalled, finalized = counts(seen)
        now = time.monotonic()
        if stalled == finalized == PROXIES and now - seen.last_write > SETTLE:
            return seen.last_write - started
        if now - last_report > 15:
            print(
                f"  ... {now - started:.0f} s: {len(seen.phase)} seen, {finalized} finalized, {stalled} "
                f"Stalled; {sampler.line(service.leader())}",
                flush=True,
            )
            last_report = now
        if now - started > INTAKE_TIMEOUT:
            raise SystemExit(f"the intake did not finish within {INTAKE_TIMEOUT:.0f} s\n{service.logs()}")
        time.sleep(1)


def wait_real_up(service: ServiceInNode, seen: Seen, host: str) -> float:
    """Apply the kubernetes Proxy and wait until it is Ready (its `up` done in the leader pod); seconds."""
    manifest = proxy_manifest(REAL, host=host, port=80)
    started = time.monotonic()
    CustomObjectsApi(service.api).create_namespaced_custom_object(
        "crawl.example.com", "v1alpha1", PROXY_NAMESPACE, "proxies", manifest
    )
    while seen.phase.get(REAL) != "Ready":
        if time.monotonic() - started > UP_TIMEOUT:
            raise SystemExit(f"{REAL} not Ready within {UP_TIMEOUT:.0f} s\n{service.logs()}")
        time.sleep(1)
    return time.monotonic() - started


def restarts(service: ServiceInNode) -> list[str]:
    told = []
    for pod in service.pods():
        for status in pod.status.container_statuses or []:
            if status.restart_count:
                last = status.last_state.terminated
                told.append(f"{pod.metadata.name}: {status.restart_count} restarts ({last and last.reason})")
    return told


def report(sampler: Sampler, leader: str | None, *, intake: float, created: float, up: float) -> None:
    limit = deploy_limit()
    print(
        f"\n{PROXIES} Proxies created in {created:.0f} s (16 threads); intake (first POST to the last status "
        f"or finalizer write) {intake:.0f} s; the kubernetes Proxy Ready {up:.0f} s after it was applied"
    )
    header = ("replica", "RSS now", "RSS peak", "WS now", "WS max", "kubelet WS", "kubelet max", "cg peak")
    print(
        f"{header[0]:<9}"
        + "".join(f"{h:>12}" for h in header[1:])
        + f"{'limit':>10}{'CPU s':>8}{'throttled':>10}"
    )
    for name, r in sorted(sampler.replicas.items(), key=lambda item: item[0] != leader):
        values = (
            r.now.get("rss", 0),
            r.now.get("hwm", 0),
            r.now.get("working_set", 0),
            r.top.get("working_set", 0),
            r.kubelet,
            r.kubelet_top,
            r.now.get("peak", 0),
        )
        row = "".join(f"{v / MIB:>8.0f} MiB" for v in values)
        role = "leader" if name == leader else "follower"
        print(f"{role:<9}{row}{limit:>10}{r.cpu:>8.0f}{r.throttled:>10}")
    print(
        "(MiB; WS: working set = cgroup usage less inactive file; cg peak: max_usage_in_bytes, page cache in)"
    )
    print("restarts: " + ("; ".join(restarts(sampler.service)) or "none"))


def run(tmp: Path) -> None:
    (tmp / "node").mkdir()
    with running_node(tmp / "node", say=say("node")) as node:
        node.load_image(build_archive(say=say("image")), name=DEFAULT_KUBERNETES_IMAGE)
        with deployed_service(node, DEFAULT_KUBERNETES_IMAGE, cache_dir=tmp) as service:
            sampler = Sampler(service)
            thread = threading.Thread(target=sampler.run, name="sampler", daemon=True)
            thread.start()
            time.sleep(10)
            print(f"watching no Proxy: {sampler.line(service.leader())}", flush=True)
            seen = Seen()
            watcher = watch(service, seen)
            try:
                started = time.monotonic()
                created = create_proxies(node.client, PROXIES, namespace=PROXY_NAMESPACE)
                print(f"created {PROXIES} Proxies in {created:.0f} s", flush=True)
                intake = wait_intake(service, seen, sampler, started)
                print(f"intake done after {intake:.0f} s: {sampler.line(service.leader())}", flush=True)
                up = wait_real_up(service, seen, node.host_ip)
                print(f"{REAL} Ready after {up:.0f} s: {sampler.line(service.leader())}", flush=True)
                time.sleep(QUIET)
            finally:
                watcher.stop()
                sampler.stop.set()
                thread.join(timeout=30)
            report(sampler, service.leader(), intake=intake, created=created, up=up)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-service-pod-") as tmp:
        run(Path(tmp))


if __name__ == "__main__":
    main()
