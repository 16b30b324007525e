"""The Kubernetes source against a real kube-apiserver: what each poll declares, and the finalizer.

Every test works in its own namespace with its own source (list + watch threads on the real apiserver).
No Pulumi here: the control loop's side is in test_incluster_engine.py.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes.client import ApiClient

from service.kube.client import ApiException, request_json
from service.kube.proxy_object import ProxyObject
from service.kube.settings import KubeSettings
from service.sources.contract import SourceChange
from service.sources.kubernetes import FINALIZER, PAUSED, RECONCILE_REQUESTED, KubernetesSource, proxy_object
from stacks.models import Proxy
from stacks.models.conditions import Reason

CATALOGUE = "providers:\n  - name: local\n    type: local\n    bindAddress: 127.0.0.1\n"
BASE = "/apis/crawl.example.com/v1alpha1"


def proxy_doc(namespace: str, name: str, port: int = 18500, **annotations: str) -> dict[str, Any]:
    return {
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": {"provider": "local", "port": port, "allowedSourceRanges": ["127.0.0.0/8"]},
    }


@pytest.fixture
def namespace(kube_client: ApiClient) -> str:
    name = f"src-{uuid.uuid4().hex[:8]}"
    request_json(kube_client, "POST", "/api/v1/namespaces", body={"metadata": {"name": name}})
    request_json(
        kube_client,
        "POST",
        f"/api/v1/namespaces/{name}/configmaps",
        body={"metadata": {"name": "proxy-operator-providers"}, "data": {"providers.yaml": CATALOGUE}},
    )
    return name


@pytest.fixture
def make_source(kube_client: ApiClient, namespace: str) -> Iterator[Callable[..., KubernetesSource]]:
    started: list[KubernetesSource] = []

    def make(*, writes: bool = True, backend_read: bool = True) -> KubernetesSource:
        settings = KubeSettings(namespaces=[namespace], namespace=namespace)
        source = KubernetesSource(kube_client, settings, writes=writes)
        source.start()
        assert source.wait_synced(30), source.watch_errors()
        if backend_read:
            source.backend_loaded()  # as the control loop does once it read the backend's stacks
        started.append(source)
        return source

    yield make
    for source in started:
        source.stop()


def create(api: ApiClient, doc: dict[str, Any]) -> dict[str, Any]:
    ns = doc["metadata"]["namespace"]
    return request_json(api, "POST", f"{BASE}/namespaces/{ns}/proxies", body=doc)


def merge(api: ApiClient, where: str, patch: dict[str, Any]) -> None:
    request_json(api, "PATCH", where, body=patch, content_type="application/merge-patch+json")


def path(namespace: str, name: str) -> str:
    return f"{BASE}/namespaces/{namespace}/proxies/{name}"


def poll_until(
    source: KubernetesSource, done: Callable[[SourceChange], bool], timeout: float = 20
) -> SourceChange:
    """Poll as the control loop does until the changes seen (merged) satisfy `done`."""
    deadline = time.monotonic() + timeout
    seen = SourceChange()
    while time.monotonic() < deadline:
        change = source.poll()
        seen.upserts += change.upserts
        seen.deletions += change.deletions
        seen.held.update(change.held)
        seen.requested |= change.requested
        seen.problems += change.problems
        seen.catalogue = change.catalogue or seen.catalogue
        if done(seen):
            return seen
        time.sleep(0.05)
    raise AssertionError(f"not seen within {timeout} s: {seen}")


def wait_for(check: Callable[[], bool], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def test_a_new_proxy_is_passed_on_and_gets_the_finalizer(kube_client, namespace, make_source) -> None:
    source = make_source()
    create(kube_client, proxy_doc(namespace, "p1"))
    change = poll_until(source, lambda c: bool(c.upserts))
    assert [p.key for p in change.upserts] == [f"{namespace}/p1"]
    assert change.catalogue is not None
    assert change.catalogue.providers[0].name == "local"
    wait_for(
        lambda: (
            FINALIZER
            in request_json(kube_client, "GET", path(namespace, "p1"))["metadata"].get("finalizers", [])
        )
    )
    # Our own finalizer write and any status write are not changes to reconcile.
    time.sleep(0.3)
    assert source.poll().upserts == []


def test_a_follower_reads_but_never_writes(kube_client, namespace, make_source) -> None:
    """A leader queues its finalizer write while it judges the object (inside poll); a follower judging the
    same object queues nothing, so no time window is needed to see that it writes nothing."""
    source = make_source(writes=False)
    create(kube_client, proxy_doc(namespace, "p1"))
    poll_until(source, lambda c: bool(c.upserts))
    assert source.finalizers.idle(), "a follower queued a write"
    assert not request_json(kube_client, "GET", path(namespace, "p1"))["metadata"].get("finalizers")
    assert source.cache.take_fresh() == set(), "a follower keeps no changes for a lane"
    source.set_writes(True)  # the same source leading: the next poll queues the finalizer, and it lands
    source.poll()
    wait_for(
        lambda: (
            FINALIZER
            in request_json(kube_client, "GET", path(namespace, "p1"))["metadata"].get("finalizers", [])
        )
    )


def test_deletion_is_declared_by_the_timestamp_and_waits_for_release(
    kube_client, namespace, make_source
) -> None:
    source = make_source()
    create(kube_client, proxy_doc(namespace, "p1"))
    poll_until(source, lambda c: bool(c.upserts))
    wait_for(
        lambda: (
            FINALIZER
            in request_json(kube_client, "GET", path(namespace, "p1"))["metadata"].get("finalizers", [])
        )
    )
    request_json(kube_client, "DELETE", path(namespace, "p1"))
    change = poll_until(source, lambda c: bool(c.deletions))
    assert change.deletions[0].metadata.deletion_timestamp is not None
    # The object waits behind our finalizer until the resources are gone.
    assert request_json(kube_client, "GET", path(namespace, "p1"))["metadata"]["deletionTimestamp"]
    source.release(f"{namespace}/p1")

    def gone() -> bool:
        try:
            request_json(kube_client, "GET", path(namespace, "p1"))
        except Exception:
            return True
        return False

    wait_for(gone)


def test_an_applied_proxy_absent_from_the_list_is_held_not_deleted(namespace, make_source) -> None:
    source = make_source()
    applied = Proxy.model_validate(proxy_doc(namespace, "ghost"))
    source.track([applied])
    change = poll_until(source, lambda c: f"{namespace}/ghost" in c.held)
    assert change.deletions == []
    assert change.held[f"{namespace}/ghost"].reason == Reason.NOT_FOUND


def test_an_invalid_object_is_held_with_its_reason(kube_client, namespace, make_source) -> None:
    """The CRD's rules and the model agree (test_crd_rules_matter), so the apiserver refuses what the model
    refuses: the event of an object the model refuses is injected here as the watch would deliver it (an
    object stored under an older, looser CRD)."""
    source = make_source()
    created = create(kube_client, proxy_doc(namespace, "p1"))
    poll_until(source, lambda c: bool(c.upserts))
    # The finalizer's own MODIFIED event must be in before the injected one, or it would overwrite it.
    wait_for(lambda: (obj := source.object(f"{namespace}/p1")) is not None and obj.finalized)
    created["spec"]["port"] = 0
    source.cache._proxy_event("MODIFIED", proxy_object(created))
    change = poll_until(source, lambda c: f"{namespace}/p1" in c.held)
    assert change.held[f"{namespace}/p1"].reason == Reason.INVALID_SPEC
    assert "port" in change.held[f"{namespace}/p1"].message
    assert change.deletions == []
    assert change.upserts == []


def test_paused_holds_changes_and_reconcile_requested_asks_a_run(kube_client, namespace, make_source) -> None:
    source = make_source()
    create(kube_client, proxy_doc(namespace, "p1"))
    poll_until(source, lambda c: bool(c.upserts))
    merge(
        kube_client,
        path(namespace, "p1"),
        {"metadata": {"annotations": {PAUSED: "true"}}, "spec": {"port": 18501}},
    )
    change = poll_until(source, lambda c: f"{namespace}/p1" in c.held)
    assert change.held[f"{namespace}/p1"].reason == Reason.PAUSED
    assert change.upserts == []
    merge(
        kube_client,
        path(namespace, "p1"),
        {"metadata": {"annotations": {PAUSED: None, RECONCILE_REQUESTED: "1"}}},
    )
    change = poll_until(source, lambda c: bool(c.upserts) and f"{namespace}/p1" in c.requested)
    assert change.upserts[0].spec.port == 18501


def test_resuming_an_unchanged_proxy_ends_its_hold(kube_client, namespace, make_source) -> None:
    """Paused and resumed with no spec change: the proxy is passed on again, so the loop sees the hold
    end (found by the RBAC audit run: Held=Paused stayed after the annotation was removed)."""
    source = make_source()
    create(kube_client, proxy_doc(namespace, "p1"))
    poll_until(source, lambda c: bool(c.upserts))
    merge(kube_client, path(namespace, "p1"), {"metadata": {"annotations": {PAUSED: "true"}}})
    poll_until(source, lambda c: f"{namespace}/p1" in c.held)
    merge(kube_client, path(namespace, "p1"), {"metadata": {"annotations": {PAUSED: None}}})
    deadline = time.monotonic() + 20
    change = source.poll()
    while not change.upserts and time.monotonic() < deadline:
        time.sleep(0.05)
        change = source.poll()
    assert [p.key for p in change.upserts] == [f"{namespace}/p1"]
    assert f"{namespace}/p1" not in change.held  # this very poll ends the hold


def test_catalogue_edits_arrive_and_a_broken_one_keeps_the_last(kube_client, namespace, make_source) -> None:
    source = make_source()
    poll_until(source, lambda c: c.catalogue is not None)
    cm = f"/api/v1/namespaces/{namespace}/configmaps/proxy-operator-providers"
    edited = CATALOGUE + "  - name: local-b\n    type: local\n    bindAddress: 127.0.0.1\n"
    request_json(kube_client, "PATCH", cm, body={"data": {"providers.yaml": edited}},
                 content_type="application/merge-patch+json")  # fmt: skip
    change = poll_until(source, lambda c: c.catalogue is not None and len(c.catalogue.providers) == 2)
    assert {p.name for p in change.catalogue.providers} == {"local", "local-b"}
    request_json(kube_client, "PATCH", cm, body={"data": {"providers.yaml": "providers: [: broken"}},
                 content_type="application/merge-patch+json")  # fmt: skip
    change = poll_until(source, lambda c: bool(c.problems))
    assert change.catalogue is None
    assert source.catalogue is not None
    assert len(source.catalogue.providers) == 2


# --- what a deletion removes, decided only on what the source knows (issue 17, item 1) -------------------
# `track` stands for what the backend's stacks hold (their output copy carries no annotations) and
# `backend_loaded` for the control loop having read them.

SKIP = "crawl.example.com/skip-cleanup"


def finalizers(api: ApiClient, namespace: str, name: str) -> list[str]:
    return request_json(api, "GET", path(namespace, name))["metadata"].get("finalizers") or []


def applied(namespace: str, name: str) -> Proxy:
    """The version a stack's outputs hold: no annotations."""
    doc = proxy_doc(namespace, name)
    doc["metadata"]["annotations"] = {}
    return Proxy.model_validate(doc)


def deleting(api: ApiClient, source: KubernetesSource, namespace: str, name: str, **annotations: str) -> None:
    create(api, proxy_doc(namespace, name, **annotations))
    wait_for(lambda: polled(source) and FINALIZER in finalizers(api, namespace, name))
    request_json(api, "DELETE", path(namespace, name))
    key = f"{namespace}/{name}"
    wait_for(lambda: (obj := source.object(key)) is not None and obj.deleting)  # the watch has seen it


def polled(source: KubernetesSource) -> bool:
    """Poll once (the source judges, and queues its finalizer writes, inside poll)."""
    source.poll()
    return True


def test_a_new_term_removes_no_finalizer_before_the_backend_is_read(
    kube_client, namespace, make_source
) -> None:
    """The review's finding: a new term polled before it read the backend, judged a deleting Proxy it did
    not know as "never applied", and removed its finalizer: the object went while its resources ran."""
    source = make_source()
    deleting(kube_client, source, namespace, "p1")
    source.replay()  # a new term: it knows nothing yet
    for _ in range(20):
        assert source.poll().deletions == []
        time.sleep(0.05)
    time.sleep(0.5)
    assert FINALIZER in finalizers(kube_client, namespace, "p1"), (
        "finalizer removed before the backend was read"
    )

    source.track([applied(namespace, "p1")])  # the backend holds it applied
    source.backend_loaded()
    change = poll_until(source, lambda c: bool(c.deletions))
    assert [p.key for p in change.deletions] == [f"{namespace}/p1"]
    assert FINALIZER in finalizers(kube_client, namespace, "p1")  # stays until its resources are gone


def test_a_deleting_proxy_the_backend_does_not_hold_is_let_go_once_it_was_read(
    kube_client, namespace, make_source
) -> None:
    source = make_source()
    deleting(kube_client, source, namespace, "p2")
    source.replay()  # a new term
    for _ in range(10):
        source.poll()
        time.sleep(0.05)
    assert FINALIZER in finalizers(kube_client, namespace, "p2")
    source.backend_loaded()  # read: the backend does not hold it, so it was never applied
    wait_for(lambda: polled(source) and request_json_or_none(kube_client, path(namespace, "p2")) is None)


def test_skip_cleanup_comes_from_the_live_object(kube_client, namespace, make_source) -> None:
    """The deletion was rebuilt from the stack output copy, which has no annotations: a skip-cleanup
    Proxy was destroyed instead of forgotten."""
    source = make_source()
    deleting(kube_client, source, namespace, "p3", **{SKIP: "true"})
    source.replay()  # a new term: what it knows of p3 is the stack output copy
    source.track([applied(namespace, "p3")])
    source.backend_loaded()
    change = poll_until(source, lambda c: bool(c.deletions))
    assert change.deletions[-1].metadata.annotations.get(SKIP) == "true"


def test_skip_cleanup_added_during_a_deletion_is_passed_on(kube_client, namespace, make_source) -> None:
    """The documented way out of a stuck deletion: add skip-cleanup to the Deleting Proxy."""
    source = make_source()
    deleting(kube_client, source, namespace, "p4")
    change = poll_until(source, lambda c: bool(c.deletions))
    assert SKIP not in change.deletions[-1].metadata.annotations
    merge(kube_client, path(namespace, "p4"), {"metadata": {"annotations": {SKIP: "true"}}})
    change = poll_until(source, lambda c: bool(c.deletions))
    assert change.deletions[-1].metadata.annotations.get(SKIP) == "true"


def test_a_proxy_made_again_after_a_vanished_deletion_can_be_deleted_again(
    kube_client, namespace, make_source
) -> None:
    """A key left among the deletions in progress made a later real deletion hang."""
    source = make_source()
    deleting(kube_client, source, namespace, "p5")
    poll_until(source, lambda c: bool(c.deletions))
    merge(kube_client, path(namespace, "p5"), {"metadata": {"finalizers": None}})  # force-removed by hand
    wait_for(lambda: request_json_or_none(kube_client, path(namespace, "p5")) is None)
    source.poll()
    create(kube_client, proxy_doc(namespace, "p5", port=18501))
    poll_until(source, lambda c: bool(c.upserts))
    wait_for(lambda: polled(source) and FINALIZER in finalizers(kube_client, namespace, "p5"))
    request_json(kube_client, "DELETE", path(namespace, "p5"))
    change = poll_until(source, lambda c: bool(c.deletions))
    assert [p.key for p in change.deletions] == [f"{namespace}/p5"]


def request_json_or_none(api: ApiClient, where: str) -> dict[str, Any] | None:
    try:
        return request_json(api, "GET", where)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_a_sliced_poll_judges_a_few_at_a_time_and_loses_none(kube_client, namespace, make_source) -> None:
    """A new term takes 10,000 in, a slice at a time (the control loop serves between slices): each call
    judges at most `limit`, the rest stay marked for the next, and every Proxy comes through once. A
    follower's source (no writes): a leader's adds its finalizer to each Proxy it judges, and the watch
    event of that write marks the Proxy again whenever it arrives, before the last call or after it (it
    did, once, in a CI run beside other tests)."""
    for i in range(7):
        create(kube_client, proxy_doc(namespace, f"p{i}", port=18600 + i))
    source = make_source(writes=False)
    wait_for(lambda: len(source.objects()) == 7)
    source.replay()
    seen: list[str] = []
    calls = 0
    more = True
    while more:
        change, more = source.poll_some(limit=3)
        assert len(change.upserts) <= 3
        seen += change.upserts.keys()
        calls += 1
    assert sorted(seen) == [f"{namespace}/p{i}" for i in range(7)]
    assert calls == 3
    only, more = source.poll_some(only=())
    assert not only.upserts, "nothing left once every slice was judged"
    assert not more


def in_stacks(
    api: ApiClient, namespace: str, make_source: Callable[..., KubernetesSource], stacks: dict[str, str]
) -> KubernetesSource:
    """A Proxy per name of `stacks` on the provider named there (`local` or `other`), its status saying it
    runs in that stack and describes its generation; a source that took them in (its first poll)."""
    catalogue = CATALOGUE + "  - name: other\n    type: local\n    bindAddress: 127.0.0.1\n"
    merge(
        api,
        f"/api/v1/namespaces/{namespace}/configmaps/proxy-operator-providers",
        {"data": {"providers.yaml": catalogue}},
    )
    for name, stack in stacks.items():
        doc = proxy_doc(namespace, name)
        doc["spec"]["provider"] = stack
        created = create(api, doc)
        merge(
            api,
            path(namespace, name) + "/status",
            {"status": {"stack": stack, "observedGeneration": created["metadata"]["generation"]}},
        )
    source = make_source()
    wait_for(
        lambda: (
            all(o.status.get("observedGeneration") for o in source.objects())
            and len(source.objects()) == len(stacks)
        )
    )
    poll_until(source, lambda seen: seen.catalogue is not None and len(seen.upserts) == len(stacks))
    return source


def test_the_lane_holds_the_changed_proxies_and_their_stacks_others(
    kube_client, namespace, make_source
) -> None:
    """What a new term takes in first: a Proxy whose generation its status does not describe yet, and the
    Proxies whose status says they run in the same stack; not the unchanged rest, not a changed Proxy
    whose flat name another shares, and no lane at all with more changes than `most` (a first intake)."""
    stacks = {"same": "local", "elsewhere": "other", "edited": "local"}
    source = in_stacks(kube_client, namespace, make_source, stacks)
    assert source.lane() is None, "an unchanged fleet has no lane"
    wait_for(lambda: all(o.finalized for o in source.objects()))
    assert source.cache.take_fresh() == set(), "our own finalizer writes are no one's change"

    merge(kube_client, path(namespace, "edited"), {"spec": {"port": 18999}})
    wait_for(lambda: source.lane() is not None)
    lane = source.lane()
    assert lane is not None
    assert lane.stacks == {"local"}
    assert lane.keys == {f"{namespace}/edited", f"{namespace}/same"}
    assert source.lane(most=0) is None, "more changes than `most`: no lane"

    # A changed Proxy whose flat name (<namespace>-<name>) an object of another namespace shares is left
    # to the bulk: `<namespace>/a-b` and `<namespace>-a/b` share one (a source watching both namespaces).
    twin_ns = f"{namespace}-a"
    request_json(kube_client, "POST", "/api/v1/namespaces", body={"metadata": {"name": twin_ns}})
    create(kube_client, proxy_doc(namespace, "a-b"))
    create(kube_client, proxy_doc(twin_ns, "b"))
    settings = KubeSettings(namespaces=[namespace, twin_ns], namespace=namespace)
    both = KubernetesSource(kube_client, settings)
    both.start()
    try:
        assert both.wait_synced(30), both.watch_errors()
        wait_for(lambda: len(both.objects()) == 5)
        poll_until(both, lambda seen: seen.catalogue is not None)
        both_lane = both.lane()
        assert both_lane is not None
        assert f"{namespace}/edited" in both_lane.keys
        assert f"{namespace}/a-b" not in both_lane.keys
        assert f"{twin_ns}/b" not in both_lane.keys
    finally:
        both.stop()


def test_a_lane_decodes_no_status_outside_it(kube_client, namespace, make_source, monkeypatch) -> None:
    """A lane, at a new term and at each urgent edit, finds the changed Proxies and their stacks' others
    by the watched copy's fields and the cache's index by stack: it decodes the status of no Proxy outside
    it (before, it decoded every Proxy's, twice: 10,000 at each urgent edit)."""
    stacks = {f"l{i}": "local" for i in range(3)} | {f"o{i}": "other" for i in range(5)}
    source = in_stacks(kube_client, namespace, make_source, stacks)
    wait_for(lambda: all(o.finalized for o in source.objects()))
    source.cache.take_fresh()
    merge(kube_client, path(namespace, "l0"), {"spec": {"port": 18999}})
    wait_for(lambda: getattr(source.object(f"{namespace}/l0"), "generation", 0) == 2)

    decoded: list[str] = []
    status = ProxyObject.__dict__["status"]  # the property

    def counted(obj: ProxyObject) -> dict[str, Any]:
        if threading.current_thread() is threading.main_thread():  # not the watch threads' reads
            decoded.append(obj.key)
        return status.fget(obj)

    monkeypatch.setattr(ProxyObject, "status", property(counted))
    urgent, lane = source.urgent(), source.lane()
    monkeypatch.undo()
    in_local = frozenset(f"{namespace}/l{i}" for i in range(3))
    assert urgent is not None
    assert lane is not None
    assert (urgent.keys, lane.keys) == (in_local, in_local)
    assert not set(decoded) - in_local, f"statuses decoded outside the lane: {sorted(set(decoded))}"
