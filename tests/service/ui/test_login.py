"""The page's log in: the body guard's one exception, the session cookie and what ends it, cross-site
refusals."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from fastapi import FastAPI

from service import ui
from service.api import create_app
from service.auth import TokenAuthenticator, hash_token
from service.discovery.memory import MemoryStore
from service.discovery.service import DiscoveryService
from service.settings import DiscoverySettings
from service.status import StatusBoard
from service.ui.session import COOKIE
from tests.service.conftest import RedisServer, UvicornThread, healthy_inventory

TOKENS = {
    "viewer": ("tok-view", "[view]"),
    "ops": ("tok-admin", "[admin]"),
    "crawler": ("tok-lease", "[lease]"),
}


def _write_tokens(path: Path, names: list[str]) -> None:
    path.write_text(
        "".join(
            f"- name: {n}\n  scopes: {TOKENS[n][1]}\n  sha256: {hash_token(TOKENS[n][0])}\n" for n in names
        )
    )


def _app(
    tmp_path: Path, ended: ui.EndedSessions | None = None, lifespan: Any = None, **settings: object
) -> FastAPI:
    tokens = tmp_path / "tokens.yaml"
    _write_tokens(tokens, list(TOKENS))
    inventory = healthy_inventory(["a", "b"])
    auth = TokenAuthenticator(path=tokens)
    discovery = DiscoveryService(inventory=inventory, store=MemoryStore(), settings=DiscoverySettings())
    app = create_app(
        inventory=inventory,
        discovery=discovery,
        authenticator=auth,
        status_board=StatusBoard(),
        body_exempt={ui.LOGIN_PATH: ui.LOGIN_BODY_LIMIT},
        lifespan=lifespan,
    )
    page = ui.build(app.state.context, settings=ui.UiSettings(**settings), key=b"k" * 32, ended=ended)
    ui.install(app, page)
    return app


@contextmanager
def _client(app: FastAPI) -> Iterator[httpx.Client]:
    server = UvicornThread(app).start()
    try:
        with httpx.Client(base_url=server.url, timeout=10) as client:
            yield client
    finally:
        server.stop()


def _origin(client: httpx.Client) -> dict[str, str]:
    return {"Origin": str(client.base_url).rstrip("/")}


def _login(client: httpx.Client, token: str) -> httpx.Response:
    return client.post("/login", data={"token": token}, headers=_origin(client))


def test_a_view_token_logs_in_and_the_cookie_holds_no_token(tmp_path: Path) -> None:
    with _client(_app(tmp_path, cookie_secure=True)) as client:
        assert (client.get("/")).status_code == 303  # to the log in form
        answer = _login(client, "tok-view")
        assert answer.status_code == 303
        cookie = answer.headers["set-cookie"]
        for attribute in ("HttpOnly", "SameSite=strict", "Secure"):
            assert attribute in cookie
        for secret in ("tok-view", hash_token("tok-view")):
            assert secret not in cookie
        client.cookies.set(COOKIE, answer.cookies[COOKIE])
        fleet = client.get("/")
        assert fleet.status_code == 200
        assert "default/a" in fleet.text
        assert "viewer" in fleet.text
        assert "p@ss word" not in fleet.text  # the page never shows a proxy's credentials


@pytest.mark.parametrize("name", ["ops", "crawler"])
def test_admin_implies_view_and_lease_alone_does_not(tmp_path: Path, name: str) -> None:
    with _client(_app(tmp_path)) as client:
        answer = _login(client, TOKENS[name][0])
        assert answer.status_code == (303 if name == "ops" else 401)


def test_the_login_body_is_capped_at_1_kib_and_other_bodies_still_need_a_token(tmp_path: Path) -> None:
    with _client(_app(tmp_path)) as client:
        big = client.post("/login", content=b"token=" + b"x" * 1100, headers={"Content-Type": "text/plain"})
        assert big.status_code == 413
        assert (client.post("/logout", content=b"x")).status_code == 401  # only /login is exempt
        assert (client.post("/v1/leases", json={})).status_code == 401


def test_tries_are_rate_limited_per_source(tmp_path: Path) -> None:
    with _client(_app(tmp_path, login_attempts=3)) as client:
        codes = [(_login(client, "wrong")).status_code for _ in range(4)]
        assert codes == [401, 401, 401, 429]


def test_cross_site_requests_are_refused(tmp_path: Path) -> None:
    with _client(_app(tmp_path)) as client:
        evil = client.post("/login", data={"token": "tok-view"}, headers={"Origin": "https://evil.example"})
        assert evil.status_code == 403
        framed = client.get("/", headers={"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Dest": "iframe"})
        assert framed.status_code == 403
        # A shared link followed from another site: a page that continues from here (the cookie goes then).
        link = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}
        followed = client.get("/proxy/default/a?x=1", headers=link)
        assert followed.status_code == 200
        assert 'content="0;url=/proxy/default/a?x=1"' in followed.text


def test_log_out_and_a_token_leaving_the_file_end_the_session(tmp_path: Path) -> None:
    with _client(_app(tmp_path)) as client:
        cookie = (_login(client, "tok-view")).cookies[COOKIE]
        client.cookies.set(COOKIE, cookie)
        assert (client.get("/")).status_code == 200
        _write_tokens(tmp_path / "tokens.yaml", ["ops"])
        os.utime(tmp_path / "tokens.yaml", ns=(1, 1))  # a new mtime, whatever the clock's resolution
        assert (client.get("/")).status_code == 303
        _write_tokens(tmp_path / "tokens.yaml", list(TOKENS))
        assert (client.get("/")).status_code == 200  # the entry is back: the same session is valid
        client.post("/logout", headers=_origin(client))
        client.cookies.set(COOKIE, cookie)  # a copy kept after log out
        assert (client.get("/")).status_code == 303


def test_links_and_the_cookie_carry_the_root_path(tmp_path: Path) -> None:
    with _client(_app(tmp_path, root_path="/ops")) as client:
        assert client.get("/").headers["location"] == "/ops/login"
        answer = _login(client, "tok-view")
        assert answer.headers["location"] == "/ops/"
        assert "Path=/ops" in answer.headers["set-cookie"]
        client.cookies.set(COOKIE, answer.cookies[COOKIE])
        assert 'action="/ops/logout"' in client.get("/").text


def test_a_forged_or_other_keys_cookie_is_refused(tmp_path: Path) -> None:
    app = _app(tmp_path)
    with _client(app) as client:
        cookie = (_login(client, "tok-view")).cookies[COOKIE]
        body, _, _sig = cookie.partition(".")
        client.cookies.set(COOKIE, body + "." + "0" * 64)
        assert (client.get("/")).status_code == 303


def test_a_log_out_in_redis_ends_the_session_on_every_replica(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """Two replicas (one session key, one redis-server): a cookie copied before log out on one is refused
    by the other; without Redis, the other replica still accepts it (the documented limit)."""

    def replica(name: str, *, shared: bool) -> FastAPI:
        folder = tmp_path / name
        folder.mkdir()
        if not shared:
            return _app(folder)
        client = aioredis.Redis.from_url(redis_server.url)

        @asynccontextmanager
        async def closing(_app: FastAPI) -> AsyncIterator[None]:
            yield
            await client.aclose()  # on the server's own loop

        return _app(
            folder, ended=ui.RedisEndedSessions(client, prefix=f"t-{tmp_path.name}"), lifespan=closing
        )

    for shared in (True, False):
        label = "redis" if shared else "local"
        first, second = replica(f"a-{label}", shared=shared), replica(f"b-{label}", shared=shared)
        with _client(first) as a, _client(second) as b:
            cookie = (_login(a, "tok-view")).cookies[COOKIE]
            for client in (a, b):
                client.cookies.set(COOKIE, cookie)
                assert client.get("/").status_code == 200, "a session is valid on every replica"
            a.post("/logout", headers=_origin(a))
            a.cookies.set(COOKIE, cookie)
            assert a.get("/").status_code == 303
            assert b.get("/").status_code == (303 if shared else 200)
