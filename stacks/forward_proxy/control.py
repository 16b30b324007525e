"""The control channel: the discovery service adds, renews and revokes lease users on a running proxy.

Either a unix socket in the proxy's state folder (the `local` provider), mode 0600 in a 0700 folder: only
the user that runs the service (and started the proxy) can connect, and the proxy itself only ever dials
TCP, so no client can reach the channel through the proxy. Or `tcp://HOST:PORT` (a proxy pod, whose
service runs in other pods): there every request carries `"token": control_token(the proxy's password)`,
and one without the right token is refused and its connection closed (`start_tcp`, `channel.py`). A shared
listener's one socket serves many proxies (`shared_listener.py`): each request names its proxy, which
`call` adds for a `shared:` channel. One JSON object per line each way:

    {"op": "add", "user": U, "password": P, "ttl": SECONDS}  -> {"ok": true}
    {"op": "add", "user": U, "digest": HEX, "ttl": SECONDS}  -> {"ok": true}   (SHA-256 of the password)
    {"op": "renew", "user": U, "ttl": SECONDS}               -> {"ok": true} | {"ok": false, "error": ...}
    {"op": "revoke", "user": U}                              -> {"ok": true}   (idempotent)
    {"op": "hello"}                                          -> {"ok": true, "instance": ID}

No Pulumi run is involved: users live in the proxy's memory only and end with it. A proxy started again (a
new pod of a rollout, a restarted container) knows none and answers `hello` with a new instance: on a
`tcp://` channel the replica that issued a live user sees that and adds it again, by its digest (the
service never keeps a password); until then, and for good when that replica is gone too (or for a `local`
proxy, whose socket is not followed), the lease's credentials fail closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from stacks.forward_proxy.channel import control_token, shared_address, tcp_address, token_matches
from stacks.forward_proxy.users import LeaseUsers, UsersFull

MAX_LINE = 4096
MAX_TTL = 7 * 86400.0
MAX_PATH = 107  # sun_path holds 108 bytes with the terminating NUL
IDLE_SECONDS = 10.0  # a tcp channel's wait for the next request line
REFUSED = {"ok": False, "error": "refused"}  # a tcp request without the right token, whatever was wrong
# How often the service asks each process of a proxy pod with live lease users who it is, and adds them to
# one it has not served (service/discovery/lease_users.py `follow`): a pod is not Ready before that.
FOLLOW_SECONDS = 5.0


class ControlError(Exception):
    """The proxy could not be reached, or refused the request."""


def _field(request: dict[str, Any], name: str) -> str:
    value = request.get(name)
    if not isinstance(value, str) or not 0 < len(value) <= 255 or ":" in value or not value.isprintable():
        raise ValueError(f"{name}: 1 to 255 printable characters without ':'")
    return value


def _ttl(request: dict[str, Any]) -> float:
    ttl = request.get("ttl")
    if not isinstance(ttl, int | float) or not math.isfinite(ttl) or not 0 < ttl <= MAX_TTL:
        raise ValueError(f"ttl: seconds, more than 0 and at most {MAX_TTL:.0f}")
    return float(ttl)


def _add(users: LeaseUsers, request: dict[str, Any]) -> None:
    user, ttl = _field(request, "user"), _ttl(request)
    if ("password" in request) == ("digest" in request):
        raise ValueError("add: a password or a digest, not both")
    if "password" in request:
        users.add(user, _field(request, "password"), ttl=ttl)
        return
    digest = request["digest"]
    if not isinstance(digest, str) or len(digest) != 64:
        raise ValueError("digest: the SHA-256 of the password, 64 hex digits")
    users.add_digest(user, bytes.fromhex(digest), ttl=ttl)  # ValueError when not hex


def apply(users: LeaseUsers, request: dict[str, Any]) -> dict[str, Any]:
    """One request against `users`; the answer to send back."""
    try:
        op = request.get("op")
        if op == "add":
            _add(users, request)
        elif op == "hello":
            return {"ok": True, "instance": users.instance}
        elif op == "renew":
            if not users.renew(_field(request, "user"), ttl=_ttl(request)):
                return {"ok": False, "error": "unknown or ended user"}
        elif op == "revoke":
            users.revoke(_field(request, "user"))
        else:
            return {"ok": False, "error": f"unknown op {op!r}"}
    except (ValueError, UsersFull) as exc:
        return {"ok": False, "error": str(exc)}
    return {"ok": True}


Answer = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


async def _session(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, answer_to: Answer) -> None:
    try:
        while line := await reader.readline():
            try:
                request = json.loads(line)
            except ValueError:
                answer = {"ok": False, "error": "one JSON object per line"}
            else:
                answer = await answer_to(request) if isinstance(request, dict) else {"ok": False}
            writer.write(json.dumps(answer).encode() + b"\n")
            await writer.drain()
    except (ConnectionError, ValueError):  # ValueError: a line past MAX_LINE
        pass
    finally:
        writer.close()


async def start(path: str, users: LeaseUsers) -> asyncio.Server:
    """Listen on the unix socket `path` (a stale socket from a dead process is replaced), mode 0600 from
    the start (a `tcp://` channel: `start_tcp`)."""

    async def answer(request: dict[str, Any]) -> dict[str, Any]:
        return apply(users, request)

    return await start_unix(path, answer)


async def start_unix(path: str, answer: Answer) -> asyncio.Server:
    """`start` with the answers of `answer` (the shared listener's, which name a proxy)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    umask = os.umask(0o177)  # no window in which the socket is wider than 0600
    try:
        server = await asyncio.start_unix_server(lambda r, w: _session(r, w, answer), path, limit=MAX_LINE)
    finally:
        os.umask(umask)
    os.chmod(path, 0o600)
    return server


async def _tcp_session(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    users: LeaseUsers,
    password: Callable[[], str | None],
) -> None:
    """Like `_session`, but a request without the right token (or not even JSON) is answered REFUSED, which
    says nothing of why, and its connection closed; a line must come within IDLE_SECONDS."""
    try:
        while True:
            async with asyncio.timeout(IDLE_SECONDS):
                line = await reader.readline()
            if not line:
                break
            request = _json_object(line)
            secret = password()
            if request is None or secret is None or not token_matches(request.get("token"), secret):
                writer.write(json.dumps(REFUSED).encode() + b"\n")
                await writer.drain()
                break
            writer.write(json.dumps(apply(users, request)).encode() + b"\n")
            await writer.drain()
    except (ConnectionError, ValueError, TimeoutError):  # ValueError: a line past MAX_LINE
        pass
    finally:
        writer.close()


def _json_object(line: bytes) -> dict[str, Any] | None:
    try:
        request = json.loads(line)
    except ValueError:
        return None
    return request if isinstance(request, dict) else None


async def start_tcp(
    host: str, port: int, users: LeaseUsers, *, password: Callable[[], str | None]
) -> asyncio.Server:
    """Listen on `host:port`; each request must carry the token of `password()`, the proxy's password as
    it is now (a reload may change it)."""
    return await asyncio.start_server(
        lambda r, w: _tcp_session(r, w, users, password), host, port, limit=MAX_LINE, reuse_address=True
    )


def socket_path(state_dir: Path, stem: str) -> str | None:
    """Where a proxy's control socket lives: `<stem>.ctl`, or a hash of the stem when that path is too long
    for a unix socket; None when even that is (a very deep state folder: no lease-scoped credentials)."""
    for name in (stem, hashlib.sha256(stem.encode()).hexdigest()[:16]):
        path = str(state_dir / f"{name}.ctl")
        if len(path.encode()) <= MAX_PATH:
            return path
    return None


async def call(
    channel: str, request: dict[str, Any], *, wait: float, password: str | None = None
) -> dict[str, Any]:
    """Send one request to `channel` (a unix socket path, or `tcp://HOST:PORT`: with the token derived from
    the proxy's `password`), wait for its answer and return it; a ControlError unless the proxy said ok."""
    address, request = addressed(channel, request, password=password)
    try:
        async with asyncio.timeout(wait):
            if isinstance(address, str):
                reader, writer = await asyncio.open_unix_connection(address, limit=MAX_LINE)
            else:
                reader, writer = await asyncio.open_connection(*address, limit=MAX_LINE)
            try:
                writer.write(json.dumps(request).encode() + b"\n")
                await writer.drain()
                line = await reader.readline()
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
    except (OSError, TimeoutError) as exc:
        raise ControlError(f"control channel {channel}: {str(exc) or type(exc).__name__}") from exc
    return checked_answer(channel, line)


def checked_answer(channel: str, line: bytes) -> dict[str, Any]:
    """The answer on `line`; a ControlError unless the proxy said ok."""
    try:
        answer = json.loads(line)
    except ValueError as exc:
        raise ControlError(f"control channel {channel}: no answer") from exc
    if not isinstance(answer, dict) or answer.get("ok") is not True:
        error = answer.get("error") if isinstance(answer, dict) else answer
        raise ControlError(f"control channel {channel}: {error}")
    return answer


def addressed(
    channel: str, request: dict[str, Any], *, password: str | None
) -> tuple[str | tuple[str, int], dict[str, Any]]:
    """Where to connect (a unix socket path, or a TCP host and port) and what to send there."""
    try:
        address = tcp_address(channel)
        shared = shared_address(channel)
    except ValueError as exc:
        raise ControlError(str(exc)) from exc
    if shared is not None:
        path, proxy = shared
        return path, {**request, "proxy": proxy}
    if address is None:
        return channel, request
    if not password:
        raise ControlError(f"control channel {channel}: a tcp channel needs the proxy's password")
    return address, {**request, "token": control_token(password)}
