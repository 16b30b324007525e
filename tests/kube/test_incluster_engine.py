"""The in-cluster mode end to end: Proxy objects in a real kube-apiserver, the real Pulumi engine, `local`
proxies as real processes, status, Events, credentials Secrets and leader election in the cluster.

No kubelet runs here, so the service runs as processes of the test (as with `--kubeconfig`), not in a pod.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes.client import ApiClient

from service.kube.client import ApiException, request_json
from service.sources.kubernetes import FINALIZER, PAUSED, RECONCILE_REQUESTED
from tests.automation.fleet import accepts
from tests.conftest import PulumiEnv
from tests.kube.apiserver import KubeApi, restartable_apiserver
from tests.kube.cluster_fleet import ClusterFleet, stays, until
from tests.kube.conftest import CRDS
from tests.kube.manifests import install_crds
from tests.ports import free_port

pytestmark = pytest.mark.engine

SKIP_CLEANUP = "crawl.example.com/skip-cleanup"


@pytest.fixture
def fleet(kube_api: KubeApi, kube_client: ApiClient, pulumi_env: PulumiEnv, tmp_path: Path):
    fleet = ClusterFleet(
        api=kube_client, kubeconfig=kube_api.kubeconfig, root=tmp_path, backend_url=pulumi_env.backend_url
    )
    yield fleet
    fleet.kill_proxies()


def status(fleet: ClusterFleet, name: str) -> dict[str, Any]:
    return (fleet.get(name) or {}).get("status") or {}


def condition(fleet: ClusterFleet, name: str, type_: str) -> dict[str, Any]:
    return next((c for c in status(fleet, name).get("conditions") or [] if c["type"] == type_), {})


async def until_ready(fleet: ClusterFleet, name: str, port: int, what: str, **kw: Any) -> None:
    await until(lambda: ready_at(fleet, name, port), what=what, show=lambda: status(fleet, name), **kw)


def ready_at(fleet: ClusterFleet, name: str, port: int) -> bool:
    current = status(fleet, name)
    return current.get("phase") == "Ready" and (current.get("address") or {}).get("port") == port


def test_a_proxy_lives_through_kubectl(fleet: ClusterFleet) -> None:
    """Applied -> finalizer, Ready with its address; a spec change -> one `up`; paused holds it; a
    reconcile request runs it; quiet -> no writes; deletion waits for the resources."""
    port, port2, port3 = free_port(), free_port(), free_port()

    async def scenario() -> None:
        replica = await fleet.start("replica-a")
        try:
            fleet.create("p1", port=port)
            await until_ready(fleet, "p1", port, "p1 Ready at its port")
            obj = fleet.get("p1")
            assert obj is not None
            assert FINALIZER in obj["metadata"]["finalizers"]
            current = obj["status"]
            assert current["stack"] == "local"
            assert current["observedSpecHash"]
            assert current["observedGeneration"] == obj["metadata"]["generation"]
            assert condition(fleet, "p1", "Ready")["status"] == "True"
            assert accepts(port)
            reasons = {e["reason"] for e in fleet.events("p1")}
            assert "Provisioned" in reasons
            secret = await until(lambda: fleet.secret("p1-proxy-credentials"), what="credentials Secret")
            assert secret["metadata"]["ownerReferences"][0]["uid"] == obj["metadata"]["uid"]
            assert "password" not in str(current)

            engine = replica.mode.engine
            ups = engine.up_count("local")
            fleet.edit("p1", {"spec": {"port": port2}})
            await until_ready(fleet, "p1", port2, "p1 moved to its new port")
            assert engine.up_count("local") == ups + 1, "one spec change, one up"

            # Quiet: no status write, no finalizer write, no event (the object's resourceVersion holds).
            version = fleet.get("p1")["metadata"]["resourceVersion"]  # type: ignore[index]
            assert await stays(
                lambda: fleet.get("p1")["metadata"]["resourceVersion"] == version,  # type: ignore[index]
                seconds=3,
            ), "steady state writes to the Proxy"

            fleet.edit("p1", {"metadata": {"annotations": {PAUSED: "true"}}, "spec": {"port": port3}})
            await until(lambda: condition(fleet, "p1", "Held").get("reason") == "Paused", what="paused")
            assert await stays(lambda: not accepts(port3), seconds=2), "a paused proxy changed"
            assert engine.up_count("local") == ups + 1
            fleet.edit("p1", {"metadata": {"annotations": {PAUSED: None}}})
            await until_ready(fleet, "p1", port3, "resumed after the pause")
            ups = engine.up_count("local")

            fleet.edit("p1", {"metadata": {"annotations": {RECONCILE_REQUESTED: "now"}}})
            await until(lambda: engine.up_count("local") == ups + 1, what="the requested run")

            fleet.delete("p1")
            deleting = fleet.get("p1")
            assert deleting is not None, "deleted before its resources were removed"
            assert deleting["metadata"]["deletionTimestamp"]
            await until(lambda: fleet.get("p1") is None, what="p1 released")
            assert not accepts(port3), "its process outlived the deletion"
        finally:
            await fleet.stop_all()

    asyncio.run(scenario())


def test_unknown_provider_stalls_until_the_catalogue_names_it(fleet: ClusterFleet) -> None:
    """An unknown provider: Stalled with the reason, and no stack run; the catalogue ConfigMap gains the
    provider -> the proxy is provisioned. A skip-cleanup Proxy is freed and its process keeps running."""
    port, kept = free_port(), free_port()

    async def scenario() -> None:
        replica = await fleet.start("replica-a")
        try:
            fleet.create("typo", port=port, provider="nope")
            stalled = await until(
                lambda: (
                    condition(fleet, "typo", "Stalled").get("status") == "True"
                    and condition(fleet, "typo", "Stalled")
                ),
                what="Stalled",
            )
            assert stalled["reason"] == "UnknownProvider"
            assert "nope" in stalled["message"]
            assert status(fleet, "typo")["phase"] == "Stalled"
            assert await stays(lambda: replica.mode.engine.up_count("nope") == 0, seconds=2)

            fleet.set_catalogue(["local", "nope"])
            await until_ready(fleet, "typo", port, "provisioned once the catalogue names it")

            fleet.create("kept", port=kept, annotations={SKIP_CLEANUP: "true"})
            await until_ready(fleet, "kept", kept, "kept Ready")
            fleet.delete("kept")
            await until(lambda: fleet.get("kept") is None, what="kept released")
            assert accepts(kept), "skip-cleanup must leave the proxy running"
        finally:
            await fleet.stop_all()

    asyncio.run(scenario())


def test_two_replicas_elect_one_leader_and_hand_over(fleet: ClusterFleet) -> None:
    """Only the leader reconciles; the follower serves the leader's proxies from the cluster; when the
    leader stops, the follower takes over and reconciles."""
    first, second = free_port(), free_port()

    async def scenario() -> None:
        a = await fleet.start("replica-a")
        await until(lambda: a.mode.leading, what="a leads")
        b = await fleet.start("replica-b")
        try:
            fleet.create("p1", port=first)
            await until_ready(fleet, "p1", first, "p1 Ready")
            assert not b.mode.leading
            assert b.mode.engine.ups == [], "a follower ran an operation"
            served = await until(lambda: b.service.controller.inventory.get(f"{fleet.namespace}/p1"),
                                 what="the follower serves p1")  # fmt: skip
            assert served.port == first
            assert served.password, "the follower has the credentials from the Secret"
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{b.service.port}") as http:
                assert (await http.get("/readyz")).status_code == 200, "a healthy follower is ready"

            started = time.monotonic()
            await a.stop()
            await until(lambda: b.mode.leading, what="b takes over", within=30)
            print(f"handover after a clean stop: {time.monotonic() - started:.2f} s")
            fleet.create("p2", port=second)
            await until_ready(fleet, "p2", second, "p2 Ready under the new leader")
            assert b.mode.engine.up_count("local") >= 1
            # The new leader continues from the cluster's status: p1 stays healthy (and leasable).
            assert condition(fleet, "p1", "Healthy").get("status") == "True"
            assert b.service.controller.inventory.health(f"{fleet.namespace}/p1").healthy
        finally:
            await fleet.stop_all()

    asyncio.run(scenario())


@pytest.mark.kube_tools  # starts its own kube-apiserver
def test_the_watch_survives_an_apiserver_restart(pulumi_env: PulumiEnv, tmp_path: Path) -> None:
    """kube-apiserver stops and starts again on the same port: the watches reconnect, the Lease is kept
    or won again, and a Proxy created afterwards is reconciled."""
    first, second = free_port(), free_port()
    (tmp_path / "kube").mkdir()
    with restartable_apiserver(tmp_path / "kube") as (kube, restart), kube.client() as api:
        only_proxies = tmp_path / "crds"  # this test needs the Proxy kind only
        only_proxies.mkdir()
        shutil.copy(CRDS / "crawl.example.com_proxies.yaml", only_proxies)
        install_crds(api, only_proxies, cache_dir=tmp_path)
        fleet = ClusterFleet(
            api=api, kubeconfig=kube.kubeconfig, root=tmp_path / "fleet", backend_url=pulumi_env.backend_url
        )

        async def scenario() -> None:
            await fleet.start("replica-a", lease_duration_seconds=15.0, renew_deadline_seconds=10.0)
            try:
                fleet.create("p1", port=first)
                await until_ready(fleet, "p1", first, "p1 Ready")
                await asyncio.to_thread(restart)
                fleet.create("p2", port=second)
                await until_ready(fleet, "p2", second, "p2 Ready after the restart")
                assert accepts(first)
            finally:
                await fleet.stop_all()

        try:
            asyncio.run(scenario())
        finally:
            fleet.kill_proxies()


def test_sigterm_stops_the_service_cleanly_and_releases_the_lease(fleet: ClusterFleet) -> None:
    """`kubectl delete pod` sends SIGTERM: the process stops its term (the Lease is released, so a
    successor takes over within a retry period) and exits 0. uvicorn re-raises the signal it caught after
    its own shutdown, which used to kill the process before the Lease was released (found by the bench)."""
    lease = f"/apis/coordination.k8s.io/v1/namespaces/{fleet.namespace}/leases/proxy-operator"
    env = {
        **os.environ,
        "PROXY_OPERATOR_KUBE_NAMESPACES": json.dumps([fleet.namespace]),
        "PROXY_OPERATOR_KUBE_NAMESPACE": fleet.namespace,
        "PROXY_OPERATOR_KUBE_IDENTITY": "replica-term",
        "PROXY_OPERATOR_INSTALLATION": "e2e",
    }
    command = [str(Path(sys.executable).parent / "proxy-operator"), "serve", "--port", "0"]
    with subprocess.Popen(
        [*command, "--kubeconfig", str(fleet.kubeconfig), "--state-dir", str(fleet.root / "term")],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        try:
            holder = lambda: request_json(fleet.api, "GET", lease)["spec"].get("holderIdentity")  # noqa: E731
            asyncio.run(until(lambda: _exists(fleet, lease) and holder() == "replica-term", what="it leads"))
            process.send_signal(signal.SIGTERM)
            _, stderr = process.communicate(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
    assert process.returncode == 0, stderr[-2000:]
    assert "stopped cleanly" in stderr
    assert not holder(), "the Lease was not released"


def _exists(fleet: ClusterFleet, path: str) -> bool:
    try:
        request_json(fleet.api, "GET", path)
    except ApiException:
        return False
    return True
