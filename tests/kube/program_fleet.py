"""Proxies of `type: kubernetes` catalogue entries, reconciled by the real engine against the test node.

`KubeFleet` is the `local` tests' `Fleet` with kubernetes entries: the same manifests folder, controller and
real engine (which records each `up`'s changes), with the provider plugin from .tools/bin.
`ClusterObjects` reads what the program made in a namespace with the admin client.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as kube_client

from automation.engine import StackInput
from automation.engine.results import OperationResult
from service.controller import Controller
from service.inventory import Inventory
from service.sources.directory import DirectorySource
from tests.automation.fleet import CountingEngine, Fleet, proxy_doc

SKIP_CLEANUP = "crawl.example.com/skip-cleanup"


class RecordingEngine(CountingEngine):
    """The real engine, keeping each `up`'s result (its changes by operation)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.results: list[OperationResult] = []

    def up(self, spec: StackInput, *, refresh: bool = False) -> Any:
        result = super().up(spec, refresh=refresh)
        self.results.append(result)
        return result


@dataclass
class KubeFleet(Fleet):
    namespace: str = "proxies"  # where the entries put the proxies' objects
    providers: list[str] = field(default_factory=lambda: ["in-cluster"])

    def write_catalogue(self, names: list[str], **extra: Any) -> None:
        self.write_entries(
            [{"name": n, "type": "kubernetes", "namespace": self.namespace, **extra} for n in names]
        )

    def write_entries(self, entries: list[dict[str, Any]]) -> None:
        (self.manifests / "catalogue.yaml").write_text(yaml.safe_dump({"providers": entries}))

    def write_proxy(self, name: str, **spec: Any) -> None:
        spec.setdefault("provider", "in-cluster")
        spec.setdefault("allowedSourceRanges", ["10.0.0.0/8"])
        self._write(name, proxy_doc(name, **spec))

    def write_deleting(self, name: str, *, skip_cleanup: bool, **spec: Any) -> None:
        """The Proxy as a cluster would show it once deleted behind our finalizer."""
        spec.setdefault("provider", "in-cluster")
        document = proxy_doc(name, **spec)
        document["metadata"]["deletionTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        if skip_cleanup:
            document["metadata"]["annotations"] = {SKIP_CLEANUP: "true"}
        self._write(name, document)

    def write_secret(self, name: str, string_data: dict[str, str]) -> None:
        document = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name},
            "stringData": string_data,
        }
        (self.manifests / f"secret-{name}.yaml").write_text(yaml.safe_dump(document))

    def controller(self) -> Controller:
        settings = self.settings()
        return Controller(
            settings=settings,
            engine=RecordingEngine(settings.engine_config()),
            source=DirectorySource(self.manifests),
            inventory=Inventory(),
        )


@dataclass
class ClusterObjects:
    """The Secret(s), Deployment, Service and NetworkPolicy of one proxy, read as the admin."""

    api: kube_client.ApiClient
    namespace: str

    def deployment(self, name: str) -> Any:
        return _or_none(
            lambda: kube_client.AppsV1Api(self.api).read_namespaced_deployment(name, self.namespace)
        )

    def service(self, name: str) -> Any:
        return _or_none(lambda: kube_client.CoreV1Api(self.api).read_namespaced_service(name, self.namespace))

    def network_policy(self, name: str) -> Any:
        networking = kube_client.NetworkingV1Api(self.api)
        return _or_none(lambda: networking.read_namespaced_network_policy(name, self.namespace))

    def secrets(self, name: str) -> list[Any]:
        """The proxy's Secrets: auto-named `<name>-<suffix>`, so found by prefix."""
        found = kube_client.CoreV1Api(self.api).list_namespaced_secret(self.namespace).items
        return [s for s in found if s.metadata.name.startswith(f"{name}-")]

    def secret_data(self, secret: Any) -> dict[str, str]:
        return {key: base64.b64decode(value).decode() for key, value in (secret.data or {}).items()}

    def uids(self, name: str) -> dict[str, str | None]:
        objects = {
            "deployment": self.deployment(name),
            "service": self.service(name),
            "networkpolicy": self.network_policy(name),
        }
        uids = {kind: obj.metadata.uid if obj else None for kind, obj in objects.items()}
        return uids | {"secret": ",".join(sorted(s.metadata.uid for s in self.secrets(name))) or None}

    def anything_of(self, name: str) -> bool:
        return any(self.uids(name).values())

    def pods(self, labels: dict[str, str]) -> list[Any]:
        """The pods carrying all of `labels` (a Deployment's selector), terminating ones included."""
        selector = ",".join(f"{key}={value}" for key, value in sorted(labels.items()))
        core = kube_client.CoreV1Api(self.api)
        return list(core.list_namespaced_pod(self.namespace, label_selector=selector).items)


def _or_none(read: Any) -> Any:
    try:
        return read()
    except kube_client.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def create_namespace(api: kube_client.ApiClient, name: str) -> None:
    try:
        kube_client.CoreV1Api(api).create_namespace({"metadata": {"name": name}})
    except kube_client.ApiException as exc:
        if exc.status != 409:
            raise


def kubeconfig_for(*, url: str, ca_file: Path, user: str, token: str, namespace: str) -> str:
    """A self-contained kubeconfig (CA embedded, as one kept in a Secret must be) for a token."""
    ca = base64.b64encode(ca_file.read_bytes()).decode()
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "remote", "cluster": {"server": url, "certificate-authority-data": ca}}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [
                {"name": "remote", "context": {"cluster": "remote", "user": user, "namespace": namespace}}
            ],
            "current-context": "remote",
        }
    )
