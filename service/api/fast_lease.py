"""`POST /v1/leases` without FastAPI's per-request machinery and our middlewares for the common request.

Profiled under load (docs/operations.md, "Bench"), FastAPI's walk over the included routers, its solving of
the route's dependencies and its re-validation of the returned model cost more than the lease itself, and the
middlewares in front of it (request id, body guard, pacing) another sixth of a lease. FastAPI's own outer
layers (Starlette's ServerErrorMiddleware, FastAPI's body limit and telemetry wrappers) cost another 6 % of a
lease in process (issue 20). This plain-ASGI layer sits in front of all of them (`LeaseServingApp.__call__`)
and serves the request that needs none of that: `POST /v1/leases`, no query string, a Content-Length within
the body limit (no chunked body), a JSON body that validates, a bearer token with the `lease` scope. It does
what the middlewares would do for it (the request id: `middleware.py`; the body guard's token check and limit:
`body_guard.py`; the client's pacing: `pacing.py`, the same `Pacer`), calls the route's own function with the
arguments FastAPI would pass and writes the same JSON. Any other request, including every one that ends in a
4xx before the route runs, goes to the middlewares and FastAPI with its body replayed, so those answers stay
theirs. Errors the route raises go to the app's own exception handlers; one without a handler of its own gets
the app's handler for `Exception` (a 500) and is raised again after it, as ServerErrorMiddleware does (the
server logs it).
tests/service/test_api_fast_lease.py holds both paths to the same bytes.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, ExceptionHandler, Message, Receive, Scope, Send

from service.api.body_guard import STATE_CLIENT
from service.api.middleware import HEADER, VALID_ID, new_request_id
from service.api.pacing import STATE_PACE, Pacer
from service.auth import Scope as AuthScope

log = logging.getLogger(__name__)
PATH = "/v1/leases"
PARAMETERS = ("client", "ctx", "body")  # what `create_lease` takes; anything else: FastAPI serves it all
Endpoint = Callable[..., Awaitable[BaseModel]]
Writer = Callable[..., Awaitable[bytes]]


def _plain(router: APIRouter, endpoint: Endpoint) -> bool:
    """The route still takes what this path passes and nothing more: the same parameters, no dependencies
    declared on the route or its router, the default status. Otherwise FastAPI serves every request."""
    routes = [r for r in router.routes if isinstance(r, APIRoute) and r.endpoint is endpoint]
    return (
        tuple(inspect.signature(endpoint).parameters) == PARAMETERS
        and not router.dependencies
        and len(routes) == 1
        and not routes[0].dependencies
        and routes[0].status_code in (None, 200)
    )


Headers = tuple[bytes | None, bytes | None, int, bytes]  # authorization, content type, length, request id


def _headers(headers: list[tuple[bytes, bytes]]) -> Headers | None:
    """What the fast path reads of the headers, each as the middlewares would; None for a chunked body (the
    body guard counts it as it streams). Without a name given twice a dict reads them at once."""
    named = dict(headers)
    if len(named) == len(headers):
        if b"transfer-encoding" in named:
            return None
        value = named.get(b"content-length")
        length = int(value) if value is not None and value.strip().isdigit() else -1
        return named.get(b"authorization"), named.get(b"content-type"), length, named.get(HEADER, b"")
    authorization = content_type = None
    length = -1
    request_id = b""
    for name, value in headers:
        if name == b"authorization":
            if authorization is None:
                authorization = value
        elif name == b"content-type":
            if content_type is None:
                content_type = value
        elif name == b"content-length":
            if value.strip().isdigit():  # the last one, as the body guard reads it
                length = int(value)
        elif name == HEADER:
            request_id = value  # the last one, as RequestIdMiddleware reads it
        elif name == b"transfer-encoding":
            return None
    return authorization, content_type, length, request_id


def _is_json(content_type: bytes) -> bool:
    """What FastAPI reads as JSON, narrowed to the plain spelling (others take FastAPI's path)."""
    return content_type.split(b";", 1)[0].strip().lower() == b"application/json"


class LeaseServingApp(FastAPI):
    """The service's app: FastAPI, with the lease fast path (when set) in front of FastAPI's whole stack."""

    lease_fast_path: LeaseFastPath | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        fast = self.lease_fast_path
        if fast is not None and scope["type"] == "http" and scope["path"] == PATH:
            scope["app"] = self  # as Starlette sets it: the error handlers' requests reach the app
            await fast(scope, receive, send)
            return
        await super().__call__(scope, receive, send)

    async def stack(self, scope: Scope, receive: Receive, send: Send) -> None:
        """FastAPI's own handling, whole: what the fast path hands every request it does not serve."""
        await super().__call__(scope, receive, send)


class LeaseFastPath:
    def __init__(
        self,
        app: ASGIApp,
        *,
        context: Any,
        router: APIRouter,
        endpoint: Endpoint,
        body_model: type[BaseModel],
        error_handlers: Mapping[Any, ExceptionHandler],
        limit: int,
        pacer: Pacer,
        exempt: Collection[str] = (),
        writer: Writer | None = None,
    ) -> None:
        """`writer`: the endpoint's answer as JSON bytes, from the same arguments (else the endpoint's model
        is dumped)."""
        self.app = app
        self._context = context
        self._endpoint = endpoint
        self._writer = writer
        self._body_model = body_model
        self._handlers = error_handlers
        self._limit = limit  # the body guard's
        self._pacer = pacer  # ClientPacing's
        self.enabled = _plain(router, endpoint) and PATH not in exempt
        if not self.enabled:
            log.warning("lease fast path off: %s is no longer the route it knows", endpoint.__name__)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            not self.enabled
            or scope["type"] != "http"
            or scope["path"] != PATH
            or scope["method"] != "POST"
            or scope.get("query_string")
        ):
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        arguments = await self._arguments(scope, receive, messages)
        if arguments is None:
            await self.app(scope, _replay(messages, receive), send)
            return
        await self._serve(scope, receive, send, arguments)

    async def _arguments(
        self, scope: Scope, receive: Receive, messages: list[Message]
    ) -> dict[str, Any] | None:
        """The route's arguments, or None when the middlewares and FastAPI should decide (and answer)."""
        read = _headers(scope["headers"])
        if read is None:
            return None
        authorization, content_type, length, request_id = read
        if not 0 < length <= self._limit or authorization is None or content_type is None:
            return None
        if not _is_json(content_type):
            return None
        scheme, _, token = authorization.decode("latin-1").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return None
        client = self._context.authenticator.authenticate(token)
        if client is None or AuthScope.lease not in client.scopes:
            return None
        body = await _read_body(receive, messages)
        if not body or len(body) > self._limit:
            return None
        try:
            parsed = self._body_model.model_validate_json(body)
        except ValidationError:  # also for JSON that does not parse: FastAPI then answers
            return None
        state = scope.setdefault("state", {})
        state["request_id"] = request_id.decode() if VALID_ID.match(request_id) else new_request_id()
        state[STATE_CLIENT] = client
        return {"client": client, "ctx": self._context, "body": parsed}

    async def _serve(self, scope: Scope, receive: Receive, send: Send, arguments: dict[str, Any]) -> None:
        name = arguments["client"].name
        await self._pacer.wait(name)
        state = scope["state"]
        id_header = (HEADER, state["request_id"].encode())
        try:
            if self._writer is None:
                answer = (await self._endpoint(**arguments)).model_dump_json(by_alias=True).encode()
            else:
                answer = await self._writer(**arguments)
        except Exception as exc:
            response, again = await self._error_response(Request(scope, receive), exc)
            if response is None:
                raise  # no handler at all: the server answers 500
            if again is not None:  # as ServerErrorMiddleware, outside the request id and pacing: sent as is
                await response(scope, receive, send)
                raise
        else:
            self._pacer.answered(name, 200, None)
            await _send_json(send, answer, id_header)
            return

        async def answering(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), id_header]
                self._pacer.answered(name, int(message["status"]), state.get(STATE_PACE))
            await send(message)

        await response(scope, receive, answering)

    async def _error_response(
        self, request: Request, exc: Exception
    ) -> tuple[Response | None, Exception | None]:
        """What the app's exception handler for `exc` answers (as ExceptionMiddleware looks it up), and the
        exception to raise once it is sent: `exc` when only the handler for `Exception` took it, as
        ServerErrorMiddleware raises it again after its 500 (so the server logs it)."""
        for cls in type(exc).__mro__:
            if cls in self._handlers:
                answer = self._handlers[cls](request, exc)  # type: ignore[arg-type]  # HTTP, not WebSocket
                response = await answer if inspect.isawaitable(answer) else answer
                return response, exc if cls is Exception else None
        return None, None


async def _send_json(send: Send, body: bytes, request_id: tuple[bytes, bytes]) -> None:
    """What Starlette's `Response(body, media_type="application/json")` sends, without building one, with the
    request id RequestIdMiddleware adds."""
    headers = [(b"content-length", b"%d" % len(body)), (b"content-type", b"application/json"), request_id]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _read_body(receive: Receive, messages: list[Message]) -> bytes:
    chunks = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return b""  # a disconnect: FastAPI sees it too
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()

    return replayed
