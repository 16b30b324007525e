"""Kubernetes Events from the board against the real apiserver: on the Proxy, aggregated, bounded, limited."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes.client import ApiClient

from service.kube.client import request_json
from service.kube.events import COMPONENT, REPORTING_CONTROLLER, EventRecorder
from service.kube.refs import ProxyRef
from service.status import Event, StatusBoard
from tests.kube.proxies import create_proxy, namespace

IDLE = 30.0


class Ticks:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.at = 1000.0

    def __call__(self) -> float:
        return self.at


@pytest.fixture
def ns(kube_client: ApiClient) -> Iterator[str]:
    with namespace(kube_client, "events") as name:
        yield name


def events_of(client: ApiClient, ref: ProxyRef) -> list[dict[str, Any]]:
    query = [("fieldSelector", f"involvedObject.uid={ref.uid}")]
    items = request_json(client, "GET", f"/api/v1/namespaces/{ref.namespace}/events", query=query)["items"]
    return sorted(
        items, key=lambda e: (e["reason"], e["metadata"]["creationTimestamp"], e["metadata"]["name"])
    )


def recorder(client: ApiClient, ref: ProxyRef, **kwargs: Any) -> EventRecorder:
    started = EventRecorder(client, {ref.key: ref}.get, instance="replica-a", qps=1000.0, **kwargs)
    started.start()
    return started


def test_board_events_become_aggregated_events_on_the_proxy(kube_client: ApiClient, ns: str) -> None:
    ref = create_proxy(kube_client, ns, "noisy")
    board = StatusBoard()
    ticks = Ticks()
    events = recorder(kube_client, ref, monotonic=ticks)
    board.subscribe_events(events.record)
    try:
        for _ in range(3):
            board.event(ref.key, reason="ProbeFailed", message="no answer on 127.0.0.1:1", warning=True)
        board.event(ref.key, reason="Provisioned", message="applied in stack local")
        board.event("crawl/not-a-live-proxy", reason="Provisioned", message="nowhere to post it")
        assert events.wait_idle(IDLE)
        failed, provisioned = events_of(kube_client, ref)
        assert (failed["reason"], failed["type"], failed["count"]) == ("ProbeFailed", "Warning", 3)
        assert (provisioned["type"], provisioned["count"]) == ("Normal", 1)
        assert failed["involvedObject"] == {
            **ref.object_reference(),
            "apiVersion": "crawl.example.com/v1alpha1",
        }
        assert failed["source"] == {"component": COMPONENT}
        assert failed["reportingComponent"] == REPORTING_CONTROLLER
        assert failed["reportingInstance"] == "replica-a"
        assert (events.created, events.patched) == (2, 2)

        ticks.at += 601  # past the window: the same event starts a new Event
        board.event(ref.key, reason="ProbeFailed", message="no answer on 127.0.0.1:1", warning=True)
        assert events.wait_idle(IDLE)
        assert [e["count"] for e in events_of(kube_client, ref) if e["reason"] == "ProbeFailed"] == [3, 1]
    finally:
        events.close()


def test_one_flapping_proxy_is_rate_limited(kube_client: ApiClient, ns: str) -> None:
    ref = create_proxy(kube_client, ns, "flapping")
    ticks = Ticks()
    events = recorder(kube_client, ref, burst=3, per_object_rate=0.01, monotonic=ticks)
    try:
        for n in range(5):
            events.record(Event(ref.key, "ProbeFailed", f"attempt {n}", True, datetime.now(UTC)))
        assert events.wait_idle(IDLE)
        assert (events.created, events.dropped) == (3, 2)
        ticks.at += 100  # one token back
        events.record(Event(ref.key, "ProbeSucceeded", "answers again", False, datetime.now(UTC)))
        assert events.wait_idle(IDLE)
        assert len(events_of(kube_client, ref)) == 4
    finally:
        events.close()


def test_the_queue_is_bounded_and_never_blocks(kube_client: ApiClient) -> None:
    ref = ProxyRef(namespace="default", name="p", uid="u")
    events = EventRecorder(kube_client, {ref.key: ref}.get, queue_size=5)  # not started: nothing drains it
    for n in range(8):
        events.record(Event(ref.key, "Reason", f"m{n}", False, datetime.now(UTC)))
    assert events.dropped == 3
    assert not events.wait_idle(0.01)
