"""`/v1/reports`: what a target did with a proxy. `banned` penalises it for that target only."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.convert import timestamp
from service.api.deps import Context, ReportClient
from service.api.errors import responses
from service.api.models import ReportBody, ReportResponse

router = APIRouter(tags=["reports"])


@router.post(
    "/v1/reports",
    response_model=ReportResponse,
    responses=responses(400, 401, 403, 404, 422),
    summary="Report an outcome",
)
async def create_report(body: ReportBody, client: ReportClient, ctx: Context) -> ReportResponse:
    proxy, target, penalty = await ctx.discovery.report(
        client=client.name, outcome=body.outcome, target=body.target, lease_id=body.lease, proxy=body.proxy
    )
    ctx.metrics.reports.labels(body.outcome).inc()
    return ReportResponse(
        proxy=proxy,
        target=target,
        outcome=body.outcome,
        penalised_until=timestamp(penalty.until) if penalty else None,
        strikes=penalty.strikes if penalty else None,
    )
