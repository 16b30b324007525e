"""The Kubernetes API client: from a kubeconfig file or the pod's ServiceAccount, and raw JSON calls.

The service keeps only the fields it needs, so it reads raw JSON (`_preload_content=False`) instead of the
client's model objects: 10,000 Proxies as models would not fit the memory goal.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from kubernetes.client import ApiClient, Configuration
from kubernetes.client.exceptions import ApiException
from kubernetes.client.rest import RESTResponse
from kubernetes.config.config_exception import ConfigException
from kubernetes.config.incluster_config import InClusterConfigLoader

from service.kube.settings import SERVICE_ACCOUNT_DIR

__all__ = ["ApiException", "KubeClientError", "api_client", "call", "in_cluster", "request_json"]

SERVICE_HOST_ENV = "KUBERNETES_SERVICE_HOST"


class KubeClientError(Exception):
    """The Kubernetes API cannot be reached with the given configuration; the message says why."""


def in_cluster() -> bool:
    """Running in a pod: the kubelet sets KUBERNETES_SERVICE_HOST and mounts a ServiceAccount token."""
    return bool(os.environ.get(SERVICE_HOST_ENV))


def api_client(kubeconfig: Path | None, service_account: Path = SERVICE_ACCOUNT_DIR) -> ApiClient:
    """An ApiClient from `kubeconfig`, else from the pod's ServiceAccount (`service_account`: the folder
    holding its `token` and `ca.crt`; the token is read again as the kubelet rotates it).

    Only a kubeconfig imports the client's kubeconfig loader (and requests, oauthlib and google-auth with
    it: service/lean_packages.py)."""
    try:
        if kubeconfig is not None:
            from kubernetes.config.kube_config import new_client_from_config

            return new_client_from_config(config_file=str(kubeconfig))
        configuration = Configuration()
        loader = InClusterConfigLoader(
            token_filename=str(service_account / "token"), cert_filename=str(service_account / "ca.crt")
        )
        loader.load_and_set(configuration)
        return ApiClient(configuration)
    except (ConfigException, OSError, ValueError, TypeError) as exc:
        where = f"kubeconfig {kubeconfig}" if kubeconfig else "the pod's ServiceAccount (in-cluster)"
        raise KubeClientError(f"cannot configure the Kubernetes client from {where}: {exc}") from exc


def call(
    api: ApiClient,
    method: str,
    path: str,
    *,
    query: list[tuple[str, Any]] | None = None,
    body: Any = None,
    content_type: str = "application/json",
    timeout: float | tuple[float, float] | None = 30.0,
) -> RESTResponse:
    """One call; the answer unread (a watch streams it). Raises ApiException on a non-2xx answer."""
    method, url, headers, payload, _ = api.param_serialize(
        method=method,
        resource_path=path,
        query_params=query or [],
        header_params={"Accept": "application/json", "Content-Type": content_type},
        body=body,
        auth_settings=["BearerToken"],
    )
    response = api.call_api(method, url, header_params=headers, body=payload, _request_timeout=timeout)
    if not 200 <= response.status < 300:
        response.read()
        raise ApiException(http_resp=response)
    return response


def request_json(
    api: ApiClient,
    method: str,
    path: str,
    *,
    query: list[tuple[str, Any]] | None = None,
    body: Any = None,
    content_type: str = "application/json",
    timeout: float | tuple[float, float] | None = 30.0,
) -> dict[str, Any]:
    """One call, the answer as a dict (raises ApiException on a non-2xx answer)."""
    response = call(api, method, path, query=query, body=body, content_type=content_type, timeout=timeout)
    data = response.read()
    return json.loads(data) if data else {}
