"""`preview` shows a pool's expansion: the children it would create (names, placements), keep and delete."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from service.cli import app
from service.pools.expand import child_proxy
from service.pools.preview import declared, expand_for_preview
from service.sources.directory import DirectorySource
from stacks.models import Proxy, ProxyPool
from tests.conftest import PulumiEnv

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pools"


def applied_children(count: int) -> list[Proxy]:
    """`count` children of examples/pools' pool as a backend would echo them, all on local-a."""
    source = DirectorySource(EXAMPLE)
    source.poll()
    assert source.manifest_set is not None
    [located] = source.manifest_set.pools
    pool: ProxyPool = located.obj
    placement = pool.spec.placement[0]
    return [
        child_proxy(pool, placement, name=f"eu-old{i}", born=1000.0 + i, port=18101 + i, replaces=None)
        for i in range(count)
    ]


def test_an_applied_pool_keeps_its_children_and_shows_only_the_difference() -> None:
    """7 applied on local-a, 6 wanted over two placements: local-a keeps its 3 newest (scale-down takes the
    oldest), local-b gets 3 new."""
    pooled, change, [pool] = expand_for_preview(DirectorySource(EXAMPLE), applied=applied_children(7))
    assert (pool.pool, pool.desired) == ("crawl/eu", 6)
    by_change = {
        c: [(x.name, x.placement) for x in pool.children if x.change == c]
        for c in ("keep", "create", "delete")
    }
    assert by_change["keep"] == [("eu-old4", "local-a"), ("eu-old5", "local-a"), ("eu-old6", "local-a")]
    assert [p for _, p in by_change["create"]] == ["local-b"] * 3
    assert sorted(n for n, _ in by_change["delete"]) == ["eu-old0", "eu-old1", "eu-old2", "eu-old3"]
    names = {p.metadata.name for p in declared(pooled)}
    assert names == {n for n, _ in by_change["keep"] + by_change["create"]}, "deleted children are absent"
    assert change.complete


@pytest.mark.engine
def test_preview_lists_the_children_a_pool_would_create(pulumi_env: PulumiEnv, tmp_path: Path) -> None:
    state = ["--state-dir", str(tmp_path / "state")]
    text = CliRunner().invoke(app, ["preview", "--manifests", str(EXAMPLE), *state])
    assert text.exit_code == 0, text.output
    assert "pool crawl/eu: 6 desired; 6 to create" in text.stdout
    rows = re.findall(r"^\s+\+\s+create\s+(eu-[a-z0-9]{5})\s+(local-[ab])$", text.stdout, re.MULTILINE)
    assert sorted(p for _, p in rows) == ["local-a"] * 3 + ["local-b"] * 3
    for name, placement in rows:  # the same children in the stacks' previews
        assert re.search(
            rf"stack {placement}: up\n(?:  .*\n)*?  \+\s+create\s+crawl/{name}\n", text.stdout
        ), name

    markdown = CliRunner().invoke(app, ["preview", "--manifests", str(EXAMPLE), *state, "--markdown"])
    assert markdown.exit_code == 0, markdown.output
    assert "**Pools**" in markdown.stdout
    assert "- `crawl/eu`: 6 desired; 6 to create" in markdown.stdout
    assert (
        len(re.findall(r"^  - create `eu-[a-z0-9]{5}` on `local-[ab]`$", markdown.stdout, re.MULTILINE)) == 6
    )

    report = json.loads(
        CliRunner().invoke(app, ["preview", "--manifests", str(EXAMPLE), *state, "--json"]).stdout
    )
    [pool] = report["pools"]
    assert {c["change"] for c in pool["children"]} == {"create"}
    assert report["totals"]["create"] == 6


@pytest.mark.parametrize("kind", ["ProxyPools", "proxypool", "ProxyPol", "Proxypool"])
def test_a_misspelt_pool_kind_deletes_none_of_its_children(tmp_path: Path, kind: str) -> None:
    """A pool whose kind is misspelt used to read as "pool removed" from a complete read: every child went."""
    manifests = tmp_path / "m"
    shutil.copytree(EXAMPLE, manifests)
    path = manifests / "pool.yaml"
    path.write_text(path.read_text().replace("kind: ProxyPool", f"kind: {kind}"))
    applied = applied_children(6)
    pooled, change, pools = expand_for_preview(DirectorySource(manifests), applied=applied)
    assert change.deletions == [], "a misspelt ProxyPool is not a removed ProxyPool"
    assert not change.complete
    assert any('did you mean "ProxyPool"?' in p.message for p in change.problems)
    assert {p.key for p in declared(pooled)} == {p.key for p in applied}, "every child is kept"
    assert pools == []
