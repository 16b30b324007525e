"""The client package's Python clients (proxy_operator_client: DiscoveryClient and AsyncDiscoveryClient,
each test run on both) against a live discovery API, real pproxy proxies and a real loopback site. The
verdicts are read from the service: penalties, health reports, metrics and holds."""

from __future__ import annotations

import asyncio
import inspect
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from proxy_operator_client import AsyncDiscoveryClient, DiscoveryClient, NoGoodAnswer, NoProxyAvailable
from service.inventory import Health, HealthState, Inventory
from tests.service.conftest import TOKENS, Api, ApiFactory, Pproxy, auth, endpoint
from tests.service.site import Site

TARGET = "127.0.0.1"
KEYS = [f"default/p{i}" for i in range(4)]
pytestmark = pytest.mark.parametrize("store_kind", ["memory"])  # the stores have their own suites


class OnALoop:
    """An AsyncDiscoveryClient driven from a test's plain code, on an event loop of its own: each of its
    coroutine methods runs to completion when called, so one test body checks both clients."""

    def __init__(self, client: AsyncDiscoveryClient) -> None:
        self._client, self._loop = client, asyncio.new_event_loop()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)
        if not inspect.iscoroutinefunction(method):
            return method
        return lambda *args, **kwargs: self._loop.run_until_complete(method(*args, **kwargs))

    def __enter__(self) -> OnALoop:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._loop.run_until_complete(self._client.aclose())
        finally:
            self._loop.close()


Open = Callable[..., Any]


@pytest.fixture(params=["sync", "async"])
def open_client(request: pytest.FixtureRequest) -> Open:
    """`open_client(api_url, **options)`: a client of crawler-a, sync or async (the test's parameter)."""

    def make(url: str, **options: Any) -> Any:
        token = TOKENS["crawler-a"][0]
        if request.param == "sync":
            return DiscoveryClient(url, token, **options)
        return OnALoop(AsyncDiscoveryClient(url, token, **options))

    return make


@pytest.fixture
def four_proxies(pproxies: Callable[..., Pproxy]) -> Inventory:
    inventory = Inventory()
    inventory.replace_all(
        [endpoint(key.split("/")[1], port=pproxies().port, username="user", password="pass") for key in KEYS]
    )
    for key in KEYS:
        inventory.set_health(key, Health(state=HealthState.healthy, egress_ip="127.0.0.1"))
    return inventory


def metric(api: Api, name: str) -> float:
    with api.client() as http:
        found = re.search(rf"^{re.escape(name)} (\S+)$", http.get("/metrics").text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def penalties(api: Api) -> dict[str, list[dict[str, object]]]:
    with api.client() as http:
        found = {
            key: http.get(f"/v1/proxies/{key}", headers=auth("crawler-a")).json()["penalties"] for key in KEYS
        }
    return {key: p for key, p in found.items() if p}


def test_bans_are_reported_and_only_the_ban_makes_the_retry_rotate(
    start_api: ApiFactory, four_proxies: Inventory, open_client: Open
) -> None:
    api = start_api(inventory=four_proxies, cooldown_seconds=0)
    others: list[str] = []

    def use_every_other_proxy() -> None:
        """While the first fetch of /ban403 waits, another client leases (and releases) every other proxy:
        the one serving this fetch becomes the least recently used, so plain LRU would hand it back."""
        with httpx.Client(base_url=api.url, headers=auth("crawler-b")) as http:
            leases = http.post("/v1/leases", json={"target": "elsewhere.example", "count": 3}).json()[
                "leases"
            ]
            for item in leases:
                http.delete(f"/v1/leases/{item['leaseId']}")
        others.extend(item["key"] for item in leases)

    with Site(on_first_hit={"/ban403": use_every_other_proxy}) as site, open_client(api.url) as client:
        first = client.fetch(site.url("/ban403"), target=TARGET, wait=0)
        second = client.fetch(site.url("/ban429"), target=TARGET, wait=0)
    assert (first.status_code, first.text, second.status_code) == (200, "<html>ok</html>", 200)
    [met_the_403] = set(KEYS) - set(others)
    banned = penalties(api)
    assert met_the_403 in banned  # had the retry gone back to it, its `ok` would have cleared this
    assert len(banned) == 2  # the 403's proxy and the 429's, for this site only, one strike each
    assert all(p == [{**p[0], "target": TARGET, "strikes": 1}] for p in banned.values())
    assert metric(api, 'proxy_operator_reports_total{outcome="banned"}') == 2
    assert metric(api, 'proxy_operator_reports_total{outcome="ok"}') == 2
    assert metric(api, "proxy_operator_lease_releases_total") == metric(
        api, "proxy_operator_leased_proxies_total"
    )


def test_a_dropped_connection_and_a_site_timeout_are_errors_not_bans(
    start_api: ApiFactory, four_proxies: Inventory, open_client: Open
) -> None:
    api = start_api(inventory=four_proxies, cooldown_seconds=0, error_quorum=1)  # one client here
    with Site(slow_seconds=3) as site, open_client(api.url) as client:
        dropped = client.fetch(site.url("/drop"), target=TARGET, wait=0)
        slow = client.fetch(site.url("/slow"), target=TARGET, wait=0, timeout=1)
        hits = dict(site.hits)
    assert (dropped.status_code, slow.status_code) == (200, 200)  # each on its second proxy
    assert hits == {"/drop": 2, "/slow": 2}
    assert len(api.errors_reported) == 2  # counted towards each proxy's health
    assert len(set(api.errors_reported)) == 2
    assert penalties(api) == {}
    assert metric(api, 'proxy_operator_reports_total{outcome="error"}') == 2
    assert metric(api, "proxy_operator_lease_releases_total") == 4


def test_close_releases_the_leases_still_held(
    start_api: ApiFactory, four_proxies: Inventory, open_client: Open
) -> None:
    api = start_api(inventory=four_proxies, cooldown_seconds=0, lease_ttl_seconds=300)
    with open_client(api.url) as client:
        held = client.lease(target=TARGET, count=3)
        renewed = client.renew(held[0], ttl=600)
        assert renewed.expires_at != held[0].expires_at
        with api.client() as http:  # held: this client gets only the fourth proxy for the site
            during = http.post("/v1/leases", json={"target": TARGET, "count": 4}, headers=auth("crawler-a"))
            http.delete(f"/v1/leases/{during.json()['leases'][0]['leaseId']}", headers=auth("crawler-a"))
        assert len(during.json()["leases"]) == 1
    assert metric(api, "proxy_operator_lease_releases_total") == 4
    with api.client() as http:
        after = http.post("/v1/leases", json={"target": TARGET, "count": 4}, headers=auth("crawler-a"))
    assert sorted(item["key"] for item in after.json()["leases"]) == KEYS


def test_a_refused_report_does_not_fail_a_download_that_worked(
    start_api: ApiFactory, four_proxies: Inventory, open_client: Open
) -> None:
    """Past the report rate the API answers 429; the page was fetched all the same."""
    api = start_api(inventory=four_proxies, cooldown_seconds=0, report_rate_limit=1)
    with Site() as site, open_client(api.url) as client:
        pages = [client.fetch(site.url("/ok"), target=TARGET, wait=0) for _ in range(2)]
    assert [page.status_code for page in pages] == [200, 200]
    assert metric(api, 'proxy_operator_reports_total{outcome="ok"}') == 1  # the second was refused


def test_past_its_share_a_lease_raises_no_proxy_available_with_the_reason(
    start_api: ApiFactory, four_proxies: Inventory, open_client: Open
) -> None:
    """A 429 (the client's fair share) is a NoProxyAvailable with its Retry-After, as a 503 is, so `fetch`
    waits it out instead of failing (before: a RuntimeError from the 429)."""
    api = start_api(inventory=four_proxies, lease_share=0.5, lease_ttl_seconds=120)
    with open_client(api.url) as client:
        assert len(client.lease(target=TARGET, count=4)) == 2
        with pytest.raises(NoProxyAvailable) as refused:
            client.lease(target=TARGET)
    assert refused.value.reason == "lease_share"
    assert refused.value.retry_after == 120


def test_a_407_from_the_proxy_is_an_error_and_fetch_tries_another_proxy(
    start_api: ApiFactory, pproxies: Callable[..., Pproxy], open_client: Open
) -> None:
    """p0's credentials in the inventory are wrong, so it answers 407: the proxy failing (`error`), never
    a page (the client before reported it `ok` and returned the 407)."""
    inventory = Inventory()
    good = pproxies().port
    inventory.replace_all(
        [
            endpoint("p0", port=pproxies().port, username="user", password="wrong"),
            endpoint("p1", port=good, username="user", password="pass"),
        ]
    )
    for key in ("default/p0", "default/p1"):
        inventory.set_health(key, Health(state=HealthState.healthy, egress_ip="127.0.0.1"))
    api = start_api(inventory=inventory, cooldown_seconds=0, error_quorum=1)
    with Site() as site, open_client(api.url) as client:
        pages = [client.fetch(site.url(f"/ok?page={i}"), target=TARGET, wait=0) for i in range(2)]
    assert [page.status_code for page in pages] == [200, 200]  # p0 served neither: each took p1 at last
    assert api.errors_reported == ["default/p0"]  # once per client and window
    assert metric(api, 'proxy_operator_reports_total{outcome="ok"}') == 2
    assert metric(api, 'proxy_operator_reports_total{outcome="error"}') >= 1


def test_fetch_waits_out_an_api_outage_with_backoff(
    start_api: ApiFactory, four_proxies: Inventory, open_client: Open
) -> None:
    """The API is down when the fetch starts and back 1.5 s later on the same port: the lease is retried
    with backoff, within `patience`, and the page comes (the client before raised httpx.ConnectError)."""
    api = start_api(inventory=four_proxies, cooldown_seconds=0)
    url = api.url
    port = int(url.rsplit(":", 1)[1])
    api.server.stop()
    restart = threading.Timer(1.5, lambda: start_api(inventory=four_proxies, cooldown_seconds=0, port=port))
    restart.start()
    started = time.monotonic()
    try:
        with Site() as site, open_client(url) as client:
            page = client.fetch(site.url("/ok"), target=TARGET, wait=0, patience=15)
    finally:
        restart.join()
    assert page.status_code == 200
    assert time.monotonic() - started >= 1.5


def test_a_report_and_a_release_that_fail_do_not_lose_the_page(
    start_api: ApiFactory, four_proxies: Inventory, open_client: Open
) -> None:
    """The API stops while the page downloads: its report and its release cannot be sent, the page is
    returned all the same; with no API and no patience left, the next fetch gives up with NoGoodAnswer."""
    api = start_api(inventory=four_proxies, cooldown_seconds=0)
    with Site(on_first_hit={"/ok": api.server.stop}) as site, open_client(api.url) as client:
        page = client.fetch(site.url("/ok"), target=TARGET, wait=0)
        with pytest.raises(NoGoodAnswer) as gave_up:
            client.fetch(site.url("/ok"), target=TARGET, wait=0, patience=0.5)
    assert (page.status_code, page.text) == (200, "<html>ok</html>")
    assert isinstance(gave_up.value.__cause__, Exception)
