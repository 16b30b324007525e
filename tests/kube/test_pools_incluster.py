"""Pools in the in-cluster mode: a ProxyPool in a real kube-apiserver, its children real Proxy objects that
the real engine provisions as `local` processes over two local providers.

The leader creates each child through the API (named and labelled as in folder mode, owned by the pool),
deletes surplus children through the API (the normal path: a deletion timestamp held by our finalizer until
the stack removed the process), and writes the pool's status.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiClient

from service.kube.client import request_json
from service.pools.naming import PLACEMENT_LABEL, POOL_LABEL
from service.sources.kubernetes import FINALIZER
from tests.automation.fleet import accepts
from tests.conftest import PulumiEnv
from tests.kube.apiserver import KubeApi
from tests.kube.cluster_fleet import BASE, ClusterFleet, until
from tests.ports import free_port

pytestmark = pytest.mark.engine

POOL = "eu"


@pytest.fixture
def fleet(kube_api: KubeApi, kube_client: ApiClient, pulumi_env: PulumiEnv, tmp_path: Path):
    fleet = ClusterFleet(
        api=kube_client, kubeconfig=kube_api.kubeconfig, root=tmp_path, backend_url=pulumi_env.backend_url
    )
    fleet.set_catalogue(["local-a", "local-b"])
    yield fleet
    fleet.kill_proxies()


def pool_doc(namespace: str, *, replicas: int, bases: tuple[int, int]) -> dict[str, Any]:
    return {
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "ProxyPool",
        "metadata": {"name": POOL, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "placement": [
                {"provider": "local-a", "portBase": bases[0]},
                {"provider": "local-b", "portBase": bases[1]},
            ],
            "template": {
                "metadata": {"labels": {"team": "crawl"}},
                "spec": {
                    "allowedSourceRanges": ["127.0.0.0/8"],
                    "egress": {"allow": [{"cidr": "127.0.0.1/32"}]},  # the service's echo
                },
            },
        },
    }


def pool_path(fleet: ClusterFleet) -> str:
    return f"{BASE}/namespaces/{fleet.namespace}/proxypools/{POOL}"


def children(fleet: ClusterFleet) -> list[dict[str, Any]]:
    path = f"{BASE}/namespaces/{fleet.namespace}/proxies"
    return request_json(fleet.api, "GET", path, query=[("labelSelector", f"{POOL_LABEL}={POOL}")])["items"]


def ready(obj: dict[str, Any]) -> bool:
    return (obj.get("status") or {}).get("phase") == "Ready" and not obj["metadata"].get("deletionTimestamp")


def pool_status(fleet: ClusterFleet) -> dict[str, Any]:
    return request_json(fleet.api, "GET", pool_path(fleet)).get("status") or {}


def settled(fleet: ClusterFleet, count: int) -> list[dict[str, Any]] | None:
    """`count` children, all Ready, and no other child left; None otherwise."""
    found = children(fleet)
    return found if len(found) == count and all(ready(c) for c in found) else None


def test_a_pool_lives_as_child_proxy_objects(fleet: ClusterFleet) -> None:
    """4 over two local providers -> 4 owned children, Ready, status 2+2; 5 adds one object; 3 deletes two
    (each held by our finalizer while its process is removed, then gone); the status follows."""
    bases = (free_port(), free_port())

    async def scenario() -> None:
        replica = await fleet.start("replica-a")
        try:
            await until(lambda: replica.mode.leading, what="leading")
            created = request_json(
                fleet.api,
                "POST",
                f"{BASE}/namespaces/{fleet.namespace}/proxypools",
                body=pool_doc(fleet.namespace, replicas=4, bases=bases),
            )
            uid = created["metadata"]["uid"]
            four = await until(
                lambda: settled(fleet, 4), what="4 Ready children", show=lambda: children(fleet)
            )
            for child in four:
                meta = child["metadata"]
                assert meta["name"].startswith(f"{POOL}-")
                owner = meta["ownerReferences"][0]
                assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
                    "ProxyPool",
                    POOL,
                    uid,
                    True,
                )
                assert meta["labels"]["team"] == "crawl"
                assert FINALIZER in meta["finalizers"]
                assert accepts(child["status"]["address"]["port"])
            placements = sorted(c["metadata"]["labels"][PLACEMENT_LABEL] for c in four)
            assert placements == ["local-a", "local-a", "local-b", "local-b"]
            await until(
                lambda: pool_status(fleet).get("ready") == 4,
                what="pool status 4 ready",
                show=lambda: pool_status(fleet),
            )
            current = pool_status(fleet)
            assert current["desired"] == 4
            assert current["placements"] == {"local-a": 2, "local-b": 2}
            assert {c["type"]: c["status"] for c in current["conditions"]} == {
                "Ready": "True",
                "Degraded": "False",
            }

            fleet.merge(pool_path(fleet), {"spec": {"replicas": 5}})
            five = await until(
                lambda: settled(fleet, 5), what="5 Ready children", show=lambda: children(fleet)
            )
            assert {c["metadata"]["uid"] for c in four} < {c["metadata"]["uid"] for c in five}, "one added"
            await until(
                lambda: pool_status(fleet).get("ready") == 5, what="status 5", show=lambda: pool_status(fleet)
            )
            assert pool_status(fleet)["placements"] == {"local-a": 3, "local-b": 2}

            fleet.merge(pool_path(fleet), {"spec": {"replicas": 3}})
            deleting: set[str] = set()

            def three() -> bool:
                found = children(fleet)
                deleting.update(
                    c["metadata"]["name"] for c in found if c["metadata"].get("deletionTimestamp")
                )
                return len(found) == 3 and all(ready(c) for c in found)

            await until(three, what="3 children left", show=lambda: children(fleet))
            left = {c["metadata"]["name"] for c in children(fleet)}
            gone = {c["metadata"]["name"] for c in five} - left
            assert len(gone) == 2
            assert left < {c["metadata"]["name"] for c in five}
            assert deleting == gone, "each removed child was held in Deleting by the finalizer, no other"
            for child in five:
                if child["metadata"]["name"] in gone:
                    assert not accepts(child["status"]["address"]["port"]), "its process outlived it"
            await until(lambda: pool_status(fleet).get("desired") == 3, what="status 3")
            final = pool_status(fleet)
            assert final["ready"] == 3
            assert sum(final["placements"].values()) == 3
        finally:
            await fleet.stop_all()

    asyncio.run(scenario())
