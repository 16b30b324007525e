"""The leader's credentials Secrets written off the event loop (service/kube/credentials_publisher.py),
against the real apiserver: `submit` only queues, one thread applies, the latest credentials win, a replica
that stepped down writes nothing it had queued, and a failed write does not stop the ones after it."""

from __future__ import annotations

import base64
import logging
import threading
from collections.abc import Iterator
from dataclasses import replace

import pytest
from kubernetes.client import ApiClient

from service.kube.client import ApiException, request_json
from service.kube.credentials import Credentials, CredentialsWriter, secret_name
from service.kube.credentials_publisher import CredentialsPublisher
from service.kube.refs import ProxyRef
from tests.kube.proxies import create_proxy, namespace

CREDS = Credentials(host="10.0.0.7", port=3128, protocol="http", username="crawler", password="s3cret")
WAIT = 30.0


@pytest.fixture
def ns(kube_client: ApiClient) -> Iterator[str]:
    with namespace(kube_client, "credpub") as name:
        yield name


class RecordingWriter(CredentialsWriter):
    """The real writer, noting which thread made each write; the first write waits for `gate`."""

    def __init__(self, api: ApiClient) -> None:
        super().__init__(api)
        self.threads: list[str] = []
        self.calls: list[tuple[str, Credentials]] = []
        self.gate = threading.Event()
        self.entered = threading.Event()

    def write(self, ref: ProxyRef, credentials: Credentials) -> bool:
        self.entered.set()
        assert self.gate.wait(WAIT)
        self.threads.append(threading.current_thread().name)
        self.calls.append((ref.key, credentials))
        return super().write(ref, credentials)


def _secret(api: ApiClient, ref: ProxyRef) -> dict[str, str] | None:
    try:
        secret = request_json(
            api, "GET", f"/api/v1/namespaces/{ref.namespace}/secrets/{secret_name(ref.name)}"
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


def _publisher(api: ApiClient) -> tuple[CredentialsPublisher, RecordingWriter]:
    writer = RecordingWriter(api)
    publisher = CredentialsPublisher(writer)
    publisher.start()
    return publisher, writer


def test_submit_only_queues_and_the_publisher_thread_writes(kube_client: ApiClient, ns: str) -> None:
    ref = create_proxy(kube_client, ns, "queued")
    publisher, writer = _publisher(kube_client)
    try:
        publisher.submit(ref, CREDS)  # the writer is held at its gate: submit returned all the same
        assert writer.entered.wait(WAIT)
        assert _secret(kube_client, ref) is None, "written before the writer's thread was let through"
        writer.gate.set()
        assert publisher.wait_idle(WAIT)
        assert writer.threads == ["credentials-writer"]
        written = _secret(kube_client, ref)
        assert written == {k: str(v) for k, v in CREDS.as_dict().items() if v is not None}
    finally:
        writer.gate.set()
        publisher.close()


def test_the_latest_credentials_of_a_proxy_win_over_those_still_queued(
    kube_client: ApiClient, ns: str
) -> None:
    first, second = create_proxy(kube_client, ns, "first"), create_proxy(kube_client, ns, "second")
    publisher, writer = _publisher(kube_client)
    try:
        publisher.submit(first, CREDS)
        assert writer.entered.wait(WAIT)  # the thread is inside the first write: the rest queue behind it
        for port in (4001, 4002, 4003):
            publisher.submit(second, replace(CREDS, port=port))
        assert publisher.pending() == 1
        writer.gate.set()
        assert publisher.wait_idle(WAIT)
        assert writer.calls == [(first.key, CREDS), (second.key, replace(CREDS, port=4003))]
        assert (_secret(kube_client, second) or {}).get("port") == "4003"
    finally:
        writer.gate.set()
        publisher.close()


def test_a_replica_that_stepped_down_drops_what_it_queued(kube_client: ApiClient, ns: str) -> None:
    ref = create_proxy(kube_client, ns, "dropped")
    publisher, writer = _publisher(kube_client)
    leading = [True]
    publisher.leading = lambda: leading[0]
    try:
        publisher.submit(create_proxy(kube_client, ns, "in-flight"), CREDS)
        assert writer.entered.wait(WAIT)
        publisher.submit(ref, CREDS)  # queued while the term lasts ...
        leading[0] = False  # ... which ends before the thread takes it
        writer.gate.set()
        assert publisher.wait_idle(WAIT)
        assert publisher.dropped == 1
        assert [key for key, _ in writer.calls] == [f"{ns}/in-flight"]  # the write in flight completed
        assert _secret(kube_client, ref) is None
    finally:
        writer.gate.set()
        publisher.close()


def test_a_failed_write_is_logged_and_the_next_one_goes_on(
    kube_client: ApiClient, ns: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="service.kube.credentials_publisher")
    gone = ProxyRef(namespace="no-such-namespace-here", name="gone", uid="0000-gone")
    ref = create_proxy(kube_client, ns, "after")
    publisher, writer = _publisher(kube_client)
    writer.gate.set()
    try:
        publisher.submit(gone, CREDS)
        publisher.submit(ref, CREDS)
        assert publisher.wait_idle(WAIT)
        assert _secret(kube_client, ref) is not None
        [warning] = [r.getMessage() for r in caplog.records]
        assert "cannot write the credentials Secret of no-such-namespace-here/gone" in warning
    finally:
        publisher.close()
