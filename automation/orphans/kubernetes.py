"""Kubernetes orphans: objects in a catalogue entry's namespace labelled as ours and as this installation's
(`app.kubernetes.io/managed-by=proxy-operator,crawl.example.com/installation=<id>`) whose `namespace/name`
no stack's state holds under that kind (the provider's id of a namespaced object).

The listing goes through `KubeObjects`, which the service layer implements with its Kubernetes client (the
entry's kubeconfigSecret, else the ambient configuration); here it stays a protocol, so the judgement is
pure and the layers hold. Tested against a real API server: tests/kube/test_orphans_kube.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from automation.orphans.model import Orphan
from stacks.marks import K8S_INSTALLATION, K8S_MANAGED_BY, MANAGED_BY, label_value

# Kind -> (API path prefix, plural, Pulumi resource type): what the kubernetes program declares.
KINDS = {
    "Deployment": ("/apis/apps/v1", "deployments", "kubernetes:apps/v1:Deployment"),
    "Service": ("/api/v1", "services", "kubernetes:core/v1:Service"),
    "Secret": ("/api/v1", "secrets", "kubernetes:core/v1:Secret"),
    "NetworkPolicy": (
        "/apis/networking.k8s.io/v1",
        "networkpolicies",
        "kubernetes:networking.k8s.io/v1:NetworkPolicy",
    ),
}


@dataclass(frozen=True)
class KubeObject:
    kind: str
    namespace: str
    name: str


class KubeObjects(Protocol):
    """One cluster, as the entry's credentials reach it."""

    def list(self, *, kind: str, namespace: str, selector: str) -> list[KubeObject]: ...

    def delete(self, obj: KubeObject) -> bool: ...


def label_selector(installation: str) -> str:
    return f"{K8S_MANAGED_BY}={MANAGED_BY},{K8S_INSTALLATION}={label_value(installation)}"


def collection_path(kind: str, namespace: str) -> str:
    prefix, plural, _ = KINDS[kind]
    return f"{prefix}/namespaces/{namespace}/{plural}"


def object_path(obj: KubeObject) -> str:
    return f"{collection_path(obj.kind, obj.namespace)}/{obj.name}"


def kubernetes_orphans(
    objects: Iterable[KubeObject], *, provider: str, known: set[tuple[str, str]]
) -> list[Orphan]:
    """The objects whose (Pulumi type, `namespace/name`) is in no stack's state (`state_ids`)."""
    orphans = []
    for obj in objects:
        key = f"{obj.namespace}/{obj.name}"
        if (KINDS[obj.kind][2], key) not in known:
            orphans.append(
                Orphan(provider, obj.kind, key, f"{obj.kind} {key}", name=obj.name, location=obj.namespace)
            )
    return orphans


def list_labelled(cluster: KubeObjects, *, namespace: str, installation: str) -> list[KubeObject]:
    """Every kind the program declares, in `namespace`, carrying our marks and this installation's id."""
    selector = label_selector(installation)
    return [obj for kind in KINDS for obj in cluster.list(kind=kind, namespace=namespace, selector=selector)]


def delete_kubernetes(cluster: KubeObjects, orphan: Orphan) -> bool:
    return cluster.delete(KubeObject(orphan.kind, orphan.location, orphan.name))
