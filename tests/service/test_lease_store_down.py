"""A lease the Redis store cannot serve (no connection, no reply in time) is a 503 `store_unavailable` with
Retry-After, never a 500: on the fast path and on FastAPI's alike. In the bench of issue 20 a Redis that fell
behind failed its queue of commands at the pipe's watchdog and every lease waiting on it got a 500."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from fastapi import FastAPI

from service.api import create_app
from service.api.fast_lease import LeaseServingApp
from service.auth import TokenAuthenticator, TokenEntry, hash_token
from service.discovery import redis_pipe
from service.discovery.redis_store import RedisStore
from service.discovery.service import DiscoveryService
from service.settings import DiscoverySettings
from tests.ports import free_port
from tests.service.conftest import RedisServer, healthy_inventory

TOKEN = "t-lease"


def _app(url: str, *, fast: bool) -> LeaseServingApp:
    discovery = DiscoveryService(
        inventory=healthy_inventory([f"p{i}" for i in range(5)]),
        store=RedisStore.from_url(url, prefix="down"),
        settings=DiscoverySettings(),
    )
    entry = TokenEntry(name="crawler", scopes={"lease"}, sha256=hash_token(TOKEN))
    app = create_app(
        inventory=discovery.inventory, discovery=discovery, authenticator=TokenAuthenticator([entry])
    )
    if not fast:
        app.lease_fast_path = None
    return app


async def _lease(app: FastAPI, body: dict[str, str]) -> httpx.Response:
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json", "X-Request-ID": "r1"}
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        return await client.post("/v1/leases", content=json.dumps(body).encode(), headers=headers)


def _assert_unavailable(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["retry-after"] == "1"
    assert response.json() == {
        "error": "store_unavailable",
        "detail": "the discovery store did not answer; retry after Retry-After",
        "requestId": "r1",
    }


@pytest.mark.parametrize("fast", [True, False], ids=["fast path", "fastapi"])
def test_a_lease_without_redis_is_a_503(fast: bool) -> None:
    nothing = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    _assert_unavailable(asyncio.run(_lease(_app(nothing, fast=fast), {"target": "shop.example"})))
    _assert_unavailable(  # a sticky session's lease too (its first store call differs)
        asyncio.run(_lease(_app(nothing, fast=fast), {"target": "shop.example", "session": "s1"}))
    )


@pytest.mark.parametrize("fast", [True, False], ids=["fast path", "fastapi"])
def test_a_lease_redis_does_not_answer_in_time_is_a_503(
    fast: bool, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_pipe, "REPLY_TIMEOUT_SECONDS", 0.2)
    app = _app(redis_server.url, fast=fast)

    async def main() -> httpx.Response:
        # The pause is in force before the lease is asked (a sleep in a task raced a loaded CI machine: the
        # lease reached Redis before the pause did and got a 200). Redis queues every client's commands until
        # the pause ends, CLIENT UNPAUSE included: a PING waits it out before the next test uses Redis.
        import redis.asyncio as aioredis

        admin = aioredis.Redis.from_url(redis_server.url)
        try:
            await admin.execute_command("CLIENT", "PAUSE", "2000", "ALL")
            response = await _lease(app, {"target": "shop.example"})
            await admin.ping()
            return response
        finally:
            await admin.aclose()

    _assert_unavailable(asyncio.run(main()))
