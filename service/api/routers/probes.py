"""Liveness, readiness and metrics: unauthenticated, for the kubelet and Prometheus."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from service.api.deps import Context
from service.api.errors import ApiError, responses
from service.api.models import Status

router = APIRouter(tags=["probes"])


@router.get("/healthz", response_model=Status, summary="The process is alive")
async def healthz() -> Status:
    return Status(status="ok")


@router.get("/readyz", response_model=Status, responses=responses(503), summary="Ready to serve leases")
async def readyz(ctx: Context) -> Status:
    problems = []
    if not ctx.inventory.loaded:
        problems.append("the desired state is not loaded yet")
    if not await ctx.discovery.store.ping():
        problems.append("the discovery store does not answer")
    for check in ctx.ready_checks:
        problem = await check()
        if problem:
            problems.append(problem)
    if problems:
        raise ApiError(503, "not_ready", "; ".join(problems), headers={"Retry-After": "1"})
    return Status(status="ready")


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Prometheus"}},
    summary="Prometheus metrics",
)
async def metrics(ctx: Context) -> Response:
    return Response(generate_latest(ctx.registry), media_type=CONTENT_TYPE_LATEST)
