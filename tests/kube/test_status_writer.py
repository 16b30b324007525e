"""The StatusWriter against the real apiserver: a write per change, none in steady state, the CRD schema."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from kubernetes.client import ApiClient
from urllib3.exceptions import ProtocolError

from service.kube.client import request_json
from service.kube.refs import ProxyRef
from service.kube.status_writer import StatusWriter, merge_patch, render
from service.status import StatusBoard
from service.status_view import pack_status_json
from stacks.compact import STATUS_PACKER
from stacks.models import Address
from stacks.models.conditions import ConditionType, Operation, Reason
from tests.kube.proxies import create_proxy, delete_proxy, namespace, read_proxy

IDLE = 30.0


@pytest.fixture
def ns(kube_client: ApiClient) -> Iterator[str]:
    with namespace(kube_client, "status") as name:
        yield name


def applied(board: StatusBoard, ref: ProxyRef) -> None:
    """What the control loop records for a proxy that came up (every call a no-op the second time)."""
    board.operation_started(ref.key, type_=Operation.UP)
    board.set_applied(
        ref.key, stack="local", spec_hash="abc", address=Address(host="127.0.0.1", port=18081), generation=1
    )
    board.set_condition(ref.key, type_=ConditionType.PROVISIONED, true=True, reason=Reason.PROVISIONED)
    board.operation_finished(ref.key, type_=Operation.UP, succeeded=True, message="1 created")


def writer_for(client: ApiClient, board: StatusBoard, refs: dict[str, ProxyRef]) -> StatusWriter:
    writer = StatusWriter(client, board, refs.get, backoff=(0.05,))
    writer.start()
    return writer


def test_written_once_per_change_and_never_in_steady_state(kube_client: ApiClient, ns: str) -> None:
    ref = create_proxy(kube_client, ns, "steady")
    board = StatusBoard()
    writer = writer_for(kube_client, board, {ref.key: ref})
    try:
        applied(board, ref)
        assert writer.wait_idle(IDLE)
        live = read_proxy(kube_client, ref)
        published = board.published(ref.key)
        assert published is not None
        # read back as written: nothing pruned, so the rendering matches the CRD's status schema
        assert live["status"] == render(published)
        assert live["status"]["phase"] == "Ready"
        assert live["status"]["observedGeneration"] == 1
        assert {c["type"] for c in live["status"]["conditions"]} == {"Provisioned", "Ready"}
        writes, version = writer.writes, live["metadata"]["resourceVersion"]

        for _ in range(20):  # a quiet period: the loop repeats itself, the writer is woken up for nothing
            board.set_condition(
                ref.key, type_=ConditionType.PROVISIONED, true=True, reason=Reason.PROVISIONED
            )
            board.set_applied(
                ref.key, stack="local", spec_hash="abc", address=Address(host="127.0.0.1", port=18081)
            )
            writer.mark(ref.key)
        assert writer.wait_idle(IDLE)
        assert writer.writes == writes
        assert read_proxy(kube_client, ref)["metadata"]["resourceVersion"] == version

        board.set_condition(ref.key, type_=ConditionType.HEALTHY, true=False, reason=Reason.PROBE_FAILED)
        assert writer.wait_idle(IDLE)
        assert writer.writes == writes + 1
        assert read_proxy(kube_client, ref)["status"]["phase"] == "Degraded"
    finally:
        writer.close()


def test_a_field_gone_from_the_board_is_removed_from_the_object(kube_client: ApiClient, ns: str) -> None:
    ref = create_proxy(kube_client, ns, "egress")
    board = StatusBoard()
    writer = writer_for(kube_client, board, {ref.key: ref})
    try:
        applied(board, ref)
        board.set_egress(ref.key, "203.0.113.9")
        assert writer.wait_idle(IDLE)
        assert read_proxy(kube_client, ref)["status"]["egressIP"] == "203.0.113.9"
        board.set_egress(ref.key, None)
        assert writer.wait_idle(IDLE)
        assert "egressIP" not in read_proxy(kube_client, ref)["status"]
    finally:
        writer.close()


def test_a_new_writer_does_not_rewrite_an_unchanged_status(kube_client: ApiClient, ns: str) -> None:
    """After a restart or a leader change the board is rebuilt (new times, no run yet): nothing is written."""
    ref = create_proxy(kube_client, ns, "restart")
    old = StatusBoard()
    first = writer_for(kube_client, old, {ref.key: ref})
    applied(old, ref)
    assert first.wait_idle(IDLE)
    first.close()
    before = read_proxy(kube_client, ref)

    board = StatusBoard()  # what a restarted loop knows from the stack outputs, without running anything
    board.set_applied(ref.key, stack="local", spec_hash="abc", address=Address(host="127.0.0.1", port=18081))
    board.set_condition(ref.key, type_=ConditionType.PROVISIONED, true=True, reason=Reason.PROVISIONED)
    second = writer_for(kube_client, board, {ref.key: ref})
    try:
        assert second.wait_idle(IDLE)
        assert second.writes == 0
        assert read_proxy(kube_client, ref) == before  # conditions' times, lastOperation, observedGeneration
        board.set_egress(ref.key, "203.0.113.7")
        assert second.wait_idle(IDLE)
        after = read_proxy(kube_client, ref)["status"]
        assert second.writes == 1
        assert after == {**before["status"], "egressIP": "203.0.113.7"}
    finally:
        second.close()


def test_a_gone_object_is_dropped_quietly(
    kube_client: ApiClient, ns: str, caplog: pytest.LogCaptureFixture
) -> None:
    ref = create_proxy(kube_client, ns, "gone")
    delete_proxy(kube_client, ref)
    board = StatusBoard()
    writer = writer_for(kube_client, board, {ref.key: ref})
    try:
        with caplog.at_level(logging.INFO, logger="service.kube.status_writer"):
            applied(board, ref)
            assert writer.wait_idle(IDLE)  # no retry pending
        assert writer.writes == 0
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    finally:
        writer.close()


def test_a_failing_write_is_retried_and_logged_once(
    kube_client: ApiClient, ns: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = create_proxy(kube_client, ns, "retried")
    real_call = kube_client.call_api
    failures = iter(range(3))

    def flaky(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name.startswith("status-writer") and next(failures, None) is not None:
            raise ProtocolError("connection reset by the test")
        return real_call(*args, **kwargs)

    monkeypatch.setattr(kube_client, "call_api", flaky)
    board = StatusBoard()
    writer = writer_for(kube_client, board, {ref.key: ref})
    try:
        with caplog.at_level(logging.INFO, logger="service.kube.status_writer"):
            applied(board, ref)
            assert writer.wait_idle(IDLE)
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1
        assert next(failures, None) is None  # all three failures happened
        assert read_proxy(kube_client, ref)["status"]["phase"] == "Ready"
    finally:
        writer.close()


def test_merge_patch_nulls_what_is_gone_and_keeps_what_is_equal() -> None:
    old = {"a": 1, "b": {"x": 1, "y": 2}, "c": [1], "gone": "z"}
    new = {"a": 1, "b": {"x": 1, "y": 3}, "c": [2]}
    assert merge_patch(old, new) == {"gone": None, "b": {"y": 3}, "c": [2]}
    assert merge_patch(new, new) == {}


def test_a_replica_that_stepped_down_writes_nothing_and_reads_again_in_its_next_term(
    kube_client: ApiClient, ns: str
) -> None:
    """The review read it: the writer kept writing after step-down (what it had queued), and its cache of
    what it last wrote survived terms, so a status another leader wrote meanwhile was not seen."""
    ref = create_proxy(kube_client, ns, "terms")
    board = StatusBoard()
    leading = [True]
    writer = writer_for(kube_client, board, {ref.key: ref})
    writer.leading = lambda: leading[0]
    try:
        applied(board, ref)
        assert writer.wait_idle(IDLE)
        writes = writer.writes
        leading[0] = False  # stepped down
        board.set_condition(ref.key, type_=ConditionType.HEALTHY, true=False, reason=Reason.PROBE_FAILED)
        assert writer.wait_idle(IDLE)
        assert writer.writes == writes, "a follower wrote a status"
        assert read_proxy(kube_client, ref)["status"]["phase"] == "Ready"

        leading[0] = True  # a later term: the board still says Degraded, the object says Ready
        writer.begin_term()
        assert writer.wait_idle(IDLE)
        assert read_proxy(kube_client, ref)["status"]["phase"] == "Degraded"
    finally:
        writer.close()


def test_a_new_writer_compares_with_the_watched_status_and_reads_nothing(
    kube_client: ApiClient, ns: str
) -> None:
    """A new leader takes 10,000 Proxies in: given the status the watch saw (`known`), it reads none of them
    again, writes none that is unchanged, and a difference is still written as a patch of what differs."""
    refs = {ref.key: ref for ref in (create_proxy(kube_client, ns, f"seen-{i}") for i in range(3))}
    old = StatusBoard()
    first = writer_for(kube_client, old, refs)
    for ref in refs.values():
        applied(old, ref)
    assert first.wait_idle(IDLE)
    first.close()
    watched = {key: read_proxy(kube_client, ref)["status"] for key, ref in refs.items()}

    board = StatusBoard()
    for key in refs:
        board.set_applied(key, stack="local", spec_hash="abc", address=Address(host="127.0.0.1", port=18081))
        board.set_condition(key, type_=ConditionType.PROVISIONED, true=True, reason=Reason.PROVISIONED)
    second = StatusWriter(kube_client, board, refs.get, backoff=(0.05,), known=watched.get)
    second.start()
    try:
        assert second.wait_idle(IDLE)
        assert (second.reads, second.writes) == (0, 0)
        key = next(iter(refs))
        board.set_egress(key, "203.0.113.7")
        assert second.wait_idle(IDLE)
        assert (second.reads, second.writes) == (0, 1)
        assert read_proxy(kube_client, refs[key])["status"] == {**watched[key], "egressIP": "203.0.113.7"}
    finally:
        second.close()


def test_a_change_made_while_a_new_term_writes_the_fleet_goes_ahead_of_it(
    kube_api: Any, kube_client: ApiClient, ns: str
) -> None:
    """A new leader's first statuses are a bulk (every Proxy it took in); a real change marked meanwhile is
    written within a batch or so, not after the bulk (etcd's revisions give the order of the writes)."""
    bulk = create_many(kube_api, ns, 400)
    changed = create_proxy(kube_client, ns, "changed")
    refs = {ref.key: ref for ref in [*bulk, changed]}
    board = StatusBoard()
    for ref in bulk:  # what the intake reported, before the writer runs: marked at once by start()
        board.set_condition(ref.key, type_=ConditionType.STALLED, true=True, reason=Reason.UNKNOWN_PROVIDER)
    writer = writer_for(kube_client, board, refs)
    try:
        deadline = time.monotonic() + IDLE
        while writer.writes == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        applied(board, changed)  # the change: its `up` started and finished
        assert writer.wait_idle(IDLE)
        after = written_after(kube_client, changed, bulk)
        assert read_proxy(kube_client, changed)["status"]["phase"] == "Ready"
        assert after > len(bulk) // 2, f"the change waited behind the bulk: only {after} written after it"
    finally:
        writer.close()


def written_after(client: ApiClient, ref: ProxyRef, others: list[ProxyRef]) -> int:
    """How many of `others` were last written after `ref` (etcd's revisions give the order of the writes)."""
    revisions = {
        item["metadata"]["name"]: int(item["metadata"]["resourceVersion"])
        for item in request_json(client, "GET", ref.path().rsplit("/", 1)[0])["items"]
    }
    return sum(1 for other in others if revisions[other.name] > revisions[ref.name])


def create_many(kube_api: Any, ns: str, count: int) -> list[ProxyRef]:
    """`count` Proxies, created by 8 threads (a client each, closed after)."""
    local, clients = threading.local(), []

    def create(i: int) -> ProxyRef:
        if not hasattr(local, "api"):
            local.api = kube_api.client()
            clients.append(local.api)
        return create_proxy(local.api, ns, f"bulk-{i:04d}")

    try:
        with ThreadPoolExecutor(8) as pool:
            return list(pool.map(create, range(count)))
    finally:
        for client in clients:
            client.close()


def test_a_status_read_back_is_the_writers_copy(kube_client: ApiClient, ns: str) -> None:
    """What the apiserver gives back of a status the writer wrote packs to the writer's own bytes
    (`pack_status_json` sorts the keys), so the watch's copy can be that one (`StatusWriter.shared`); and a
    new writer given the watched copy keeps that copy as what it last wrote."""
    refs = {ref.key: ref for ref in (create_proxy(kube_client, ns, f"shared-{i}") for i in range(2))}
    board = StatusBoard()
    writer = writer_for(kube_client, board, refs)
    try:
        for ref in refs.values():
            applied(board, ref)
        assert writer.wait_idle(IDLE)
        for key, ref in refs.items():
            read_back = pack_status_json(read_proxy(kube_client, ref)["status"])
            assert writer.shared(key, read_back) is writer._written[ref.uid]
        key, ref = next(iter(refs.items()))
        assert writer.shared(key, pack_status_json({"phase": "Other"})) is not writer._written[ref.uid]
    finally:
        writer.close()
    watched = {key: pack_status_json(read_proxy(kube_client, ref)["status"]) for key, ref in refs.items()}
    second = StatusWriter(
        kube_client,
        board,
        refs.get,
        known=lambda key: json.loads(STATUS_PACKER.unpack(watched[key])),
        known_packed=watched.get,
    )
    second.start()
    try:
        assert second.wait_idle(IDLE)
        assert second.writes == 0
        for key, ref in refs.items():
            assert second._written[ref.uid] is watched[key]
    finally:
        second.close()


def test_a_status_marked_first_is_not_held_back_by_newer_marks(
    kube_api: Any, kube_client: ApiClient, ns: str
) -> None:
    """10,000 running proxies turn Healthy one after the other: a steady inflow of newer marks. Taken
    newest first alone, a status marked before them waited behind all of them (the bench saw 12 Proxies
    show "not applied yet" for 7 minutes after they served); half of each batch is now the longest waiting."""
    bulk = create_many(kube_api, ns, 300)
    first = create_proxy(kube_client, ns, "first")
    refs = {ref.key: ref for ref in [first, *bulk]}
    board = StatusBoard()
    writer = StatusWriter(kube_client, board, refs.get, backoff=(0.05,))
    board.subscribe(writer.mark)
    try:
        applied(board, first)
        time.sleep(0.2)  # settled: due before every one of the bulk
        for ref in bulk:  # all marked before the worker takes its first batch
            board.set_condition(
                ref.key, type_=ConditionType.STALLED, true=True, reason=Reason.UNKNOWN_PROVIDER
            )
        time.sleep(0.2)
        writer._start_thread()
        assert writer.wait_idle(IDLE)
        after = written_after(kube_client, first, bulk)
        assert read_proxy(kube_client, first)["status"]["phase"] == "Ready"
        assert after > len(bulk) // 2, f"the first status waited behind newer ones: {after} written after it"
    finally:
        writer.close()
