"""Benchmark: 10,000 running `local` proxies in the in-cluster mode (issue 20's goal), probed every 10 s and
leased from at 500/s, against the tests' etcd + kube-apiserver.

The Proxies are spread over BENCH_STACKS `local` entries with `processModel: shared` and `checkpoints: end`
(docs/decisions.md, "Checkpoints"): one listener process per entry serves each proxy on its own port with its
own generated credentials, egress policy and lease users. The service is `proxy-operator serve` configured as
in a pod (bench_incluster.configured; BENCH_KUBECONFIG=1: `--kubeconfig`, 6.5 MiB more of imports), in its
own process (its RSS is its own: the engine and the listeners are other processes), with the default
health probing every 10 s, through each proxy to an echo route in a process of its own (as the issue allows:
the probes' targets are not the service's work; BENCH_ECHO=service probes the service's own /v1/echo).

Printed, never asserted: the time until every Proxy is Ready (the whole fleet made by the real engine), the
service's RSS against the 128 MiB goal, then two windows: probes alone, and probes with a paced lease load
(tests/bench/follower_phase.py's open-loop generator) at BENCH_LEASE_RATE; for each, CPU seconds per second
of the service, the listeners together, kube-apiserver + etcd and the lease generator (this bench's own
process), the probes per second the service counted, the event loop's lag p99 and the leases' latency.
Two cores cannot hold all of them at once: the CPU lines say which saturated.

The service's RSS is printed with its parts from /proc (anonymous memory against mapped files, the
libraries' pages) as it grows.

BENCH_RUNNING (10000), BENCH_STACKS (20), BENCH_LEASE_RATE (500) over BENCH_CONNECTIONS (64), BENCH_WINDOW
(30 s), BENCH_LEASE_WINDOW (BENCH_WINDOW's: 300 reaches the lease state's steady state for this load),
BENCH_READY_WITHIN (2400 s), BENCH_IDLE_WITHIN (600 s: the windows wait for the engine host to exit),
BENCH_ECHO (own), BENCH_STORE (memory; `redis`: the discovery store in a
redis-server this bench starts, as every multi-replica installation runs, its RSS and CPU printed beside
the service's), BENCH_KEEP=1 keeps the working folder,
BENCH_TRACEMALLOC=1 runs the service under tracemalloc and prints where its memory went (its RSS and CPU are
then the tracer's too; BENCH_TRACE_FRAMES, 8, frames kept per allocation), BENCH_CENSUS=1 prints a census of
the service's objects by what holds them at the end (tests/bench/census.py, with the modules it loaded),
BENCH_PYSPY (a py-spy binary, from PyPI) samples the service's threads for the lease window's first
BENCH_PYSPY_SECONDS (120) and prints where its event loop spent them (tests/bench/pyspy_profile.py),
BENCH_STALL_SECONDS (0.1: the service's `loop_stall_seconds`; each window prints its stalls and where the
loop was, from the service's log: tests/bench/stall_log.py),
BENCH_SERVICE_ENV (a JSON object) adds to the service's environment only (to compare an allocator:
`{"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "PYTHONMALLOC": "malloc"}`). About 15-20
minutes at 10,000.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import urllib3
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kubernetes.client import ApiClient  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402

from service.kube.client import request_json  # noqa: E402
from tests.bench import stall_log  # noqa: E402
from tests.bench.bench_incluster import (  # noqa: E402
    CENSUS,
    NAMESPACE,
    PROXIES_PATH,
    TRACEMALLOC,
    Service,
    _read,
    _served_url,
    _until,
    configured,
    create_proxies,
    prepare_cluster,
    service,
)
from tests.bench.follower_phase import (  # noqa: E402
    LEASE_ENV,
    _rss_mib,
    cpu_seconds,
    lag_buckets,
    machine_busy,
    paced_leases,
    quantile,
)
from tests.bench.incluster_trace import report_allocations, report_census  # noqa: E402
from tests.bench.pyspy_profile import sampled  # noqa: E402
from tests.kube.apiserver import KubeApi, running_apiserver  # noqa: E402

RUNNING = int(os.environ.get("BENCH_RUNNING", "10000"))
STACKS = int(os.environ.get("BENCH_STACKS", "20"))
RATE = float(os.environ.get("BENCH_LEASE_RATE", "500"))
# crawlers leasing at once: with follower_phase's 8, the rate was bound by each answer's latency (8 in flight)
CONNECTIONS = int(os.environ.get("BENCH_CONNECTIONS", "64"))
WINDOW = float(os.environ.get("BENCH_WINDOW", "30"))
LEASE_WINDOW = float(
    os.environ.get("BENCH_LEASE_WINDOW", str(WINDOW))
)  # long: the lease state's steady state
READY_WITHIN = float(os.environ.get("BENCH_READY_WITHIN", "2400"))
# The windows measure the fleet at rest: after the last Ready, the intake's drift checks may still run in
# the engine host (its CLI and providers then share the cores); wait up to this long for it to exit.
IDLE_WITHIN = float(os.environ.get("BENCH_IDLE_WITHIN", "600"))
ECHO = os.environ.get("BENCH_ECHO", "own")
STORE = os.environ.get("BENCH_STORE", "memory")
PYSPY = os.environ.get("BENCH_PYSPY", "")  # a py-spy binary: the service sampled in the lease window
PYSPY_SECONDS = float(os.environ.get("BENCH_PYSPY_SECONDS", "120"))
if STORE not in ("memory", "redis"):
    raise SystemExit(f"BENCH_STORE={STORE!r}: `memory` or `redis`")
GOAL_MIB = 128
LEASE_SECONDS = "proxy_operator_lease_duration_seconds"  # the lease route's own time (service/api/metrics.py)
FIRST_PORT = 20000  # below the ephemeral range (32768-60999 here): no outgoing connection holds one
EPHEMERAL_LOW = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


def entries(tmp: Path) -> list[dict[str, Any]]:
    return [
        {
            "name": f"run-{n:02d}",
            "type": "local",
            "stateDir": str(tmp / "l" / f"{n:02d}"),  # short: a control socket's path holds 107 bytes
            "processModel": "shared",
            "checkpoints": "end",
        }
        for n in range(STACKS)
    ]


def catalogue(api: ApiClient, tmp: Path) -> None:
    body = {"data": {"providers.yaml": yaml.safe_dump({"providers": entries(tmp)})}}
    path = f"/api/v1/namespaces/{NAMESPACE}/configmaps/proxy-operator-providers"
    request_json(api, "PATCH", path, body=body, content_type="application/merge-patch+json")


def ready_count(api: ApiClient) -> int | None:
    """How many Proxies are Ready, read 1,000 at a time (one list of 10,000 is itself a load on an apiserver
    that saturates a core during the intake); None, printed, when the apiserver did not answer in time: the
    poll is the bench's own, and a slow answer is a figure to report, not a reason to end the run."""
    ready, token = 0, ""
    try:
        while True:
            query: list[tuple[str, Any]] = [("limit", 1000)] + ([("continue", token)] if token else [])
            page = request_json(api, "GET", PROXIES_PATH, query=query, timeout=(5, 60))
            ready += sum(
                1
                for item in page["items"]
                if any(
                    c.get("type") == "Ready" and c.get("status") == "True"
                    for c in (item.get("status") or {}).get("conditions", [])
                )
            )
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                return ready
    except (urllib3.exceptions.HTTPError, ApiException) as exc:  # a timeout, or 410 for an expired token
        print(f"  (the progress poll got no answer: {type(exc).__name__}; polling again)", flush=True)
        return None


def pids_of(pattern: str, *, names: tuple[str, ...] = ()) -> list[int]:
    """The processes whose command line holds `pattern`, only those named `names` (their comm) if given:
    the service's own command line holds the kubeconfig's path under `{tmp}/kube`, and counting it there
    once made the apiserver's CPU look like it rose with the leases (it was the service's)."""
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    pids = [int(p) for p in out.stdout.split()]
    return [p for p in pids if not names or _comm(p) in names]


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:  # ended
        return ""


def cpu_of(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # a process that ended
            total += cpu_seconds(pid)
    return total


def probes(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("proxy_operator_probe_results_total{")
    )


def _until_engine_idle(pid: int) -> float:
    """Seconds until the service has no engine host (its operations done; at most IDLE_WITHIN)."""
    started = time.monotonic()
    while engine_hosts(pid) and time.monotonic() - started < IDLE_WITHIN:
        time.sleep(2)
    return time.monotonic() - started


def engine_hosts(pid: int) -> list[int]:
    """The service's engine host children (`python -m automation.engine.host`)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended, a child that exited meanwhile
            for child in (task / "children").read_text().split():
                if b"automation.engine.host" in Path(f"/proc/{child}/cmdline").read_bytes():
                    found.append(int(child))
    return found


def window(
    label: str,
    svc: Service,
    url: str,
    groups: dict[str, list[int]],
    *,
    port: int,
    token: str,
    rate: float,
    seconds: float = WINDOW,
) -> None:
    cpu = {name: cpu_of(pids) for name, pids in groups.items()}
    own, machine = time.process_time(), machine_busy()
    lag, probed, started = lag_buckets(url), probes(url), time.monotonic()
    served = lag_buckets(url, LEASE_SECONDS)
    logged = stall_log.log_size(svc.log)
    rss = [_rss_mib(svc.process.pid)]
    load = paced_leases(port, token, rate=rate, connections=CONNECTIONS)
    profile = (
        sampled(PYSPY, svc.process.pid, svc.log.with_suffix(".pyspy"), seconds=min(seconds, PYSPY_SECONDS))
        if PYSPY and rate
        else contextlib.nullcontext()
    )
    with profile:
        latencies, not_ok = load(seconds) if rate else ([], 0)
    if not rate:
        time.sleep(seconds)
    wall = time.monotonic() - started
    rss.append(_rss_mib(svc.process.pid))
    used = {name: (cpu_of(pids) - cpu[name]) / wall for name, pids in groups.items()}
    used["lease generator (this bench)"] = (time.process_time() - own) / wall
    listed = sum(used.values())
    # the engine host and its Pulumi calls (children the groups do not list), the kernel, anything else
    used["not listed (engine host, system)"] = max((machine_busy() - machine) / wall - listed, 0.0)
    line = (
        f"{label}: {wall:.0f} s, probes {(probes(url) - probed) / wall:.0f}/s, "
        f"lag p99 {quantile(lag, lag_buckets(url)) * 1000:.1f} ms, service RSS {max(rss):.1f} MiB"
    )
    if latencies:
        q = statistics.quantiles(latencies, n=100)
        line += (
            f", leases {len(latencies) / wall:.0f}/s p50 {q[49] * 1000:.1f} ms p99 {q[98] * 1000:.1f} ms, "
            f"not 2xx {not_ok}"
        )
        inside = lag_buckets(url, LEASE_SECONDS)
        line += (  # from its route's start to its answer's: what the client waited beyond is the server's
            f"; in the service p50 {quantile(served, inside, 0.5) * 1000:.1f} ms "
            f"p99 {quantile(served, inside) * 1000:.1f} ms"
        )
    print(line)
    for name, value in used.items():
        print(f"  CPU {name:34s} {value:4.2f} s/s")
    print(f"  CPU in all (the machine)                  {sum(used.values()):4.2f} s/s (of 2 cores)")
    print("\n".join(stall_log.summary(svc.log, logged)))
    print(stall_log.drift_checks(svc.log, logged))


def run(tmp: Path) -> None:
    (tmp / "kube").mkdir()
    with contextlib.ExitStack() as outer, running_apiserver(tmp / "kube") as kube, kube.client() as api:
        # before the proxies' ports are picked (they skip ports in use): redis-server's must not be one
        redis: subprocess.Popen[bytes] | None = None
        if STORE == "redis":
            redis, redis_url = outer.enter_context(redis_server())
        prepare_cluster(kube, api, tmp)
        catalogue(api, tmp)
        created = _create(kube, api)
        print(f"created {RUNNING} Proxies over {STACKS} shared local entries in {created:.1f} s")
        args, pod = configured(kube, tmp)
        env = {
            **pod,
            **LEASE_ENV,
            "PROXY_OPERATOR_KUBE_NAMESPACES": json.dumps([NAMESPACE]),
            "PROXY_OPERATOR_KUBE_NAMESPACE": NAMESPACE,
            "PROXY_OPERATOR_KUBE_IDENTITY": "bench-running",
            "PROXY_OPERATOR_KUBE_LEASE_NAME": "bench-running",
            "PROXY_OPERATOR_HEALTH_INTERVAL_SECONDS": "10",
            "PROXY_OPERATOR_HEALTH_HEALTHY_THRESHOLD": "1",
            "PROXY_OPERATOR_LOOP_STALL_SECONDS": os.environ.get("BENCH_STALL_SECONDS", "0.1"),
        }
        name = "bench-full" if TRACEMALLOC else "bench-running"  # bench_incluster traces "bench-full"
        with contextlib.ExitStack() as stack:
            if ECHO == "own":
                echo = stack.enter_context(echo_server())
                env["PROXY_OPERATOR_HEALTH_PROBE_URL"] = f"http://127.0.0.1:{echo.args[-1]}/v1/echo"
            if redis is not None:
                env["PROXY_OPERATOR_DISCOVERY_STORE"] = "redis"
                env["PROXY_OPERATOR_DISCOVERY_REDIS_URL"] = redis_url
            svc = stack.enter_context(service(args, tmp=tmp, name=name, env=env))
            url = _served_url(svc)
            token_file = tmp / f"state-{name}" / "dev-token"
            token = str(_until(lambda: _read(token_file), what="the dev token"))
            took = _until_ready(svc, api)
            print(f"every Proxy Ready {took:.0f} s after the service started ({RUNNING / took:.0f}/s)")
            waited = _until_engine_idle(svc.process.pid)
            print(f"engine host gone {waited:.0f} s after the last Ready (its operations done)")
            if TRACEMALLOC:  # the traced service is too slow for the windows' figures to mean anything
                time.sleep(WINDOW)
                print(f"service RSS {_rss_mib(svc.process.pid):.1f} MiB (traced)")
                report_allocations(svc.process, tmp / "snapshot", until=_until)
                return
            groups = {
                "service (serve, alone)": [svc.process.pid],
                "listeners (all entries)": pids_of(f"{tmp}/l/"),
                "kube-apiserver + etcd": pids_of(f"{tmp}/kube", names=("kube-apiserver", "etcd")),
            }
            if ECHO == "own":
                groups["echo route (its own process)"] = [echo.pid]
            if redis is not None:
                groups["redis-server (the store)"] = [redis.pid]
            print(f"{len(groups['listeners (all entries)'])} listener processes")
            port = int(url.rsplit(":", 1)[1])
            window("probes alone", svc, url, groups, port=port, token=token, rate=0)
            if CENSUS:  # before the leases: what the running fleet costs, without held leases
                report_census(svc.process, tmp / "census.txt", until=_until)
                (tmp / "census.txt").unlink()
            leases = f"probes + {RATE:.0f} leases/s"
            window(leases, svc, url, groups, port=port, token=token, rate=RATE, seconds=LEASE_WINDOW)
            rss = _rss_mib(svc.process.pid)
            # The engine host (automation/engine/hosted.py) exits when idle: its memory is the pod's only
            # while it works.
            print(f"engine host processes of the service at the end: {len(engine_hosts(svc.process.pid))}")
            print(f"service RSS at the end {rss:.1f} MiB: {rss / GOAL_MIB:.2f}x the {GOAL_MIB} MiB goal")
            print(f"service {memory_parts(svc.process.pid)}")
            if redis is not None:
                print(f"redis-server RSS {_rss_mib(redis.pid):.1f} MiB (the lease state, out of the service)")
                print(redis_commands(redis_url))
            if CENSUS:
                report_census(svc.process, tmp / "census.txt", until=_until)


def _create(kube: KubeApi, api: ApiClient) -> float:
    from tests.bench import bench_incluster

    ports = _ports(RUNNING)

    def doc(namespace: str, name: str, *, port: int, provider: str) -> dict[str, Any]:
        i = int(name[1:])
        return _proxy(namespace, name, port=ports[i], provider=f"run-{i % STACKS:02d}")

    bench_incluster.proxy_doc = doc  # type: ignore[assignment]  # create_proxies' document, per entry
    return create_proxies(kube.client, RUNNING)


def _ports(count: int) -> list[int]:
    """`count` ports from FIRST_PORT up that nothing listens on now (etcd and kube-apiserver took theirs
    from the tests' range below the ephemeral one: a proxy given one of them never comes up). Checked with
    SO_REUSEADDR, as the listeners bind: a port whose connections of an earlier run wait in TIME_WAIT is
    free to them (without it, a run right after another skipped thousands and went into the ephemeral
    range, where the probes' own connections took some first: `address already in use` on a create)."""
    found, port = [], FIRST_PORT
    while len(found) < count:
        if port >= EPHEMERAL_LOW:
            raise SystemExit(f"only {len(found)} free ports between {FIRST_PORT} and {EPHEMERAL_LOW}")
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
                found.append(port)
            except OSError:
                pass
        port += 1
    return found


def _proxy(namespace: str, name: str, *, port: int, provider: str) -> dict[str, Any]:
    from tests.kube.cluster_fleet import proxy_doc

    return proxy_doc(namespace, name, port=port, provider=provider)


@contextlib.contextmanager
def echo_server() -> Iterator[subprocess.Popen[bytes]]:
    """bench_discovery's echo route (`/v1/echo` answering the caller's address) in a process of its own."""
    from tests.bench import bench_discovery

    port = _free_port()
    args = [sys.executable, bench_discovery.__file__, "serve", "echo", str(port)]
    process = subprocess.Popen(args)
    try:
        bench_discovery._wait_listening(port, process, "echo server")
        yield process
    finally:
        process.terminate()
        process.wait(10)


@contextlib.contextmanager
def redis_server() -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A redis-server of this bench's own (bench_discovery's: no persistence, loopback only)."""
    from tests.bench import bench_discovery

    started = bench_discovery._redis()
    if started is None:
        raise SystemExit("BENCH_STORE=redis needs redis-server on PATH (the test command installs it)")
    process, url = started
    try:
        yield process, url
    finally:
        process.terminate()
        process.wait(10)


def redis_commands(url: str, top: int = 10) -> str:
    """What redis-server spent its time on over the run (`INFO commandstats`: the scripts' own commands are
    counted both inside EVALSHA and on their own), the costliest first: where a lease load that is not
    sustained waits, when the service and redis-server both have CPU to spare (run 22)."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        stats: dict[str, dict[str, Any]] = client.info("commandstats")
    finally:
        client.close()
    rows = sorted(stats.items(), key=lambda item: -int(item[1]["usec"]))[:top]
    lines = ["redis-server commands (calls, us a call, s in all, failed):"]
    for name, entry in rows:
        lines.append(
            f"  {name.removeprefix('cmdstat_'):20s} {int(entry['calls']):>10,}"
            f" {float(entry['usec_per_call']):>9.1f} {int(entry['usec']) / 1e6:>8.1f}"
            f" {int(entry.get('failed_calls', 0)):>6}"
        )
    return "\n".join(lines)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def memory_parts(pid: int) -> str:
    """The RSS with its parts: anonymous (heaps, arenas, stacks) and file-backed (the libraries' pages)."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM", "Threads"):
            fields[key] = value.split()[0]
    mib = {key: int(value) / 1024 for key, value in fields.items() if key != "Threads"}
    rss, anon, files, peak = (mib.get(key, 0.0) for key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"))
    threads = fields.get("Threads", "?")
    return f"RSS {rss:.0f} MiB (anon {anon:.0f}, files {files:.0f}; peak {peak:.0f}), {threads} threads"


def _hosts_rss(pid: int) -> str:
    """The engine host's RSS while one runs (the pod's memory then holds it beside the service's)."""
    sizes = []
    for host in engine_hosts(pid):
        with contextlib.suppress(OSError, ValueError):
            sizes.append(_rss_mib(host))
    return f"; engine host RSS {max(sizes):.0f} MiB" if sizes else ""


def _until_ready(svc: Service, api: ApiClient) -> float:
    last, deadline = -1, time.monotonic() + READY_WITHIN
    while time.monotonic() < deadline:
        svc.alive()
        ready = ready_count(api)
        if ready is None:
            time.sleep(10)
            continue
        if ready != last:
            print(
                f"  {ready}/{RUNNING} Ready after {time.monotonic() - svc.started:.0f} s; service "
                f"{memory_parts(svc.process.pid)}{_hosts_rss(svc.process.pid)}",
                flush=True,
            )
            last = ready
        if ready >= RUNNING:
            return time.monotonic() - svc.started
        time.sleep(10)
    raise SystemExit(f"only {last} of {RUNNING} Proxies Ready within {READY_WITHIN:.0f} s")


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="pr-"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped bench stops its listeners too
    try:
        run(tmp)
    finally:
        for pid in pids_of(f"{tmp}/l/"):  # the listeners outlive the service (their own sessions)
            subprocess.run(["kill", "-9", str(pid)], check=False)
        if os.environ.get("BENCH_KEEP"):
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
