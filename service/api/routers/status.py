"""`/v1/status` (scope admin): each Proxy's phase, conditions, address and recent events.

In directory mode this is the only place the reconciler's verdicts are visible besides the logs (in a
cluster the same data goes to each Proxy's status subresource and events).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from service.api.deps import AdminClient, Context
from service.api.errors import ApiError, responses
from service.status import StatusReader

router = APIRouter(tags=["status"])


class EventOut(BaseModel):
    reason: str
    message: str
    warning: bool
    at: datetime


class ProxyStatusOut(BaseModel):
    key: str
    status: dict[str, Any] = Field(
        description="phase, conditions, address, egressIP, observedSpecHash, stack"
    )
    events: list[EventOut] = Field(description="The most recent events, oldest first.")


class StatusList(BaseModel):
    items: list[ProxyStatusOut]


def _board(ctx: Context) -> StatusReader:
    if ctx.status is None:
        raise ApiError(503, "unavailable", "proxy status is not kept in this process")
    return ctx.status


def _one(board: StatusReader, key: str, *, events: int) -> ProxyStatusOut:
    recent = board.events(key)[-events:]
    return ProxyStatusOut(
        key=key,
        status=(board.published(key) or board.get(key)).model_dump(
            mode="json", by_alias=True, exclude_none=True
        ),
        events=[EventOut(reason=e.reason, message=e.message, warning=e.warning, at=e.at) for e in recent],
    )


@router.get(
    "/v1/status", response_model=StatusList, responses=responses(401, 403, 503), summary="Proxy status"
)
async def list_status(ctx: Context, _client: AdminClient) -> StatusList:
    board = _board(ctx)
    return StatusList(items=[_one(board, key, events=5) for key in sorted(board.all())])


@router.get(
    "/v1/status/{namespace}/{name}",
    response_model=ProxyStatusOut,
    responses=responses(401, 403, 404, 503),
    summary="One proxy's status and events",
)
async def get_status(namespace: str, name: str, ctx: Context, _client: AdminClient) -> ProxyStatusOut:
    board = _board(ctx)
    key = f"{namespace}/{name}"
    if not board.has(key) and not board.events(key):
        raise ApiError(404, "proxy_not_found", f"no status for {key!r}; GET /v1/status lists them")
    return _one(board, key, events=50)
