"""deploy/ RBAC is enough and nothing more, proven by the apiserver's audit log.

The deploy/ Namespace, ServiceAccount and RBAC are applied to the test apiserver; two replicas of the real
service run as that ServiceAccount (a TokenRequest token, `serve --kubeconfig` as a process would) with the
namespaces deploy/ assumes: the service's `proxy-operator` (catalogue ConfigMap, Lease) and the Proxies'
`crawl`. They go through everything the service does in a cluster: Proxies created, Ready (finalizer,
status, Events, credentials Secrets), an `auth.mode: secret` Proxy, an Event repeated (paused twice), a spec
change that meets a stack lock left by a replica that is gone (recovered after reading its pod), deletion,
and a leader handover.

Then every request of the ServiceAccount is read back from the audit log: none may be forbidden, and every
verb the Roles grant must have been used, except the explicit allowlist below (granted, not exercised here,
and why).
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiClient
from kubernetes.dynamic import DynamicClient

from service.kube.client import ApiException, request_json
from service.sources.kubernetes import CREDENTIALS_LABEL, FINALIZER, PAUSED
from tests.conftest import PulumiEnv
from tests.kube.apiserver import ROOT, KubeApi, write_kubeconfig
from tests.kube.audit import (
    Access,
    grants_to,
    log_offset,
    requests_by,
    service_account,
    table,
    uncovered,
)
from tests.kube.cluster_fleet import ClusterFleet, page_client, until
from tests.kube.manifests import apply, kube_documents, namespaces_first
from tests.ports import free_port

pytestmark = pytest.mark.engine

DEPLOY = ROOT / "deploy"
MANIFESTS = ("namespace.yaml", "serviceaccount.yaml", "rbac.yaml")
OWN, PROXIES = "proxy-operator", "crawl"  # the service's namespace and the Proxies' (deploy/rbac.yaml)
ACCOUNT = "proxy-operator"
USER = service_account(OWN, ACCOUNT)
LEASE = f"/apis/coordination.k8s.io/v1/namespaces/{OWN}/leases/proxy-operator"

_WORKLOADS = (
    "the Role for a `type: kubernetes` entry's objects: the kubernetes program needs a provider plugin and "
    "pods; tests/kube/test_kubernetes_program_engine.py runs it on the test node through a user holding "
    "this Role, not here"
)
# Granted but not exercised here, and why. Everything else the RBAC grants must show in the audit log.
ALLOWED_UNUSED: dict[Access, str] = {
    Access("proxies", group, resource, verb): _WORKLOADS
    for group, resources, verbs in [
        ("", ["secrets", "services"], ["get", "list", "watch", "create", "update", "patch", "delete"]),
        ("apps", ["deployments"], ["get", "list", "watch", "create", "update", "patch", "delete"]),
        ("networking.k8s.io", ["networkpolicies"], ["get", "list", "watch", "create", "update", "patch",
                                                    "delete"]),
        ("apps", ["replicasets"], ["get", "list", "watch"]),
        ("", ["pods", "endpoints", "events", "persistentvolumeclaims"], ["get", "list", "watch"]),
    ]
    for resource in resources
    for verb in verbs
}  # fmt: skip
_POOLS = (
    "a pool's writes (children created and deleted, its status): no ProxyPool in this scenario; the leader's "
    "ProxyPool list+watch is exercised here, the writes in tests/kube/test_pools_incluster.py as the admin"
)
ALLOWED_UNUSED |= {
    Access(PROXIES, "crawl.example.com", "proxies", "create"): _POOLS,
    Access(PROXIES, "crawl.example.com", "proxies", "delete"): _POOLS,
    Access(PROXIES, "crawl.example.com", "proxypools/status", "patch"): _POOLS,
}


def deploy_documents() -> list[dict[str, Any]]:
    return namespaces_first([doc for _, doc in kube_documents(DEPLOY / name for name in MANIFESTS)])


@pytest.fixture
def as_service_account(
    kube_api: KubeApi, kube_client: ApiClient, dynamic: DynamicClient, tmp_path: Path
) -> Path:
    """deploy/ applied (idempotent: other tests may have done it), and a kubeconfig of its ServiceAccount."""
    for document in deploy_documents():
        apply(dynamic, document)
    path = f"/api/v1/namespaces/{OWN}/serviceaccounts/{ACCOUNT}/token"
    body = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600},
    }
    token = request_json(kube_client, "POST", path, body=body)["status"]["token"]
    (tmp_path / "sa").mkdir()
    return write_kubeconfig(tmp_path / "sa", url=kube_api.url, ca_file=kube_api.ca_file, token=token)


@pytest.fixture
def fleet(
    as_service_account: Path, kube_client: ApiClient, pulumi_env: PulumiEnv, tmp_path: Path
) -> Iterator[ClusterFleet]:
    fleet = ClusterFleet(
        api=kube_client,
        kubeconfig=as_service_account,
        root=tmp_path,
        backend_url=pulumi_env.backend_url,
        namespace=PROXIES,
        service_namespace=OWN,
    )
    with_no_lease(kube_client)  # the first replica creates it
    yield fleet
    fleet.kill_proxies()


def with_no_lease(api: ApiClient) -> None:
    try:
        request_json(api, "DELETE", LEASE)
    except ApiException as exc:
        if exc.status != 404:
            raise


def ready_at(fleet: ClusterFleet, name: str, port: int) -> bool:
    status = (fleet.get(name) or {}).get("status") or {}
    return status.get("phase") == "Ready" and (status.get("address") or {}).get("port") == port


async def until_ready(fleet: ClusterFleet, name: str, port: int) -> None:
    await until(
        lambda: ready_at(fleet, name, port), what=f"{name} Ready at {port}", show=lambda: fleet.get(name)
    )


def held_paused(fleet: ClusterFleet, name: str) -> bool:
    conditions = ((fleet.get(name) or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Held" and c["status"] == "True" and c["reason"] == "Paused" for c in conditions)


async def pause_with_a_change(fleet: ClusterFleet, name: str, port: int) -> None:
    fleet.edit(name, {"metadata": {"annotations": {PAUSED: "true"}}, "spec": {"port": port}})
    await until(lambda: held_paused(fleet, name), what=f"{name} paused")


def repeated_event(fleet: ClusterFleet, name: str) -> bool:
    return any((e.get("count") or 1) > 1 for e in fleet.events(name))


def user_secret(fleet: ClusterFleet, name: str) -> None:
    """A Secret an `auth.mode: secret` Proxy names, labelled so that the service watches it."""
    data = {
        k: base64.b64encode(v.encode()).decode() for k, v in {"username": "u", "password": "p4ss"}.items()
    }
    body = {"metadata": {"name": name, "labels": {CREDENTIALS_LABEL: "true"}}, "data": data}
    request_json(fleet.api, "POST", f"/api/v1/namespaces/{fleet.namespace}/secrets", body=body)


def plant_foreign_lock(backend: Path, *, host: str) -> Path:
    """A stack lock as a replica `host` would leave it when killed during an operation (the only stack)."""
    # The engine made the folder of each stack's locks (organization/<project>/<stack>) on its first run.
    [stack_locks] = [p for p in (backend / ".pulumi" / "locks").glob("*/*/*") if p.is_dir()]
    lock = stack_locks / "0b6f1a7e-6f0c-4b89-9a5e-2f9d2c1e0001.json"
    stamp = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    lock.write_text(json.dumps({"pid": 4242, "username": "proxy", "hostname": host, "timestamp": stamp}))
    return lock


def test_deploy_rbac_is_enough_and_nothing_more(
    fleet: ClusterFleet, kube_api: KubeApi, pulumi_env: PulumiEnv
) -> None:
    first, second, moved = free_port(), free_port(), free_port()
    offset = log_offset(kube_api.audit_log)

    async def scenario() -> None:
        # The gone replica's lock is recovered on evidence: its pod or its operations heartbeat.
        a = await fleet.start("replica-a")
        await until(lambda: a.mode.leading, what="a leads")
        b = await fleet.start("replica-b")
        try:
            user_secret(fleet, "p2-login")
            fleet.create("p1", port=first)
            fleet.create("p2", port=second, auth={"mode": "secret", "secretRef": {"name": "p2-login"}})
            await until_ready(fleet, "p1", first)
            await until_ready(fleet, "p2", second)
            assert FINALIZER in fleet.get("p1")["metadata"]["finalizers"]  # type: ignore[index]
            await until(lambda: fleet.secret("p1-proxy-credentials"), what="p1's credentials Secret")
            await until(lambda: b.service.controller.inventory.get(f"{PROXIES}/p2"), what="b serves p2")
            # A follower's fleet page reads the leader's summary (written by the leader: create, update).
            await until(lambda: a.mode.summary.writes, what="the leader's summary")
            page = await page_client(fleet, b)
            try:
                assert "replica-a" in (await page.get("/deletions")).text
            finally:
                await page.aclose()

            # Paused (with a change that waits), resumed, paused again: the same Event twice, patched into
            # its count. p2 stays paused (its deletion proceeds all the same).
            await pause_with_a_change(fleet, "p2", free_port())
            fleet.edit("p2", {"metadata": {"annotations": {PAUSED: None}}})
            await until(lambda: not held_paused(fleet, "p2"), what="p2 resumed")
            await pause_with_a_change(fleet, "p2", free_port())
            await until(lambda: repeated_event(fleet, "p2"), what="a repeated Event on p2")

            lock = plant_foreign_lock(pulumi_env.backend_dir, host="replica-gone")
            fleet.edit("p1", {"spec": {"port": moved}})
            await until_ready(fleet, "p1", moved)
            assert not lock.exists(), "the gone replica's lock was not recovered"

            fleet.delete("p1")
            await until(lambda: fleet.get("p1") is None, what="p1 released")

            await a.stop()
            await until(lambda: b.mode.leading, what="b takes over", within=30)
            fleet.delete("p2")
            await until(lambda: fleet.get("p2") is None, what="p2 released by the new leader")
        finally:
            await fleet.stop_all()

    failure: AssertionError | None = None
    try:
        asyncio.run(scenario())
    except AssertionError as exc:  # the audit log usually says why (a 403): report that first
        failure = exc

    requests = requests_by(kube_api.audit_log, USER, offset=offset)
    granted = grants_to(deploy_documents(), namespace=OWN, name=ACCOUNT)
    print(f"\n{USER}: {len(requests)} requests\n" + table(granted, requests, ALLOWED_UNUSED))

    assert requests, f"no request of {USER} in the audit log: did the replicas run as the ServiceAccount?"
    forbidden = sorted({str(r.access) for r in requests if r.code == 403})
    assert not forbidden, f"deploy/rbac.yaml lacks what the service needs: {forbidden}"
    beyond = uncovered(granted, requests)
    assert not beyond, f"allowed by something deploy/rbac.yaml does not hold (left in the cluster?): {beyond}"
    if failure is not None:
        raise failure
    assert set(ALLOWED_UNUSED) <= granted, f"allowlisted but not granted: {set(ALLOWED_UNUSED) - granted}"
    unused = sorted(str(g) for g in granted - set(ALLOWED_UNUSED) if not any(r.uses(g) for r in requests))
    assert not unused, f"granted but never used (remove them, or allowlist them with the reason): {unused}"
