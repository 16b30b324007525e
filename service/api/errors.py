"""Every 4xx/5xx is `{"error": reason, "detail": ..., "requestId": ...}`; domain errors map here."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.api.middleware import request_id_of
from service.api.pacing import STATE_PACE
from service.discovery.errors import (
    DiscoveryError,
    InvalidRequest,
    LeaseLimited,
    LeaseNotFound,
    LeaseRequired,
    NoProxyAvailable,
    NotALeaseholder,
    ProxyNotFound,
    SessionLost,
    StoreUnavailable,
    TargetNotLeased,
    TooManyReports,
)

log = logging.getLogger(__name__)

STATUS_REASONS = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "too_large",
    429: "too_many_requests",
    415: "unsupported_media_type",
    422: "invalid_request",
    500: "internal_error",
    503: "unavailable",
}
_DISCOVERY_STATUS: dict[type[DiscoveryError], int] = {
    NoProxyAvailable: 503,
    SessionLost: 409,
    LeaseNotFound: 404,
    ProxyNotFound: 404,
    InvalidRequest: 422,
    NotALeaseholder: 403,
    TooManyReports: 429,
    LeaseLimited: 429,
    LeaseRequired: 422,
    TargetNotLeased: 409,
    StoreUnavailable: 503,
}


class ErrorBody(BaseModel):
    error: str = Field(description="A stable machine-readable reason, e.g. `all_cooling_down`.")
    detail: Any = Field(None, description="What went wrong and how to fix it (a string or a list of fields).")
    requestId: str = Field(description="Also in the X-Request-ID response header; quote it in bug reports.")


class ApiError(Exception):
    """Raised by routes for a 4xx/5xx with a reason."""

    def __init__(
        self, status: int, reason: str, detail: Any = None, *, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(detail)
        self.status, self.reason, self.detail, self.headers = status, reason, detail, headers


def error_response(
    request: Request, *, status: int, reason: str, detail: Any, headers: dict[str, str] | None = None
) -> JSONResponse:
    body = {"error": reason, "detail": detail, "requestId": request_id_of(request.scope)}
    return JSONResponse(body, status_code=status, headers=headers)


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI declarations of a route's error responses (so schemathesis can check them)."""
    return {s: {"model": ErrorBody, "description": STATUS_REASONS.get(s, "error")} for s in statuses}


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)  # type: ignore[arg-type]
    app.add_exception_handler(DiscoveryError, _discovery_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _unexpected)


async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
    return error_response(
        request, status=exc.status, reason=exc.reason, detail=exc.detail, headers=exc.headers
    )


async def _discovery_error(request: Request, exc: DiscoveryError) -> JSONResponse:
    detail = str(exc)
    if isinstance(exc, StoreUnavailable):  # a subclass of the store's own error too (redis_pipe.py)
        log.warning("%s %s: %s", request.method, request.url.path, exc)
        status, detail = 503, exc.DETAIL
    else:
        status = _DISCOVERY_STATUS.get(type(exc), 400)
    headers = None
    if isinstance(exc, NoProxyAvailable | TooManyReports | LeaseLimited | StoreUnavailable):
        headers = {"Retry-After": retry_after(exc.retry_after)}
    if isinstance(exc, TooManyReports) or (isinstance(exc, LeaseLimited) and exc.reason == "lease_rate"):
        request.scope.setdefault("state", {})[STATE_PACE] = exc.retry_after  # the client's own limit
    return error_response(request, status=status, reason=exc.reason, detail=detail, headers=headers)


def retry_after(seconds: float) -> str:
    """Whole seconds, rounded up, at least 1: retrying after it never lands inside the cooldown."""
    whole = int(seconds) + (seconds > int(seconds))
    return str(max(1, whole))


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    detail = [
        {"field": ".".join(str(p) for p in err.get("loc", ())), "message": err.get("msg", "invalid")}
        for err in exc.errors()
    ]
    return error_response(request, status=422, reason="invalid_request", detail=detail)


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    reason = STATUS_REASONS.get(exc.status_code, "error")
    return error_response(
        request,
        status=exc.status_code,
        reason=reason,
        detail=exc.detail,
        headers=getattr(exc, "headers", None),
    )


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unexpected error in %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(
        request, status=500, reason="internal_error", detail="unexpected error; see the logs"
    )
