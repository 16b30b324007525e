"""Folder mode: a hand-written Proxy document carrying a pool's label is the folder's, not the pool's.

The pool generated no such document (its children live in the backend only), so a Proxy the folder declares
is never taken as a child, even when the backend's applied proxies (`track()` after a restart) show it with
the pool label: it is not re-templated, not deleted and not counted. No engine: a real DirectorySource on a
temporary folder, driven as the controller drives it at start (poll, track what the backend applied, poll).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from service.pools.naming import POOL_LABEL
from service.pools.wiring import pooled_directory
from service.sources.directory import DirectorySource
from stacks.models import Proxy
from tests.pools.pools import pool_doc


def test_a_hand_written_proxy_with_a_pool_label_is_left_alone(tmp_path: Path) -> None:
    catalogue = {"providers": [{"name": "a", "type": "local", "stateDir": str(tmp_path / "state")}]}
    (tmp_path / "catalogue.yaml").write_text(yaml.safe_dump(catalogue))
    (tmp_path / "pool.yaml").write_text(yaml.safe_dump(pool_doc(replicas=0, providers=("a",))))
    mine = {
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": "mine", "namespace": "crawl", "labels": {POOL_LABEL: "eu", "team": "me"}},
        "spec": {"provider": "a", "port": 3999, "allowedSourceRanges": ["10.0.0.0/8"]},
    }
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(mine))
    source = pooled_directory(DirectorySource(tmp_path), inventory=None)
    first = source.poll()
    source.track([Proxy.model_validate(mine)])  # the backend applied it: a restart
    changes = [first, source.poll(), source.poll()]
    assert [m.name for m in source.children("crawl/eu")] == [], "not counted as the pool's"
    assert not any(p.key == "crawl/mine" for c in changes for p in c.deletions), "never deleted"
    for change in changes:
        for proxy in change.upserts:
            if proxy.key == "crawl/mine":
                assert proxy.spec.port == 3999, "never re-templated"
                assert proxy.spec.allowed_source_ranges == ["10.0.0.0/8"]
    assert any(p.key == "crawl/mine" for p in source.proxies())
