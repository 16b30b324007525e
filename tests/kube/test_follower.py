"""A follower's inventory against a real kube-apiserver (service/kube/follower.py): it changes with the watch
events, judging only the Proxies that changed, and still comes out right for an invalid Proxy, a deletion,
a Secret that arrives late, what a former leader left in the inventory and a re-list after a watch gap.

The leader's part (status and credentials Secrets) is written here through the API as the leader writes it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiClient

from service.inventory import HealthState, Inventory, ProxyEndpoint
from service.kube.client import request_json
from service.kube.credentials import Credentials, CredentialsReader, CredentialsWriter
from service.kube.follower import FollowedInventory
from service.kube.lease import LeaseRecord, write_lease
from service.kube.refs import ProxyRef
from service.kube.settings import KubeSettings
from service.sources.kubernetes import FINALIZER, KubernetesSource, proxy_object
from tests.kube.apiserver import KubeApi, running_apiserver
from tests.kube.manifests import install_crds
from tests.kube.test_watch import compact_etcd

BASE = "/apis/crawl.example.com/v1alpha1"
ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "crds"
WAIT = 20.0


@dataclass
class Follower:
    api: ApiClient
    namespace: str
    source: KubernetesSource
    credentials: CredentialsReader
    inventory: Inventory
    followed: FollowedInventory

    def path(self, name: str) -> str:
        return f"{BASE}/namespaces/{self.namespace}/proxies/{name}"

    def create(self, name: str, *, auth: str = "none", port: int = 18500, **meta: Any) -> ProxyRef:
        body = {
            "apiVersion": "crawl.example.com/v1alpha1",
            "kind": "Proxy",
            "metadata": {"name": name, **meta},
            "spec": {
                "provider": "local",
                "port": port,
                "auth": {"mode": auth},
                "allowedSourceRanges": ["127.0.0.0/8"],
            },
        }
        made = request_json(self.api, "POST", f"{BASE}/namespaces/{self.namespace}/proxies", body=body)
        meta_out = made["metadata"]
        return ProxyRef(namespace=self.namespace, name=name, uid=meta_out["uid"], generation=1)

    def write_status(self, name: str, *, port: int, healthy: bool = True, egress: str = "10.0.0.1") -> None:
        """What the leader writes: where it serves, its stack, egress address and Healthy."""
        condition = {
            "type": "Healthy",
            "status": "True" if healthy else "False",
            "reason": "ProbeSucceeded" if healthy else "ProbeFailed",
            "message": "",
            "lastTransitionTime": "2026-12-02T00:00:00Z",
        }
        status = {
            "address": {"host": "127.0.0.1", "port": port},
            "stack": "local",
            "egressIP": egress,
            "conditions": [condition],
        }
        request_json(
            self.api,
            "PATCH",
            self.path(name) + "/status",
            body={"status": status},
            content_type="application/merge-patch+json",
        )

    def settle(self, check: Callable[[], bool], what: str) -> None:
        """Apply what the watch marked until `check` holds."""
        deadline = time.monotonic() + WAIT
        while True:
            while not self.followed.apply(budget=0.01):
                pass
            if check():
                return
            assert time.monotonic() < deadline, f"not reached: {what}"
            time.sleep(0.05)

    def port(self, name: str) -> int | None:
        endpoint = self.inventory.get(f"{self.namespace}/{name}")
        return None if endpoint is None else endpoint.port

    def state(self, name: str) -> HealthState:
        return self.inventory.health(f"{self.namespace}/{name}").state


@pytest.fixture
def follower(kube_client: ApiClient) -> Iterator[Follower]:
    with following(kube_client) as found:
        yield found


@contextmanager
def following(api: ApiClient) -> Iterator[Follower]:
    """A follower's inventory of a fresh namespace, wired as ClusterMode wires it, its watches running."""
    namespace = f"follow-{uuid.uuid4().hex[:8]}"
    request_json(api, "POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}})
    settings = KubeSettings(namespaces=[namespace], namespace=namespace)
    source = KubernetesSource(api, settings, writes=False)
    credentials = CredentialsReader(api, [namespace])
    inventory = Inventory()
    followed = FollowedInventory.attach(source=source, credentials=credentials, inventory=inventory)
    source.start()
    credentials.start()
    try:
        assert source.wait_synced(30), source.watch_errors()
        assert credentials.synced(30)
        yield Follower(api, namespace, source, credentials, inventory, followed)
    finally:
        source.stop()
        credentials.stop()


def test_the_inventory_follows_status_and_judges_only_what_changed(follower: Follower) -> None:
    for n in range(3):
        follower.create(f"p{n}")
        follower.write_status(f"p{n}", port=20000 + n)
    follower.create("unserved")  # no address yet: nothing to hand out
    follower.settle(lambda: all(follower.port(f"p{n}") == 20000 + n for n in range(3)), what="three served")
    assert follower.port("unserved") is None
    assert {follower.state(f"p{n}") for n in range(3)} == {HealthState.healthy}
    assert follower.inventory.loaded
    follower.settle(lambda: follower.source.object(f"{follower.namespace}/unserved") is not None, what="seen")
    time.sleep(0.3)  # the last event's mark follows its copy: judged before the count starts
    follower.followed.apply(budget=1.0)
    judged = follower.followed.judged
    follower.write_status("p1", port=20001, healthy=False, egress="10.0.0.9")
    follower.settle(lambda: follower.state("p1") is HealthState.unhealthy, what="p1 unhealthy")
    assert follower.followed.judged - judged == 1, "more than the changed Proxy was judged"
    assert follower.inventory.health(f"{follower.namespace}/p1").egress_ip == "10.0.0.9"
    assert follower.state("p0") is HealthState.healthy
    follower.write_status("p2", port=20099)
    follower.settle(lambda: follower.port("p2") == 20099, what="p2 at its new port")


def test_an_invalid_proxy_and_a_deletion_leave_the_inventory(follower: Follower) -> None:
    follower.create("bad")
    follower.write_status("bad", port=20010)
    follower.create("gone")
    follower.write_status("gone", port=20011)
    follower.create("leaving", finalizers=[FINALIZER])
    follower.write_status("leaving", port=20012)
    served = ("bad", "gone", "leaving")
    follower.settle(lambda: all(follower.port(n) for n in served), what="all three served")
    # The apiserver refuses what the model refuses (the CRD's rules agree with it): the event of an object
    # stored under a looser CRD is injected as the watch would deliver it.
    bad = request_json(follower.api, "GET", follower.path("bad"))
    bad["spec"]["port"] = 0
    follower.source.cache._proxy_event("MODIFIED", proxy_object(bad))
    request_json(follower.api, "DELETE", follower.path("gone"))
    request_json(follower.api, "DELETE", follower.path("leaving"))  # held by the finalizer: deleting
    follower.settle(lambda: not any(follower.port(n) for n in served), what="all three out")
    assert follower.source.object(f"{follower.namespace}/leaving") is not None, "the finalizer holds it"
    assert len(follower.inventory) == 0


def test_a_proxy_with_credentials_is_served_once_its_secret_arrives(follower: Follower) -> None:
    ref = follower.create("secret", auth="generated")
    follower.write_status("secret", port=20020)
    follower.settle(lambda: bool(_watched_address(follower, ref.key)), what="its status watched")
    time.sleep(0.3)  # its mark follows its copy: judged before the Secret comes
    follower.followed.apply(budget=1.0)
    assert follower.port("secret") is None, "served without its credentials: it would answer 407"
    credentials = Credentials(host="127.0.0.1", port=20020, protocol="http", username="u", password="pw")
    CredentialsWriter(follower.api).write(ref, credentials)
    follower.settle(lambda: follower.port("secret") == 20020, what="served with its Secret")
    endpoint = follower.inventory.get(ref.key)
    assert endpoint is not None
    assert endpoint.password == "pw"


def _watched_address(follower: Follower, key: str) -> dict[str, Any] | None:
    obj = follower.source.object(key)
    return None if obj is None else obj.status.get("address")


def test_a_new_follower_drops_what_its_term_published(follower: Follower) -> None:
    """At a step-down the inventory holds what the leader's own reporter published; `mark_all` (what
    ClusterMode does then) makes it what the cluster says."""
    follower.create("kept")
    follower.write_status("kept", port=20030)
    follower.settle(lambda: follower.port("kept") == 20030, what="kept served")
    ns = follower.namespace
    published = ProxyEndpoint(key=f"{ns}/own", namespace=ns, name="own", provider="local", host="h", port=1)
    follower.inventory.upsert(published)  # as the leader's reporter did: gone from the cluster since
    stale = ProxyEndpoint(key=f"{ns}/kept", namespace=ns, name="kept", provider="local", host="h", port=2)
    follower.inventory.upsert(stale)
    follower.followed.mark_all()
    follower.settle(lambda: follower.port("kept") == 20030, what="kept as the cluster says")
    assert follower.inventory.get(f"{ns}/own") is None


def test_a_long_pass_runs_in_slices_and_loads_the_inventory_at_its_end(follower: Follower) -> None:
    for n in range(5):
        follower.create(f"s{n}")
        follower.write_status(f"s{n}", port=20040 + n)
    deadline = time.monotonic() + WAIT
    while sum(1 for obj in follower.source.objects() if obj.status.get("address")) < 5:
        assert time.monotonic() < deadline, "the statuses were not watched"
        time.sleep(0.05)
    fresh = Inventory()
    followed = FollowedInventory(source=follower.source, credentials=follower.credentials, inventory=fresh)
    slices = 0
    while not followed.apply(budget=0.0):  # one Proxy a slice
        slices += 1
        assert fresh.loaded is False, "loaded before the pass over everything ended"
    assert slices >= 4
    assert fresh.loaded
    assert len(fresh) == 5


@pytest.mark.kube_tools  # starts its own kube-apiserver, without the watch cache
def test_a_relist_after_a_watch_gap_comes_out_right(tmp_path: Path) -> None:
    """The watch stops (a dropped connection); meanwhile one Proxy is deleted, one becomes unhealthy, one
    is created, and etcd's history is compacted: resuming answers 410 Gone, the list replaces the copy and
    names what changed, and the inventory follows it."""
    with running_apiserver(tmp_path, extra_args=("--watch-cache=false",)) as kube, kube.client() as api:
        install_crds(api, CRDS, cache_dir=tmp_path)
        with following(api) as follower:
            for name in ("a", "b"):
                follower.create(name)
                follower.write_status(name, port=20050 if name == "a" else 20051)
            follower.settle(lambda: bool(follower.port("a") and follower.port("b")), what="both served")
            (watcher,) = [w for w in follower.source.watchers if w.name.startswith("proxies")]
            lists = watcher.lists
            watcher.stop()
            request_json(api, "DELETE", follower.path("a"))
            follower.write_status("b", port=20051, healthy=False)
            follower.create("c")
            follower.write_status("c", port=20052)
            compact_etcd(kube.etcd_url)
            watcher._stop.clear()  # the same watcher resumes from its resourceVersion: compacted away
            watcher.start()
            try:
                follower.settle(lambda: follower.port("c") == 20052, what="c served after the re-list")
                assert watcher.lists == lists + 1, "no re-list: the gap was not a 410"
                assert follower.port("a") is None
                assert follower.state("b") is HealthState.unhealthy
            finally:
                watcher.stop()


def test_a_follower_serves_without_importing_the_engine_sdk(
    kube_api: KubeApi, follower: Follower, tmp_path: Path
) -> None:
    """`serve` as a follower (the Lease held by a leader that is not running), in a fresh interpreter,
    configured as in a pod (a ServiceAccount folder, no kubeconfig): it serves the leader's proxy and never
    imports the Pulumi SDK, gRPC or protobuf (issue 20: about 33 MiB of its RSS), nor the `kubernetes`
    package's kubeconfig loader, requests and oauthlib (6.5 MiB). A leader's CLI calls run in an engine host
    and load it there (tests/automation/test_engine_host.py)."""
    record = LeaseRecord.first("elsewhere", now=datetime.now(UTC), duration=600)
    write_lease(
        follower.api,
        namespace=follower.namespace,
        name="proxy-operator",
        current=None,
        record=record,
        timeout=10,
    )
    follower.create("p1", port=18531)
    follower.write_status("p1", port=18531)
    follower.settle(lambda: follower.port("p1") == 18531, "the leader's status watched")
    # configured as in a pod: a ServiceAccount folder and the kubelet's environment, no kubeconfig
    pod = kube_api.service_account(tmp_path / "serviceaccount", follower.namespace)
    args = [str(tmp_path / "serviceaccount"), follower.namespace, str(tmp_path / "state"), "6"]
    done = subprocess.run(
        [sys.executable, "-m", "tests.service.follower_modules", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **pod, "PYTHONPATH": str(ROOT)},
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["terms"] == 0, "it led: the Lease was not held"
    assert found["served"] == [f"{follower.namespace}/p1"], "not a working follower"
    assert found["loaded"] == [], f"a follower's import set regained {found['loaded']}"


def test_a_leader_keeps_no_marks_and_its_term_s_end_judges_the_changes_anyway(follower: Follower) -> None:
    """While a whole pass is due (a leader's term asks for one at its start and its end), a change is not
    kept as a mark (10,000 keys on a leader that never applies them); the pass judges it all the same."""
    follower.create("m")
    follower.write_status("m", port=20050)
    follower.settle(lambda: follower.port("m") == 20050, what="m served")
    follower.followed.mark("unrelated")  # pending from before the term
    follower.followed.mark_all()  # a term starts
    assert not follower.followed._pending  # the term's end takes every key again
    marked: list[str] = []  # keys whose mark has run (the watch marks after it updated its copy)
    mark = follower.source.cache.on_object

    def recording(key: str) -> None:
        mark(key)
        marked.append(key)

    follower.source.cache.on_object = recording
    follower.write_status("m", port=20051)
    key = f"{follower.namespace}/m"
    deadline = time.monotonic() + WAIT
    while key not in marked or (_watched_address(follower, key) or {}).get("port") != 20051:
        assert time.monotonic() < deadline, "the status was not watched and marked"
        time.sleep(0.05)
    assert not follower.followed._pending  # the watch's mark was made and not kept
    follower.followed.mark_all()  # the term ends
    follower.settle(lambda: follower.port("m") == 20051, what="m at its new port")
