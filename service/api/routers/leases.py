"""`/v1/leases`: hand out proxies (LRU among eligible, sticky sessions, bounded wait), renew, release."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Body, Response

from service.api.convert import lease_json, leased, timestamp
from service.api.deps import ApiContext, Context, LeaseClient
from service.api.errors import ApiError, responses
from service.api.models import LeaseBody, LeaseResponse, RenewBody, RenewResponse
from service.auth import Client
from service.discovery.errors import DiscoveryError
from service.discovery.limits import Granted, grant, lease_ttl, lowered
from service.discovery.service import ANY_TARGET, LeaseGrant, LeaseQuery

router = APIRouter(tags=["leases"])
RETRY_AFTER_HEADER = {
    "Retry-After": {
        "description": "Whole seconds until a proxy is eligible (503) or the client's share lets one more "
        "lease through (429)",
        "schema": {"type": "string"},
    }
}
MAX_LEASE_ID = 128


def _query(body: LeaseBody, *, client: Client, ctx: Context) -> tuple[LeaseQuery, Granted]:
    """The request within this server's limits: count, ttl and wait are lowered, not refused (docs/api.md
    "Leases"); the answer's `lowered` names what was."""
    granted = grant(count=body.count, ttl=body.ttl, wait=body.wait, settings=ctx.discovery.settings)
    query = LeaseQuery(
        client=client.name,
        count=granted.count,
        pool=body.pool,
        provider=body.provider,
        labels=body.labels,
        protocol=body.protocol,
        target=body.target or ANY_TARGET,
        session=body.session,
        strict=body.strict,
        ttl=granted.ttl,
        wait=granted.wait,
        share=client.lease_share,
        rate=client.lease_rate,
    )
    return query, granted


@router.post(
    "/v1/leases",
    response_model=LeaseResponse,
    responses={
        **responses(400, 401, 403, 409, 413, 422),
        429: {**responses(429)[429], "headers": RETRY_AFTER_HEADER},
        503: {**responses(503)[503], "headers": RETRY_AFTER_HEADER},
    },
    summary="Lease proxies",
)
async def create_lease(
    client: LeaseClient, ctx: Context, body: Annotated[LeaseBody | None, Body()] = None
) -> LeaseResponse:
    lease_grant, query, granted = await _take(client, ctx, body)
    return _response(lease_grant, query=query, granted=granted, ctx=ctx)


async def create_lease_json(client: Client, ctx: ApiContext, body: LeaseBody | None) -> bytes:
    """`create_lease`'s answer as the JSON FastAPI writes of it, mostly without building the models (the
    lease fast path's: service/api/fast_lease.py)."""
    lease_grant, query, granted = await _take(client, ctx, body)
    answer: dict[str, object] = {
        "target": query.target,
        "session": lease_grant.session,
        "rebound": lease_grant.rebound,
        "previousProxy": lease_grant.previous_proxy,
        "lowered": granted.lowered,
    }
    written = lease_json(lease_grant.leases, lease_grant.users, ctx.inventory, answer=answer)
    if written is None:
        model = _response(lease_grant, query=query, granted=granted, ctx=ctx)
        return model.model_dump_json(by_alias=True).encode()
    return written


async def _take(
    client: Client, ctx: ApiContext, body: LeaseBody | None
) -> tuple[LeaseGrant, LeaseQuery, Granted]:
    query, granted = _query(body or LeaseBody(), client=client, ctx=ctx)
    started = time.perf_counter()
    try:
        lease_grant = await ctx.discovery.lease(query)
    except DiscoveryError as exc:
        ctx.metrics.leases.labels(exc.reason).inc()
        raise
    finally:
        ctx.metrics.lease_seconds.observe(time.perf_counter() - started)
    (ctx.metrics.leases_rebound if lease_grant.rebound else ctx.metrics.leases_ok).inc()
    ctx.metrics.leased.inc(len(lease_grant.leases))
    return lease_grant, query, granted


def _response(grant: LeaseGrant, *, query: LeaseQuery, granted: Granted, ctx: Context) -> LeaseResponse:
    items = []
    for lease in grant.leases:
        endpoint = ctx.inventory.get(lease.proxy)
        if endpoint is not None and endpoint.has_address:  # removed in the last instant: leave it out
            health = ctx.inventory.health(lease.proxy)
            user = grant.users.get(lease.lease_id)
            items.append(leased(lease, endpoint=endpoint, health=health, user=user))
    return LeaseResponse(
        leases=items,
        target=query.target,
        session=grant.session,
        rebound=grant.rebound,
        previous_proxy=grant.previous_proxy,
        lowered=granted.lowered,
    )


@router.post(
    "/v1/leases/{lease_id}/renew",
    response_model=RenewResponse,
    responses=responses(400, 401, 403, 404, 413, 422),
    summary="Extend a lease",
)
async def renew_lease(
    lease_id: str, client: LeaseClient, ctx: Context, body: Annotated[RenewBody | None, Body()] = None
) -> RenewResponse:
    if len(lease_id) > MAX_LEASE_ID:
        raise ApiError(404, "lease_not_found", "no such lease")
    ttl = (body or RenewBody()).ttl
    lease = await ctx.discovery.renew(client=client.name, lease_id=lease_id, ttl=ttl)
    ctx.metrics.renewals.inc()
    return RenewResponse(
        lease_id=lease.lease_id,
        key=lease.proxy,
        target=lease.target,
        expires_at=timestamp(lease.expires_at),
        lowered=lowered({"ttl": ttl}, {"ttl": lease_ttl(ttl, settings=ctx.discovery.settings)}),
    )


@router.delete(
    "/v1/leases/{lease_id}",
    status_code=204,
    response_class=Response,
    responses=responses(401, 403, 404, 422),
    summary="Release a lease early",
)
async def release_lease(lease_id: str, client: LeaseClient, ctx: Context) -> Response:
    if len(lease_id) > MAX_LEASE_ID:
        raise ApiError(404, "lease_not_found", "no such lease")
    await ctx.discovery.release(client=client.name, lease_id=lease_id)
    ctx.metrics.releases.inc()
    return Response(status_code=204)
