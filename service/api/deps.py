"""Dependencies shared by the routers, as `Annotated` aliases: the context and the authenticated client."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Protocol

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CollectorRegistry

from automation.deletion_budget import DeletionBudget, HeldDeletion
from service.api.body_guard import STATE_CLIENT
from service.api.errors import ApiError
from service.api.metrics import ApiMetrics
from service.auth import Client, Scope, TokenAuthenticator
from service.discovery.service import DiscoveryService
from service.inventory import Inventory
from service.status import StatusReader

ReadyCheck = Callable[[], Awaitable[str | None]]  # returns why not ready, or None
REALM = 'Bearer realm="proxy-operator"'


class StackInspector(Protocol):
    """What `/v1/stacks` shows; the same inspection as the CLI (the lead wires the real one)."""

    def list_stacks(self) -> Sequence[Any] | Awaitable[Sequence[Any]]: ...

    def get_stack(self, name: str) -> Any | Awaitable[Any]: ...


class DeletionGate(Protocol):
    """The control loop's deletion budget, as `/v1/deletions` sees it."""

    @property
    def held_deletion(self) -> HeldDeletion | None: ...

    @property
    def budget(self) -> DeletionBudget: ...

    def allow_deletions(self, change_id: str) -> bool: ...


@dataclass
class ApiContext:
    inventory: Inventory
    discovery: DiscoveryService
    authenticator: TokenAuthenticator
    registry: CollectorRegistry
    metrics: ApiMetrics
    stacks: StackInspector | None = None
    status: StatusReader | None = None
    ready_checks: Sequence[ReadyCheck] = field(default_factory=tuple)
    deletions: DeletionGate | None = None


async def get_context(request: Request) -> ApiContext:
    # async: FastAPI runs a plain `def` dependency in a worker thread, which costs more than the lookup
    return context_of(request)


def context_of(request: Request) -> ApiContext:
    context: ApiContext = request.app.state.context
    return context


Context = Annotated[ApiContext, Depends(get_context)]
_bearer = HTTPBearer(auto_error=False, description="A token from the tokens file; scopes lease/report/admin.")


def _client(request: Request, credentials: HTTPAuthorizationCredentials | None) -> Client:
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise ApiError(
            401, "unauthorized", "send Authorization: Bearer <token>", headers={"WWW-Authenticate": REALM}
        )
    # BodyGuard already checked this header when the request has a body: no second hash.
    client = request.scope.get("state", {}).get(STATE_CLIENT)
    if not isinstance(client, Client):
        client = context_of(request).authenticator.authenticate(credentials.credentials)
    if client is None:
        raise ApiError(
            401,
            "unauthorized",
            "unknown token",
            headers={"WWW-Authenticate": f'{REALM}, error="invalid_token"'},
        )
    return client


def require(*scopes: Scope) -> Callable[..., Awaitable[Client]]:
    """A dependency that authenticates and demands one of `scopes` (none given: any known token)."""
    wanted = " ".join(s.value for s in scopes)

    async def dependency(
        request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
    ) -> Client:
        client = _client(request, credentials)
        if scopes and not client.scopes.intersection(scopes):
            raise ApiError(
                403,
                "forbidden",
                f"client {client.name!r} lacks scope {wanted!r}",
                headers={"WWW-Authenticate": f'{REALM}, error="insufficient_scope", scope="{wanted}"'},
            )
        return client

    return dependency


AnyClient = Annotated[Client, Depends(require())]
LeaseClient = Annotated[Client, Depends(require(Scope.lease))]
ReportClient = Annotated[Client, Depends(require(Scope.report))]
ReaderClient = Annotated[Client, Depends(require(Scope.lease, Scope.report, Scope.admin))]
AdminClient = Annotated[Client, Depends(require(Scope.admin))]
