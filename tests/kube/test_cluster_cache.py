"""The watched copy (service/kube/cluster_cache.py): what a lane reads of each Proxy without decoding its
status (`ProxyObject.stack` and `observed_generation`, the cache's index by stack) agrees with the decoded
status through any run of watch events and lists.

Offline: the watch threads are not started; the callbacks they call are fed here.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes.client import ApiClient

from service.kube.cluster_cache import ClusterCache
from service.kube.proxy_object import ProxyObject, proxy_object
from service.kube.settings import KubeSettings

SHARED_MACHINE = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])  # no timings asserted
NS = "ns"
PATH = f"/apis/crawl.example.com/v1alpha1/namespaces/{NS}/proxies"
NAMES = st.sampled_from(["p0", "p1", "p2", "p3"])
STACKS = ("a", "b", "c")
GENERATION = st.integers(1, 3)
# A status as the watch reads it: its stack and observed generation present or not, and (though the CRD's
# types rule them out) of another type.
STATUS = st.fixed_dictionaries(
    {},
    optional={
        "stack": st.sampled_from(["a", "b", 7]),
        "observedGeneration": st.sampled_from([1, 2, 3, "2", True]),
        "egressIP": st.just("10.0.0.1"),
    },
)
EVENT = st.tuples(
    st.just("event"), st.sampled_from(["ADDED", "MODIFIED", "DELETED"]), NAMES, GENERATION, STATUS
)
LIST = st.tuples(st.just("list"), st.dictionaries(NAMES, st.tuples(GENERATION, STATUS), max_size=4))
STEPS = st.lists(st.one_of(EVENT, LIST), max_size=25)


def watched(name: str, generation: int, status: dict[str, Any]) -> ProxyObject:
    raw = {
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "generation": generation},
        "spec": {"provider": "a", "port": 1},
        "status": status,
    }
    return proxy_object(raw)


def assert_agrees(cache: ClusterCache) -> None:
    objects = cache.objects()
    for obj in objects:
        status = obj.status
        stack, observed = status.get("stack"), status.get("observedGeneration")
        assert obj.stack == (stack if isinstance(stack, str) else None)
        assert obj.observed_generation == (observed if type(observed) is int else None)
    for stack in STACKS:
        decoded = {obj.key for obj in objects if obj.status.get("stack") == stack}
        assert cache.keys_in_stacks({stack}) == decoded, stack
    assert cache.keys_in_stacks(STACKS) == {obj.key for obj in objects if obj.status.get("stack") in STACKS}
    assert cache._by_stack is not None
    assert all(cache._by_stack.values()), "an emptied stack's set was kept"


@SHARED_MACHINE
@given(steps=STEPS, asked_from=st.integers(0, 25))
def test_the_stack_index_agrees_with_the_decoded_statuses(steps: list[Any], asked_from: int) -> None:
    """Adds, status changes, replacements, lists and removals; the index is made when a lane first asks
    (`asked_from`: at any point of the run) and kept from then on. Until then there is none (a follower's
    cache, asked nothing, keeps none)."""
    cache = ClusterCache(ApiClient(), KubeSettings(namespaces=[NS], namespace=NS))
    listed = cache._proxy_lister(PATH)
    for n, step in enumerate(steps):
        if step[0] == "list":
            listed([watched(name, generation, status) for name, (generation, status) in step[1].items()])
        else:
            _, kind, name, generation, status = step
            cache._proxy_event(kind, watched(name, generation, status))
        if n >= asked_from:
            assert_agrees(cache)
        else:
            assert cache._by_stack is None, "an index made before anyone asked"
    assert_agrees(cache)


def test_a_proxys_uid_stays_one_string_across_its_watched_copies() -> None:
    """The writers key what they wrote by uid: each status write read back makes a new watched copy, whose
    uid must be the string they already hold, not an equal one (85 bytes a proxy at 10,000)."""
    cache = ClusterCache(ApiClient(), KubeSettings(namespaces=[NS], namespace=NS))
    cache._proxy_event("ADDED", watched("p0", 1, {}))
    first = cache.objects()[0].uid
    again = watched("p0", 1, {"stack": "a"})
    assert again.uid == first
    assert again.uid is not first  # decoded again: an equal string of its own
    cache._proxy_event("MODIFIED", again)
    assert cache.objects()[0].uid is first
    cache._proxy_lister(PATH)([watched("p0", 2, {"stack": "b"})])
    assert cache.objects()[0].uid is first
    cache._proxy_event("DELETED", watched("p0", 2, {}))
    renewed = watched("p0", 1, {})
    renewed.uid = "uid-p0-new"
    cache._proxy_event("ADDED", renewed)
    assert cache.objects()[0].uid == "uid-p0-new", "another Proxy of the same name: its own uid"
