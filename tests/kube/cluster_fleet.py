"""Replicas of `serve` in the in-cluster mode against the test apiserver, reconciling `local` proxies.

Each replica is the real service (`build_service` with no manifests folder: Kubernetes source, leader
election, status writer, Events, credentials Secrets, the real Pulumi engine, the health engine, the API on
uvicorn) run as a task on the test's event loop. Replicas share one process but not their terms: a replica
that steps down signals only its own term's `pulumi` children (automation/engine/term.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from kubernetes.client import ApiClient

from service.config import OperatorSettings
from service.incluster import ClusterMode
from service.kube.client import ApiException, request_json
from service.kube.settings import KubeSettings
from service.serve import Service, build_service, serve
from service.settings import HealthSettings
from tests.automation.fleet import CountingEngine

BASE = "/apis/crawl.example.com/v1alpha1"


def proxy_doc(
    namespace: str, name: str, *, port: int, provider: str = "local", **extra: Any
) -> dict[str, Any]:
    annotations = extra.pop("annotations", {})
    return {
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": {
            "provider": provider,
            "port": port,
            "allowedSourceRanges": ["127.0.0.0/8"],
            "egress": {"allow": [{"cidr": "127.0.0.1/32"}]},  # the service's echo on a loopback port
            **extra,
        },
    }


@dataclass
class Replica:
    identity: str
    service: Service
    task: asyncio.Task[None]

    @property
    def mode(self) -> ClusterMode:
        assert isinstance(self.service.controller, ClusterMode)
        return self.service.controller

    async def stop(self) -> None:
        self.service.server.should_exit = True
        await self.task


@dataclass
class ClusterFleet:
    """One namespace holding the Proxies, the catalogue ConfigMap and the Lease of a test.

    `service_namespace` puts the catalogue ConfigMap and the Lease in a namespace of their own (the
    service's, as deploy/ has it); `api` is the test's (admin) client, `kubeconfig` the one the replicas use.
    Both namespaces may exist already (fixed names), and so may the catalogue (replaced)."""

    api: ApiClient
    kubeconfig: Path
    root: Path
    backend_url: str
    namespace: str = field(default_factory=lambda: f"e2e-{uuid.uuid4().hex[:8]}")
    service_namespace: str | None = None
    replicas: list[Replica] = field(default_factory=list)
    overrides: dict[str, Any] = field(default_factory=dict)  # OperatorSettings fields a test changes

    def __post_init__(self) -> None:
        self.local_state = self.root / "local-proxies"
        for name in dict.fromkeys([self.namespace, self.own_namespace]):
            _create(self.api, "/api/v1/namespaces", {"metadata": {"name": name}})
        catalogue = {"metadata": {"name": "proxy-operator-providers"}, "data": self._catalogue(["local"])}
        if not _create(self.api, f"/api/v1/namespaces/{self.own_namespace}/configmaps", catalogue):
            self.set_catalogue(["local"])

    @property
    def own_namespace(self) -> str:
        """The service's namespace: the catalogue ConfigMap and the Lease."""
        return self.service_namespace or self.namespace

    # --- the cluster's side -----------------------------------------------------------------------------

    def _catalogue(self, names: list[str]) -> dict[str, str]:
        entries = [{"name": n, "type": "local", "stateDir": str(self.local_state / n)} for n in names]
        return {"providers.yaml": yaml.safe_dump({"providers": entries})}

    def set_catalogue(self, names: list[str]) -> None:
        self.merge(
            f"/api/v1/namespaces/{self.own_namespace}/configmaps/proxy-operator-providers",
            {"data": self._catalogue(names)},
        )

    def path(self, name: str) -> str:
        return f"{BASE}/namespaces/{self.namespace}/proxies/{name}"

    def create(self, name: str, *, port: int, **extra: Any) -> None:
        body = proxy_doc(self.namespace, name, port=port, **extra)
        request_json(self.api, "POST", f"{BASE}/namespaces/{self.namespace}/proxies", body=body)

    def merge(self, path: str, patch: dict[str, Any]) -> None:
        request_json(self.api, "PATCH", path, body=patch, content_type="application/merge-patch+json")

    def edit(self, name: str, patch: dict[str, Any]) -> None:
        self.merge(self.path(name), patch)

    def delete(self, name: str) -> None:
        request_json(self.api, "DELETE", self.path(name))

    def get(self, name: str) -> dict[str, Any] | None:
        try:
            return request_json(self.api, "GET", self.path(name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events_all() if e["involvedObject"]["name"] == name]

    def events_all(self) -> list[dict[str, Any]]:
        return request_json(self.api, "GET", f"/api/v1/namespaces/{self.namespace}/events")["items"]

    def secret(self, name: str) -> dict[str, Any] | None:
        try:
            return request_json(self.api, "GET", f"/api/v1/namespaces/{self.namespace}/secrets/{name}")
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    # --- the service's side -----------------------------------------------------------------------------

    def settings(self) -> OperatorSettings:
        return OperatorSettings(
            state_dir=self.root / "state",
            backend_url=self.backend_url,
            listen_port=0,
            installation="e2e",
            backoff_base_seconds=0.2,
            backoff_cap_seconds=1.0,
            poll_seconds=0.2,
            resync_seconds=0,
            deletion_window_quiet_seconds=0.5,  # a short deletion window: the suite's time budget
            health=HealthSettings(interval_seconds=0.5, healthy_threshold=1),
            # Replicas, the apiserver and the other tests share one cgroup here, not a pod each: at the
            # default nice 10 a replica's `up` would wait for all of them, not only for its own service
            # (tests/automation/test_engine_host.py holds the engine host to its nice value).
            engine_host_nice=0,
        ).model_copy(update=self.overrides)

    def kube(self, identity: str, **overrides: Any) -> KubeSettings:
        values: dict[str, Any] = {
            "kubeconfig": self.kubeconfig,
            "namespaces": [self.namespace],
            "namespace": self.own_namespace,
            "identity": identity,
            "lease_duration_seconds": 4.0,
            "renew_deadline_seconds": 3.0,
            "retry_period_seconds": 0.5,
            **overrides,
        }
        return KubeSettings(**values)

    async def start(self, identity: str, **kube: Any) -> Replica:
        settings = self.settings().model_copy(update={"state_dir": self.root / f"state-{identity}"})
        service = build_service(settings, None, kube=self.kube(identity, **kube))
        mode = service.controller
        assert isinstance(mode, ClusterMode)
        mode.engine = CountingEngine(mode.engine.config)  # counts `up` runs; the real engine underneath
        task = asyncio.create_task(serve(service), name=f"replica {identity}")
        replica = Replica(identity=identity, service=service, task=task)
        self.replicas.append(replica)
        return replica

    async def stop_all(self) -> None:
        for replica in self.replicas:
            if not replica.task.done():
                await replica.stop()
        self.replicas.clear()

    def kill_proxies(self) -> None:
        out = subprocess.run(["pgrep", "-f", str(self.local_state)], capture_output=True, text=True)
        for pid in (int(p) for p in out.stdout.split()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _create(api: ApiClient, path: str, body: dict[str, Any]) -> bool:
    """POST `body`; False when the object exists already."""
    try:
        request_json(api, "POST", path, body=body)
    except ApiException as exc:
        if exc.status == 409:
            return False
        raise
    return True


def dev_token(fleet: ClusterFleet, replica: Replica) -> str:
    """A replica's development token (no tokens file in these tests): every scope."""
    return (fleet.root / f"state-{replica.identity}" / "dev-token").read_text().strip()


async def page_client(fleet: ClusterFleet, replica: Replica) -> httpx.AsyncClient:
    """A client logged in to a replica's fleet page through its log in form (close it after use)."""
    base = f"http://127.0.0.1:{replica.service.port}"
    http = httpx.AsyncClient(base_url=base, timeout=10)
    answer = await http.post("/login", data={"token": dev_token(fleet, replica)}, headers={"Origin": base})
    assert answer.status_code == 303, answer.text
    return http


async def until(
    check: Callable[[], Any], *, within: float = 90, what: str = "", show: Callable[[], Any] | None = None
) -> Any:
    """Poll `check` (a plain function, run in a thread) until it returns something truthy; on failure the
    message ends with `show()` (what was there instead)."""
    deadline = time.monotonic() + within
    while True:
        value = await asyncio.to_thread(check)
        if value:
            return value
        if time.monotonic() > deadline:
            seen = await asyncio.to_thread(show) if show is not None else ""
            raise AssertionError(f"not reached within {within:.0f} s: {what or check} {seen}")
        await asyncio.sleep(0.2)


async def stays(check: Callable[[], bool], *, seconds: float) -> bool:
    """`check` holds on every poll for `seconds` (a quiet period, not a timing assertion)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not await asyncio.to_thread(check):
            return False
        await asyncio.sleep(0.2)
    return True


Scenario = Callable[[], Awaitable[None]]
