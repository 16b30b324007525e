"""The list+watch loop (service/kube/watch.py) against the real apiserver: 410 Gone lists again."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import httpx
from kubernetes.client import ApiClient

from service.kube.client import request_json
from service.kube.watch import Watcher
from tests.kube.apiserver import KubeApi, running_apiserver


def compact_etcd(etcd_url: str) -> None:
    """Drop etcd's history up to now (what the apiserver's periodic compaction does every 5 minutes)."""
    revision = httpx.post(f"{etcd_url}/v3/kv/range", json={"key": "AA=="}).json()["header"]["revision"]
    httpx.post(
        f"{etcd_url}/v3/kv/compaction", json={"revision": revision, "physical": True}
    ).raise_for_status()


def test_a_watch_from_a_compacted_version_lists_again(tmp_path: Path) -> None:
    """A watch resumed from a resourceVersion the apiserver no longer has answers 410 Gone: the watcher
    lists the whole set again and watches on from there (as after a long disconnection). The apiserver runs
    without its watch cache, so the watch reaches etcd, whose history the test compacts."""
    with running_apiserver(tmp_path, extra_args=("--watch-cache=false",)) as kube, kube.client() as api:
        _relists_after_gone(kube, api)


def _relists_after_gone(kube_api: KubeApi, kube_client: ApiClient) -> None:
    namespace = f"watch-{uuid.uuid4().hex[:8]}"
    request_json(kube_client, "POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}})
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    first = request_json(kube_client, "POST", path, body={"metadata": {"name": "before"}})
    stale = first["metadata"]["resourceVersion"]
    for n in range(3):  # history after the stale version, then compacted away
        request_json(kube_client, "POST", path, body={"metadata": {"name": f"churn-{n}"}})
    compact_etcd(kube_api.etcd_url)
    listed: list[list[str]] = []
    seen: list[tuple[str, str]] = []
    event = threading.Event()

    def on_event(kind: str, obj: dict[str, Any]) -> None:
        seen.append((kind, obj["metadata"]["name"]))
        event.set()

    watcher = Watcher(
        kube_client,
        path,
        on_list=lambda items: listed.append(sorted(i["metadata"]["name"] for i in items)),
        on_event=on_event,
        name="compacted",
        resource_version=stale,  # compacted away: the apiserver answers 410 Gone
    )
    watcher.start()
    try:
        assert watcher.synced.wait(30), watcher.last_error
        assert watcher.lists == 1
        assert "before" in listed[0]
        request_json(kube_client, "POST", path, body={"metadata": {"name": "after"}})
        assert event.wait(30)
        assert ("ADDED", "after") in seen
    finally:
        watcher.stop()
