"""The list+watch loop (service/kube/watch.py) against the real apiserver: 410 Gone lists again."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import config
from kubernetes.client import ApiClient, Configuration

from service.kube.client import request_json
from service.kube.watch import Watcher
from tests.kube.apiserver import KubeApi, running_apiserver


def compact_etcd(etcd_url: str) -> None:
    """Drop etcd's history up to now (what the apiserver's periodic compaction does every 5 minutes)."""
    revision = httpx.post(f"{etcd_url}/v3/kv/range", json={"key": "AA=="}).json()["header"]["revision"]
    httpx.post(
        f"{etcd_url}/v3/kv/compaction", json={"revision": revision, "physical": True}
    ).raise_for_status()


@pytest.mark.kube_tools  # starts its own kube-apiserver
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


def test_a_watch_stopped_while_it_opens_leaves_no_busy_connection(kube_api: KubeApi) -> None:
    """A watcher stopped while its watch request was on the way (a term ending, the service stopping) used
    to hand the still-streaming connection back to the client's pool: the next request on that client was
    written behind the open watch and hung until its read timeout (a CI run lost a source's first list to
    it). Now such a connection is closed, and the next request on the same client answers."""
    namespace = f"watch-{uuid.uuid4().hex[:8]}"
    configuration = Configuration()
    config.load_kube_config(config_file=str(kube_api.kubeconfig), client_configuration=configuration)
    configuration.retries = 0  # a hung request fails at its read timeout instead of being sent again
    with ApiClient(configuration) as api:  # its own pool: a poisoned connection reaches no other test
        request_json(api, "POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}})
        path = f"/api/v1/namespaces/{namespace}/configmaps"
        stopper: list[threading.Thread] = []
        watcher: Watcher

        def stop_before_the_watch(items: list[dict[str, Any]]) -> None:
            stopper.append(threading.Thread(target=watcher.stop))
            stopper[0].start()
            assert watcher._stop.wait(5)  # stopping, and the watch request not sent yet

        watcher = Watcher(api, path, on_list=stop_before_the_watch, on_event=lambda *_: None, name="stopped")
        watcher.start()
        assert watcher.synced.wait(30), watcher.last_error
        stopper[0].join(10)  # stop() returns once the watch thread ended
        assert not stopper[0].is_alive()
        for _ in range(3):  # the pool hands out the connection put back last first
            request_json(api, "GET", path, timeout=(5, 10))
