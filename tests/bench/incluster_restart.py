"""bench_incluster.py's restart: the service stopped (SIGTERM: it releases its Lease) and started again on
the same state and backend, as after an upgrade or a handover, so a new leader takes in 10,000 unchanged
Proxies. The local Proxy is edited as soon as the Lease is held (a change during the intake)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from kubernetes.client import ApiClient

from service.kube.client import request_json
from tests.bench.bench_incluster import (
    LOCAL,
    PROXIES,
    PROXIES_PATH,
    SETTLE,
    Seen,
    Service,
    _leads,
    _until,
    cluster_edit,
    cluster_service,
    count_events,
    one_edit,
    resource_versions,
)
from tests.kube.apiserver import KubeApi


@dataclass
class Restart:
    leading: float  # from the process start to the Lease held
    first_pass: float | None  # to the log's "first pass done" (every stack read, changes run)
    lane: float | None  # to the log's "has a change: run before the rest is taken in" (the lane submitted)
    to_up: float  # the edit (made once the Lease is held) to its `up` started
    to_ready: float  # to Ready at the new port
    settled: float  # to the last write seen, from the start
    rewritten: int  # of the other Proxies, with a new resourceVersion
    writes: int  # Proxy writes the watch saw, the edited Proxy's included
    events: int  # Events created meanwhile


def restart(kube: KubeApi, api: ApiClient, tmp: Path, seen: Seen) -> Restart:
    """Stop the service and start it again on the same state and backend; edit the local Proxy as soon as
    the Lease is held; wait until nothing was written for SETTLE s; then remove the local proxy."""
    before, writes, events = resource_versions(api), seen.writes, count_events(api)
    edit, status = cluster_edit(api)
    with cluster_service(kube, tmp, "bench-full", run="-restart") as svc:
        _until(lambda: _leads(svc, api, "bench-full"), what="the restarted service leads", within=120)
        leading = time.monotonic() - svc.started
        to_up, to_ready = one_edit(edit, status)
        while time.monotonic() - seen.last_write <= SETTLE:
            svc.alive()
            time.sleep(0.5)
        after = resource_versions(api)
        figures = Restart(
            leading=leading,
            first_pass=_logged(svc, "first pass done"),
            lane=_logged(svc, "run before the rest is taken in"),
            to_up=to_up,
            to_ready=to_ready,
            settled=seen.last_write - svc.started,
            rewritten=sum(1 for name, rv in after.items() if name != LOCAL and before.get(name) != rv),
            writes=seen.writes - writes,
            events=count_events(api) - events,
        )
        request_json(api, "DELETE", f"{PROXIES_PATH}/{LOCAL}")
        _until(lambda: LOCAL not in resource_versions(api), what="the local proxy released", within=120)
    return figures


def _logged(svc: Service, text: str) -> float | None:
    """Seconds from the start to the first log line holding `text` (the log's local time)."""
    for line in svc.log.read_text(errors="replace").splitlines():
        if text in line:
            stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
            return stamp.timestamp() - svc.wall
    return None


def report_restart(figures: Restart) -> None:
    first = f"{figures.first_pass:.1f} s" if figures.first_pass is not None else "not logged"
    print(
        f"restart on {PROXIES} unchanged Proxies + 1, from the process start: Lease {figures.leading:.1f} s, "
        f"first pass done {first}, last write {figures.settled:.1f} s; {figures.rewritten} of the "
        f"{PROXIES} with a new resourceVersion, {figures.writes} Proxy writes seen (the edited one's "
        f"included), {figures.events} Events created"
    )
    print(
        f"a change made as the Lease was taken (during the intake): up started after {figures.to_up:.2f} s, "
        f"Ready at the new port after {figures.to_ready:.2f} s; its stack submitted ahead of the rest "
        + (f"{figures.lane - figures.leading:.2f} s after the Lease" if figures.lane is not None else "never")
        + " (a fresh process lists every Proxy before its lane; a local stack's process check runs after"
        " the up)"
    )
