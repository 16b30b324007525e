"""The lease fast path answers byte for byte as FastAPI's route does, and hands FastAPI everything else.

Two apps are built from the same state (fake clock, counted lease ids); one has the fast path taken out.
The same requests, in the same order, must get the same status, headers and body from both.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import APIRouter, Depends, FastAPI
from hypothesis import given
from hypothesis import strategies as st

from service.api import create_app, fast_lease, middleware
from service.api.fast_lease import LeaseFastPath, LeaseServingApp
from service.api.models import LeaseBody
from service.api.pacing import ClientPacing, Pacer
from service.api.routers import leases
from service.auth import TokenAuthenticator, TokenEntry, hash_token
from service.discovery.memory import MemoryStore
from service.discovery.service import DiscoveryService
from service.inventory import Health, HealthState
from service.settings import DiscoverySettings
from tests.service.conftest import FakeClock, endpoint, healthy_inventory

TOKENS = {"lease": "t-lease", "report": "t-report"}
JSON = {"Content-Type": "application/json"}


def _app(*, fast: bool) -> LeaseServingApp:
    ids = itertools.count()
    inventory = healthy_inventory([f"p{i}" for i in range(3)])
    odd = [  # what JSON and URLs must escape, no pool, IPv6, SOCKS5, no credentials, no egress IP
        endpoint(
            "a3", pool=None, protocol="socks5", host="::1", username='ü"s\\er', password="p@ss:w/rd\n\t\x01"
        ),
        endpoint("a4", host="proxy.example", username=None, password=None, provider="café"),
    ]
    inventory.replace_all([*(inventory.get(f"default/p{i}") for i in range(3)), *odd])
    inventory.set_health("default/a3", Health(state=HealthState.healthy, egress_ip="::2"))
    inventory.set_health("default/a4", Health(state=HealthState.healthy))
    discovery = DiscoveryService(
        inventory=inventory,
        store=MemoryStore(),
        settings=DiscoverySettings(max_count=3),
        clock=FakeClock(),
        rng=random.Random(7),
        new_id=lambda: f"lease-{next(ids)}",
    )
    entries = [
        TokenEntry(name=f"client-{scope}", scopes={scope}, sha256=hash_token(token))
        for scope, token in TOKENS.items()
    ]
    app = create_app(
        inventory=discovery.inventory, discovery=discovery, authenticator=TokenAuthenticator(entries)
    )
    if not fast:
        app.lease_fast_path = None
    return app


def _request(body: Any = None, *, token: str | None = "t-lease", **extra: Any) -> dict[str, Any]:
    headers = {"X-Request-ID": "req-1", **JSON}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    more = extra.pop("headers", {})
    if isinstance(more, list):  # repeated names: these replace the defaults of the same names
        names = {name.lower() for name, _ in more}
        headers = [(k, v) for k, v in headers.items() if k.lower() not in names] + more  # type: ignore[assignment]
    else:
        headers.update(more)
    content = extra.pop("content", None)
    if content is None and body is not None:
        content = json.dumps(body).encode()
    if content is None:
        content = json.dumps({"target": "z.example"}).encode()
    return {"headers": headers, "content": content, **extra}


REQUESTS = [
    _request({"target": "shop.example"}),
    _request({"target": "Shop.Example.", "count": 2}),
    _request({"target": "shop.example", "count": 5, "ttl": 999999, "wait": 99}),  # lowered
    _request({"target": "shop.example"}),  # everything held: 503 with Retry-After
    _request({"target": "other.example", "session": "s1"}),
    _request({"target": "other.example", "session": "s1"}),  # sticky
    _request({"target": "other.example", "session": "s1", "strict": True}),
    _request({}),
    _request(None, content=b"null"),
    _request(None, content=b""),  # no body: every field is optional
    _request(None, content=b"{not json"),
    _request({"target": "no scheme://here"}),
    _request({"count": 2, "session": "s2"}),
    _request({"bogus": 1}),
    _request({"target": "a.example"}, token=None),
    _request({"target": "a.example"}, token="wrong"),
    _request({"target": "a.example"}, token="t-report"),  # lacks the lease scope
    _request({"target": "a.example"}, headers={"Authorization": "Basic dTpw"}),
    _request({"target": "a.example"}, headers={"Content-Type": "text/plain"}),
    _request({"target": "a.example"}, headers={"Content-Type": "application/json; charset=utf-8"}),
    _request({"target": "b.example"}, params={"unknown": "1"}),
    # JSON the fast path reads in pydantic's JSON mode, FastAPI in Python mode after json.loads
    _request({"count": "2", "ttl": "5", "wait": 0.0}),
    _request({"count": 1.0, "target": "c.example"}),
    _request({"count": 1.5}),
    _request({"wait": False}),
    _request({"strict": "true", "session": "s3"}),
    _request({"labels": {"zone": 1}}),
    _request({"labels": {"zone": "eu"}, "pool": "main"}),
    _request(None, content=b'{"target": "d.example", "target": "e.example"}'),
    _request(None, content=b'{"ttl": NaN}'),
    _request(None, content=b'{"ttl": 1e400}'),
    _request(None, content=b'{"count": 2, }'),
    _request(None, content=b'\xef\xbb\xbf{"count": 1}'),
    _request(None, content='{"target": "\u00e9.example"}'.encode()),
    _request(None, content=b'{"target": "f.example"} trailing'),
    # what the middlewares in front of FastAPI decide, which the fast path now does itself
    _request({"target": "g.example"}, headers={"X-Request-ID": "bad id!"}),  # made up instead
    _request({"target": "g.example"}, headers={"X-Request-ID": ""}),
    _request({"target": "h.example"}, headers=[("X-Request-ID", "first"), ("X-Request-ID", "last")]),
    _request(None, content=b'{"target": "i.example"' + b" " * 70_000 + b"}"),  # valid, past max_body_bytes
    _request(None, content=[b'{"target": ', b'"j.example"}']),  # chunked
    _request(None, headers=[("Authorization", "Bearer t-lease"), ("Authorization", "Bearer wrong")]),
    _request(None, headers=[("Authorization", "Bearer wrong"), ("Authorization", "Bearer t-lease")]),
]


async def _chunks(parts: list[bytes]) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def _answers(app: FastAPI) -> list[tuple[int, list[tuple[str, str]], bytes]]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        answers = []
        for request in REQUESTS:
            if isinstance(request["content"], list):  # sent chunked, from a fresh iterator each time
                request = {**request, "content": _chunks(request["content"])}
            response = await client.post("/v1/leases", **request)
            answers.append((response.status_code, sorted(response.headers.items()), response.content))
        return answers


def test_the_fast_path_answers_as_fastapi_does(monkeypatch: pytest.MonkeyPatch) -> None:
    served: list[int] = []
    made_up = itertools.count()
    for module in (middleware, fast_lease):  # the ids made up for requests without a valid one: in order
        monkeypatch.setattr(module, "new_request_id", lambda: f"made-up-{next(made_up)}")
    serve = LeaseFastPath._serve

    async def counting(self: LeaseFastPath, *args: Any) -> None:
        served.append(1)
        await serve(self, *args)

    monkeypatch.setattr(LeaseFastPath, "_serve", counting)
    fast = asyncio.run(_answers(_app(fast=True)))
    made_up = itertools.count()
    slow = asyncio.run(_answers(_app(fast=False)))
    for request, got, want in zip(REQUESTS, fast, slow, strict=True):
        assert got == want, request
    statuses = [status for status, _, _ in slow]
    written = b"".join(body for _, _, body in slow)
    for odd in (b'"host":"::1"', b'"username":null', b'"pool":null', b'"egressIp":null'):
        assert odd in written  # the odd proxies were leased
    assert {200, 401, 403, 413, 422, 503} <= set(statuses)
    assert len(served) == 19  # the well-formed, authorised ones; the rest went to FastAPI


def test_the_fast_path_turns_itself_off_when_the_route_changes() -> None:
    def fast_path(router: APIRouter, endpoint: Any) -> LeaseFastPath:
        return LeaseFastPath(
            _app(fast=False),
            context=None,
            router=router,
            endpoint=endpoint,
            body_model=LeaseBody,
            error_handlers={},
            limit=1000,
            pacer=Pacer(),
        )

    async def same(client: Any, ctx: Any, body: Any) -> Any: ...

    async def more(client: Any, ctx: Any, body: Any, extra: Any) -> Any: ...

    def plain() -> APIRouter:
        router = APIRouter()
        router.post("/v1/leases")(same)
        router.post("/v1/leases/more")(more)
        return router

    assert fast_path(plain(), same).enabled
    assert not fast_path(plain(), more).enabled  # another parameter
    guarded = plain()
    guarded.dependencies.append(Depends(lambda: None))
    assert not fast_path(guarded, same).enabled  # a router dependency
    with_dependency = APIRouter()
    with_dependency.post("/v1/leases", dependencies=[Depends(lambda: None)])(same)
    assert not fast_path(with_dependency, same).enabled
    created = APIRouter()
    created.post("/v1/leases", status_code=201)(same)
    assert not fast_path(created, same).enabled
    assert fast_path(leases.router, leases.create_lease).enabled  # the real route, as create_app wires it


def test_a_lease_the_fast_path_serves_lifts_the_client_s_pacing() -> None:
    """As ClientPacing does for an answer that is not a refusal: the client's next request is not held."""
    app = _app(fast=True)
    pacer: Pacer = next(m.kwargs["pacer"] for m in app.user_middleware if m.cls is ClientPacing)
    pacer.answered("client-lease", 422, None)  # refused once: its next request would wait a spacing
    assert pacer.paces("client-lease")

    async def lease() -> int:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return (await client.post("/v1/leases", **_request({"target": "shop.example"}))).status_code

    assert asyncio.run(lease()) == 200
    assert not pacer.paces("client-lease")


@pytest.mark.parametrize("fast", [True, False], ids=["fast path", "fastapi"])
def test_an_unexpected_error_is_the_same_500_on_both_paths_and_reaches_the_server(
    fast: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fast path sits in front of Starlette's ServerErrorMiddleware, so it answers an error no handler of
    its own takes as that middleware does: the app's handler for `Exception` (500 `internal_error`, the
    request id in the body; no header, as that middleware is outside the one that adds it), then the error
    raised again for the server to log."""
    app = _app(fast=fast)
    discovery = app.state.context.discovery

    async def broken(query: Any) -> Any:
        raise RuntimeError("a bug in the lease path")

    monkeypatch.setattr(discovery, "lease", broken)

    async def lease(*, raise_app_exceptions: bool) -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=raise_app_exceptions)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.post("/v1/leases", **_request({"target": "shop.example"}))

    response = asyncio.run(lease(raise_app_exceptions=False))
    assert response.status_code == 500
    assert "x-request-id" not in response.headers
    assert response.json() == {
        "error": "internal_error",
        "detail": "unexpected error; see the logs",
        "requestId": "req-1",
    }
    with pytest.raises(RuntimeError, match="a bug in the lease path"):
        asyncio.run(lease(raise_app_exceptions=True))


NAMES = [b"authorization", b"content-type", b"content-length", b"x-request-id", b"transfer-encoding", b"host"]


@given(
    st.lists(
        st.tuples(
            st.sampled_from(NAMES),
            st.sampled_from([b"", b"12", b" 7 ", b"x", b"Bearer t", b"application/json"]),
        ),
        max_size=8,
    )
)
def test_the_headers_read_at_once_are_the_ones_read_in_turn(headers: list[tuple[bytes, bytes]]) -> None:
    """Without a name given twice the fast path reads the headers through a dict; with one, in turn, as the
    middlewares do. A pair of an unrelated name given twice sends any list down the second way: both
    readings agree."""
    assert fast_lease._headers(headers) == fast_lease._headers(
        [*headers, (b"x-other", b"1"), (b"x-other", b"2")]
    )
