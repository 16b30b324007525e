"""`create_app`: the FastAPI app over collaborators passed in explicitly (nothing global)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI
from prometheus_client import CollectorRegistry

from service.api.body_guard import BodyGuard
from service.api.deps import ApiContext, DeletionGate, ReadyCheck, StackInspector
from service.api.errors import install_error_handlers, responses
from service.api.fast_lease import LeaseFastPath, LeaseServingApp
from service.api.metrics import ApiMetrics
from service.api.middleware import RequestIdMiddleware
from service.api.models import LeaseBody
from service.api.pacing import ClientPacing, Pacer
from service.api.query_guard import refuse_unknown_query
from service.api.routers import deletions as deletions_router
from service.api.routers import echo, leases, probes, proxies, reports, stacks, status, whoami
from service.auth import TokenAuthenticator
from service.discovery.service import DiscoveryService
from service.inventory import Inventory
from service.status import StatusReader

DESCRIPTION = (
    "Lease healthy forward proxies for crawling: least recently used among eligible proxies, per-client and "
    "per-target cooldowns, per-target ban penalties with full-jitter backoff, sticky sessions. "
    "See docs/api.md."
)


def _with_sweeper(discovery: DiscoveryService, lifespan: Any) -> Any:
    """The caller's lifespan, with discovery's lease-user sweeper running for as long as the app serves (and
    the lease users' control connections closed after it)."""

    @asynccontextmanager
    async def wrapped(app: FastAPI) -> AsyncIterator[Any]:
        sweeper = asyncio.create_task(discovery.sweeper(), name="lease-user-sweeper")
        try:
            if lifespan is None:
                yield None
            else:
                async with lifespan(app) as state:
                    yield state
        finally:
            sweeper.cancel()
            await asyncio.gather(sweeper, return_exceptions=True)
            await discovery.lease_users.close()  # its kept control connections

    return wrapped


def create_app(
    *,
    inventory: Inventory,
    discovery: DiscoveryService,
    authenticator: TokenAuthenticator,
    registry: CollectorRegistry | None = None,
    stack_inspector: StackInspector | None = None,
    status_board: StatusReader | None = None,
    ready_checks: Sequence[ReadyCheck] = (),
    deletions: DeletionGate | None = None,
    lifespan: Any = None,
    body_exempt: Mapping[str, int] | None = None,
) -> LeaseServingApp:
    """Build the app. `registry` should be the one the health engine's metrics use, so /metrics shows both.
    `body_exempt`: POST paths that take a body without a token, each with its limit (the page's log in)."""
    registry = registry or CollectorRegistry()
    app = LeaseServingApp(
        title="proxy-operator discovery API",
        version="v1",
        description=DESCRIPTION,
        lifespan=_with_sweeper(discovery, lifespan),
        # FastAPI's OpenTelemetry bridge looks for configured providers on every request (about 5 % of a
        # lease); the service has its own metrics (/metrics) and configures no OpenTelemetry SDK.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.context = ApiContext(
        inventory=inventory,
        discovery=discovery,
        authenticator=authenticator,
        registry=registry,
        metrics=ApiMetrics(registry),
        stacks=stack_inspector,
        status=status_board,
        ready_checks=ready_checks,
        deletions=deletions,
    )
    install_error_handlers(app)
    pacer = Pacer()
    limit = discovery.settings.max_body_bytes
    app.add_middleware(ClientPacing, pacer=pacer)  # after BodyGuard named the client, before any lease work
    app.add_middleware(BodyGuard, authenticator=authenticator, limit=limit, exempt=body_exempt)
    app.add_middleware(RequestIdMiddleware)
    # in front of them all, FastAPI's own included: it does what they would (see fast_lease.py)
    app.lease_fast_path = LeaseFastPath(
        app.stack,
        context=app.state.context,
        router=leases.router,
        endpoint=leases.create_lease,
        writer=leases.create_lease_json,
        body_model=LeaseBody,
        error_handlers=app.exception_handlers,
        limit=limit,
        pacer=pacer,
        exempt=body_exempt or (),
    )
    app.include_router(probes.router)  # probes take what kubelets and Prometheus send
    for module in (echo, whoami, proxies, leases, reports, stacks, status, deletions_router):
        # An unknown query parameter is a 422 on every route: declared, so /openapi.json tells the truth.
        app.include_router(
            module.router, dependencies=[Depends(refuse_unknown_query)], responses=responses(422)
        )
    return app
