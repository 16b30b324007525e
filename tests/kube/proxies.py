"""Proxy objects in the test apiserver for the status, events and credentials tests (raw JSON calls)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kubernetes.client import ApiClient

from service.kube.client import ApiException, request_json
from service.kube.refs import ProxyRef
from stacks.crd import PLURAL, VERSION
from stacks.models import API_GROUP, API_VERSION, KIND


@contextmanager
def namespace(client: ApiClient, prefix: str) -> Iterator[str]:
    """A fresh namespace (there is no controller-manager: its objects are not cleaned up, names differ)."""
    name = f"{prefix}-{secrets.token_hex(3)}"
    request_json(client, "POST", "/api/v1/namespaces", body={"metadata": {"name": name}})
    try:
        yield name
    finally:
        request_json(client, "DELETE", f"/api/v1/namespaces/{name}")


def create_proxy(client: ApiClient, ns: str, name: str) -> ProxyRef:
    body = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name},
        "spec": {"provider": "local"},
    }
    created = request_json(client, "POST", f"/apis/{API_GROUP}/{VERSION}/namespaces/{ns}/{PLURAL}", body=body)
    meta = created["metadata"]
    return ProxyRef(namespace=ns, name=name, uid=meta["uid"], generation=meta.get("generation"))


def read_proxy(client: ApiClient, ref: ProxyRef) -> dict[str, Any]:
    return request_json(client, "GET", ref.path())


def delete_proxy(client: ApiClient, ref: ProxyRef) -> None:
    try:
        request_json(client, "DELETE", ref.path())
    except ApiException as exc:
        if exc.status != 404:
            raise
