"""Request ids: from a well-formed `X-Request-ID` header or made up; echoed back and put in errors."""

from __future__ import annotations

import re
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = b"x-request-id"
_VALID = re.compile(rb"^[A-Za-z0-9._:-]{1,128}$")


class RequestIdMiddleware:
    """Plain ASGI (not BaseHTTPMiddleware): it costs one dict write per request, not a task."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(HEADER, b"")
        request_id = given.decode() if _VALID.match(given) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (HEADER, request_id.encode())]
            await send(message)

        await self.app(scope, receive, send_with_id)


def request_id_of(scope: Scope) -> str:
    return str(scope.get("state", {}).get("request_id", "")) or uuid.uuid4().hex
