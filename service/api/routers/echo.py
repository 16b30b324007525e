"""The echo route answers with the caller's address: fetched through a proxy, its egress IP."""

from __future__ import annotations

from fastapi import APIRouter, Request

from service.api.models import Echo

router = APIRouter(tags=["echo"])


@router.get(
    "/v1/echo", response_model=Echo, summary="The caller's address (no auth: probes go through proxies)"
)
async def echo(request: Request) -> Echo:
    client = request.client
    return Echo(ip=client.host if client else "unknown", port=client.port if client else None)
