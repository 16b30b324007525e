"""The pools view: each ProxyPool's status as its source keeps it (desired, ready, replacing, placements,
conditions), beside the phases of its children from the page's index, and the pools' last decisions."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence

from service.pools.history import PoolDecision
from service.ui.html import esc, href, table, when
from service.ui.index import Row
from stacks.models import ProxyPoolStatus

PoolsSource = Callable[[], Mapping[str, ProxyPoolStatus]]


def render_pools(
    statuses: Mapping[str, ProxyPoolStatus],
    proxies: list[Row],
    *,
    root: str,
    decisions: Sequence[PoolDecision] = (),
) -> str:
    """`decisions`: the pools' last decisions (replacements, scaling, drains with their reasons), newest
    first."""
    phases: dict[str, Counter[str]] = defaultdict(Counter)
    for row in proxies:
        if row.pool:
            phases[row.pool][row.phase] += 1
    names = sorted(set(statuses) | set(phases))
    body = []
    for key in names:
        status = statuses.get(key)
        name = key.rpartition("/")[2]
        counts = phases.get(name) or phases.get(key) or Counter()
        conditions = "<br>".join(
            f"{esc(c.type)}={esc(c.status)} <strong>{esc(c.reason)}</strong> {esc(c.message)}"
            for c in (status.conditions if status else [])
        )
        body.append(
            [
                f'<a href="{href(root, "/", {"pool": name})}">{esc(key)}</a>',
                str(status.desired) if status else "-",
                str(status.ready) if status else "-",
                str(status.replacing) if status else "-",
                esc(", ".join(f"{k}: {v}" for k, v in sorted(status.placements.items())) if status else "-"),
                esc(", ".join(f"{phase} {n}" for phase, n in sorted(counts.items())) or "-"),
                conditions or '<span class="mute">-</span>',
            ]
        )
    headers: list[str | tuple[str, str]] = [
        "Pool",
        "Desired",
        "Ready",
        "Replacing",
        ("Placements", "wide"),
        "Children by phase",
        "Conditions",
    ]
    recent = [
        [when(d.at), f'<a href="{href(root, "/", {"pool": d.pool.rpartition("/")[2]})}">{esc(d.pool)}</a>',
         esc(d.message)]
        for d in decisions
    ]  # fmt: skip
    return (
        table(headers, body, caption=f"{len(names)} pools")
        + "<h2>Last decisions</h2>"
        + table(["When", "Pool", "What and why"], recent, caption="replacements, scaling and drains")
    )
