"""Benchmark: what a follower keeps of each Proxy, part by part (issue 20, the Memory goal).

No API server: BENCH_PROXIES (10,000) Proxy objects as bench_incluster's follower phase leaves them (the
spec of tests/kube/cluster_fleet.py's `proxy_doc`, a leader's status: address, stack, egress IP, Healthy)
are fed, one at a time as the watch feeds them, through the parts a follower keeps them in:
- the watched copy (`proxy_object`: service/kube/cluster_cache.py's `_objects`);
- the cluster's status for the follower's view (`ClusterStatus.observe`, service/status_view.py);
- the inventory discovery serves (`ProxyEndpoint` + `Health`, as service/kube/follower.py judges them);
- the credentials Secrets as the reader keeps them (`CredentialsReader`, service/kube/credentials.py: the
  Secret follower_phase.py's leader writes for each, fed through its watch's slim and event), with the
  watched copies' keys held meanwhile as the cluster cache holds them (the reader's keys are those strings).
Each part is measured with tracemalloc (the bytes still allocated after the part took every Proxy, over
the count) and the whole with the process's VmRSS. Asserts nothing; prints bytes per Proxy.
`PYTHONPATH=$PWD .venv/bin/python tests/bench/bench_follower_state.py`
"""

from __future__ import annotations

import gc
import os
import sys
import tracemalloc
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kubernetes.client import ApiClient  # noqa: E402

from service.inventory import Health, HealthState, Inventory  # noqa: E402
from service.kube.credentials import Credentials, CredentialsReader, followed_output, secret_body  # noqa: E402
from service.kube.proxy_object import ProxyObject, proxy_object  # noqa: E402
from service.kube.refs import ProxyRef  # noqa: E402
from service.reporter import endpoint_of  # noqa: E402
from service.status_view import ClusterStatus  # noqa: E402
from stacks.models import Proxy  # noqa: E402
from tests.kube.cluster_fleet import proxy_doc  # noqa: E402

PROXIES = int(os.environ.get("BENCH_PROXIES", "10000"))
NAMESPACE = "bench"


def raw(n: int) -> dict[str, Any]:
    """One Proxy as the watch reads it, with what the API server adds."""
    doc = proxy_doc(NAMESPACE, f"p{n:05d}", port=20000 + n)
    doc["metadata"].update(
        uid=f"{n:08d}-0000-4000-8000-000000000000",
        generation=1,
        resourceVersion=str(100000 + n),
        creationTimestamp="2026-12-03T00:00:00Z",
        finalizers=["crawl.example.com/cleanup"],
        managedFields=[{"manager": "proxy-operator", "operation": "Update", "fieldsV1": {"f:status": {}}}],
    )
    now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    doc["status"] = {
        "phase": "Ready",
        "address": {"host": "127.0.0.1", "port": 20000 + n},
        "stack": "local",
        "egressIP": "127.0.0.1",
        "conditions": [
            {
                "type": "Healthy",
                "status": "True",
                "reason": "ProbeSucceeded",
                "message": "",
                "lastTransitionTime": now,
            },
        ],
    }
    return doc


def measured(what: str, feed: Callable[[dict[str, Any]], object]) -> list[object]:
    kept: list[object] = []
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for n in range(PROXIES):
        kept.append(feed(raw(n)))
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    print(f"  {what:58s} {(after - before) / PROXIES:8.0f} B/Proxy  {(after - before) / 2**20:6.1f} MiB")
    return kept


def vm_rss() -> float:
    text = Path("/proc/self/status").read_text()
    return next(int(line.split()[1]) for line in text.splitlines() if line.startswith("VmRSS")) / 1024


def main() -> None:
    print(f"{PROXIES} Proxies, bytes still allocated per Proxy (tracemalloc)")
    start = vm_rss()
    objects = [o for o in measured("watched copy (ProxyObject)", proxy_object) if isinstance(o, ProxyObject)]
    status = ClusterStatus()
    measured("cluster status for the follower's view (zlib JSON)", status.observe)
    inventory = Inventory()

    def judge(doc: dict[str, Any]) -> None:
        obj = proxy_object(doc)  # the follower judges the watched copy (dropped here: measured above)
        proxy = Proxy.model_validate(obj.body)
        out = followed_output(obj.status["address"], {})
        inventory.upsert(endpoint_of(proxy, stack=obj.status.get("stack"), out=out, creds={}))
        inventory.set_health(obj.key, Health(state=HealthState.healthy, egress_ip=obj.status["egressIP"]))

    measured("inventory (ProxyEndpoint + Health)", judge)
    keys = {o.key: o for o in objects}  # as the cluster cache holds them (not measured: above)
    watcher = CredentialsReader(ApiClient(), [NAMESPACE]).watchers[0]  # not started: fed here

    def secret(doc: dict[str, Any]) -> None:
        meta = doc["metadata"]
        ref = ProxyRef(namespace=NAMESPACE, name=meta["name"], uid=meta["uid"], generation=1)
        creds = Credentials(
            host="127.0.0.1", port=doc["spec"]["port"], protocol="http", username="u", password="p"
        )
        watcher.on_event("ADDED", watcher.slim(secret_body(ref, creds)))

    measured("credentials Secrets (CredentialsReader)", secret)
    print(f"VmRSS {vm_rss():.1f} MiB, {vm_rss() - start:.1f} MiB above the start ({len(keys)} objects kept)")


if __name__ == "__main__":
    main()
