"""Credentials Secrets against the real apiserver: owned by the Proxy, written on change, read by a watch."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Iterator

import pytest
from kubernetes.client import ApiClient

from service.kube.client import request_json
from service.kube.credentials import (
    SECRET_TYPE,
    Credentials,
    CredentialsReader,
    CredentialsWriter,
    secret_name,
)
from tests.kube.proxies import create_proxy, namespace, read_proxy

CREDS = Credentials(host="10.0.0.7", port=3128, protocol="http", username="crawler", password="s3cret")
WAIT = 30.0


@pytest.fixture
def ns(kube_client: ApiClient) -> Iterator[str]:
    with namespace(kube_client, "creds") as name:
        yield name


def eventually(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_the_secret_is_owned_by_the_proxy_and_written_on_change(kube_client: ApiClient, ns: str) -> None:
    ref = create_proxy(kube_client, ns, "owned")
    writer = CredentialsWriter(kube_client)
    assert writer.write(ref, CREDS)
    assert not writer.write(ref, CREDS)  # unchanged: no call at all
    path = f"/api/v1/namespaces/{ns}/secrets/{secret_name(ref.name)}"
    secret = request_json(kube_client, "GET", path)
    assert secret["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "crawl.example.com/v1alpha1",
            "kind": "Proxy",
            "name": "owned",
            "uid": read_proxy(kube_client, ref)["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": False,
        }
    ]
    assert secret["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "proxy-operator",
        "crawl.example.com/proxy": "owned",
    }
    assert secret["type"] == SECRET_TYPE
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert data == {
        "host": "10.0.0.7",
        "port": "3128",
        "protocol": "http",
        "username": "crawler",
        "password": "s3cret",
    }
    assert [m["manager"] for m in secret["metadata"]["managedFields"]] == ["proxy-operator"]

    # a new leader writes once more (it remembers nothing); the apiserver sees no change: same version
    again = CredentialsWriter(kube_client)
    assert again.write(ref, CREDS)
    assert (
        request_json(kube_client, "GET", path)["metadata"]["resourceVersion"]
        == secret["metadata"]["resourceVersion"]
    )
    changed = Credentials(host="10.0.0.7", port=3128, protocol="http", username="crawler", password="rotated")
    assert again.write(ref, changed)
    assert base64.b64decode(request_json(kube_client, "GET", path)["data"]["password"]) == b"rotated"


def test_the_reader_follows_the_secrets_and_resumes_after_a_cut_watch(
    kube_client: ApiClient, ns: str
) -> None:
    ref = create_proxy(kube_client, ns, "watched")
    writer = CredentialsWriter(kube_client)
    # the server ends each watch after about a second: every change below comes through a resumed watch
    reader = CredentialsReader(kube_client, [ns], timeout_seconds=1)
    reader.start()
    try:
        assert reader.synced(WAIT)
        assert reader.credentials(ref.key) is None
        writer.write(ref, CREDS)
        eventually(
            lambda: reader.credentials(ref.key) == CREDS.as_dict(), "the new Secret reached the reader"
        )
        (watcher,) = reader.watchers
        for password in ("two", "three"):
            time.sleep(1.5)  # past the watch's end: the next change arrives on a new watch
            writer.write(ref, Credentials(host="10.0.0.7", port=3128, protocol="http", password=password))
            eventually(
                lambda password=password: (reader.credentials(ref.key) or {}).get("password") == password,  # type: ignore[misc]
                f"password {password} reached the reader",
            )
        assert watcher.lists == 1  # resumed from its resourceVersion, never listed again

        request_json(kube_client, "DELETE", f"/api/v1/namespaces/{ns}/secrets/{secret_name(ref.name)}")
        eventually(lambda: reader.credentials(ref.key) is None, "the deletion reached the reader")
    finally:
        reader.stop()


def test_a_deleted_secret_is_forgotten_by_the_writer_and_written_again(
    kube_client: ApiClient, ns: str
) -> None:
    """The reader tells the leader's writer (service/incluster.py wires `on_deleted` to `forget`) the uid of
    the Proxy whose Secret went: with its Proxy (the garbage collector; none runs here, so the Secret is
    deleted by hand), the writer keeps nothing of it; deleted by someone, the next publish writes it again."""
    ref = create_proxy(kube_client, ns, "healed")
    writer, deleted = CredentialsWriter(kube_client), list[str]()
    reader = CredentialsReader(kube_client, [ns])

    def forget(uid: str) -> None:
        deleted.append(uid)
        writer.forget(uid)

    reader.on_deleted = forget
    reader.start()
    try:
        assert reader.synced(WAIT)
        assert writer.write(ref, CREDS)
        eventually(lambda: reader.credentials(ref.key) == CREDS.as_dict(), "the Secret reached the reader")
        assert not writer.write(ref, CREDS)  # unchanged: no call at all
        request_json(kube_client, "DELETE", f"/api/v1/namespaces/{ns}/secrets/{secret_name(ref.name)}")
        eventually(lambda: deleted == [ref.uid], "the deletion reached the writer")
        assert writer.write(ref, CREDS), "the same credentials are written again"
        eventually(lambda: reader.credentials(ref.key) == CREDS.as_dict(), "the Secret is back")
        assert writer._written == {ref.uid: CREDS}
    finally:
        reader.stop()


def test_other_secrets_are_not_credentials(kube_client: ApiClient, ns: str) -> None:
    ref = create_proxy(kube_client, ns, "other")
    labels = {"app.kubernetes.io/managed-by": "proxy-operator", "crawl.example.com/proxy": "other"}
    body = {"metadata": {"name": "lookalike", "labels": labels}, "stringData": {"host": "x", "port": "1"}}
    request_json(kube_client, "POST", f"/api/v1/namespaces/{ns}/secrets", body=body)  # type Opaque
    reader = CredentialsReader(kube_client, [ns], timeout_seconds=1)  # a watch begun after stop() ends soon
    reader.start()
    try:
        assert reader.synced(WAIT)
        assert reader.credentials(ref.key) is None
    finally:
        reader.stop()


def test_secret_names_are_capped_subdomains() -> None:
    assert secret_name("a") == "a-proxy-credentials"
    long = secret_name("x" * 250)
    assert len(long) <= 253
    assert long[-1].isalnum()
