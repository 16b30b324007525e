"""The fleet view (`/`): every proxy, filtered and sorted on the index, one page of rows rendered."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from service.api.deps import ApiContext
from service.health.egress import shared_egress
from service.ui.context import DesiredHash, StackRow
from service.ui.facts import Facts, facts_of, leases_by_proxy, now
from service.ui.html import esc, href, table, when
from service.ui.index import Row

SORTS = ("key", "phase", "pool", "provider", "stack")
PHASE_CLASS = {"Ready": "ok", "Degraded": "warn", "Held": "warn", "Provisioning": "mute", "Pending": "mute"}


@dataclass(frozen=True)
class FleetQuery:
    pool: str = ""
    provider: str = ""
    phase: str = ""
    text: str = ""
    sort: str = "key"
    page: int = 1

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> FleetQuery:
        sort = params.get("sort", "key")
        page = params.get("page", "1")
        return cls(
            pool=params.get("pool", "")[:253],
            provider=params.get("provider", "")[:253],
            phase=params.get("phase", "")[:40],
            text=params.get("q", "")[:200].strip(),
            sort=sort if sort in SORTS else "key",
            page=max(1, int(page)) if page.isdigit() else 1,
        )

    def link(self, **change: str) -> dict[str, str]:
        query = {"pool": self.pool, "provider": self.provider, "phase": self.phase, "q": self.text}
        query |= {
            "sort": self.sort if self.sort != "key" else "",
            "page": str(self.page) if self.page > 1 else "",
        }
        return query | change


def select(rows: list[Row], query: FleetQuery) -> list[Row]:
    text = query.text.lower()
    chosen = [
        r
        for r in rows
        if (not query.pool or r.pool == query.pool)
        and (not query.provider or r.provider == query.provider)
        and (not query.phase or r.phase == query.phase)
        and (not text or text in r.key.lower() or text in r.stack.lower() or text in r.reason.lower())
    ]
    chosen.sort(key=lambda r: (getattr(r, query.sort), r.key))
    return chosen


def phase_badge(phase: str) -> str:
    return f'<span class="phase {PHASE_CLASS.get(phase, "bad")}">{esc(phase)}</span>'


def _select_box(name: str, label: str, current: str, options: list[str]) -> str:
    opts = "".join(
        f'<option value="{esc(o)}"{" selected" if o == current else ""}>{esc(o or "any")}</option>'
        for o in ["", *options]
    )
    return f'<label for="f-{name}">{esc(label)}<select id="f-{name}" name="{name}">{opts}</select></label>'


def filters(root: str, rows: list[Row], query: FleetQuery) -> str:
    pools = sorted({r.pool for r in rows if r.pool})
    providers = sorted({r.provider for r in rows if r.provider})
    phases = sorted({r.phase for r in rows})
    return (
        f'<form class="filters" method="get" action="{href(root, "/")}" role="search">'
        + _select_box("pool", "Pool", query.pool, pools)
        + _select_box("provider", "Provider", query.provider, providers)
        + _select_box("phase", "Phase", query.phase, phases)
        + f'<label for="f-q">Text<input id="f-q" name="q" value="{esc(query.text)}" size="18"></label>'
        + _select_box("sort", "Sort by", query.sort, list(SORTS))
        + '<button type="submit">Apply</button></form>'
    )


def why(facts: Facts) -> str:
    """The reason and message of a non-Ready proxy, with the next retry where one waits."""
    found = facts.not_ready
    if found is None:
        return '<span class="mute">-</span>'
    reason, message = found
    return f"<strong>{esc(reason)}</strong>: {esc(message)}"


def health_cell(facts: Facts) -> str:
    h = facts.health
    latency = f" {h.last_latency_seconds * 1000:.0f} ms" if h.last_latency_seconds is not None else ""
    tone = {"healthy": "ok", "unhealthy": "bad"}.get(h.state.value, "mute")
    text = f'<span class="{tone}">{esc(h.state.value)}</span>{latency}'
    if h.egress_ip:
        text += f'<br><span class="mute">egress {esc(h.egress_ip)}</span>'
    if facts.shared_with:
        text += f'<br><span class="warn">shares its IP with {esc(", ".join(facts.shared_with))}</span>'
    if h.last_error:
        text += f'<br><span class="mute">{esc(h.last_error)}</span>'
    return text


def operation_cell(facts: Facts, at: float) -> str:
    last = facts.status.last_operation if facts.status is not None else None
    if last is None:
        return '<span class="mute">-</span>'
    took = ""
    if last.started_at and last.finished_at:
        took = f", {(last.finished_at - last.started_at).total_seconds():.1f} s"
    return f"{esc(last.type)} {esc(last.result)}{took}<br>{when(last.finished_at or last.started_at, now=at)}"


def pending(desired: str | None, applied: str | None, *, phase: str) -> str | None:
    """Why the declared spec is not the applied one, or None when they agree (or desired is unknown here)."""
    if desired is None or desired == applied:
        return None
    return "held: not applied" if phase == "Held" else "update pending"


def hash_cell(desired: str | None, applied: str | None, *, phase: str, width: int = 12) -> str:
    """Desired vs applied spec hash: one hash when they agree, both and why when they do not."""
    gap = pending(desired, applied, phase=phase)
    shown = f"<code>{esc((applied or '-')[:width])}</code>"
    if gap is None:
        return shown if desired is None else f'{shown}<br><span class="mute">= desired</span>'
    return (
        f"desired <code>{esc(desired[:width] if desired else '-')}</code><br>applied {shown}"
        f'<br><span class="warn">{esc(gap)}</span>'
    )


def leases_cell(facts: Facts) -> str:
    sticky = (
        f'<br><span class="mute">{facts.sessions} sticky session{"s" if facts.sessions != 1 else ""}</span>'
        if facts.sessions
        else ""
    )
    if not facts.leases:
        return "0" + sticky
    clients = sorted({lease.client for lease in facts.leases})
    return f'{len(facts.leases)}<br><span class="mute">{esc(", ".join(clients))}</span>' + sticky


def bans_cell(facts: Facts, at: float) -> str:
    if not facts.bans:
        return '<span class="mute">none</span>'
    return "<br>".join(
        f"{esc(b.target)} (strikes {b.strikes}) until {when(b.until, now=at)}" for b in facts.bans
    )


def retry_note(stack: StackRow | None, at: float) -> str:
    """Where its stack waits for a retry: when, and after what."""
    if stack is None or stack.state not in ("backoff", "stalled", "failed"):
        return ""
    text = f'<br><span class="warn">stack {esc(stack.state)}'
    if stack.reason:
        text += f" ({esc(stack.reason)})"
    if stack.next_retry_at is not None:
        text += f", next try {when(stack.next_retry_at, now=at)}"
    elif stack.state != "backoff":
        text += ", no retry until its input changes"
    return text + "</span>"


async def render_fleet(
    ctx: ApiContext,
    rows: list[Row],
    query: FleetQuery,
    *,
    root: str,
    size: int,
    stacks: Mapping[str, StackRow] | None = None,
    desired: DesiredHash | None = None,
) -> str:
    chosen = select(rows, query)
    pages = max(1, -(-len(chosen) // size))
    page = min(query.page, pages)
    shown = chosen[(page - 1) * size : page * size]
    at = now()
    leases = await leases_by_proxy(ctx, now=at)
    facts = await facts_of(
        ctx, [r.key for r in shown], leases=leases, shared=shared_egress(ctx.inventory.health_snapshot())
    )
    body = []
    for row, fact in zip(shown, facts, strict=True):
        applied = fact.status.observed_spec_hash if fact.status is not None else None
        body.append(
            [
                f'<a href="{href(root, "/proxy/" + row.key)}">{esc(row.key)}</a>',
                phase_badge(row.phase),
                why(fact),
                f'{esc(row.pool or "-")}<br><span class="mute">{esc(row.provider)}</span>',
                f'<a href="{href(root, "/stacks", {"q": row.stack})}">{esc(row.stack or "-")}</a>',
                hash_cell(desired(row.key) if desired else None, applied, phase=row.phase),
                operation_cell(fact, at),
                health_cell(fact),
                leases_cell(fact),
                bans_cell(fact, at),
            ]
        )
    summary = f"{len(chosen)} of {len(rows)} proxies; page {page} of {pages}"
    headers: list[str | tuple[str, str]] = [
        "Proxy",
        "Phase",
        "Why not ready",
        "Pool / provider",
        ("Stack", "wide"),
        ("Spec hash", "wide"),
        ("Last operation", "wide"),
        "Probe",
        "Leases",
        "Bans (target, time left)",
    ]
    pager = []
    if page > 1:
        pager.append(
            f'<a rel="prev" href="{href(root, "/", query.link(page=str(page - 1)))}">previous page</a>'
        )
    if page < pages:
        pager.append(f'<a rel="next" href="{href(root, "/", query.link(page=str(page + 1)))}">next page</a>')
    return (
        filters(root, rows, query)
        + table(headers, body, caption=summary)
        + f'<nav class="pager" aria-label="Pages">{"".join(pager)}</nav>'
    )
