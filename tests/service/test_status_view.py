"""A follower's status: each Proxy's status as written in the cluster, read by role with the leader's board.

The cluster side is fed the raw objects a watch reads (here made by hand: the in-cluster test,
tests/kube/test_incluster_summary.py, feeds it from a real apiserver)."""

from __future__ import annotations

from typing import Any

from service.status import StatusBoard
from service.status_view import ClusterStatus, ReplicaStatus, pack_status_json


def raw(name: str, *, phase: str, reason: str, spec_hash: str = "abc") -> dict[str, Any]:
    return {
        "metadata": {"namespace": "crawl", "name": name, "resourceVersion": "1"},
        "status": {
            "phase": phase,
            "observedSpecHash": spec_hash,
            "conditions": [
                {"type": "Held", "status": "True", "reason": reason, "message": "why"},
                {"type": "Ready", "status": "False", "reason": reason, "message": "why"},
            ],
            "lastOperation": {"type": "up", "result": "succeeded"},
        },
    }


def test_the_cluster_status_is_kept_as_written_and_tells_only_changes() -> None:
    cluster = ClusterStatus()
    told: list[str] = []
    cluster.subscribe(told.append)
    cluster.observe(raw("a", phase="Held", reason="DeletionHeld"))
    cluster.observe(raw("a", phase="Held", reason="DeletionHeld"))  # the same again: no news
    status = cluster.published("crawl/a")
    assert status is not None
    assert (status.phase, status.observed_spec_hash) == ("Held", "abc")
    assert [c.reason for c in status.conditions if c.type == "Ready"] == ["DeletionHeld"]
    assert set(cluster.held()) == {"crawl/a"}
    assert told == ["crawl/a"]
    cluster.observe(raw("b", phase="Ready", reason="Ready"))
    cluster.keep_only(["crawl/b"])
    assert cluster.published("crawl/a") is None
    assert told == ["crawl/a", "crawl/b", "crawl/a"]
    cluster.observe({"metadata": {"namespace": "crawl", "name": "b"}})  # its status went away
    assert not cluster.has("crawl/b")


def test_a_replica_reads_its_board_while_it_leads_and_the_cluster_otherwise() -> None:
    own, cluster = StatusBoard(), ClusterStatus()
    leading = [False]
    view = ReplicaStatus(own=own, cluster=cluster, leading=lambda: leading[0])
    told: list[str] = []
    view.subscribe(told.append)
    cluster.observe(raw("a", phase="Held", reason="DeletionHeld"))
    own.set_condition("crawl/z", type_="Provisioned", true=True, reason="Provisioned")  # not shown now
    assert view.tracked() == ["crawl/a"]
    assert told == ["crawl/a"]
    leading[0] = True
    view.switched()
    assert view.tracked() == ["crawl/z"]
    assert sorted(told[1:]) == ["crawl/a", "crawl/z"]  # every key reads differently now
    assert view.published("crawl/a") is None


def test_a_status_read_back_keeps_one_copy_shared_with_its_writer() -> None:
    """The leader's status writer and the watch's copy hold one packed copy of a status the writer wrote and
    the watch read back (service/incluster.py joins them): the same content, whatever its key order."""
    written: dict[str, bytes] = {}
    cluster = ClusterStatus()
    cluster.share = lambda key, packed: written[key] if written.get(key) == packed else packed
    doc = raw("a", phase="Ready", reason="AsDeclared")
    written["crawl/a"] = pack_status_json(dict(reversed(list(doc["status"].items()))))
    cluster.observe(doc)
    assert cluster.packed("crawl/a") is written["crawl/a"]
    assert cluster.raw("crawl/a") == doc["status"]
    other = raw("b", phase="Held", reason="DeletionHeld")
    cluster.observe(other)  # not what was written: its own copy
    assert cluster.packed("crawl/b") is not None
    assert cluster.raw("crawl/b") == other["status"]
