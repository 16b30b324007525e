"""Leader election by Lease, and the stack-lock holder check, against the real API server.

Short timings (lease 3 s, renew deadline 2 s, retry 0.5 s) keep the module quick; each test uses its own
Lease. Where a test needs the API to fail or a write to race, it interposes on that elector's own client.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest
from kubernetes.client import ApiClient

from service.kube.client import request_json
from service.kube.heartbeat import OperationsHeartbeat, heartbeat_name
from service.kube.holder import lease_holder_gone
from service.kube.leader import LeaderElector
from service.kube.lease import LeaseRecord, read_lease, utcnow, write_lease
from service.kube.settings import KubeSettings
from tests.automation.eventually import eventually
from tests.kube.apiserver import KubeApi

NS = "leader-election"
FAST = {"lease_duration_seconds": 3.0, "renew_deadline_seconds": 2.0, "retry_period_seconds": 0.5}


@pytest.fixture(scope="module")
def namespace(kube_client: ApiClient) -> str:
    request_json(kube_client, "POST", "/api/v1/namespaces", body={"metadata": {"name": NS}})
    # No controller-manager here: the pod test needs the ServiceAccount that admission looks up.
    sa = {"metadata": {"name": "default"}}
    request_json(kube_client, "POST", f"/api/v1/namespaces/{NS}/serviceaccounts", body=sa)
    return NS


def settings(lease: str, identity: str, **overrides: Any) -> KubeSettings:
    return KubeSettings(namespace=NS, lease_name=lease, identity=identity, **{**FAST, **overrides})


@dataclass
class Recorder:
    """The callbacks of one elector: when each was called, on the loop's clock."""

    started: list[float] = field(default_factory=list)
    stopped: list[float] = field(default_factory=list)
    stopped_wall: list[datetime] = field(default_factory=list)

    async def on_started(self) -> None:
        self.started.append(asyncio.get_running_loop().time())

    async def on_stopped(self) -> None:
        self.stopped.append(asyncio.get_running_loop().time())
        self.stopped_wall.append(utcnow())

    @property
    def leading(self) -> bool:
        return len(self.started) > len(self.stopped)


@dataclass
class Candidate:
    elector: LeaderElector
    calls: Recorder
    stop: asyncio.Event
    task: asyncio.Task[None]

    async def halt(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, 10)


@asynccontextmanager
async def candidates(*pairs: tuple[ApiClient, KubeSettings]) -> AsyncIterator[list[Candidate]]:
    """Electors campaigning concurrently; every one is stopped (cleanly) on leaving."""
    running = []
    for api, config in pairs:
        calls, stop = Recorder(), asyncio.Event()
        elector = LeaderElector(api, config, on_started=calls.on_started, on_stopped=calls.on_stopped)
        running.append(Candidate(elector, calls, stop, asyncio.create_task(elector.run(stop))))
    try:
        yield running
    finally:
        for candidate in running:
            await candidate.halt()


def lease_of(api: ApiClient, name: str) -> LeaseRecord:
    lease = read_lease(api, namespace=NS, name=name, timeout=10)
    assert lease is not None, f"no Lease {name}"
    return lease.record


def put_lease(api: ApiClient, name: str, record: LeaseRecord) -> None:
    """Write `record` as another party would (create, or replace at the current resourceVersion)."""
    current = read_lease(api, namespace=NS, name=name, timeout=10)
    write_lease(api, namespace=NS, name=name, current=current, record=record, timeout=10)


@pytest.fixture
def own_client(kube_api: KubeApi) -> Iterator[ApiClient]:
    """A client of its own, so a test may break or interpose on it without touching the others."""
    with kube_api.client() as client:
        yield client


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cut_off(api: ApiClient) -> Callable[[bool], None]:
    """Make this client's requests go to a closed port (connection refused) while switched on."""
    original, base = api.call_api, api.configuration.host
    dead = {"on": False, "base": f"https://127.0.0.1:{closed_port()}"}

    def call_api(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if dead["on"]:
            url = url.replace(base, str(dead["base"]), 1)
        return original(method, url, *args, **kwargs)

    api.call_api = call_api  # type: ignore[method-assign]
    return lambda on: dead.update(on=on)


def test_one_candidate_becomes_leader_and_keeps_renewing(namespace: str, kube_client: ApiClient) -> None:
    async def scenario() -> None:
        async with candidates((kube_client, settings("solo", "pod-a"))) as [a]:
            await eventually(lambda: a.calls.leading, within=10, what="pod-a to lead")
            first = lease_of(kube_client, "solo")
            assert (first.holder, first.duration_seconds, first.transitions) == ("pod-a", 3, 0)
            assert a.elector.is_leader
            assert a.elector.holder() == "pod-a"
            await eventually(
                lambda: lease_of(kube_client, "solo").renewed != first.renewed, within=5, what="a renewal"
            )
            renewed = lease_of(kube_client, "solo")
            assert renewed.acquired == first.acquired, "a renewal keeps acquireTime"
        assert a.calls.stopped, "a clean stop calls on_stopped"

    asyncio.run(scenario())


def test_a_leader_keeps_renewing_while_the_default_executor_is_busy(
    namespace: str, kube_client: ApiClient
) -> None:
    """The engine's operations run in the default executor (`asyncio.to_thread`) and take minutes: a leader
    taking 10,000 running proxies in stepped down every few minutes with "no renewal for 10 s" when its
    renewals queued behind them. Here its one thread is held for three renew deadlines."""

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(max_workers=1))
        async with candidates((kube_client, settings("busy", "pod-a"))) as [a]:
            await eventually(lambda: a.calls.leading, within=10, what="pod-a to lead")
            before = lease_of(kube_client, "busy").renewed
            await asyncio.to_thread(time.sleep, 3 * FAST["renew_deadline_seconds"])  # an `up` in the pool
            assert a.calls.stopped == [], "the leader stepped down while the default executor was busy"
            assert lease_of(kube_client, "busy").renewed != before
            assert a.elector.is_leader

    asyncio.run(scenario())


def block_the_loop(seconds: float) -> None:
    """Hold the event loop as a burst of work on a saturated machine does (the GIL and two cores shared
    with a dozen processes): nothing on the loop runs meanwhile."""
    time.sleep(seconds)


def test_a_leader_keeps_the_lead_while_its_event_loop_is_late(namespace: str, kube_client: ApiClient) -> None:
    """At 10,000 running proxies the loop came back to its renewal after the deadline, and the leader
    stepped down every few minutes while every renewal it tried succeeded. The renewals now come from a
    thread: here the loop is held for 3 s at a time, three times, against a 2 s renew deadline (the loop
    renewing itself gives the lead up at the first)."""
    config = settings("late-loop", "pod-a", loop_stall_seconds=5.0)

    async def scenario() -> None:
        async with candidates((kube_client, config)) as [a]:
            await eventually(lambda: a.calls.leading, within=10, what="pod-a to lead")
            renewals = []
            for _ in range(3):
                block_the_loop(3.0)
                renewals.append(lease_of(kube_client, "late-loop").renewed)
                await asyncio.sleep(0.05)
            assert a.calls.stopped == [], "the leader stepped down while its loop was late"
            assert a.elector.is_leader
            assert len(set(renewals)) == 3, f"the Lease was not renewed while the loop was held: {renewals}"

    asyncio.run(scenario())


def test_a_leader_whose_event_loop_is_stuck_gives_the_lead_up(namespace: str, kube_client: ApiClient) -> None:
    """A loop that does not run for loop_stall_seconds is taken as stuck: the renewer stops renewing, so the
    Lease expires for the others as it would for a dead process, and the leader steps down once its loop
    runs again."""
    config = settings("stuck-loop", "pod-a", loop_stall_seconds=2.5)  # lease 3 s, renew deadline 2 s

    async def scenario() -> None:
        async with candidates((kube_client, config)) as [a]:
            await eventually(lambda: a.calls.leading, within=10, what="pod-a to lead")
            held_from = utcnow()
            block_the_loop(6.0)
            renewed = lease_of(kube_client, "stuck-loop").renewed
            assert renewed is not None
            renewed_after = (renewed - held_from).total_seconds()
            # Renewed until about loop_stall_seconds into the block (plus a request); the loop's own
            # renewer, or a thread without the stall check, renews until the block ends (about 6 s).
            assert renewed_after < config.loop_stall_seconds + 1.5, (
                f"renewed {renewed_after:.1f} s into a stuck loop"
            )
            assert not a.elector.is_leader, "the renewer gave the lead up; every thread sees it"
            await eventually(lambda: a.calls.stopped, within=5, what="pod-a to step down")

    asyncio.run(scenario())


def test_a_follower_waits_and_takes_over_at_once_after_a_clean_stop(
    namespace: str, kube_client: ApiClient
) -> None:
    # A long lease: without the release, the follower would wait 30 s for it to expire.
    slow = {"lease_duration_seconds": 30.0, "renew_deadline_seconds": 20.0}

    async def scenario() -> None:
        async with candidates(
            (kube_client, settings("handover", "pod-a", **slow)),
            (kube_client, settings("handover", "pod-b", **slow)),
        ) as [a, b]:
            await eventually(lambda: a.calls.leading or b.calls.leading, within=10, what="a leader")
            leader, follower = (a, b) if a.calls.leading else (b, a)
            await eventually(
                lambda: follower.elector.holder() is not None, within=5, what="the follower to look"
            )
            assert follower.elector.holder() == leader.elector.identity
            assert not follower.calls.started
            assert not follower.elector.is_leader

            stopped_at = asyncio.get_running_loop().time()
            await leader.halt()
            assert leader.calls.stopped
            assert not leader.elector.is_leader
            await eventually(lambda: follower.calls.leading, within=15, what="the follower to take over")
            handover = follower.calls.started[0] - stopped_at
            print(f"\nhandover after a clean stop: {handover:.2f} s (lease 30 s, retry 0.5 s)")
            record = lease_of(kube_client, "handover")
            assert (record.holder, record.transitions) == (follower.elector.identity, 1)
            assert follower.elector.figures().last_handover == record.acquired

    asyncio.run(scenario())


def test_a_leader_that_cannot_reach_the_api_stops_before_its_renew_deadline(
    namespace: str, kube_client: ApiClient, own_client: ApiClient
) -> None:
    config = settings("unreachable", "pod-a")

    async def scenario() -> None:
        async with candidates((own_client, config)) as [a]:
            await eventually(lambda: a.calls.leading, within=10, what="pod-a to lead")
            switch = cut_off(own_client)
            switch(True)
            await eventually(lambda: a.calls.stopped, within=10, what="on_stopped")
            renewed_at = a.elector.renewed_at
            assert renewed_at is not None
            assert a.calls.stopped[0] - renewed_at < config.renew_deadline_seconds
            expires = lease_of(kube_client, "unreachable").expires()
            assert expires is not None
            assert a.calls.stopped_wall[0] < expires, "stopped before the Lease could expire for the others"
            assert not a.elector.is_leader
            # Reachable again: the Lease still names it, so it leads again (after on_stopped returned).
            switch(False)
            await eventually(lambda: len(a.calls.started) == 2, within=10, what="pod-a to lead again")

    asyncio.run(scenario())


def test_a_leader_whose_lease_was_taken_steps_down(namespace: str, kube_client: ApiClient) -> None:
    async def scenario() -> None:
        async with candidates((kube_client, settings("stolen", "pod-a"))) as [a]:
            await eventually(lambda: a.calls.leading, within=10, what="pod-a to lead")
            now = utcnow()
            thief = LeaseRecord(holder="thief", duration_seconds=3, acquired=now, renewed=now, transitions=7)
            put_lease(kube_client, "stolen", thief)
            await eventually(lambda: a.calls.stopped, within=5, what="pod-a to step down")
            assert not a.elector.is_leader
            assert a.elector.holder() == "thief"

    asyncio.run(scenario())


def test_the_lease_of_a_dead_holder_is_taken_only_once_it_expired(
    namespace: str, kube_client: ApiClient
) -> None:
    now = utcnow()
    put_lease(
        kube_client, "stale", LeaseRecord(holder="dead-pod", duration_seconds=3, acquired=now, renewed=now)
    )

    async def scenario() -> None:
        async with candidates((kube_client, settings("stale", "pod-b"))) as [b]:
            await eventually(lambda: b.calls.leading, within=10, what="pod-b to take the stale Lease")
            taken = lease_of(kube_client, "stale")
            assert (taken.holder, taken.transitions) == ("pod-b", 1)
            assert taken.acquired is not None
            assert taken.acquired > now + timedelta(seconds=3)
            print(
                f"\nstale Lease taken {(taken.acquired - now).total_seconds():.2f} s after its last renewal"
            )

    asyncio.run(scenario())


def test_racing_candidates_never_lead_together(namespace: str, kube_client: ApiClient) -> None:
    leading: list[int] = []

    async def scenario() -> None:
        async with candidates(*[(kube_client, settings("race", f"pod-{i}")) for i in range(4)]) as pods:
            deadline = time.monotonic() + 2.5
            while time.monotonic() < deadline:
                leading.append(sum(pod.calls.leading for pod in pods))
                await asyncio.sleep(0.01)
            assert sum(len(pod.calls.started) for pod in pods) == 1

    asyncio.run(scenario())
    assert max(leading) == 1


def interpose_before_put(api: ApiClient, action: Callable[[], None]) -> list[int]:
    """Run `action` once, just before this client's next PUT (between its read and its write); returns the
    statuses of the PUTs that follow."""
    original, statuses, pending = api.call_api, [], [action]

    def call_api(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if method == "PUT" and pending:
            pending.pop()()
        response = original(method, url, *args, **kwargs)
        if method == "PUT":
            statuses.append(response.status)
        return response

    api.call_api = call_api  # type: ignore[method-assign]
    return statuses


@pytest.mark.parametrize("competitor", ["annotates", "takes it"])
def test_a_conflicting_write_is_read_again_and_decided_afresh(
    namespace: str, kube_client: ApiClient, own_client: ApiClient, competitor: str
) -> None:
    name = f"conflict-{competitor.replace(' ', '-')}"

    def write_between() -> None:
        current = read_lease(kube_client, namespace=NS, name=name, timeout=10)
        assert current is not None
        if competitor == "annotates":  # kubectl annotate: a new resourceVersion, the same holder
            body = {**current.raw, "metadata": {**current.raw["metadata"], "annotations": {"note": "x"}}}
            request_json(
                kube_client, "PUT", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{name}", body=body
            )
        else:
            now = utcnow()
            record = LeaseRecord(holder="thief", duration_seconds=3, acquired=now, renewed=now)
            write_lease(kube_client, namespace=NS, name=name, current=current, record=record, timeout=10)

    async def scenario() -> None:
        async with candidates((own_client, settings(name, "pod-a"))) as [a]:
            await eventually(lambda: a.calls.leading, within=10, what="pod-a to lead")
            statuses = interpose_before_put(own_client, write_between)
            await eventually(lambda: statuses, within=5, what="a renewal")
            assert statuses[0] == 409
            if competitor == "annotates":
                await eventually(lambda: len(statuses) >= 2, within=5, what="the renewal after the 409")
                assert statuses[1] == 200
                assert a.calls.leading
                assert not a.calls.stopped
            else:
                await eventually(lambda: a.calls.stopped, within=5, what="pod-a to step down")
                assert lease_of(kube_client, name).holder == "thief"

    asyncio.run(scenario())


def test_the_settings_refuse_a_renew_deadline_past_the_lease() -> None:
    with pytest.raises(ValueError, match="renew_deadline_seconds"):
        settings("x", "pod-a", renew_deadline_seconds=3.0)
    with pytest.raises(ValueError, match="loop_stall_seconds"):
        settings("x", "pod-a", loop_stall_seconds=1.0)


# --- lease_holder_gone: may a stack lock of `identity` be cancelled? ------------------------------------


def create_pod(api: ApiClient, name: str) -> None:
    container = {"name": "c", "image": "example.invalid/none"}
    body = {
        "metadata": {"name": name},
        "spec": {"containers": [container], "automountServiceAccountToken": False},
    }
    request_json(api, "POST", f"/api/v1/namespaces/{NS}/pods", body=body)


@pytest.mark.parametrize(
    ("leader", "heartbeat", "pod_exists", "gone"),
    [
        ("itself", "expired", False, False),  # it leads: its locks are the one writer's
        ("new-pod", None, True, False),  # no heartbeat, its pod is there: no evidence, however long ago
        ("new-pod", None, False, True),  # its pod is gone
        ("new-pod", "running", True, False),  # its operations heartbeat is renewed: it may run Pulumi
        ("new-pod", "running", False, True),  # ... but its pod is gone
        ("new-pod", "expired", True, True),  # not renewed for longer than any child of its may run
        ("new-pod", "released", True, True),  # it ended its term with no child left
        (None, "running", True, False),
    ],
)
def test_lease_holder_gone_takes_evidence_not_time(
    namespace: str,
    kube_client: ApiClient,
    leader: str | None,
    heartbeat: str | None,
    pod_exists: bool,
    gone: bool,
) -> None:
    """A stack lock of another replica is taken over only on evidence that it cannot run Pulumi: its pod
    gone, or its operations heartbeat expired or released. The Lease leaving it long ago is not evidence
    (the rule before issue 17, which let a frozen leader's `up` run beside the new leader's)."""
    case = f"{leader or 'none'}-{heartbeat or 'none'}-{pod_exists}".lower()
    lease, identity = f"holder-{case}", f"old-{case}"
    long_ago = utcnow() - timedelta(seconds=3600)
    owner = identity if leader == "itself" else leader
    put_lease(
        kube_client,
        lease,
        LeaseRecord(holder=owner, duration_seconds=3600, acquired=long_ago, renewed=utcnow()),
    )
    config = settings(lease, "pod-checking")
    if heartbeat is not None:
        renewed = long_ago if heartbeat == "expired" else utcnow()
        record = LeaseRecord(holder=identity, duration_seconds=30, acquired=long_ago, renewed=renewed)
        put_lease(
            kube_client,
            heartbeat_name(config, identity),
            record.released(utcnow()) if heartbeat == "released" else record,
        )
    if pod_exists:
        create_pod(kube_client, identity)
    assert lease_holder_gone(kube_client, config, identity) is gone


def test_the_heartbeat_is_on_record_while_operations_run_and_released_after(
    namespace: str, kube_client: ApiClient
) -> None:
    """ensure() writes the heartbeat before an operation (a lock then always has evidence behind it); the
    keeper renews it while the term is busy; release() tells the others no operation of ours runs."""
    config = settings("hb-cycle", "replica-hb")
    busy = [True]
    beat = OperationsHeartbeat(kube_client, config, grace=1.0, busy=lambda: busy[0])
    other = settings("hb-cycle", "replica-other")
    create_pod(kube_client, "replica-hb")
    assert lease_holder_gone(kube_client, other, "replica-hb") is False  # no heartbeat: the pod is there
    beat.ensure()
    first = read_lease(kube_client, namespace=NS, name=heartbeat_name(config, "replica-hb"), timeout=10)
    assert first is not None
    assert first.record.holder == "replica-hb"
    assert beat.covers_until() > time.monotonic()
    time.sleep(config.retry_period_seconds * 2.5)
    renewed = read_lease(kube_client, namespace=NS, name=heartbeat_name(config, "replica-hb"), timeout=10)
    assert renewed is not None
    assert renewed.record.renewed is not None
    assert first.record.renewed is not None
    assert renewed.record.renewed > first.record.renewed, "the keeper renews while operations run"
    assert lease_holder_gone(kube_client, other, "replica-hb") is False
    busy[0] = False
    beat.release()
    assert lease_holder_gone(kube_client, other, "replica-hb") is True


def test_lease_holder_gone_without_a_lease_asks_the_pods(namespace: str, kube_client: ApiClient) -> None:
    create_pod(kube_client, "alive-pod")
    config = settings("no-such-lease", "pod-checking")
    assert lease_holder_gone(kube_client, config, "alive-pod") is False
    assert lease_holder_gone(kube_client, config, "vanished-pod") is True


def test_lease_holder_gone_is_false_when_the_api_cannot_be_asked(
    namespace: str, own_client: ApiClient
) -> None:
    cut_off(own_client)(True)
    assert lease_holder_gone(own_client, settings("solo", "pod-checking"), "vanished-pod") is False
