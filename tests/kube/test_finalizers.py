"""The finalizer writer against the real apiserver: an add to a Proxy the watch saw with no finalizer is one
PATCH, unread; the guard it carries keeps a finalizer added since (the add is then read and made again)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes.client import ApiClient

from service.kube.client import request_json
from service.kube.finalizers import FinalizerWriter
from service.kube.proxy_object import FINALIZER
from service.kube.refs import ProxyRef
from tests.kube.proxies import create_proxy, namespace, read_proxy

OTHER = "example.com/other"
JSON_PATCH = "application/json-patch+json"


@pytest.fixture
def ns(kube_client: ApiClient) -> Iterator[str]:
    with namespace(kube_client, "finalizers") as name:
        yield name


@pytest.fixture
def calls(kube_client: ApiClient, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The methods the writer's thread sends."""
    seen: list[str] = []
    real = kube_client.call_api

    def counted(method: str, *args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == "proxy finalizers":
            seen.append(method)
        return real(method, *args, **kwargs)

    monkeypatch.setattr(kube_client, "call_api", counted)
    return seen


def finalizers(client: ApiClient, ref: ProxyRef) -> list[str]:
    return list(read_proxy(client, ref)["metadata"].get("finalizers") or [])


def until(check: Callable[[], bool], within: float = 20) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "not reached"
        time.sleep(0.05)


def add_other(client: ApiClient, ref: ProxyRef) -> None:
    body = [{"op": "add", "path": "/metadata/finalizers", "value": [OTHER]}]
    request_json(client, "PATCH", ref.path(), body=body, content_type=JSON_PATCH)


def remove_other(client: ApiClient, ref: ProxyRef) -> None:
    index = finalizers(client, ref).index(OTHER)
    body = [{"op": "remove", "path": f"/metadata/finalizers/{index}"}]
    request_json(client, "PATCH", ref.path(), body=body, content_type=JSON_PATCH)


def test_a_bare_proxy_gets_ours_in_one_patch_and_one_given_another_since_keeps_it(
    kube_client: ApiClient, ns: str, calls: list[str]
) -> None:
    bare, since = create_proxy(kube_client, ns, "bare"), create_proxy(kube_client, ns, "since")
    add_other(kube_client, since)  # after the watch saw it bare
    writer = FinalizerWriter(kube_client, writes=lambda: True)
    writer.start()
    try:
        writer.add(bare.key, bare=True)
        until(lambda: finalizers(kube_client, bare) == [FINALIZER])
        assert calls == ["PATCH"], "a bare Proxy was read first"
        writer.add(since.key, bare=True)
        until(lambda: FINALIZER in finalizers(kube_client, since))
        assert finalizers(kube_client, since) == [OTHER, FINALIZER]
    finally:
        writer.stop()
        remove_other(kube_client, since)
