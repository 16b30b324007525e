"""The documented clients (docs/clients/*.py) against a live API, real pproxy processes and a real site."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from service.inventory import Health, HealthState, Inventory
from tests.service.conftest import TOKENS, ApiFactory, Pproxy, auth, endpoint

DOCS = Path(__file__).resolve().parents[2] / "docs" / "clients"
pytestmark = pytest.mark.parametrize("store_kind", ["memory"])  # the stores have their own suites


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"docs_clients_{name}", DOCS / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


class Site:
    """A real HTTP site on 127.0.0.1 that answers 403 to its first `bans` requests, then 200."""

    def __init__(self, *, bans: int) -> None:
        site = self
        self.bans = bans

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status = 403 if site.bans > 0 else 200
                site.bans -= 1
                body = b"blocked" if status == 403 else b"<html>ok</html>"
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, name="site")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/page"

    def __enter__(self) -> Site:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def two_proxies(pproxies: Callable[..., Pproxy]) -> Inventory:
    inventory = Inventory()
    inventory.replace_all(
        [endpoint(n, port=pproxies().port, username="user", password="pass") for n in ("a", "b")]
    )
    for key in ("default/a", "default/b"):
        inventory.set_health(key, Health(state=HealthState.healthy, egress_ip="127.0.0.1"))
    return inventory


def test_the_python_client_fetches_reports_the_ban_and_rotates(
    start_api: ApiFactory, two_proxies: Inventory
) -> None:
    client_module = _load("python_client")
    api = start_api(inventory=two_proxies, cooldown_seconds=0)
    with Site(bans=1) as site, client_module.DiscoveryClient(api.url, TOKENS["crawler-a"][0]) as client:
        page = client.fetch(site.url, target="127.0.0.1")
    assert page.status_code == 200
    assert page.text == "<html>ok</html>"
    with api.client() as http:
        penalties = [
            http.get(f"/v1/proxies/default/{n}", headers=auth("crawler-a")).json()["penalties"]
            for n in ("a", "b")
        ]
    assert sorted(len(p) for p in penalties) == [0, 1]  # the proxy that met the 403, for that site only
    assert next(p for ps in penalties for p in ps)["target"] == "127.0.0.1"


@dataclass
class FakeRequest:
    """The part of scrapy.Request the middleware touches (Scrapy is not installed here)."""

    url: str
    meta: dict[str, Any] = field(default_factory=dict)
    dont_filter: bool = False

    def replace(self, **changes: Any) -> FakeRequest:
        return FakeRequest(url=self.url, **{"meta": self.meta, "dont_filter": self.dont_filter, **changes})


@dataclass
class FakeResponse:
    status: int


def test_the_scrapy_middleware_leases_reports_bans_and_rotates(
    start_api: ApiFactory, two_proxies: Inventory
) -> None:
    module = _load("scrapy_middleware")
    api = start_api(inventory=two_proxies, cooldown_seconds=0)

    async def crawl() -> list[str]:
        middleware = module.ProxyOperatorMiddleware(url=api.url, token=TOKENS["crawler-a"][0], wait=1)
        used = []
        request = FakeRequest("https://shop.example/item/1")
        try:
            await middleware.process_request(request, None)
            used.append(request.meta["proxy"])
            retry = await middleware.process_response(request, FakeResponse(429), None)
            assert isinstance(retry, FakeRequest)
            assert retry.dont_filter
            assert "proxy" not in retry.meta
            await middleware.process_request(retry, None)
            used.append(retry.meta["proxy"])
            answer = FakeResponse(200)
            assert await middleware.process_response(retry, answer, None) is answer
        finally:
            await middleware.spider_closed(None)
        return used

    used = asyncio.run(crawl())
    assert used[0] != used[1]  # rotated away from the banned proxy
    assert all(url.startswith("http://user:pass@127.0.0.1:") for url in used)
    with api.client() as http:
        listed = http.get("/v1/proxies", headers=auth("crawler-a")).json()["items"]
        details = [http.get(f"/v1/proxies/{p['key']}", headers=auth("crawler-a")).json() for p in listed]
    assert sorted(p["target"] for d in details for p in d["penalties"]) == ["shop.example"]


def test_the_scrapy_middleware_reports_download_errors_and_leaves_spider_proxies_alone(
    start_api: ApiFactory, two_proxies: Inventory
) -> None:
    module = _load("scrapy_middleware")
    api = start_api(inventory=two_proxies, cooldown_seconds=0)

    async def crawl() -> tuple[Any, FakeRequest]:
        middleware = module.ProxyOperatorMiddleware(url=api.url, token=TOKENS["crawler-a"][0], max_retries=1)
        try:
            request = FakeRequest("https://shop.example/item/2")
            await middleware.process_request(request, None)
            retry = await middleware.process_exception(request, ConnectionResetError(), None)
            assert isinstance(retry, FakeRequest)
            await middleware.process_request(retry, None)
            gave_up = await middleware.process_exception(retry, ConnectionResetError(), None)
            own = FakeRequest("https://shop.example/", meta={"proxy": "http://mine:3128"})
            await middleware.process_request(own, None)
        finally:
            await middleware.spider_closed(None)
        return gave_up, own

    gave_up, own = asyncio.run(crawl())
    assert gave_up is None  # max_retries reached: Scrapy's own error handling takes over
    assert own.meta == {"proxy": "http://mine:3128"}
    assert len(api.errors_reported) == 2  # each error counted towards the proxy's health
