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


def test_the_reader_and_the_writer_keep_one_credentials_object_between_them(
    kube_client: ApiClient, ns: str
) -> None:
    """Wired as service/incluster.py does: the reader keeps the writer's equal object for a Secret it
    reads back, and a writer that finds the reader's equal object (a new term: the reader listed first)
    keeps that one (one object a proxy, not two: about 110 bytes at 10,000 proxies)."""
    ref = create_proxy(kube_client, ns, "single")
    writer = CredentialsWriter(kube_client)
    reader = CredentialsReader(kube_client, [ns])
    reader.shared, writer.known = writer.shared, reader.held
    reader.start()
    try:
        assert reader.synced(WAIT)
        mine = Credentials(host="10.0.0.7", port=3128, protocol="http", username="crawler", password="s3cret")
        assert writer.write(ref, mine)
        eventually(lambda: reader.held(ref.key) == mine, "the Secret reached the reader")
        # One object, whichever came first: the writer's (the reader read it back after the apply returned)
        # or the reader's (the watch was quicker than the apply's answer: the writer kept the reader's). In
        # the narrow race between the two, each may keep its own until the writer's next publish:
        assert not writer.write(ref, mine)  # unchanged: no call, but the reader's copy kept if they differ
        assert reader.held(ref.key) is writer._written[ref.uid]

        fresh = CredentialsWriter(kube_client)  # a new term's writer: the reader has the Secret already
        fresh.known = reader.held
        assert fresh.write(ref, CREDS)  # it remembers nothing: one (no-op) apply
        assert fresh._written[ref.uid] is reader.held(ref.key)
        assert not fresh.write(ref, CREDS)
    finally:
        reader.stop()
    unwired = CredentialsReader(kube_client, [ns])
    unwired.start()
    try:
        assert unwired.synced(WAIT)
        assert unwired.held(ref.key) == CREDS
        assert unwired.held(ref.key) is not writer._written[ref.uid], "unwired: its own copy"
    finally:
        unwired.stop()


def test_the_reader_keeps_the_writers_equal_copy_of_what_it_reads() -> None:
    """The reader's half alone (no apiserver: the watch's events are given to it): the Secret's owner uid
    finds the writer's copy, kept when equal."""
    api = ApiClient()
    writer, reader = CredentialsWriter(api), CredentialsReader(api, ["ns"])
    reader.shared = writer.shared
    writer._written["uid-1"] = CREDS
    read = Credentials(host="10.0.0.7", port=3128, protocol="http", username="crawler", password="s3cret")
    reader._event("ns", "ADDED", {"key": "ns/a", "credentials": read, "owner": "uid-1"})
    assert reader.held("ns/a") is CREDS
    other = Credentials(host="10.0.0.7", port=3128, protocol="http", username="crawler", password="new")
    reader._event("ns", "MODIFIED", {"key": "ns/a", "credentials": other, "owner": "uid-1"})
    assert reader.held("ns/a") is other, "not equal: its own"
    reader._listed("ns", [{"key": "ns/a", "credentials": read, "owner": "uid-1"}])
    assert reader.held("ns/a") is CREDS
    reader._event("ns", "ADDED", {"key": "ns/b", "credentials": read, "owner": None})
    assert reader.held("ns/b") is read, "no owner: its own"
