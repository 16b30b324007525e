"""Benchmark: the in-cluster service watching 10,000 Proxies in a real API server: its memory, how long it
takes them in, how quiet it is after, and the time from a spec change to the `up` starting.

Against the tests' etcd + kube-apiserver (tests/kube/apiserver.py). The service is `proxy-operator serve`
in its own process, configured as in a pod (a ServiceAccount folder and the kubelet's environment, as
deploy/ runs it; BENCH_KUBECONFIG=1: `--kubeconfig`, which also imports the client's kubeconfig loader), so
the RSS and PSS read from /proc are its own (its Pulumi children are other processes). Asserts nothing
about time or memory; prints figures and ratios against:
- the seed's memory goal (128 MiB) and the same service watching no Proxy (measured first, in the same run);
- for the latency, the same edit in the folder mode (`serve --manifests`, one proxy), also measured here.

The 10,000 Proxies name a provider the catalogue does not hold (`elsewhere`), so no process is started for
them, yet each goes the whole way a real one goes in the service: watched, validated into a model, planned
against the catalogue, Stalled (UnknownProvider) on the status board, its status and finalizer written, an
Event recorded. (`crawl.example.com/paused` would stop each at the source: no model kept, no plan, a lighter
and less representative load.) One more Proxy on the catalogue's `local` provider is the one edited for the
latency. Health probing is set to 1 s and one success, so "Ready at the new port" is not dominated by the
default 10 s x 2 probes; the figure to the `up` start does not depend on it.

Then the service is stopped (SIGTERM: it releases its Lease) and started again on the same state, as after an
upgrade or a handover: a new leader on 10,000 unchanged Proxies. The bench edits the `local` Proxy's port as
soon as the Lease is held (a change during the intake) and prints the time to its `up` and to Ready, the
time to the service's "first pass done" (every stack read, changes run), and the writes to the other
10,000 (Proxies with a new resourceVersion, writes seen by its watch, new Events) until nothing is written
for SETTLE s.

Then the follower phase (tests/bench/follower_phase.py): the same Proxies given a leader's status (address,
Healthy), a second `serve` that never leads, its event-loop lag (the service's own histogram), CPU and a paced
lease load, quiet and while Healthy flips, against the same lease load over a static inventory. The leader's
lag and CPU are printed for its intake and its quiet window.

BENCH_PROXIES (default 10000), BENCH_ROUNDS (latency edits, 5), BENCH_QUIET (seconds of the quiet window, 60),
BENCH_ONLY (the phases, `leader,follower`); the follower phase's own settings are in its module.
BENCH_TRACEMALLOC=1 runs the service watching the Proxies under tracemalloc and prints where its memory was
allocated after the quiet window (its RSS is then inflated by the tracing: use it to find consumers, not for
the figures). BENCH_KEEP=1 keeps the working folder (service logs, the apiserver's audit log).
BENCH_SERVICE_ENV (a JSON object) adds to the service's environment alone (an allocator to compare).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kubernetes.client import ApiClient  # noqa: E402

from service.kube.client import ApiException, request_json  # noqa: E402
from service.kube.watch import Watcher  # noqa: E402
from service.sources.kubernetes import FINALIZER  # noqa: E402
from tests.bench.follower_phase import (  # noqa: E402
    FollowerRun,
    Window,
    cpu_seconds,
    follower_phase,
    lag_buckets,
    quantile,
    report,
)
from tests.bench.incluster_trace import TRACED, report_allocations  # noqa: E402
from tests.kube.apiserver import KubeApi, die_with_parent, running_apiserver  # noqa: E402
from tests.kube.cluster_fleet import BASE, proxy_doc  # noqa: E402
from tests.kube.manifests import install_crds  # noqa: E402
from tests.ports import free_port  # noqa: E402

PROXIES = int(os.environ.get("BENCH_PROXIES", "10000"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
QUIET = float(os.environ.get("BENCH_QUIET", "60"))
ONLY = os.environ.get("BENCH_ONLY", "leader,follower").split(",")  # the phases to run
NAMESPACE, LOCAL, GOAL_MIB = "bench", "edited", 128
SETTLE = 10.0  # no write to any Proxy for this long: the service has settled
PROXIES_PATH = f"{BASE}/namespaces/{NAMESPACE}/proxies"
VENV_BIN = Path(sys.executable).parent
TRACEMALLOC = bool(os.environ.get("BENCH_TRACEMALLOC"))
KUBECONFIG_MODE = bool(os.environ.get("BENCH_KUBECONFIG"))  # `--kubeconfig` instead of a pod's configuration
CENSUS = bool(os.environ.get("BENCH_CENSUS"))
SERVICE_ENV = {
    "PATH": f"{ROOT / '.tools' / 'bin'}:{VENV_BIN}:{os.environ['PATH']}",
    "PULUMI_CONFIG_PASSPHRASE": "bench",
    "PULUMI_SKIP_UPDATE_CHECK": "true",
    "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
    "PROXY_OPERATOR_HEALTH_INTERVAL_SECONDS": "1",
    "PROXY_OPERATOR_HEALTH_HEALTHY_THRESHOLD": "1",
}


# --- the service process and its memory ------------------------------------------------------------------


@dataclass
class Service:
    process: subprocess.Popen[bytes]
    log: Path
    started: float
    wall: float = field(default_factory=time.time)  # the start, as the service's log times read

    def memory(self) -> tuple[float, float, float]:
        """RSS, PSS and peak RSS (VmHWM) of the service process alone, in MiB."""
        pid = self.process.pid
        status = _kib_fields(Path(f"/proc/{pid}/status").read_text())
        rollup = _kib_fields(Path(f"/proc/{pid}/smaps_rollup").read_text())
        return status["VmRSS"] / 1024, rollup["Pss"] / 1024, status["VmHWM"] / 1024

    def alive(self) -> None:
        if self.process.poll() is not None:
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])
            raise SystemExit(f"the service exited with {self.process.returncode}:\n{tail}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)


def _kib_fields(text: str) -> dict[str, int]:
    fields = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        parts = value.split()
        if len(parts) == 2 and parts[1] == "kB":
            fields[name.strip()] = int(parts[0])
    return fields


@contextmanager
def service(
    args: list[str], *, tmp: Path, name: str, env: dict[str, str], run: str = ""
) -> Iterator[Service]:
    """The service `name` (its state and backend folders kept across runs: `run` names a restart's log)."""
    state = tmp / f"state-{name}"
    (tmp / f"backend-{name}").mkdir(exist_ok=True)
    full_env = {
        **os.environ,
        **SERVICE_ENV,
        **env,
        **json.loads(os.environ.get("BENCH_SERVICE_ENV", "{}")),  # e.g. an allocator to compare
        "PULUMI_HOME": str(tmp / "pulumi-home"),
        "PULUMI_BACKEND_URL": (tmp / f"backend-{name}").as_uri(),
    }
    argv = [str(VENV_BIN / "proxy-operator"), "serve", *args, "--state-dir", str(state), "--port", "0"]
    if TRACEMALLOC and name == "bench-full":
        frames = os.environ.get("BENCH_TRACE_FRAMES", "8")  # deeper: slower, but reaches our callers
        argv[:1] = [sys.executable, "-X", f"tracemalloc={frames}", "-c", TRACED]
        full_env.update(BENCH_SNAPSHOT=str(tmp / "snapshot"), PYTHONPATH=str(ROOT))
    elif CENSUS and name in ("bench-full", "bench-running"):  # not traced: a census costs seconds, once
        argv[:1] = [sys.executable, "-c", TRACED]
        full_env.update(BENCH_CENSUS_FILE=str(tmp / "census.txt"), PYTHONPATH=str(ROOT))
    log = tmp / f"service-{name}{run}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv, env=full_env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=die_with_parent
        )
    running = Service(process=process, log=log, started=time.monotonic())
    try:
        yield running
    finally:
        running.stop()


def configured(kube: KubeApi, tmp: Path) -> tuple[list[str], dict[str, str]]:
    """`serve`'s arguments and environment to reach the API server: as in a pod (a ServiceAccount folder,
    KUBERNETES_SERVICE_HOST and _PORT; what deploy/ runs), or `--kubeconfig` with BENCH_KUBECONFIG=1."""
    if KUBECONFIG_MODE:
        return ["--kubeconfig", str(kube.kubeconfig)], {}
    folder = tmp / "serviceaccount"
    pod = kube.service_account(folder, NAMESPACE)
    return [], {**pod, "PROXY_OPERATOR_KUBE_SERVICE_ACCOUNT_DIR": str(folder)}


def cluster_service(kube: KubeApi, tmp: Path, identity: str, run: str = "") -> Any:
    env = {
        "PROXY_OPERATOR_KUBE_NAMESPACES": json.dumps([NAMESPACE]),
        "PROXY_OPERATOR_KUBE_NAMESPACE": NAMESPACE,
        "PROXY_OPERATOR_KUBE_IDENTITY": identity,
        # A Lease of its own: a predecessor's Lease left held would delay the start by a lease duration.
        "PROXY_OPERATOR_KUBE_LEASE_NAME": identity,
    }
    args, pod = configured(kube, tmp)
    return service(args, tmp=tmp, name=identity, env={**pod, **env}, run=run)


def sample_memory(svc: Service, *, seconds: float, every: float = 2.0) -> list[tuple[float, float]]:
    samples = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        svc.alive()
        rss, pss, _ = svc.memory()
        samples.append((rss, pss))
        time.sleep(every)
    return samples


# --- the cluster's side ---------------------------------------------------------------------------------


def prepare_cluster(kube: KubeApi, api: ApiClient, tmp: Path) -> None:
    crds = tmp / "crds"  # the Proxy CRD only: a ProxyPool CRD in the working tree is not this bench's
    crds.mkdir()
    shutil.copy(ROOT / "crds" / "crawl.example.com_proxies.yaml", crds)
    install_crds(api, crds, cache_dir=tmp)
    request_json(api, "POST", "/api/v1/namespaces", body={"metadata": {"name": NAMESPACE}})
    catalogue = {"providers": [{"name": "local", "type": "local", "stateDir": str(tmp / "local-proxies")}]}
    body = {
        "metadata": {"name": "proxy-operator-providers"},
        "data": {"providers.yaml": yaml.safe_dump(catalogue)},
    }
    request_json(api, "POST", f"/api/v1/namespaces/{NAMESPACE}/configmaps", body=body)


def create_proxies(client: Callable[[], ApiClient], count: int, *, namespace: str = NAMESPACE) -> float:
    """POST `count` Proxies on the unknown provider with 16 threads (a client each, made by `client`);
    seconds taken."""
    local = threading.local()

    def create(i: int) -> None:
        if not hasattr(local, "api"):
            local.api = client()
        body = proxy_doc(namespace, f"p{i:05d}", port=20000 + i % 40000, provider="elsewhere")
        request_json(local.api, "POST", f"{BASE}/namespaces/{namespace}/proxies", body=body)

    started = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(create, range(count)))
    return time.monotonic() - started


def lease_holder(api: ApiClient, name: str) -> str | None:
    try:
        lease = request_json(api, "GET", f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{name}")
    except ApiException:
        return None
    return (lease.get("spec") or {}).get("holderIdentity")


def gone(api: ApiClient, name: str) -> bool:
    try:
        request_json(api, "GET", f"{PROXIES_PATH}/{name}")
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


def resource_versions(api: ApiClient) -> dict[str, str]:
    versions, token = {}, None
    while True:
        query: list[tuple[str, Any]] = [("limit", 500)] + ([("continue", token)] if token else [])
        page = request_json(api, "GET", PROXIES_PATH, query=query, timeout=(10, 60))
        for obj in page["items"]:
            versions[obj["metadata"]["name"]] = obj["metadata"]["resourceVersion"]
        token = page["metadata"].get("continue")
        if not token:
            return versions


def count_events(api: ApiClient) -> int:
    total, token = 0, None
    while True:
        query: list[tuple[str, Any]] = [("limit", 500)] + ([("continue", token)] if token else [])
        page = request_json(api, "GET", f"/api/v1/namespaces/{NAMESPACE}/events", query=query)
        total += len(page["items"])
        token = page["metadata"].get("continue")
        if not token:
            return total


@dataclass
class Seen:
    """What the bench's own watch saw of the Proxies: per name, phase and finalizer; each write's time."""

    phase: dict[str, str] = field(default_factory=dict)
    finalized: set[str] = field(default_factory=set)
    writes: int = 0
    last_write: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, obj: dict[str, Any], *, write: bool) -> None:
        name = obj["metadata"]["name"]
        with self.lock:
            self.phase[name] = (obj.get("status") or {}).get("phase") or ""
            if FINALIZER in (obj["metadata"].get("finalizers") or []):
                self.finalized.add(name)
            if write:
                self.writes += 1
                self.last_write = time.monotonic()

    def take_all(self, items: list[dict[str, Any]]) -> None:
        for obj in items:
            self.take(obj, write=False)

    def counts(self) -> tuple[int, int, str]:
        with self.lock:
            stalled = sum(1 for n, p in self.phase.items() if p == "Stalled" and n != LOCAL)
            return stalled, len(self.finalized), self.phase.get(LOCAL, "")


def watch_proxies(api: ApiClient, seen: Seen) -> Watcher:
    watcher = Watcher(
        api,
        PROXIES_PATH,
        on_list=seen.take_all,
        on_event=lambda kind, obj: seen.take(obj, write=True),
        name="bench",
    )
    watcher.start()
    watcher.synced.wait(120)
    return watcher


def wait_intake(svc: Service, api: ApiClient, seen: Seen, count: int) -> dict[str, float]:
    """Until every Proxy has our finalizer, the unknown ones are Stalled, the local one Ready and nothing
    was written for SETTLE s: seconds from the start to each milestone (0.5 s resolution)."""
    marks: dict[str, float] = {}
    last_report = time.monotonic()
    while True:
        svc.alive()
        stalled, finalized, local = seen.counts()
        now = time.monotonic()
        reached = {
            "leading": lease_holder(api, "bench-full") == "bench-full",
            "first write": seen.writes > 0,
            "all finalized": finalized == count + 1,
            "all Stalled": stalled == count,
            "local Ready": local == "Ready",
        }
        for mark, done in reached.items():
            if done and mark not in marks:
                marks[mark] = now - svc.started
        if all(reached.values()) and now - seen.last_write > SETTLE:
            marks["last write"] = seen.last_write - svc.started
            return marks
        if now - last_report > 30:
            elapsed = now - svc.started
            print(f"  ... {elapsed:.0f} s: {stalled} Stalled, {finalized} finalized, local {local!r}")
            last_report = now
        time.sleep(0.5)


# --- latency: a spec change to its `up` starting ---------------------------------------------------------


@dataclass
class Latency:
    to_up: list[float] = field(default_factory=list)  # PATCH/file write -> lastOperation.startedAt
    to_ready: list[float] = field(default_factory=list)  # -> seen Ready at the new port


def measure_latency(edit: Callable[[int], None], status: Callable[[], dict[str, Any]]) -> Latency:
    figures = Latency()
    for _ in range(ROUNDS):
        to_up, to_ready = one_edit(edit, status)
        figures.to_up.append(to_up)
        figures.to_ready.append(to_ready)
        time.sleep(2)
    return figures


def one_edit(edit: Callable[[int], None], status: Callable[[], dict[str, Any]]) -> tuple[float, float]:
    """Seconds from the edit to its `up` starting (the service's startedAt) and to Ready at the new port."""
    port = free_port()
    changed = time.time()
    edit(port)
    started = _until(lambda: _started_after(status(), changed), what="the up to start")
    _until(lambda: _ready_at(status(), port), what="Ready at the new port")
    return started - changed, time.time() - changed


def _started_after(status: dict[str, Any], changed: float) -> float | None:
    last = status.get("lastOperation") or {}
    if last.get("type") != "up" or not last.get("startedAt"):
        return None
    started = datetime.fromisoformat(last["startedAt"].replace("Z", "+00:00")).timestamp()
    return started if started >= changed else None


def _ready_at(status: dict[str, Any], port: int) -> bool:
    return status.get("phase") == "Ready" and (status.get("address") or {}).get("port") == port


def _until(check: Callable[[], Any], *, what: str, within: float = 180) -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise SystemExit(f"not reached within {within:.0f} s: {what}")


def cluster_edit(api: ApiClient) -> tuple[Callable[[int], None], Callable[[], dict[str, Any]]]:
    """Edit the local Proxy's port; read its status."""
    path = f"{PROXIES_PATH}/{LOCAL}"

    def edit(port: int) -> None:
        body = {"spec": {"port": port}}
        request_json(api, "PATCH", path, body=body, content_type="application/merge-patch+json")

    return edit, lambda: request_json(api, "GET", path).get("status") or {}


def cluster_latency(api: ApiClient) -> Latency:
    return measure_latency(*cluster_edit(api))


def folder_latency(tmp: Path) -> Latency:
    """The same edits in the folder mode: one proxy in a manifests folder, status from the API."""
    folder = tmp / "manifests"
    folder.mkdir()
    catalogue = {"providers": [{"name": "local", "type": "local", "stateDir": str(tmp / "folder-proxies")}]}
    (folder / "catalogue.yaml").write_text(yaml.safe_dump(catalogue))

    def edit(port: int) -> None:
        doc = proxy_doc("default", LOCAL, port=port)
        doc["metadata"].pop("annotations")
        (folder / "proxy.yaml").write_text(yaml.safe_dump(doc))

    edit(free_port())
    with service(["--manifests", str(folder)], tmp=tmp, name="folder", env={}) as svc:
        url = _served_url(svc)
        token = _until(lambda: _read(tmp / "state-folder" / "dev-token"), what="the dev token")
        headers = {"Authorization": f"Bearer {token}"}

        def status() -> dict[str, Any]:
            answer = httpx.get(f"{url}/v1/status/default/{LOCAL}", headers=headers, timeout=10)
            return answer.json().get("status") or {} if answer.status_code == 200 else {}

        _until(lambda: status().get("phase") == "Ready", what="the folder proxy Ready")
        figures = measure_latency(edit, status)
        (folder / "proxy.yaml").unlink()  # its process is removed before the service stops
        _until(lambda: "phase" not in status(), what="the folder proxy removed", within=120)
    return figures


def _served_url(svc: Service) -> str:
    def url() -> str | None:
        svc.alive()
        for line in svc.log.read_text(errors="replace").splitlines():
            if line.startswith("serving on "):
                return line.split()[2]
        return None

    return str(_until(url, what="the service's URL"))


def _read(path: Path) -> str | None:
    return path.read_text().strip() if path.exists() else None


# --- the run --------------------------------------------------------------------------------------------


def mib(samples: list[tuple[float, float]], which: int) -> tuple[float, float]:
    values = [s[which] for s in samples]
    return max(values), statistics.median(values)


def baseline_memory(kube: KubeApi, api: ApiClient, tmp: Path) -> list[tuple[float, float]]:
    """The same service watching no Proxy: leader, settled, sampled for 20 s; then stopped with SIGTERM
    (as the kubelet stops a pod), and whether it released its Lease is told."""
    with cluster_service(kube, tmp, "bench-empty") as svc:
        _until(lambda: _leads(svc, api, "bench-empty"), what="the empty service leads")
        time.sleep(SETTLE)
        samples = sample_memory(svc, seconds=20)
    holder = lease_holder(api, "bench-empty")
    print(
        f"the service stopped by SIGTERM: exit code {svc.process.returncode}, its Lease "
        f"{'still held by ' + holder if holder else 'released'}"
    )
    return samples


def _leads(svc: Service, api: ApiClient, identity: str) -> bool:
    svc.alive()
    return lease_holder(api, identity) == identity


def run(tmp: Path) -> None:
    from tests.bench.incluster_restart import report_restart  # it imports this module

    (tmp / "kube").mkdir()
    windows: list[Window] = []
    with running_apiserver(tmp / "kube") as kube, kube.client() as api:
        prepare_cluster(kube, api, tmp)
        empty = baseline_memory(kube, api, tmp) if "leader" in ONLY else []
        created = create_proxies(kube.client, PROXIES)
        print(f"created {PROXIES} Proxies in {created:.1f} s ({PROXIES / created:.0f}/s, 16 threads)")
        if "leader" in ONLY:
            windows, latency, again = leader_phase(kube, api, tmp, empty)
        if "follower" in ONLY:
            names = [(f"p{i:05d}", 20000 + i % 40000) for i in range(PROXIES)]
            windows += follower_phase(
                api, kube.client, namespace=NAMESPACE, names=names, run=_follower(tmp, kube)
            )
    report(windows)
    if "leader" in ONLY:
        report_latency(latency, folder_latency(tmp))
        report_restart(again)


def leader_phase(
    kube: KubeApi, api: ApiClient, tmp: Path, empty: list[tuple[float, float]]
) -> tuple[list[Window], Latency, Any]:
    """The leader's intake, latency and a restart on the same fleet (tests/bench/incluster_restart.py,
    which removes the local proxy at its end)."""
    from tests.bench.incluster_restart import restart  # it imports this module

    request_json(api, "POST", PROXIES_PATH, body=proxy_doc(NAMESPACE, LOCAL, port=free_port()))
    seen = Seen()
    watcher = watch_proxies(api, seen)
    try:
        with cluster_service(kube, tmp, "bench-full") as svc:
            windows = report_full(svc, api, seen, empty)
            latency = cluster_latency(api)
        again = restart(kube, api, tmp, seen)
    finally:
        watcher.stop()
    return windows, latency, again


def _follower(tmp: Path, kube: KubeApi) -> FollowerRun:
    def start(env: dict[str, str]) -> Any:
        args, pod = configured(kube, tmp)
        return service(args, tmp=tmp, name="bench-follower", env={**pod, **env})

    token = tmp / "state-bench-follower" / "dev-token"
    return FollowerRun(
        start=start, url=_served_url, token=lambda: _until(lambda: _read(token), what="token"), root=ROOT
    )


def report_full(svc: Service, api: ApiClient, seen: Seen, empty: list[tuple[float, float]]) -> list[Window]:
    url = _served_url(svc)
    marks = wait_intake(svc, api, seen, PROXIES)
    intake = Window(
        "leader, intake", time.monotonic() - svc.started, quantile({}, lag_buckets(url)) * 1000, 0.0
    )
    lag, cpu, started = lag_buckets(url), cpu_seconds(svc.process.pid), time.monotonic()
    _, _, peak = svc.memory()
    steps = ", ".join(f"{mark} {seconds:.1f} s" for mark, seconds in marks.items())
    print(
        f"intake of {PROXIES} + 1 Proxies, from the service's start: {steps} ({seen.writes} Proxy writes "
        f"seen: finalizers and status; {count_events(api)} Events); peak RSS during intake {peak:.0f} MiB"
    )
    before, writes = resource_versions(api), seen.writes
    quiet = sample_memory(svc, seconds=QUIET)
    wall = time.monotonic() - started
    cpu = (cpu_seconds(svc.process.pid) - cpu) / wall
    settled = Window("leader, settled", wall, quantile(lag, lag_buckets(url)) * 1000, cpu)
    after = resource_versions(api)
    changed = sum(1 for name, rv in after.items() if before.get(name) != rv)
    print(
        f"quiet {QUIET:.0f} s: {changed} Proxies with a new resourceVersion, {seen.writes - writes} writes "
        "seen by the watch (0 expected)"
    )
    report_memory(quiet, empty)
    if TRACEMALLOC:
        report_allocations(svc.process, svc.log.parent / "snapshot", until=_until)
    return [intake, settled]


def report_memory(full: list[tuple[float, float]], empty: list[tuple[float, float]]) -> None:
    for label, which in (("RSS", 0), ("PSS", 1)):
        top, median = mib(full, which)
        base_top, base_median = mib(empty, which)
        print(
            f"{label} of the service watching {PROXIES} Proxies: max {top:.1f} MiB, median {median:.1f} MiB "
            f"({len(full)} samples); ratio to {GOAL_MIB} MiB {median / GOAL_MIB:.2f}; watching none: max "
            f"{base_top:.1f}, median {base_median:.1f} MiB (ratio {median / base_median:.2f}, "
            f"+{(median - base_median) * 1024 / PROXIES:.1f} KiB per Proxy)"
        )


def report_latency(cluster: Latency, folder: Latency) -> None:
    for label, ours, base in (
        ("spec change -> up started", cluster.to_up, folder.to_up),
        ("spec change -> Ready at the new port", cluster.to_ready, folder.to_ready),
    ):
        print(
            f"{label}: in-cluster median {statistics.median(ours):.2f} s, max {max(ours):.2f} s; "
            f"folder mode median {statistics.median(base):.2f} s, max {max(base):.2f} s "
            f"(ratio {statistics.median(ours) / statistics.median(base):.2f}; {ROUNDS} edits each)"
        )


def main() -> None:
    if os.environ.get("BENCH_KEEP"):  # keep the logs (service-*.log, kube/) to look at
        tmp = tempfile.mkdtemp(prefix="bench-incluster-")
        print(f"working folder kept: {tmp}")
        run(Path(tmp))
        return
    with tempfile.TemporaryDirectory(prefix="bench-incluster-") as tmp:
        run(Path(tmp))


if __name__ == "__main__":
    main()
