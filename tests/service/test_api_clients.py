"""The Scrapy middleware's decisions step by step, with stand-ins for Scrapy's request and response, against a
live API and real pproxy processes. (A real spider runs it in test_scrapy_middleware.py; the Python client
runs in test_python_client.py.)"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
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


@pytest.fixture
def two_proxies(pproxies: Callable[..., Pproxy]) -> Inventory:
    inventory = Inventory()
    inventory.replace_all(
        [endpoint(n, port=pproxies().port, username="user", password="pass") for n in ("a", "b")]
    )
    for key in ("default/a", "default/b"):
        inventory.set_health(key, Health(state=HealthState.healthy, egress_ip="127.0.0.1"))
    return inventory


@dataclass
class FakeRequest:
    """The part of scrapy.Request the middleware touches."""

    url: str
    meta: dict[str, Any] = field(default_factory=dict)
    dont_filter: bool = False

    def replace(self, **changes: Any) -> FakeRequest:
        return FakeRequest(url=self.url, **{"meta": self.meta, "dont_filter": self.dont_filter, **changes})


@dataclass
class FakeResponse:
    status: int
    headers: dict[str, str] = field(default_factory=dict)  # a site's answer: no Proxy-Status


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
            # Another client takes (and gives back) the other proxy while this request is out: plain LRU
            # would now hand the first proxy back, so only the ban can make the retry rotate.
            with api.client() as http:
                other = http.post(
                    "/v1/leases", json={"target": "x.example"}, headers=auth("crawler-b")
                ).json()
                http.delete(f"/v1/leases/{other['leases'][0]['leaseId']}", headers=auth("crawler-b"))
            assert other["leases"][0]["url"] != used[0]
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
    assert used[0] != used[1]  # rotated away from the banned proxy, against the LRU order
    assert all(url.startswith("http://user:pass@127.0.0.1:") for url in used)
    with api.client() as http:
        listed = http.get("/v1/proxies", headers=auth("crawler-a")).json()["items"]
        details = [http.get(f"/v1/proxies/{p['key']}", headers=auth("crawler-a")).json() for p in listed]
    assert sorted(p["target"] for d in details for p in d["penalties"]) == ["shop.example"]


def test_the_scrapy_middleware_reports_download_errors_and_leaves_spider_proxies_alone(
    start_api: ApiFactory, two_proxies: Inventory
) -> None:
    module = _load("scrapy_middleware")
    api = start_api(inventory=two_proxies, cooldown_seconds=0, error_quorum=1)  # one client here

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
