"""The fleet page: a read-only view of every proxy, its stack and its leases, served by the API's app.

`install(app, ...)` adds the page's routes (`/`, `/proxy/...`, `/stacks`, `/deletions`, `/leases`, the log in
form) to the FastAPI app; see docs/operations.md ("The fleet page").
"""

from __future__ import annotations

from fastapi import FastAPI

from service.api.deps import ApiContext
from service.ui import login, router
from service.ui.context import LoginLimiter, StackRow, StacksSource, UiContext
from service.ui.index import FleetIndex
from service.ui.probes import ProbeHistory
from service.ui.session import EndedSessions, LocalEndedSessions, RedisEndedSessions, Sessions
from service.ui.settings import UiSettings
from service.ui.views import LeaseRates

__all__ = [
    "LOGIN_BODY_LIMIT",
    "LOGIN_PATH",
    "EndedSessions",
    "LocalEndedSessions",
    "ProbeHistory",
    "RedisEndedSessions",
    "StackRow",
    "StacksSource",
    "UiSettings",
    "build",
    "install",
]
LOGIN_PATH = login.LOGIN_PATH
LOGIN_BODY_LIMIT = login.LOGIN_BODY_LIMIT


def build(
    context: ApiContext,
    *,
    settings: UiSettings,
    key: bytes,
    stacks: StacksSource | None = None,
    probes: ProbeHistory | None = None,
    ended: EndedSessions | None = None,
) -> UiContext:
    """`ended`: where log outs are kept (Redis, shared by the replicas, when the discovery store is Redis)."""
    return UiContext(
        settings=settings,
        sessions=Sessions(
            key=key,
            authenticator=context.authenticator,
            lifetime=settings.session_hours * 3600,
            ended=ended or LocalEndedSessions(),
        ),
        index=FleetIndex(inventory=context.inventory, board=context.status),
        limiter=LoginLimiter(attempts=settings.login_attempts),
        stacks=stacks,
        probes=probes,
    )


def install(app: FastAPI, ui: UiContext) -> None:
    app.state.ui = ui
    app.state.lease_rates = LeaseRates(app.state.context.registry)
    app.include_router(login.router)
    app.include_router(router.router)
