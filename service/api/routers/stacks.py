"""`/v1/stacks` (scope admin): the same stack inspection as the CLI, through a `StackInspector`."""

from __future__ import annotations

import inspect
from typing import Any

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel

from service.api.deps import AdminClient, Context, StackInspector
from service.api.errors import ApiError, responses

router = APIRouter(tags=["stacks"])


class StackList(BaseModel):
    items: list[dict[str, Any]]


def _plain(value: Any) -> dict[str, Any]:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True)
    return dict(value)


async def _call(fn: Any, *args: Any) -> Any:
    # The real inspector reads Pulumi state (blocking): keep it off the event loop.
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    return await run_in_threadpool(fn, *args)


def _inspector(ctx: Context) -> StackInspector:
    if ctx.stacks is None:
        raise ApiError(503, "unavailable", "stack inspection is not configured in this process")
    return ctx.stacks


@router.get("/v1/stacks", response_model=StackList, responses=responses(401, 403, 503), summary="List stacks")
async def list_stacks(ctx: Context, _client: AdminClient) -> StackList:
    stacks = await _call(_inspector(ctx).list_stacks)
    return StackList(items=[_plain(s) for s in stacks])


@router.get(
    "/v1/stacks/{name}",
    response_model=dict[str, Any],
    responses=responses(401, 403, 404, 503),
    summary="One stack",
)
async def get_stack(name: str, ctx: Context, _client: AdminClient) -> dict[str, Any]:
    try:
        stack = await _call(_inspector(ctx).get_stack, name)
    except KeyError:
        stack = None
    if stack is None:
        raise ApiError(404, "stack_not_found", f"no stack {name!r}; GET /v1/stacks lists them")
    return _plain(stack)
