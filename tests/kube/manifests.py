"""Manifests in and out of the test apiserver with the official client: CRDs, server-side apply, no kubectl.

Applies go through `kubernetes.dynamic` as a server-side apply (PATCH application/apply-patch+yaml) with
`fieldValidation=Strict`, as `kubectl apply --server-side` sends it. A server-side apply refuses a field the
schema does not declare in any case (500, "field not declared in schema"); a create or update prunes it with
a warning unless fieldValidation is Strict.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client import ApiClient
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import DynamicApiError

FIELD_MANAGER = "proxy-operator-tests"
CRD_KIND = ("apiextensions.k8s.io/v1", "CustomResourceDefinition")

Document = dict[str, Any]


def kube_documents(paths: Iterable[Path]) -> list[tuple[Path, Document]]:
    """Every document of `paths` that is a Kubernetes object (apiVersion, kind and metadata.name)."""
    found = []
    for path in paths:
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if is_object(document):
                found.append((path, document))
    return found


def is_object(document: Any) -> bool:
    return (
        isinstance(document, dict)
        and {"apiVersion", "kind", "metadata"} <= document.keys()
        and isinstance(document["metadata"], dict)
        and "name" in document["metadata"]
    )


def dynamic_client(client: ApiClient, cache_dir: Path) -> DynamicClient:
    """A dynamic client whose discovery cache lives in `cache_dir` (not a shared file in /tmp)."""
    return DynamicClient(client, cache_file=str(cache_dir / "discovery.json"))


def apply(dynamic: DynamicClient, document: Document, *, dry_run: bool = False) -> Document:
    """Server-side apply one object; DynamicApiError when the apiserver refuses it."""
    resource = dynamic.resources.get(api_version=document["apiVersion"], kind=document["kind"])
    namespace = document["metadata"].get("namespace", "default") if resource.namespaced else None
    result = dynamic.server_side_apply(
        resource,
        body=document,
        namespace=namespace,
        field_manager=FIELD_MANAGER,
        force_conflicts=True,
        dry_run="All" if dry_run else None,
        query_params=[("fieldValidation", "Strict")],
    )
    applied: Document = result.to_dict()
    return applied


def refusal(error: DynamicApiError) -> str:
    """The apiserver's message of a refused request."""
    try:
        return str(json.loads(error.body or "")["message"])
    except (TypeError, ValueError, KeyError):
        return str(error.body or error.reason)


def namespaces_first(documents: list[Document]) -> list[Document]:
    """Namespace objects first (with one for each namespace the others name), then the rest in order."""
    declared = [d for d in documents if d["kind"] == "Namespace"]
    named = {d["metadata"]["name"] for d in declared}
    wanted = {d["metadata"]["namespace"] for d in documents if d["metadata"].get("namespace")}
    implied = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        for name in sorted(wanted - named - {"default"})
    ]
    return [*declared, *implied, *(d for d in documents if d["kind"] != "Namespace")]


def install_crds(client: ApiClient, folder: Path, *, cache_dir: Path, timeout: float = 30.0) -> list[str]:
    """Server-side apply every CRD in `folder` and wait until each is Established; their names."""
    dynamic = dynamic_client(client, cache_dir)
    crds = [d for _, d in kube_documents(sorted(folder.glob("*.yaml"))) if kind_of(d) == CRD_KIND]
    for crd in crds:
        apply(dynamic, crd)
    names = [crd["metadata"]["name"] for crd in crds]
    for name in names:
        wait_established(dynamic, name, timeout=timeout)
    return names


def kind_of(document: Document) -> tuple[str, str]:
    return document["apiVersion"], document["kind"]


def wait_established(dynamic: DynamicClient, name: str, *, timeout: float) -> None:
    resource = dynamic.resources.get(api_version=CRD_KIND[0], kind=CRD_KIND[1])
    deadline = time.monotonic() + timeout
    while True:
        crd = dynamic.get(resource, name=name).to_dict()
        conditions = {c["type"]: c for c in (crd.get("status") or {}).get("conditions") or []}
        if conditions.get("Established", {}).get("status") == "True":
            return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"CRD {name} not Established after {timeout:.0f} s: {list(conditions.values())}"
            )
        time.sleep(0.1)
