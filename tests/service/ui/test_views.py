"""The views without a browser: the index refreshes only what changed; filter, sort and pages; the held
deletion with the one command that allows it; links under the root path."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from automation.deletion_budget import DeletionBudget, HeldDeletion
from service.api.deps import ApiContext
from service.api.metrics import ApiMetrics
from service.auth import TokenAuthenticator
from service.discovery.memory import MemoryStore
from service.discovery.service import DiscoveryService
from service.inventory import Health, HealthState
from service.pools.history import PoolHistory
from service.settings import DiscoverySettings
from service.status import StatusBoard
from service.ui.context import Forgotten, HeldView
from service.ui.fleet import FleetQuery, render_fleet, select
from service.ui.index import FleetIndex, Row
from service.ui.pools import render_pools
from service.ui.probes import ProbeHistory, chart
from service.ui.sources import held_deletion
from service.ui.views import LeaseRates, render_deletions, render_leases, render_proxy
from stacks.models import Condition, ProxyPoolStatus
from tests.service.conftest import healthy_inventory


@dataclass
class Gate:
    held_deletion: HeldDeletion | None
    budget: DeletionBudget = field(default_factory=DeletionBudget)

    def allow_deletions(self, change_id: str) -> bool:
        return False


def _context(names: list[str], **extra: Any) -> ApiContext:
    inventory = healthy_inventory(names, **extra)
    registry = CollectorRegistry()
    return ApiContext(
        inventory=inventory,
        discovery=DiscoveryService(inventory=inventory, store=MemoryStore(), settings=DiscoverySettings()),
        authenticator=TokenAuthenticator([]),
        registry=registry,
        metrics=ApiMetrics(registry),
        status=StatusBoard(),
    )


def test_the_index_decodes_only_the_statuses_that_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = _context([f"p{i}" for i in range(200)])
    board = ctx.status
    assert board is not None
    for i in range(200):
        board.set_condition(f"default/p{i}", type_="Provisioned", true=True, reason="Provisioned")
    index = FleetIndex(inventory=ctx.inventory, board=board)
    assert len(index.rows()) == 200
    decoded: list[str] = []
    published = board.published
    monkeypatch.setattr(board, "published", lambda key: decoded.append(key) or published(key))
    board.set_condition("default/p7", type_="Healthy", true=False, reason="ProbeFailed", message="refused")
    rows = {r.key: r for r in index.rows()}
    assert decoded == ["default/p7"]
    assert (rows["default/p7"].phase, rows["default/p7"].ready) == ("Degraded", False)
    index.rows()
    assert decoded == ["default/p7"]  # nothing changed since: nothing decoded


def test_before_its_first_read_the_index_marks_nothing_then_builds_every_row_as_it_is() -> None:
    ctx = _context(["p0", "p1"])
    board = ctx.status
    assert board is not None
    index = FleetIndex(inventory=ctx.inventory, board=board)
    for key in ("default/p0", "default/p1"):
        board.set_condition(key, type_="Provisioned", true=True, reason="Provisioned")
    board.set_condition("default/p0", type_="Healthy", true=False, reason="ProbeFailed", message="refused")
    board.set_condition("default/stalled", type_="Provisioned", true=False, reason="UnknownProvider")
    assert not index._dirty  # a page nobody opened keeps no marks (10,000 keys: 0.5 MiB)
    rows = {r.key: r for r in index.rows()}
    assert (rows["default/p0"].phase, rows["default/p0"].ready) == ("Degraded", False)
    assert "default/stalled" in rows  # a status and no endpoint: found through the board
    board.set_condition("default/p1", type_="Healthy", true=False, reason="ProbeFailed", message="refused")
    assert index._dirty == {"default/p1"}  # read once: changes are marked from then on
    assert {r.key: r.phase for r in index.rows()}["default/p1"] == "Degraded"


def test_a_row_counts_the_sticky_sessions_bound_to_its_proxy() -> None:
    ctx = _context(["a", "b"])
    store = ctx.discovery.store

    async def render() -> str:
        now = time.time()
        for session in ("s1", "s2"):
            await store.bind_session(client="crawler", session=session, proxy="default/a", now=now, idle=60)
        rows = FleetIndex(inventory=ctx.inventory, board=None).rows()
        return await render_fleet(ctx, rows, FleetQuery(sort="key"), root="", size=50)

    html = asyncio.run(render())
    row_a, row_b = html.split('href="/proxy/default/a"')[1], html.split('href="/proxy/default/b"')[1]
    assert "2 sticky sessions" in row_a.split("</tr>")[0]
    assert "sticky" not in row_b.split("</tr>")[0]


def test_filter_sort_and_pages() -> None:
    ctx = _context([f"p{i:03}" for i in range(120)])
    rows = FleetIndex(inventory=ctx.inventory, board=None).rows()
    assert len(select(rows, FleetQuery(text="p01"))) == 10
    assert select(rows, FleetQuery(pool="other")) == []
    assert select(rows, FleetQuery(sort="key"))[0].key == "default/p000"
    html = asyncio.run(render_fleet(ctx, rows, FleetQuery(page=3), root="/ops", size=50))
    assert html.count("<tr>") == 1 + 20  # the header and the last 20
    assert 'href="/ops/?page=2"' in html
    assert 'href="/ops/proxy/default/p100"' in html
    assert "p@ss word" not in html


def test_a_held_deletion_shows_its_id_and_the_exact_ways_to_allow_it() -> None:
    ctx = _context(["a"])
    gate = Gate(HeldDeletion(change_id="c0ffee12", keys=("crawl/p1", "crawl/p2"), fleet=3))
    ctx.deletions = gate
    html = render_deletions(ctx, [], root="/ops", held=held_deletion(gate)())  # type: ignore[arg-type]
    assert "c0ffee12" in html
    assert "/ops/v1/deletions/c0ffee12/allow" in html
    assert "proxy-operator up --allow-deletions c0ffee12" in html
    assert "crawl/p1, crawl/p2" in html
    assert "It would remove 2 of 3 proxies" in html
    assert "No deletion is held" in render_deletions(ctx, [], root="", held=None)


def test_a_followers_view_names_the_leader_and_a_cut_list_says_how_many_more() -> None:
    published = HeldView(change_id="beef", keys=("crawl/p1",), count=700, fleet=800, message="held")
    html = render_deletions(
        _context(["a"]), [], root="", held=published, leader="pod-0", provenance="as pod-0 published it"
    )
    assert "pod-0" in html
    assert "as pod-0 published it" in html
    assert "crawl/p1 and 699 more" in html
    gone = [Forgotten(key="crawl/kept", message="forgotten: its resources keep running", at=0.0)]
    assert "crawl/kept" in render_deletions(_context(["a"]), [], root="", held=None, forgotten=gone)


def test_the_lease_view_reads_the_services_own_counters() -> None:
    ctx = _context(["a"])
    ctx.metrics.leases.labels(outcome="ok").inc(3)
    ctx.metrics.leases.labels(outcome="no_proxy_available").inc()
    ctx.metrics.lease_seconds.observe(0.004)
    html = render_leases(LeaseRates(ctx.registry))
    assert "no_proxy_available" in html
    assert ">3<" in html


def test_the_probe_history_keeps_the_last_30_and_the_chart_marks_failures() -> None:
    history = ProbeHistory()
    for n in range(40):
        history.record("default/a", Health(state=HealthState.healthy, last_latency_seconds=0.001 * n))
    history.record("default/a", Health(state=HealthState.unhealthy, consecutive_failures=1))
    series = history.series("default/a")
    assert len(series) == 30
    assert series[-1] is None
    assert series[0] == pytest.approx(0.011)
    svg = chart(series)
    assert 'role="img"' in svg
    assert "1 failed" in svg
    assert svg.count("<rect") == 30


def test_the_probe_history_keeps_whole_milliseconds_per_proxy_and_reuses_a_forgotten_slot() -> None:
    history = ProbeHistory()
    history.record("default/a", Health(state=HealthState.healthy, last_latency_seconds=0.0004))
    history.record("default/a", Health(state=HealthState.healthy, last_latency_seconds=0.0126))
    history.record("default/a", Health(state=HealthState.healthy, last_latency_seconds=300.0))
    history.record("default/b", Health(state=HealthState.unhealthy, consecutive_failures=2))
    assert history.series("default/a") == [0.0, 0.013, 65.534]  # the chart's resolution; capped
    assert history.series("default/b") == [None]
    assert "0 ms" in chart([0.0, 0.0])  # every probe under 1 ms: no division by 0
    assert "slowest 0 ms" in chart([0.0])
    history.forget("default/a")
    history.forget("default/a")  # twice: nothing more
    assert history.series("default/a") == []
    assert len(history) == 1
    history.record("default/c", Health(state=HealthState.healthy, last_latency_seconds=0.002))
    assert history.series("default/c") == [0.002], "a reused slot starts empty"
    assert history.series("default/b") == [None]
    assert len(history._count) == 2, "the forgotten slot served the new proxy"


def test_the_pools_view_joins_a_pools_status_and_its_childrens_phases() -> None:
    status = ProxyPoolStatus(desired=3, ready=2, replacing=1, placements={"local": 3})
    status.conditions.append(
        Condition(type="Degraded", status="True", reason="ReplacementFailed", message="rolled back")
    )
    rows = [
        Row(
            key=f"crawl/p{i}",
            pool="main",
            provider="local",
            stack="local",
            phase=phase,
            ready=True,
            reason="",
        )
        for i, phase in enumerate(["Ready", "Ready", "Provisioning"])
    ]
    history = PoolHistory(size=2)
    history.record("crawl/main", ["replacing main-0: older than maxAge", "scaling down: draining main-9"])
    history.record("crawl/main", ["main-7 is healthy: draining main-0, which it replaces"])
    html = render_pools({"crawl/main": status}, rows, root="", decisions=history.recent())
    assert "ReplacementFailed" in html
    assert "Provisioning 1, Ready 2" in html
    assert 'href="/?pool=main"' in html
    # The last decisions, newest first, the oldest past the size dropped.
    assert html.index("main-7 is healthy") < html.index("draining main-9")
    assert "older than maxAge" not in html


def test_a_row_whose_declared_spec_is_not_the_applied_one_says_so() -> None:
    ctx = _context(["a", "b"])
    board = ctx.status
    assert board is not None
    for name in ("a", "b"):
        board.set_applied(f"default/{name}", stack="local", spec_hash="a" * 64, address=None)
    desired = {"default/a": "a" * 64, "default/b": "b" * 64}.get
    rows = FleetIndex(inventory=ctx.inventory, board=board).rows()
    html = asyncio.run(render_fleet(ctx, rows, FleetQuery(), root="", size=50, desired=desired))
    a, b = html.split("<tr>")[2:4]
    assert "= desired" in a
    assert "update pending" not in a
    assert "desired <code>bbbbbbbbbbbb</code><br>applied <code>aaaaaaaaaaaa</code>" in b
    assert "update pending" in b
    page = asyncio.run(render_proxy(ctx, "default/b", root="", desired=desired))
    assert page is not None
    assert f"desired <code>{'b' * 64}</code><br>applied <code>{'a' * 64}</code>" in page
    assert "update pending" in page
    follower = asyncio.run(render_fleet(ctx, rows, FleetQuery(), root="", size=50))
    assert "update pending" not in follower  # no control loop: nothing to compare with


def test_a_proxy_page_lists_its_reports_by_target_and_client() -> None:
    ctx = _context(["a"])
    store = ctx.discovery.store
    at = time.time()

    async def page() -> str | None:
        await store.note_report(
            proxy="default/a", target="shop.example", client="crawler-a", kind="banned", now=at
        )
        await store.note_report(
            proxy="default/a", target="shop.example", client="crawler-a", kind="banned", now=at
        )
        await store.note_report(proxy="default/a", target="*", client="crawler-b", kind="error", now=at - 60)
        return await render_proxy(ctx, "default/a", root="")

    html = asyncio.run(page())
    assert html is not None
    section = html.split("Reports by target and client")[1]
    rows = section.split("<tbody>")[1].split("</tbody>")[0].split("<tr>")[1:]
    assert [r.count("<td") for r in rows] == [5, 5]
    cells = [[c.split(">", 1)[1] for c in r.split("</td>")[:5]] for r in rows]
    assert cells[0][:4] == ["shop.example", "crawler-a", "banned", "2"]
    assert cells[1][:4] == ['<span class="mute">any (by proxy)</span>', "crawler-b", "error", "1"]
    assert cells[1][4].endswith(" s ago</time>")
