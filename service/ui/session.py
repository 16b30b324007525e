"""Page sessions: a signed cookie that names a token's entry (never the token), valid on every replica.

The cookie is `<payload>.<signature>`: the payload (base64url JSON) holds the client's name, the fingerprint
of its token's entry (`auth.fingerprint_of`), a session id and the end time; the signature is HMAC-SHA256
with the session key (a Secret shared by the replicas, or a file generated into the state folder), so any
replica checks it and a rollout keeps it. A session ends at its end time, when its token's entry leaves the
tokens file (or changes), and at log out: the cookie is cleared, and its id is recorded as ended until its
end time. With Redis configured (the discovery store's) the record is in Redis, so every replica refuses
a copy of the cookie kept after log out; without it, only the replica that took the log out does (a
single replica, or a cluster without Redis: see docs/operations.md).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from service.auth import Client, TokenAuthenticator, can_view

COOKIE = "po_session"
log = logging.getLogger(__name__)


class EndedSessions(Protocol):
    """The ids of sessions ended by log out, each kept until the session's own end time."""

    async def end(self, session_id: str, until: float) -> None: ...

    async def ended(self, session_id: str) -> bool: ...


@dataclass
class LocalEndedSessions:
    clock: Callable[[], float] = time.time
    _ended: dict[str, float] = field(default_factory=dict)  # session id -> its end time

    async def end(self, session_id: str, until: float) -> None:
        now = self.clock()
        self._ended = {sid: t for sid, t in self._ended.items() if t > now}
        self._ended[session_id] = until

    async def ended(self, session_id: str) -> bool:
        return session_id in self._ended


@dataclass
class RedisEndedSessions:
    """In Redis, shared by the replicas: `<prefix>:ui-ended:<session id>`, expiring with the session.
    Kept locally too: when Redis cannot be reached, this replica still refuses what it ended itself (a
    page view is not refused for an outage; the log says so)."""

    client: Any  # redis.asyncio.Redis
    prefix: str
    local: LocalEndedSessions = field(default_factory=LocalEndedSessions)

    def _key(self, session_id: str) -> str:
        return f"{self.prefix}:ui-ended:{session_id}"

    async def end(self, session_id: str, until: float) -> None:
        from redis.exceptions import RedisError

        await self.local.end(session_id, until)
        try:
            await self.client.set(self._key(session_id), "1", exat=max(int(until) + 1, int(time.time()) + 1))
        except (RedisError, OSError) as exc:
            log.warning("cannot record a log out in Redis (other replicas still accept it): %s", exc)

    async def ended(self, session_id: str) -> bool:
        from redis.exceptions import RedisError

        if await self.local.ended(session_id):
            return True
        try:
            return bool(await self.client.exists(self._key(session_id)))
        except (RedisError, OSError) as exc:
            log.warning("cannot read ended sessions from Redis: %s", exc)
            return False


@dataclass(frozen=True)
class Session:
    client: Client
    session_id: str
    expires_at: float


@dataclass
class Sessions:
    key: bytes
    authenticator: TokenAuthenticator
    lifetime: float
    clock: Callable[[], float] = time.time
    ended: EndedSessions = field(default_factory=LocalEndedSessions)

    def start(self, token: str) -> tuple[str, Session] | None:
        """(cookie value, session) for a token that may view the page; None otherwise."""
        client = self.authenticator.authenticate(token)
        fingerprint = self.authenticator.fingerprint(token)
        if client is None or fingerprint is None or not can_view(client.scopes):
            return None
        session = Session(
            client=client, session_id=secrets.token_urlsafe(12), expires_at=self.clock() + self.lifetime
        )
        payload = {"n": client.name, "f": fingerprint, "s": session.session_id, "e": int(session.expires_at)}
        body = base64.urlsafe_b64encode(json.dumps(payload, separators=(",", ":")).encode()).decode()
        return f"{body}.{self._sign(body)}", session

    async def check(self, cookie: str | None) -> Session | None:
        payload = self._verified(cookie or "")
        if payload is None:
            return None
        now = self.clock()
        expires = float(str(payload.get("e", 0)))
        if expires <= now or await self.ended.ended(str(payload.get("s"))):
            return None
        client = self.authenticator.by_fingerprint(str(payload.get("n")), str(payload.get("f")))
        if client is None or not can_view(client.scopes):
            return None  # its token left the tokens file, or lost the scope
        return Session(client=client, session_id=str(payload["s"]), expires_at=expires)

    async def end(self, session: Session) -> None:
        await self.ended.end(session.session_id, session.expires_at)

    def _sign(self, body: str) -> str:
        return hmac.new(self.key, body.encode(), hashlib.sha256).hexdigest()

    def _verified(self, cookie: str) -> dict[str, object] | None:
        body, dot, signature = cookie.partition(".")
        if not dot or not hmac.compare_digest(self._sign(body), signature):
            return None
        try:
            payload = json.loads(base64.urlsafe_b64decode(body.encode()))
        except ValueError:
            return None
        return payload if isinstance(payload, dict) else None
