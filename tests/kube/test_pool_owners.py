"""A ProxyPool in a real kube-apiserver, its ClusterPools driven pass by pass (no engine: the children are
objects only, nothing provisions them). Membership is the pool's ownerReference by uid: a hand-made Proxy
carrying the pool label is left alone, named in a Warning Event on the pool. A placement naming a provider
the catalogue lacks holds the pool: its owned child is not deleted, status and a Warning Event say why."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import yaml
from kubernetes.client import ApiClient

from service.inventory import Inventory
from service.kube.client import request_json
from service.kube.pools import ClusterPools
from service.kube.settings import KubeSettings
from service.pools.naming import POOL_LABEL
from service.pools.signals import PoolSignals
from service.sources.kubernetes import KubernetesSource
from tests.kube.apiserver import KubeApi

BASE = "/apis/crawl.example.com/v1alpha1"
MERGE = "application/merge-patch+json"


def passes(
    source: KubernetesSource, pools: ClusterPools, until: Callable[[], Any], *, within: float = 30
) -> Any:
    """Passes (a poll of the source for its catalogue, a pool step) until `until()` is truthy."""
    deadline = time.monotonic() + within
    while True:
        source.poll()
        pools.step()
        found = until()
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def test_membership_is_the_owner_uid_and_an_unknown_provider_holds(
    kube_api: KubeApi, kube_client: ApiClient
) -> None:
    api, ns = kube_client, f"owners-{uuid.uuid4().hex[:8]}"
    request_json(api, "POST", "/api/v1/namespaces", body={"metadata": {"name": ns}})
    entries = [{"name": "a", "type": "local", "stateDir": "/nonexistent/a"}]
    configmap = {
        "metadata": {"name": "proxy-operator-providers"},
        "data": {"providers.yaml": yaml.safe_dump({"providers": entries})},
    }
    request_json(api, "POST", f"/api/v1/namespaces/{ns}/configmaps", body=configmap)
    mine = {
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": "mine", "labels": {POOL_LABEL: "eu"}},
        "spec": {"provider": "a", "port": 3999, "allowedSourceRanges": ["10.0.0.0/8"]},
    }
    made = request_json(api, "POST", f"{BASE}/namespaces/{ns}/proxies", body=mine)
    pool = {
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "ProxyPool",
        "metadata": {"name": "eu"},
        "spec": {
            "replicas": 1,
            "placement": [{"provider": "a", "portBase": 18400}],
            "template": {"spec": {"allowedSourceRanges": ["127.0.0.0/8"]}},
        },
    }
    uid = request_json(api, "POST", f"{BASE}/namespaces/{ns}/proxypools", body=pool)["metadata"]["uid"]
    settings = KubeSettings(kubeconfig=kube_api.kubeconfig, namespaces=[ns], namespace=ns, identity="t")
    source = KubernetesSource(api, settings)
    cluster = ClusterPools(api, settings, source=source, signals=PoolSignals(Inventory()))

    def proxies() -> list[dict[str, Any]]:
        return request_json(api, "GET", f"{BASE}/namespaces/{ns}/proxies")["items"]

    def owned() -> list[dict[str, Any]]:
        return [
            p for p in proxies() if any(r["uid"] == uid for r in p["metadata"].get("ownerReferences", []))
        ]

    def events(reason: str) -> list[str]:
        items = request_json(api, "GET", f"/api/v1/namespaces/{ns}/events")["items"]
        return [
            e["message"]
            for e in items
            if e["involvedObject"]["kind"] == "ProxyPool" and e["reason"] == reason and e["type"] == "Warning"
        ]

    source.start()
    cluster.start()
    try:
        [child] = passes(source, cluster, owned)
        assert child["metadata"]["ownerReferences"][0]["controller"] is True
        for _ in range(5):
            passes(source, cluster, lambda: False, within=0)
        now = {p["metadata"]["name"]: p for p in proxies()}
        assert now["mine"]["metadata"]["resourceVersion"] == made["metadata"]["resourceVersion"], (
            "the stranger was never patched (re-templated) nor deleted"
        )
        assert len(owned()) == 1
        warned = passes(source, cluster, lambda: events("NotOwned"))
        assert f"Proxy {ns}/mine carries the label of pool {ns}/eu but is not owned by it" in warned[0]

        path = f"{BASE}/namespaces/{ns}/proxypools/eu"
        typo = {"spec": {"placement": [{"provider": "aa", "portBase": 18400}]}}
        request_json(api, "PATCH", path, body=typo, content_type=MERGE)
        held = passes(source, cluster, lambda: events("UnknownProvider"))
        assert "spec.placement[0] names provider 'aa'" in held[0]
        for _ in range(5):
            passes(source, cluster, lambda: False, within=0)
        [still] = owned()
        assert still["metadata"]["uid"] == child["metadata"]["uid"]
        assert not still["metadata"].get("deletionTimestamp"), "the running child is not deleted"
        conditions = request_json(api, "GET", path)["status"]["conditions"]
        degraded = next(c for c in conditions if c["type"] == "Degraded")
        assert (degraded["status"], degraded["reason"]) == ("True", "UnknownProvider")
    finally:
        cluster.stop()
        source.stop()
