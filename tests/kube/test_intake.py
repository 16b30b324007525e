"""A new leader taking the fleet in (issue 20's intake), against the real apiserver and the real engine:
it writes nothing to a Proxy that is already right, and it still acts on no stack it could not read.

The replicas are the real service (tests/kube/cluster_fleet.py). A change made during the handover runs
before the rest is taken in (below); its status writes go ahead of the bulk's at the status writer
(tests/kube/test_status_writer.py), where the order is etcd's.
"""

from __future__ import annotations

import asyncio
import gc
import json
import weakref
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiClient

import service.first_pass
from automation.engine import APPLIED_PROXIES_OUTPUT
from service.kube.client import ApiException, request_json
from service.kube.lease import LeaseRecord, read_lease, write_lease
from service.sources.kubernetes import FINALIZER
from tests.automation.fleet import accepts
from tests.conftest import PulumiEnv
from tests.kube.apiserver import KubeApi
from tests.kube.cluster_fleet import BASE, ClusterFleet, Replica, stays, until
from tests.ports import free_port

COUNT = 120  # Proxies on a provider the catalogue lacks: no process, but finalizer, status and Event each


@pytest.fixture
def fleet(kube_api: KubeApi, kube_client: ApiClient, pulumi_env: PulumiEnv, tmp_path: Path):
    fleet = ClusterFleet(
        api=kube_client, kubeconfig=kube_api.kubeconfig, root=tmp_path, backend_url=pulumi_env.backend_url
    )
    yield fleet
    fleet.kill_proxies()


def listed(fleet: ClusterFleet) -> list[dict[str, Any]]:
    return request_json(fleet.api, "GET", f"{BASE}/namespaces/{fleet.namespace}/proxies")["items"]


def versions(fleet: ClusterFleet) -> dict[str, str]:
    return {item["metadata"]["name"]: item["metadata"]["resourceVersion"] for item in listed(fleet)}


def taken_in(fleet: ClusterFleet) -> bool:
    """Every Proxy has our finalizer and its status says Stalled (the provider is unknown)."""
    items = listed(fleet)
    return len(items) == COUNT and all(
        FINALIZER in (item["metadata"].get("finalizers") or [])
        and (item.get("status") or {}).get("phase") == "Stalled"
        for item in items
    )


def recorded(fleet: ClusterFleet) -> dict[str, int]:
    """Each Event's count, by name (a repeat of one raises its count)."""
    return {e["metadata"]["name"]: int(e.get("count") or 1) for e in fleet.events_all()}


def settled(replica: Replica) -> bool:
    """Leading, its first pass done, and nothing left to write."""
    mode = replica.mode
    controller = mode.controller
    return (
        mode.leading
        and controller is not None
        and controller.started
        and mode.status_writer.wait_idle(0)
        and mode.source.finalizers.idle()
    )


def test_a_new_leader_writes_nothing_to_proxies_already_right(fleet: ClusterFleet) -> None:
    """Before: a new leader read each Proxy's status again (a GET each) and compared, and wrote a Proxy
    whose status it caught half-built. Now it compares with the watched copy: no read, and no write to a
    Proxy whose finalizer and status are right. Nor an Event: a condition that the cluster's status shows
    alike is taken over, not recorded as a transition again (before, every one was: 120 Events here)."""
    for i in range(COUNT):
        fleet.create(f"u{i:03d}", port=20000 + i, provider="elsewhere")

    async def scenario() -> None:
        first = await fleet.start("replica-a")
        try:
            await until(lambda: taken_in(fleet), what="the first leader takes them in", within=120)
            await until(lambda: settled(first), what="the first leader settles")
            await first.stop()
            before = versions(fleet)
            events = recorded(fleet)

            second = await fleet.start("replica-b")
            await until(lambda: settled(second), what="the second leader settles", within=60)
            assert await stays(lambda: versions(fleet) == before, seconds=3), "a Proxy was written"
            assert recorded(fleet) == events, "Events recorded again for conditions the cluster shows"
            writer = second.mode.status_writer
            assert (writer.reads, writer.writes) == (0, 0), "statuses read again or rewritten"
            # Their statuses describe their generation (refused ones too): nothing to take in first.
            assert second.mode.source.lane() is None
        finally:
            await fleet.stop_all()

    asyncio.run(scenario())


@pytest.mark.engine
def test_a_stack_that_cannot_be_read_is_not_acted_on(
    fleet: ClusterFleet, pulumi_env: PulumiEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backend read runs across stacks at once; one whose read fails (its applied proxies no longer
    read) is left alone while the other goes on: a Proxy of it deleted during the handover keeps its
    finalizer and its process until the stack reads again. Before, the read that failed for good counted
    as read, and the deleting Proxy, known to no stack, lost its finalizer with its process still running."""
    monkeypatch.setattr(service.first_pass, "REREAD_SECONDS", 1.0, raising=False)
    fleet.set_catalogue(["a", "b"])
    pa, pb, moved = free_port(), free_port(), free_port()
    fleet.create("pa", port=pa, provider="a")
    fleet.create("pb", port=pb, provider="b")

    async def scenario() -> None:
        first = await fleet.start("replica-a")
        try:
            for name, port in (("pa", pa), ("pb", pb)):
                await until(lambda n=name, p=port: ready_at(fleet, n, p), what=f"{name} Ready", within=180)
            await first.stop()
            checkpoint, saved = unreadable(pulumi_env.backend_dir, "b")
            fleet.delete("pb")  # a deletion during the handover: our finalizer holds the object

            second = await fleet.start("replica-b")
            await until(lambda: settled(second), what="the second leader settles", within=60)
            fleet.edit("pa", {"spec": {"port": moved}})  # the readable stack goes on
            await until(lambda: ready_at(fleet, "pa", moved), what="pa Ready at its new port", within=120)
            kept = await stays(lambda: fleet.get("pb") is not None and accepts(pb), seconds=3)
            assert kept, "the Proxy of the stack that cannot be read lost its finalizer or its process"
            assert second.mode.engine.up_count("b") == 0, "an up ran on a stack that was not read"

            checkpoint.write_text(saved)  # it reads again: the deletion goes ahead
            await until(lambda: fleet.get("pb") is None, what="pb released once its stack reads", within=120)
            assert not accepts(pb), "pb's process was left running"
        finally:
            await fleet.stop_all()

    asyncio.run(scenario())


def ready_at(fleet: ClusterFleet, name: str, port: int) -> bool:
    status = (fleet.get(name) or {}).get("status") or {}
    return status.get("phase") == "Ready" and (status.get("address") or {}).get("port") == port


def unreadable(backend: Path, stack: str) -> tuple[Path, str]:
    """Make the applied proxies of a stack's checkpoint (the file backend's) unreadable to the current
    rules, as a stricter rule would; returns the file and its text to restore."""
    (checkpoint,) = backend.glob(f".pulumi/stacks/**/{stack}.json")
    saved = checkpoint.read_text()
    doc = json.loads(saved)
    for resource in doc["checkpoint"]["latest"]["resources"]:
        if resource["type"] == "pulumi:pulumi:Stack":
            for proxy in resource["outputs"][APPLIED_PROXIES_OUTPUT]:
                proxy["spec"]["port"] = "not a port"
    checkpoint.write_text(json.dumps(doc))
    return checkpoint, saved


@dataclass
class Handover:
    """The lane tests' fleet: the Proxy `pa` on the catalogue's one entry `a` at `port` (`moved`: a free port
    to move it to), and 20 Proxies on a provider the catalogue lacks (Stalled)."""

    fleet: ClusterFleet
    port: int
    moved: int

    async def first_leader_settled(self) -> None:
        """A first leader takes the fleet in (pa Ready), settles and stops: no leader is left."""
        first = await self.fleet.start("replica-a")
        await until(lambda: ready_at(self.fleet, "pa", self.port), what="pa Ready", within=180)
        await until(lambda: settled(first), what="the first leader settles")
        await first.stop()


@pytest.fixture
def handover(fleet: ClusterFleet) -> Handover:
    fleet.set_catalogue(["a"])
    port, moved = free_port(), free_port()
    fleet.create("pa", port=port, provider="a")
    for i in range(20):
        fleet.create(f"u{i:03d}", port=20000 + i, provider="elsewhere")
    return Handover(fleet=fleet, port=port, moved=moved)


@pytest.mark.engine
def test_a_change_made_during_the_handover_runs_before_the_rest_is_taken_in(
    fleet: ClusterFleet, handover: Handover, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new leader judges the fleet in slices, and first the few Proxies whose status does not describe
    their generation yet, with the other Proxies of their stacks (the lane): their stack is read and runs
    while the rest is judged. Here the bulk's judging is held until the edited Proxy's `up` has started:
    before, that `up` waited for the whole first pass, so the test never got there."""
    from service.controller import Controller

    moved = handover.moved

    async def scenario() -> None:
        try:
            await handover.first_leader_settled()
            fleet.edit("pa", {"spec": {"port": moved}})  # during the handover: no leader
            await until(lambda: (fleet.get("pa") or {})["metadata"]["generation"] == 2, what="the edit")

            bulk: list[int] = []
            judge = Controller._sync_slices

            async def held(self: Controller, *, submit: bool = True) -> set[str]:
                if not self.started and not submit:  # the first pass's bulk
                    counted: Any = self.engine  # the CountingEngine of tests/automation/fleet.py, in a view
                    await until(lambda: counted.up_count("a") > 0, what="the lane's up", within=60)
                    bulk.append(len(self.planner.applied_keys()))
                return await judge(self, submit=submit)

            monkeypatch.setattr(Controller, "_sync_slices", held)
            second = await fleet.start("replica-b")
            await until(lambda: ready_at(fleet, "pa", moved), what="pa Ready at its new port", within=120)
            await until(lambda: settled(second), what="the second leader settles", within=60)
            assert bulk, "the first pass's bulk was never judged"
            stalled = [item for item in listed(fleet) if item["metadata"]["name"].startswith("u")]
            assert all((item.get("status") or {}).get("phase") == "Stalled" for item in stalled)
        finally:
            await fleet.stop_all()

    asyncio.run(scenario())


@pytest.mark.engine
def test_a_change_made_while_the_rest_is_judged_takes_the_lane_too(
    fleet: ClusterFleet, handover: Handover, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A change that a watch event brings while the new leader judges the bulk (slice by slice) is taken
    in ahead of what is left: between two slices the loop asks the source for the changes made meanwhile
    (`urgent`). Here the edit is made once the bulk has begun, one Proxy a slice."""
    import service.controller
    from service.controller import Controller

    monkeypatch.setattr(service.controller, "SLICE", 1)
    moved = handover.moved
    key = f"{fleet.namespace}/pa"

    async def scenario() -> None:
        try:
            await handover.first_leader_settled()

            lanes: list[tuple[bool, frozenset[str]]] = []
            judge, take = Controller._sync_slices, Controller._take_lane

            async def bulk(self: Controller, *, submit: bool = True) -> set[str]:
                if not self.started and not submit:  # the first pass's bulk: the edit comes now
                    fleet.edit("pa", {"spec": {"port": moved}})
                    await until(
                        lambda: getattr(self.source.object(key), "generation", 0) == 2, what="the edit"
                    )
                return await judge(self, submit=submit)

            def taken(self: Controller, lane: Any) -> None:
                if lane is not None:
                    lanes.append((self.started, lane.keys))
                take(self, lane)

            monkeypatch.setattr(Controller, "_sync_slices", bulk)
            monkeypatch.setattr(Controller, "_take_lane", taken)
            second = await fleet.start("replica-b")
            await until(lambda: ready_at(fleet, "pa", moved), what="pa Ready at its new port", within=120)
            assert (False, frozenset({key})) in lanes, f"the edit took no lane during the first pass: {lanes}"
            await until(lambda: settled(second), what="the second leader settles", within=60)
        finally:
            await fleet.stop_all()

    asyncio.run(scenario())


def test_the_watched_status_of_a_deleted_proxy_is_dropped(fleet: ClusterFleet) -> None:
    """What a replica keeps of each Proxy's status (for a follower's view) is pruned once the Proxy leaves
    the watched copy: pruned only then, since a pass over 10,000 every poll took 50 ms of each second."""
    for name in ("kept", "gone"):
        fleet.create(name, port=free_port(), provider="elsewhere")

    async def scenario() -> None:
        replica = await fleet.start("replica-a")
        try:
            status = replica.mode.cluster_status
            key = f"{fleet.namespace}/gone"
            await until(
                lambda: status.raw(key).get("phase") == "Stalled", what="its status watched", within=60
            )
            # Its provider is unknown: only skip-cleanup lets it go (nothing of it can be removed).
            fleet.edit("gone", {"metadata": {"annotations": {"crawl.example.com/skip-cleanup": "true"}}})
            fleet.delete("gone")
            await until(lambda: fleet.get("gone") is None, what="the Proxy gone", within=60)
            await until(lambda: status.raw(key) == {}, what="its watched status dropped", within=30)
            assert status.raw(f"{fleet.namespace}/kept").get("phase") == "Stalled"
        finally:
            await fleet.stop_all()

    asyncio.run(scenario())


def test_a_term_that_ends_gives_its_state_back_before_the_next_term(fleet: ClusterFleet) -> None:
    """A term's controller (its planner, reporter, queue: the leader's state for every Proxy) is held in
    reference cycles, and the collector's settles freeze it with the rest (service/gc_tuning.py). Before,
    a term that ended stayed in memory until the next settle (up to 5 minutes) while the next term built
    the same state again: in bench_running at 6,000 running proxies a new term took the service from 162 to
    194 MiB, and the allocator kept it. Now the term's end runs a full collection that reaches frozen
    objects too. The step-down here is a Lease taken by another holder."""
    for i in range(20):
        fleet.create(f"t{i:02d}", port=20000 + i, provider="elsewhere")

    async def scenario() -> None:
        replica = await fleet.start("replica-t")
        try:
            await until(lambda: settled(replica), what="the leader settles", within=60)
            mode = replica.mode
            controller = mode.controller
            assert controller is not None
            gone = weakref.ref(controller)
            del controller
            gc.freeze()  # as a settle leaves the term's objects: out of the collector's reach
            now = datetime.now(UTC)
            thief = LeaseRecord.first("thief", now=now, duration=30)
            lease = fleet.kube("replica-t").lease_name
            for _ in range(10):  # the leader may renew between the read and the write (a 409)
                current = read_lease(fleet.api, namespace=fleet.own_namespace, name=lease, timeout=10)
                try:
                    write_lease(
                        fleet.api,
                        namespace=fleet.own_namespace,
                        name=lease,
                        current=current,
                        record=thief,
                        timeout=10,
                    )
                    break
                except ApiException as exc:
                    if exc.status != 409:
                        raise
            await until(lambda: mode.controller is None and not mode.leading, what="the step-down")
            assert gone() is None, "the ended term's controller is still in memory"
        finally:
            gc.unfreeze()
            await fleet.stop_all()

    asyncio.run(scenario())
