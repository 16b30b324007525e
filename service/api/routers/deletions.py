"""`/v1/deletions` (scope admin): the change the deletion budget stopped, and the one way to let it through.

A change that would remove more than the budget allows (docs/operations.md, "What deletes a proxy") removes
nothing until someone allows exactly that change by its id, once.
"""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, Field

from service.api.deps import AdminClient, Context, DeletionGate
from service.api.errors import ApiError, responses

router = APIRouter(tags=["deletions"])


class HeldDeletionOut(BaseModel):
    change_id: str = Field(serialization_alias="changeId", description="Allow it with this id.")
    proxies: list[str] = Field(description="The proxies (ns/name) the change would remove.")
    fleet: int = Field(description="How many proxies run now.")
    message: str


class DeletionsOut(BaseModel):
    held: HeldDeletionOut | None = Field(description="The change waiting for an allowance, if any.")


class AllowedOut(BaseModel):
    change_id: str = Field(serialization_alias="changeId")
    allowed: bool


def _gate(ctx: Context) -> DeletionGate:
    if ctx.deletions is None:
        raise ApiError(503, "unavailable", "no control loop runs in this process")
    return ctx.deletions


@router.get(
    "/v1/deletions",
    response_model=DeletionsOut,
    response_model_by_alias=True,
    responses=responses(401, 403, 503),
    summary="The change the deletion budget stopped",
)
async def held_deletions(ctx: Context, _client: AdminClient) -> DeletionsOut:
    gate = _gate(ctx)
    held = gate.held_deletion
    if held is None:
        return DeletionsOut(held=None)
    return DeletionsOut(
        held=HeldDeletionOut(
            change_id=held.change_id,
            proxies=list(held.keys),
            fleet=held.fleet,
            message=held.message(budget=gate.budget),
        )
    )


@router.post(
    "/v1/deletions/{change_id}/allow",
    response_model=AllowedOut,
    response_model_by_alias=True,
    responses=responses(401, 403, 404, 503),
    summary="Let the stopped change go ahead, once",
)
async def allow_deletion(change_id: str, ctx: Context, _client: AdminClient) -> AllowedOut:
    if not _gate(ctx).allow_deletions(change_id):
        raise ApiError(
            404,
            "no_such_change",
            f"no change with id {change_id} is waiting: GET /v1/deletions shows the one that is (a new "
            "edit of the manifests makes a new id)",
        )
    return AllowedOut(change_id=change_id, allowed=True)
