"""Request bodies: only an authenticated client may send one, and only up to `max_body_bytes`.

Plain ASGI, outside FastAPI (which reads a route's body before it solves the route's dependencies, so the
token check in `deps.py` comes too late to spare the read). A request that carries a body (a Content-Length
above 0 or a Transfer-Encoding) must present a known bearer token before a byte of it is read: 401 otherwise.
Then the body is counted as it streams in, since Content-Length may be absent (chunked) or wrong: a declared
length above the limit is a 413 at once, and a stream that passes it is cut at the limit with a 413.
The client found here is kept in the scope's state, so the route's dependency does not hash the token again.

Named exceptions (`exempt`: a POST path and its own smaller limit) take a body without a token: the fleet
page's log in form (service/ui/login.py), which is where a token arrives, 1 KiB at most and rate limited by
source in its route.
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.middleware import request_id_of
from service.auth import Client, TokenAuthenticator

REALM = 'Bearer realm="proxy-operator"'
STATE_CLIENT = "client"


class BodyTooLarge(HTTPException):
    """Raised from `receive` past the limit; FastAPI re-raises an HTTPException met while reading a body."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request bodies are limited to {limit} bytes (max_body_bytes); send less")


class BodyGuard:
    def __init__(
        self,
        app: ASGIApp,
        *,
        authenticator: TokenAuthenticator,
        limit: int,
        exempt: Mapping[str, int] | None = None,
    ) -> None:
        self.app = app
        self._authenticator = authenticator
        self.limit = limit
        self._exempt = dict(exempt or {})  # POST path -> its limit; no token asked

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared, has_body = _declared_length(scope)
        if not has_body:
            await self.app(scope, receive, send)
            return
        limit = self._exempt.get(scope["path"]) if scope["method"] == "POST" else None
        refusal = self._refuse_client(scope) if limit is None else None
        limit = self.limit if limit is None else limit
        if refusal is None and declared is not None and declared > limit:
            refusal = _too_large(scope, limit)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await _Capped(self.app, limit=limit)(scope, receive, send)

    def _refuse_client(self, scope: Scope) -> JSONResponse | None:
        scheme, _, token = _authorization(scope).partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return _unauthorized(scope, "send Authorization: Bearer <token> with a request body", REALM)
        client: Client | None = self._authenticator.authenticate(token.strip())
        if client is None:
            return _unauthorized(scope, "unknown token", f'{REALM}, error="invalid_token"')
        scope.setdefault("state", {})[STATE_CLIENT] = client
        return None


class _Capped:
    """One request whose body is counted as it is received; past the limit the answer is a 413, whatever
    the app would have said (it may have caught the error and answered something else)."""

    def __init__(self, app: ASGIApp, *, limit: int) -> None:
        self.app, self.limit = app, limit
        self.received = 0
        self.exceeded = False
        self.started = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def counted() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                self.received += len(message.get("body", b""))
                if self.received > self.limit:
                    self.exceeded = True
                    raise BodyTooLarge(self.limit)
            return message

        async def guarded(message: Message) -> None:
            if self.exceeded and not self.started:
                return  # the app's own answer to a body that was cut: ours goes instead
            self.started = True
            await send(message)

        try:
            await self.app(scope, counted, guarded)
        except BodyTooLarge:
            if self.started:
                raise
        if self.exceeded and not self.started:
            await _too_large(scope, self.limit)(scope, receive, send)


def _declared_length(scope: Scope) -> tuple[int | None, bool]:
    """(Content-Length if given, whether a body follows). A malformed length never reaches here: the HTTP
    server refuses it."""
    length: int | None = None
    chunked = False
    for name, value in scope["headers"]:
        if name == b"content-length" and value.strip().isdigit():
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = True
    return length, chunked or bool(length)


def _authorization(scope: Scope) -> str:
    for name, value in scope["headers"]:
        if name == b"authorization":
            return str(value.decode("latin-1"))  # the first, as Starlette's headers.get reads it
    return ""


def _error(scope: Scope, status: int, reason: str, detail: str, headers: dict[str, str]) -> JSONResponse:
    body = {"error": reason, "detail": detail, "requestId": request_id_of(scope)}
    return JSONResponse(body, status_code=status, headers=headers)


def _unauthorized(scope: Scope, detail: str, challenge: str) -> JSONResponse:
    return _error(scope, 401, "unauthorized", detail, {"WWW-Authenticate": challenge, "Connection": "close"})


def _too_large(scope: Scope, limit: int) -> JSONResponse:
    detail = f"request bodies are limited to {limit} bytes (max_body_bytes); send less"
    return _error(scope, 413, "body_too_large", detail, {"Connection": "close"})
