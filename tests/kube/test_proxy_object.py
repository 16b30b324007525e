"""ProxyObject (service/kube/proxy_object.py): the compact body, which leaves out what the object keeps as
fields, decodes to the body it was given after a JSON round trip, and compares as that body does.

Offline: no API server.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from service.kube.proxy_object import ProxyObject, _version, proxy_object, slim_proxy
from stacks.compact import PROXY_PACKER
from stacks.models import API_VERSION, KIND
from tests.stacks.test_crd import example_proxies

EXAMPLES = example_proxies()
SHARED_MACHINE = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])  # no timings asserted
TEXT = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-._/", min_size=1, max_size=20)
LABELS = st.dictionaries(TEXT, st.text(max_size=20), max_size=3)
CONDITION = st.fixed_dictionaries(
    {"type": st.sampled_from(["Healthy", "Ready", "Stalled"]), "status": st.sampled_from(["True", "False"])},
    optional={
        "reason": st.sampled_from(["ProbeSucceeded", "ProbeFailed", "Reconciled"]),
        "message": st.text(max_size=300),  # any text: a probe's error, in any script
        "lastTransitionTime": st.just("2026-12-04T15:31:28.240721Z"),
        "observedGeneration": st.integers(0, 2**40),
    },
)
STATUS = st.fixed_dictionaries(
    {"address": st.fixed_dictionaries({"host": st.just("127.0.0.1"), "port": st.integers(1, 65535)})},
    optional={
        "stack": TEXT,
        "egressIP": st.just("10.0.0.1"),
        "phase": st.just("Ready"),
        "conditions": st.lists(CONDITION, max_size=3),
    },
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=12,
)


@st.composite
def raw_proxies(draw: st.DrawFn) -> dict[str, Any]:
    """An example manifest as the watch reads it: drawn metadata (each identity field there or not, empty or
    drawn labels and annotations, a deletion timestamp, finalizers, managedFields) and status."""
    document = copy.deepcopy(draw(st.sampled_from(EXAMPLES)))
    meta = document["metadata"]
    meta["name"] = draw(TEXT)
    for key, values in (
        ("namespace", TEXT),
        ("uid", st.uuids().map(str)),
        ("generation", st.integers(0, 2**40)),
        ("resourceVersion", st.integers(1, 2**40).map(str)),
        ("deletionTimestamp", st.just("2026-12-04T00:00:00Z")),
        ("finalizers", st.lists(st.sampled_from(["crawl.example.com/cleanup", "other/one"]), max_size=2)),
        ("labels", LABELS),
        ("annotations", st.dictionaries(TEXT.map(lambda k: f"crawl.example.com/{k}"), TEXT, max_size=2)),
    ):
        if draw(st.booleans()):
            meta[key] = draw(values)
        else:
            meta.pop(key, None)
    meta["managedFields"] = [{"manager": "kubectl", "operation": "Update"}]
    if draw(st.booleans()):
        document["status"] = draw(STATUS)
    return document


def decoded_before(raw: dict[str, Any]) -> dict[str, Any]:
    """The body as `ProxyObject.body` gave it before the compact form: the whole body's sorted JSON text."""
    obj = slim_proxy(raw)
    meta = {k: v for k, v in obj["metadata"].items() if k not in ("resourceVersion", "finalizers")}
    body = {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "spec": obj["spec"]}
    return dict(json.loads(json.dumps(body, separators=(",", ":"), sort_keys=True)))


def in_order(obj: Any) -> str:
    """Its JSON text with the keys as they are ordered: equal dicts in another order give another text."""
    return json.dumps(obj)


@SHARED_MACHINE
@given(raw=raw_proxies())
def test_the_watched_copy_decodes_to_the_body_it_was_given(raw: dict[str, Any]) -> None:
    obj = proxy_object(raw)
    expected = decoded_before(raw)
    assert obj.body == expected
    assert in_order(obj.body) == in_order(expected), "the keys in the same (sorted) order as before"
    assert obj.annotations == expected["metadata"]["annotations"]
    assert obj.body is not obj.body, "every caller gets its own copy"


def test_a_plain_proxys_text_holds_none_of_what_the_object_keeps() -> None:
    raw = copy.deepcopy(EXAMPLES[0])
    raw["metadata"].update(namespace="crawl", uid="0000-uid", generation=3, labels={}, annotations={})
    obj = proxy_object(raw)
    for kept in ("crawl", "0000-uid", API_VERSION, KIND, raw["metadata"]["name"], "generation", "labels"):
        assert kept.encode() not in PROXY_PACKER.unpack(obj._body)
    assert obj.body == decoded_before(raw)


@st.composite
def bodies(draw: st.DrawFn) -> dict[str, Any]:
    """A body given to ProxyObject directly, its identity fields equal to the object's or not, or missing,
    or of another JSON type (a bool for the generation)."""
    body: dict[str, Any] = {"spec": {"port": draw(st.integers(1, 65535))}}
    if draw(st.booleans()):
        body["apiVersion"] = draw(st.sampled_from([API_VERSION, "crawl.example.com/v1", None]))
    if draw(st.booleans()):
        body["kind"] = draw(st.sampled_from([KIND, "ProxyPool"]))
    if draw(st.booleans()):
        return body
    meta: dict[str, Any] = {}
    for key, values in (
        ("name", st.sampled_from(["p1", "p2"])),
        ("namespace", st.sampled_from(["ns", "other", None])),
        ("uid", st.sampled_from(["u1", "u2"])),
        ("generation", st.sampled_from([1, 2, True, 1.0, "1"])),
        ("labels", st.sampled_from([{}, {"a": "b"}, None, []])),
        ("annotations", st.sampled_from([{}, {"crawl.example.com/x": "y"}])),
    ):
        if draw(st.booleans()):
            meta[key] = draw(values)
    body["metadata"] = meta
    return body


def made(body: dict[str, Any], *, name: str = "p1", uid: str = "u1", generation: int = 1) -> ProxyObject:
    return ProxyObject(
        namespace="ns",
        name=name,
        uid=uid,
        generation=generation,
        resource_version="7",
        deleting=False,
        finalized=True,
        body=body,
        status={},
    )


@SHARED_MACHINE
@given(body=bodies(), name=st.sampled_from(["p1", "p2"]), generation=st.sampled_from([1, 2]))
def test_any_body_given_decodes_as_its_json_round_trip(
    body: dict[str, Any], name: str, generation: int
) -> None:
    expected = json.loads(json.dumps(body, sort_keys=True))
    obj = made(body, name=name, generation=generation)
    assert obj.body == expected
    assert in_order(obj.body) == in_order(expected)


@st.composite
def body_pairs(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two bodies: the same one (which two objects of other identities may leave other parts out of), or
    two drawn apart."""
    first = draw(bodies())
    return first, copy.deepcopy(first) if draw(st.booleans()) else draw(bodies())


@SHARED_MACHINE
@given(
    pair=body_pairs(),
    uids=st.tuples(st.sampled_from(["u1", "u2"]), st.sampled_from(["u1", "u2"])),
    generations=st.tuples(st.sampled_from([1, 2]), st.sampled_from([1, 2])),
)
def test_two_copies_have_the_same_body_exactly_when_their_bodies_are_equal(
    pair: tuple[dict[str, Any], dict[str, Any]], uids: tuple[str, str], generations: tuple[int, int]
) -> None:
    first = made(pair[0], uid=uids[0], generation=generations[0])
    second = made(pair[1], uid=uids[1], generation=generations[1])
    same = first.body == second.body and in_order(first.body) == in_order(second.body)
    assert first.same_body(second) is same
    assert first.same_reconciled_parts(second) is same


@SHARED_MACHINE
@given(raw=raw_proxies(), change=st.sampled_from(["uid", "generation", "labels", "spec", "status", "none"]))
def test_a_watched_change_touches_the_reconciled_parts_exactly_when_the_body_changed(
    raw: dict[str, Any], change: str
) -> None:
    """A new copy of the same Proxy (as a watch event brings it): the identity fields are changed too,
    which the compact text does not hold."""
    changed = copy.deepcopy(raw)
    meta = changed["metadata"]
    if change == "uid":
        meta["uid"] = meta.get("uid", "") + "-new"
    elif change == "generation":
        meta["generation"] = meta.get("generation", 0) + 1
    elif change == "labels":
        meta["labels"] = {**meta.get("labels", {}), "new": "label"}
    elif change == "spec":
        changed["spec"]["port"] = changed["spec"].get("port", 0) + 1
    elif change == "status":
        changed["status"] = {"address": {"host": "10.9.9.9", "port": 1}}
    before, after = proxy_object(raw), proxy_object(changed)
    body_changed = change not in ("status", "none")
    assert before.same_body(after) is not body_changed
    assert before.same_reconciled_parts(after) is not body_changed
    assert (before.body == after.body) is not body_changed


def round_trip(obj: Any) -> Any:
    return json.loads(json.dumps(obj, separators=(",", ":"), sort_keys=True))


@SHARED_MACHINE
@given(raw=raw_proxies())
def test_the_watched_copy_gives_back_the_slim_status(raw: dict[str, Any]) -> None:
    """The status is kept deflated: what it gives back is the slimmed status's JSON round trip, as before."""
    obj = proxy_object(raw)
    expected = round_trip(slim_proxy(raw)["status"])
    assert obj.status == expected
    assert in_order(obj.status) == in_order(expected)


@SHARED_MACHINE
@given(
    first=st.dictionaries(st.text(max_size=8), JSON, max_size=4),
    second=st.dictionaries(st.text(max_size=8), JSON, max_size=4),
)
def test_any_status_round_trips_and_two_copies_differ_exactly_when_their_statuses_do(
    first: dict[str, Any], second: dict[str, Any]
) -> None:
    """Any JSON a status may hold; the cluster cache tells a status change from none by the copies'
    equality (a follower judges the Proxy again)."""
    a = ProxyObject(**{**FIELDS, "status": first})
    b = ProxyObject(**{**FIELDS, "status": second})
    assert a.status == round_trip(first)
    assert (a == b) is (json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True))
    assert a == ProxyObject(**{**FIELDS, "status": copy.deepcopy(first)})


FIELDS: dict[str, Any] = {
    "namespace": "ns",
    "name": "p1",
    "uid": "u1",
    "generation": 1,
    "resource_version": "7",
    "deleting": False,
    "finalized": True,
    "body": {"spec": {"port": 1}},
}


@given(a=st.one_of(st.text(max_size=8), st.integers(0, 10**20).map(str)), b=st.text(max_size=8))
@example(a="7", b="07")
@example(a="١٢", b="12")  # other scripts' digits stay text
def test_resource_versions_kept_as_ints_compare_as_their_texts(a: str, b: str) -> None:
    """A watched copy keeps its resourceVersion as an int when the text is one's: two copies still compare
    equal exactly when their versions' texts are equal."""
    assert (_version(a) == _version(b)) is (a == b)
    assert str(_version(a)) == a
