"""The page routes: every one same-site only and behind a session; links carry the root path."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from service.api.deps import context_of
from service.ui.fleet import FleetQuery, render_fleet
from service.ui.html import PAGE_HEADERS, esc, page
from service.ui.login import from_another_site, session_of, to_login, ui_of
from service.ui.pools import render_pools
from service.ui.views import LeaseRates, render_deletions, render_leases, render_proxy, render_stacks

router = APIRouter(include_in_schema=False)
HEADERS = PAGE_HEADERS


def _answer(request: Request, title: str, body: str | None, who: str) -> Response:
    ui = ui_of(request)
    if body is None:
        return HTMLResponse(
            page(
                root=ui.settings.root_path,
                title="Not found",
                body="<p>No such proxy.</p>",
                who=who,
                refresh=False,
            ),
            status_code=404,
            headers=HEADERS,
        )
    leader = ui.leader() if ui.leader is not None else None
    note = (
        f'<p class="mute">This replica follows; the leader is <strong>{esc(leader)}</strong>.</p>'
        if leader
        else ""
    )
    return HTMLResponse(
        page(root=ui.settings.root_path, title=title, body=body, who=who, note=note), headers=HEADERS
    )


async def _guard(request: Request) -> tuple[str, Response | None]:
    other = from_another_site(request)
    if other is not None:
        return "", other
    session = await session_of(request)
    if session is None:
        return "", to_login(request)
    return session.client.name, None


@router.get("/", response_class=HTMLResponse)
async def fleet(request: Request) -> Response:
    who, stop = await _guard(request)
    if stop is not None:
        return stop
    ui = ui_of(request)
    query = FleetQuery.parse(request.query_params)
    stacks = {r.name: r for r in await asyncio.to_thread(ui.stacks)} if ui.stacks is not None else {}
    body = await render_fleet(
        context_of(request),
        await asyncio.to_thread(ui.index.rows),
        query,
        root=ui.settings.root_path,
        size=ui.settings.page_size,
        stacks=stacks,
        desired=ui.desired,
    )
    return _answer(request, "Fleet", body, who)


@router.get("/proxy/{namespace}/{name}", response_class=HTMLResponse)
async def proxy(request: Request, namespace: str, name: str) -> Response:
    who, stop = await _guard(request)
    if stop is not None:
        return stop
    ui = ui_of(request)
    key = f"{namespace}/{name}"
    body = await render_proxy(
        context_of(request), key, root=ui.settings.root_path, probes=ui.probes, desired=ui.desired
    )
    return _answer(request, f"Proxy {namespace}/{name}", body, who)


@router.get("/stacks", response_class=HTMLResponse)
async def stacks(request: Request) -> Response:
    who, stop = await _guard(request)
    if stop is not None:
        return stop
    ui = ui_of(request)
    rows = list(await asyncio.to_thread(ui.stacks)) if ui.stacks is not None else []
    body = _from_leader(await _provenance(request)) + render_stacks(
        rows,
        await asyncio.to_thread(ui.index.rows),
        root=ui.settings.root_path,
        text=request.query_params.get("q", "")[:200],
    )
    return _answer(request, "Stacks", body, who)


@router.get("/pools", response_class=HTMLResponse)
async def pools(request: Request) -> Response:
    who, stop = await _guard(request)
    if stop is not None:
        return stop
    ui = ui_of(request)
    statuses = await asyncio.to_thread(ui.pools) if ui.pools is not None else {}
    body = _from_leader(await _provenance(request))
    decisions = await asyncio.to_thread(ui.decisions) if ui.decisions is not None else []
    rows = await asyncio.to_thread(ui.index.rows)
    body += render_pools(statuses, rows, root=ui.settings.root_path, decisions=decisions)
    if ui.pools is None:
        body += "<p class='mute'>No pool source runs in this process.</p>"
    return _answer(request, "Pools", body, who)


@router.get("/deletions", response_class=HTMLResponse)
async def deletions(request: Request) -> Response:
    who, stop = await _guard(request)
    if stop is not None:
        return stop
    ui = ui_of(request)
    leader = ui.leader() if ui.leader is not None else None
    held = await asyncio.to_thread(ui.held) if ui.held is not None else None
    body = render_deletions(
        context_of(request),
        await asyncio.to_thread(ui.index.rows),
        root=ui.settings.root_path,
        held=held,
        forgotten=await asyncio.to_thread(ui.forgotten) if ui.forgotten is not None else [],
        leader=leader,
        provenance=await _provenance(request),
    )
    return _answer(request, "Deletions", body, who)


def _from_leader(provenance: str | None) -> str:
    """A follower's leader-only view says whose it is."""
    return f'<p class="mute">From the leader\'s summary: {esc(provenance)}.</p>' if provenance else ""


async def _provenance(request: Request) -> str | None:
    ui = ui_of(request)
    return await asyncio.to_thread(ui.provenance) if ui.provenance is not None else None


@router.get("/leases", response_class=HTMLResponse)
async def leases(request: Request) -> Response:
    who, stop = await _guard(request)
    if stop is not None:
        return stop
    rates: LeaseRates = request.app.state.lease_rates
    return _answer(request, "Lease API", render_leases(rates), who)
