"""The other views: one proxy, the stacks, the deletions, the lease API. Each reads what the service keeps."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from service.api.deps import ApiContext
from service.discovery.report_summary import KEEP_SECONDS, MOST, ReportEntry
from service.discovery.reports import ANY_TARGET
from service.health.egress import shared_egress
from service.ui.context import DesiredHash, Forgotten, HeldView, StackRow
from service.ui.facts import facts_of, leases_by_proxy, now
from service.ui.fleet import (
    bans_cell,
    hash_cell,
    health_cell,
    leases_cell,
    operation_cell,
    phase_badge,
    why,
)
from service.ui.html import esc, href, table, when
from service.ui.index import Row
from service.ui.probes import ProbeHistory, chart


async def render_proxy(
    ctx: ApiContext,
    key: str,
    *,
    root: str,
    probes: ProbeHistory | None = None,
    desired: DesiredHash | None = None,
) -> str | None:
    endpoint = ctx.inventory.get(key)
    at = now()
    leases = await leases_by_proxy(ctx, now=at)
    [fact] = await facts_of(ctx, [key], leases=leases, shared=shared_egress(ctx.inventory.health_snapshot()))
    if endpoint is None and fact.status is None:
        return None
    status = fact.status
    facts = [
        ("Phase", phase_badge(status.phase or "Unknown") if status else "-"),
        ("Why not ready", why(fact)),
        ("Pool", esc(endpoint.pool if endpoint else "-")),
        ("Provider", esc(endpoint.provider if endpoint else "-")),
        (
            "Stack",
            f'<a href="{href(root, "/stacks", {"q": status.stack or ""} if status else None)}">'
            f"{esc(status.stack if status else '-')}</a>",
        ),
        (
            "Address",
            esc(
                f"{endpoint.protocol}://{endpoint.host}:{endpoint.port}"
                if endpoint and endpoint.has_address
                else "-"
            ),
        ),
        (
            "Spec hash (desired / applied)",
            hash_cell(
                desired(key) if desired else None,
                status.observed_spec_hash if status else None,
                phase=(status.phase or "") if status else "",
                width=64,
            ),
        ),
        ("Last operation", operation_cell(fact, at)),
        ("Probe", health_cell(fact)),
        ("Leases now", leases_cell(fact)),
        ("Bans", bans_cell(fact, at)),
    ]
    out = '<dl class="facts">' + "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in facts) + "</dl>"
    conditions = [
        [esc(c.type), esc(c.status), esc(c.reason), esc(c.message), when(c.last_transition_time, now=at)]
        for c in (status.conditions if status else [])
    ]
    if probes is not None:
        out += "<h2>Probes</h2>" + chart(probes.series(key))
    out += "<h2>Reports by target and client</h2>" + reports_table(await ctx.discovery.reports_on(key), at)
    out += "<h2>Conditions</h2>" + table(
        ["Type", "Status", "Reason", "Message", "Since"], conditions, caption="conditions"
    )
    events = ctx.status.events(key)[-50:] if ctx.status is not None else []
    timeline = "".join(
        f'<li><span class="{"warn" if e.warning else "mute"}">{when(e.at, now=at)}</span> '
        f"<strong>{esc(e.reason)}</strong> {esc(e.message)}</li>"
        for e in reversed(events)
    )
    out += f"<h2>Recent events</h2><ol reversed>{timeline or '<li class=mute>none kept</li>'}</ol>"
    return out


def reports_table(entries: list[ReportEntry], at: float) -> str:
    """The proxy's report summary from the discovery store (every replica's, with Redis): names and counts,
    no lease id."""
    rows = [
        [
            esc(e.target) if e.target != ANY_TARGET else '<span class="mute">any (by proxy)</span>',
            esc(e.client),
            esc(e.kind),
            str(e.count),
            when(e.last, now=at),
        ]
        for e in entries
    ]
    return table(
        ["Target", "Client", "Kind", "Count", "Last"],
        rows,
        caption=f"reports of the last {KEEP_SECONDS / 3600:g} h, at most {MOST} kept",
    )


def update_cell(r: StackRow, at: float) -> str:
    """The stack's last update: kind and result (a failure's reason), how long, when, resource counts."""
    if r.last_kind is None:
        return '<span class="mute">none since this replica started</span>'
    tone = "ok" if r.last_result == "succeeded" else "bad"
    text = f'{esc(r.last_kind)} <span class="{tone}">{esc(r.last_result)}</span>'
    if r.last_reason:
        text += f" ({esc(r.last_reason)})"
    if r.last_seconds is not None:
        text += f", {r.last_seconds:.1f} s"
    text += f"<br>{when(r.last_started_at, now=at)}"
    if r.last_changes:
        text += f'<br><span class="mute">{esc(", ".join(r.last_changes))}</span>'
    return text


def lock_cell(r: StackRow) -> str:
    if r.lock is None:
        return '<span class="mute">none</span>'
    return f'<span class="{"mute" if "this replica" in r.lock else "warn"}">{esc(r.lock)}</span>'


def render_stacks(rows: list[StackRow], proxies: list[Row], *, root: str, text: str) -> str:
    at = now()
    shown = [r for r in rows if not text or text in r.name]
    counts = Counter(p.stack for p in proxies)
    body = []
    for r in shown:
        retry = when(r.next_retry_at, now=at) if r.next_retry_at else "-"
        body.append(
            [
                f'<a href="{href(root, "/", {"q": r.name})}">{esc(r.name)}</a>',
                esc(r.owner),
                esc(r.state),
                str(counts.get(r.name, 0)),
                str(r.runs),
                update_cell(r, at),
                lock_cell(r),
                esc(r.reason or "-") + (f'<br><span class="mute">{esc(r.error)}</span>' if r.error else ""),
                retry,
                esc(", ".join(r.outputs) or "-"),
            ]
        )
    note = (
        "<p class='mute'>Output values are not shown here (they hold credentials): "
        "<code>proxy-operator stacks outputs NAME</code>.</p>"
    )
    return (
        table(
            [
                "Stack",
                "Owner",
                "Queue state",
                "Proxies",
                "Runs",
                ("Last update", "wide"),
                "Lock",
                "Last error",
                "Next retry",
                ("Outputs", "wide"),
            ],
            body,
            caption=f"{len(shown)} stacks",
        )
        + note
    )


def render_deletions(
    ctx: ApiContext,
    proxies: list[Row],
    *,
    root: str,
    held: HeldView | None,
    forgotten: Sequence[Forgotten] = (),
    leader: str | None = None,
    provenance: str | None = None,
) -> str:
    """`held`: the leader's held deletion, `forgotten` what skip-cleanup forgot, newest first (on a
    follower, as the leader published them: `provenance` says whose and how old, or why there is none)."""
    out = ""
    if leader is not None:
        out += (
            "<p>Only the leader judges deletions: this view shows what it published, "
            f"{esc(provenance or 'nothing yet')}.</p>"
        )
    elif ctx.deletions is None:
        out += "<p>No control loop runs in this process.</p>"
    if held is None:
        out += "<p>No deletion is held.</p>"
    else:
        listed = ", ".join(held.keys)
        more = f" and {held.count - len(held.keys)} more" if held.count > len(held.keys) else ""
        out += (
            '<section aria-labelledby="held">'
            f'<h2 id="held">Held deletion <code>{esc(held.change_id)}</code></h2>'
            f"<p>{esc(held.message)}</p>"
            f"<p>It would remove {held.count} of {held.fleet} "
            f"proxies: {esc(listed)}{more}</p><p>Allow exactly this change, once:</p>"
            f'<pre>curl -X POST -H "Authorization: Bearer $ADMIN_TOKEN" '
            f"http://HOST{esc(root)}/v1/deletions/{esc(held.change_id)}/allow</pre>"
            f"<p>or <code>proxy-operator up --allow-deletions {esc(held.change_id)}</code></p></section>"
        )
    deleting = [
        [f'<a href="{href(root, "/proxy/" + r.key)}">{esc(r.key)}</a>', esc(r.reason or "-")]
        for r in proxies
        if r.phase == "Deleting"
    ]
    out += "<h2>Proxies in Deleting</h2>" + table(["Proxy", "Why"], deleting, caption="deleting")
    out += "<h2>What skip-cleanup forgot</h2>" + table(
        ["Proxy", "What", "When"],
        [[esc(e.key), esc(e.message), when(e.at)] for e in forgotten],
        caption="forgotten",
    )
    return out


@dataclass
class LeaseRates:
    """Samples of the lease API's own counters (its prometheus registry), one per view, for rates over the
    last minutes."""

    registry: CollectorRegistry
    window: float = 300.0
    _samples: deque[tuple[float, dict[str, float]]] = field(default_factory=deque)

    def sample(self) -> tuple[dict[str, float], dict[str, float], float]:
        """(totals, per-minute rates since the oldest sample in the window, seconds covered)."""
        at = now()
        totals = self._read()
        self._samples.append((at, totals))
        while len(self._samples) > 1 and self._samples[0][0] < at - self.window:
            self._samples.popleft()
        first_at, first = self._samples[0]
        span = at - first_at
        rates = {k: (v - first.get(k, 0.0)) * 60 / span for k, v in totals.items()} if span > 0 else {}
        return totals, rates, span

    def _read(self) -> dict[str, float]:
        found: dict[str, float] = {}
        for metric in self.registry.collect():
            for s in metric.samples:
                if s.name == "proxy_operator_lease_requests_total":
                    found[f"requests {s.labels.get('outcome', '')}"] = s.value
                elif s.name in (
                    "proxy_operator_lease_duration_seconds_sum",
                    "proxy_operator_lease_duration_seconds_count",
                ):
                    found[s.name.rsplit("_", 1)[1]] = s.value
                elif s.name == "proxy_operator_lease_duration_seconds_bucket":
                    found[f"le {s.labels['le']}"] = s.value
                elif s.name in ("proxy_operator_leased_proxies_total", "proxy_operator_lease_releases_total"):
                    found[s.name.removeprefix("proxy_operator_").removesuffix("_total")] = s.value
        return found


def render_leases(rates: LeaseRates) -> str:
    totals, per_minute, span = rates.sample()
    rows = [
        [esc(k.removeprefix("requests ")), f"{v:.0f}", f"{per_minute.get(k, 0):.1f}"]
        for k, v in sorted(totals.items())
        if k.startswith("requests ")
    ]
    count, total = totals.get("count", 0.0), totals.get("sum", 0.0)
    mean = f"{total / count * 1000:.1f} ms" if count else "-"
    p99 = "-"
    buckets = sorted((float(k[3:]), v) for k, v in totals.items() if k.startswith("le "))
    for bound, seen in buckets:
        if count and seen >= 0.99 * count:
            p99 = f"≤ {bound * 1000:g} ms"
            break
    return (
        f"<p>Lease requests by outcome (an error's reason is a 503's or 429's word), rate over the last "
        f"{span / 60:.1f} minutes of this page's samples.</p>"
        + table(["Outcome", "Total", "Per minute"], rows, caption="lease requests")
        + f'<dl class="facts"><dt>Mean answer time</dt><dd>{mean}</dd>'
        f"<dt>p99 (bucket)</dt><dd>{esc(p99)}</dd>"
        f"<dt>Proxies handed out</dt><dd>{totals.get('leased_proxies', 0):.0f}</dd>"
        f"<dt>Released early</dt><dd>{totals.get('lease_releases', 0):.0f}</dd></dl>"
    )
