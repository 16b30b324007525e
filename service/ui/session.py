"""Page sessions: a signed cookie that names a token's entry (never the token), valid on every replica.

The cookie is `<payload>.<signature>`: the payload (base64url JSON) holds the client's name, the fingerprint
of its token's entry (`auth.fingerprint_of`), a session id and the end time; the signature is HMAC-SHA256
with the session key (a Secret shared by the replicas, or a file generated into the state folder), so any
replica checks it and a rollout keeps it. A session ends at its end time, when its token's entry leaves the
tokens file (or changes), and at log out: the cookie is cleared, and its id is refused by this replica
until its end time (another replica only learns it by the cleared cookie; see docs/operations.md).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from service.auth import Client, TokenAuthenticator, can_view

COOKIE = "po_session"


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
    _ended: dict[str, float] = field(default_factory=dict)  # session id -> its end time

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

    def check(self, cookie: str | None) -> Session | None:
        payload = self._verified(cookie or "")
        if payload is None:
            return None
        now = self.clock()
        expires = float(str(payload.get("e", 0)))
        if expires <= now or str(payload.get("s")) in self._ended:
            return None
        client = self.authenticator.by_fingerprint(str(payload.get("n")), str(payload.get("f")))
        if client is None or not can_view(client.scopes):
            return None  # its token left the tokens file, or lost the scope
        return Session(client=client, session_id=str(payload["s"]), expires_at=expires)

    def end(self, session: Session) -> None:
        now = self.clock()
        self._ended = {sid: until for sid, until in self._ended.items() if until > now}
        self._ended[session.session_id] = session.expires_at

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
