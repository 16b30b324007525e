"""`/v1/reports`: what a target did with a proxy, from a client that leased it (discovery/reports.py)."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.convert import timestamp
from service.api.deps import Context, ReportClient
from service.api.errors import responses
from service.api.models import ReportBody, ReportResponse

router = APIRouter(tags=["reports"])
RETRY_AFTER = {
    "Retry-After": {
        "description": "Whole seconds until the client's report window ends",
        "schema": {"type": "string"},
    }
}


@router.post(
    "/v1/reports",
    response_model=ReportResponse,
    responses={
        **responses(400, 401, 403, 404, 413, 422),
        429: {**responses(429)[429], "headers": RETRY_AFTER},
    },
    summary="Report an outcome",
)
async def create_report(body: ReportBody, client: ReportClient, ctx: Context) -> ReportResponse:
    result = await ctx.discovery.report(
        client=client.name, outcome=body.outcome, target=body.target, lease_id=body.lease, proxy=body.proxy
    )
    ctx.metrics.reports.labels(body.outcome).inc()
    penalty = result.penalty
    return ReportResponse(
        proxy=result.proxy,
        target=result.target,
        outcome=body.outcome,
        penalised_until=timestamp(penalty.until) if penalty else None,
        strikes=penalty.strikes if penalty else None,
        effect=result.effect,
    )
