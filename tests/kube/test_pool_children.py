"""A pool's children as the cluster's cache shows them, between a write and the watch event that shows it.

Offline: the cache is a list of `ProxyObject`s made here; the cluster run is test_pools_incluster.py.
"""

from __future__ import annotations

import random

from service.kube.pool_children import PENDING_SECONDS, ClusterChildren, child_body, retemplated
from service.pools.expand import new_child
from service.pools.naming import member_of
from service.sources.kubernetes import ProxyObject
from stacks.models import Proxy
from tests.pools.pools import pool

EU = pool("eu", replicas=2, placement=[{"provider": "a", "portBase": 18000}])


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


def child(name: str, *, port: int = 18000) -> Proxy:
    made = new_child(EU, "a", replaces=None, others=[], rng=random.Random(name), born=900.0)
    assert made is not None
    return made.model_copy(update={"metadata": made.metadata.model_copy(update={"name": name})}).model_copy(
        update={"spec": made.spec.model_copy(update={"port": port})}
    )


def obj(proxy: Proxy, *, deleting: bool = False) -> ProxyObject:
    body = proxy.model_dump(mode="json", by_alias=True, exclude_none=True, exclude={"status"})
    return ProxyObject(
        namespace=proxy.metadata.namespace,
        name=proxy.metadata.name,
        uid=proxy.metadata.uid or f"uid-{proxy.metadata.name}",
        generation=proxy.metadata.generation or 1,
        resource_version="1",
        deleting=deleting,
        finalized=True,
        body=body,
        status={},
    )


OWNERS = {f"crawl/{n}": ("eu", "u1") for n in ("eu-aaaaa", "eu-bbbbb")}
POOLS = {"crawl/eu": "u1"}


def refresh(kids: ClusterChildren, objects: list[ProxyObject]) -> list[str]:
    return kids.refresh(objects, owners=OWNERS, pools=POOLS)


def test_a_created_child_counts_until_the_cache_shows_it_and_not_twice() -> None:
    clock = Clock()
    kids = ClusterChildren(clock=clock)
    first = child("eu-aaaaa")
    refresh(kids, [])
    kids.created(first)
    assert [m.name for m in kids.members("crawl/eu")] == ["eu-aaaaa"], "counted before the watch shows it"
    refresh(kids, [obj(first)])
    assert [m.name for m in kids.members("crawl/eu")] == ["eu-aaaaa"], "counted once when it shows"


def test_a_created_child_no_event_ever_shows_stops_counting() -> None:
    clock = Clock()
    kids = ClusterChildren(clock=clock)
    kids.created(child("eu-aaaaa"))
    clock.now += PENDING_SECONDS + 1
    refresh(kids, [])
    assert kids.members("crawl/eu") == []


def test_a_deleted_child_leaves_at_once_keeps_its_port_and_is_reported_gone_at_the_end() -> None:
    kids = ClusterChildren(clock=Clock())
    one, two = child("eu-aaaaa", port=18000), child("eu-bbbbb", port=18001)
    refresh(kids, [obj(one), obj(two)])
    kids.deleted(one.key)
    refresh(kids, [obj(one), obj(two)])  # the cache does not show the deletion yet
    assert [m.name for m in kids.members("crawl/eu")] == ["eu-bbbbb"]
    assert {m.proxy.spec.port for m in kids.all()} == {18000, 18001}, "a leaving child's port stays taken"
    refresh(kids, [obj(one, deleting=True), obj(two)])
    assert [m.name for m in kids.members("crawl/eu")] == ["eu-bbbbb"]
    assert refresh(kids, [obj(two)]) == [one.key], "gone: its signals can be forgotten"


def test_the_body_is_owned_by_the_pool_and_a_template_edit_is_a_patch() -> None:
    proxy = child("eu-aaaaa")
    owner = {"kind": "ProxyPool", "name": "eu", "uid": "u1", "controller": True}
    body = child_body(proxy, owner=owner)
    assert body["metadata"]["ownerReferences"] == [owner]
    assert body["metadata"]["labels"] == proxy.metadata.labels
    member = member_of(Proxy.model_validate(body))
    assert member is not None
    assert retemplated(EU, member, body) is None, "unchanged template: no write"
    edited = pool(
        "eu",
        replicas=2,
        placement=[{"provider": "a", "portBase": 18000}],
        template_spec={"protocol": "socks5"},
    )
    patch = retemplated(edited, member, body)
    assert patch is not None
    assert patch["spec"]["protocol"] == "socks5"
    assert "port" not in patch["spec"], "the child keeps its port"


def test_a_proxy_with_the_label_but_not_owned_by_the_pool_is_a_stranger() -> None:
    kids = ClusterChildren(clock=Clock())
    mine, owned, old = child("eu-mine0"), child("eu-aaaaa"), child("eu-bbbbb", port=18001)
    owners = {owned.key: ("eu", "u1"), old.key: ("eu", "u0")}  # eu-bbbbb: a pool of that name before
    kids.refresh([obj(mine), obj(owned), obj(old)], owners=owners, pools=POOLS)
    assert [m.name for m in kids.members("crawl/eu")] == ["eu-aaaaa"]
    assert kids.strangers == {mine.key: "crawl/eu", old.key: "crawl/eu"}
    assert len(kids.all()) == 3, "a stranger's name and port stay taken for new children"


def test_each_refresh_validates_only_the_bodies_that_changed() -> None:
    """The leader refreshes every pass (every second): an unchanged child is not validated again, a
    changed one is, and its new body is what counts."""
    kids = ClusterChildren(clock=Clock())
    one, two = child("eu-aaaaa", port=18000), child("eu-bbbbb", port=18001)
    refresh(kids, [obj(one), obj(two)])
    assert kids.validated == 2
    refresh(kids, [obj(one), obj(two)])
    assert kids.validated == 2, "unchanged children were validated again"
    moved = two.model_copy(update={"spec": two.spec.model_copy(update={"port": 18009})})
    refresh(kids, [obj(one), obj(moved)])
    assert kids.validated == 3
    assert {m.proxy.spec.port for m in kids.members("crawl/eu")} == {18000, 18009}
    refresh(kids, [obj(one)])
    refresh(kids, [obj(one), obj(moved)])  # gone from the cache, then back: judged again
    assert kids.validated == 4


def test_a_child_made_again_under_its_name_is_judged_again() -> None:
    """Deleted and made again between two refreshes, with the same spec and labels: only its uid and
    generation differ, which the watched copy keeps beside its body's text (not in it)."""
    kids = ClusterChildren(clock=Clock())
    first = child("eu-aaaaa")
    first = first.model_copy(update={"metadata": first.metadata.model_copy(update={"uid": "u-1"})})
    refresh(kids, [obj(first)])
    again = first.model_copy(update={"metadata": first.metadata.model_copy(update={"uid": "u-2"})})
    refresh(kids, [obj(again)])
    assert kids.validated == 2
    assert [m.proxy.metadata.uid for m in kids.members("crawl/eu")] == ["u-2"]
    later = again.model_copy(update={"metadata": again.metadata.model_copy(update={"generation": 5})})
    refresh(kids, [obj(later)])
    assert [m.proxy.metadata.generation for m in kids.members("crawl/eu")] == [5]
