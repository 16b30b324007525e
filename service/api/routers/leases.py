"""`/v1/leases`: hand out proxies (LRU among eligible, sticky sessions, bounded wait) and release them."""

from __future__ import annotations

import time

from fastapi import APIRouter, Response

from service.api.convert import leased
from service.api.deps import Context, LeaseClient
from service.api.errors import ApiError, responses
from service.api.models import LeaseBody, LeaseResponse
from service.discovery.errors import DiscoveryError
from service.discovery.service import ANY_TARGET, LeaseGrant, LeaseQuery

router = APIRouter(tags=["leases"])
RETRY_AFTER_HEADER = {
    "Retry-After": {"description": "Whole seconds until a proxy is eligible", "schema": {"type": "string"}}
}


def _query(body: LeaseBody, *, client: str, ctx: Context) -> LeaseQuery:
    """The request within this server's limits: count, ttl and wait are clamped, not refused (see docs)."""
    limits = ctx.discovery.settings
    return LeaseQuery(
        client=client,
        count=min(body.count, limits.max_count),
        pool=body.pool,
        provider=body.provider,
        labels=body.labels,
        protocol=body.protocol,
        target=body.target or ANY_TARGET,
        session=body.session,
        strict=body.strict,
        ttl=min(body.ttl, limits.lease_ttl_max_seconds) if body.ttl is not None else None,
        wait=min(body.wait, limits.max_wait_seconds),
    )


@router.post(
    "/v1/leases",
    response_model=LeaseResponse,
    responses={
        **responses(400, 401, 403, 409, 422),
        503: {**responses(503)[503], "headers": RETRY_AFTER_HEADER},
    },
    summary="Lease proxies",
)
async def create_lease(body: LeaseBody, client: LeaseClient, ctx: Context) -> LeaseResponse:
    query = _query(body, client=client.name, ctx=ctx)
    started = time.perf_counter()
    try:
        grant = await ctx.discovery.lease(query)
    except DiscoveryError as exc:
        ctx.metrics.leases.labels(exc.reason).inc()
        raise
    finally:
        ctx.metrics.lease_seconds.observe(time.perf_counter() - started)
    ctx.metrics.leases.labels("rebound" if grant.rebound else "ok").inc()
    ctx.metrics.leased.inc(len(grant.leases))
    return _response(grant, query=query, ctx=ctx)


def _response(grant: LeaseGrant, *, query: LeaseQuery, ctx: Context) -> LeaseResponse:
    items = []
    for lease in grant.leases:
        endpoint = ctx.inventory.get(lease.proxy)
        if endpoint is not None and endpoint.has_address:  # removed in the last instant: leave it out
            items.append(leased(lease, endpoint=endpoint, health=ctx.inventory.health(lease.proxy)))
    return LeaseResponse(
        leases=items,
        target=query.target,
        session=grant.session,
        rebound=grant.rebound,
        previous_proxy=grant.previous_proxy,
    )


@router.delete(
    "/v1/leases/{lease_id}",
    status_code=204,
    response_class=Response,
    responses=responses(401, 403, 404, 422),
    summary="Release a lease early",
)
async def release_lease(lease_id: str, client: LeaseClient, ctx: Context) -> Response:
    if len(lease_id) > 128:
        raise ApiError(404, "lease_not_found", "no such lease")
    await ctx.discovery.release(client=client.name, lease_id=lease_id)
    return Response(status_code=204)
