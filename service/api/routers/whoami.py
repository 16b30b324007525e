"""`/v1/whoami`: which client a token belongs to, its scopes, and the limits this server applies."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import AnyClient, Context
from service.api.errors import responses
from service.api.models import Limits, Whoami

router = APIRouter(tags=["whoami"])


@router.get("/v1/whoami", response_model=Whoami, responses=responses(401, 422), summary="Who the token is")
async def whoami(client: AnyClient, ctx: Context) -> Whoami:
    settings = ctx.discovery.settings
    return Whoami(
        name=client.name,
        scopes=sorted(scope.value for scope in client.scopes),
        limits=Limits(
            max_count=settings.max_count,
            lease_ttl_seconds=settings.lease_ttl_seconds,
            lease_ttl_max_seconds=settings.lease_ttl_max_seconds,
            max_wait_seconds=settings.max_wait_seconds,
            cooldown_seconds=settings.cooldown_seconds,
            session_idle_seconds=settings.session_idle_seconds,
        ),
    )
