"""The client package's clients tell the proxy's own answers from the site's (issue 11).

Real `local` proxies (our forward proxy, started by the provider's create as `up` starts it) allow one
loopback site and one port where nothing listens; a second site is outside their egress policy. Leased
from a live discovery API, they answer: the allowed site's 403 (a ban), their own refusal (403 with
`Proxy-Status: ...; error=destination_ip_prohibited`, or a failed CONNECT), a site that is down (502 with
`error=connection_refused`, or a CONNECT answered 502). The verdicts are read from the service: the
reports it counted, penalties, health reports, leases. On the clients before this, the refusals were bans.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy_operator_client import DiscoveryClient, ProxyAnswer
from service.inventory import Health, HealthState, Inventory
from stacks.programs.local import LocalProxyProvider
from tests.ports import free_port
from tests.service.conftest import TOKENS, Api, ApiFactory, auth, endpoint
from tests.service.site import Site
from tests.service.test_python_client import metric
from tests.service.test_scrapy_middleware import crawl
from tests.service.test_scrapy_middleware import metric as metric_in

TARGET = "127.0.0.1"
pytestmark = pytest.mark.parametrize("store_kind", ["memory"])  # the stores have their own suites


@pytest.fixture
def allowed() -> Iterator[Site]:
    with Site() as site:
        yield site


@pytest.fixture
def refused() -> Iterator[Site]:
    """A site the proxies' egress policy does not allow (loopback is refused by default)."""
    with Site() as site:
        yield site


@pytest.fixture
def down() -> int:
    return free_port()  # allowed by the policy; nothing listens there


@pytest.fixture
def forward_proxies(tmp_path: Path, allowed: Site, down: int) -> Iterator[Callable[[int], Inventory]]:
    """`make(n)`: n real forward proxies allowing the allowed site's port and `down`, healthy."""
    provider, created = LocalProxyProvider(), []
    ports = [int(allowed.base.rsplit(":", 1)[1]), down]

    def make(count: int) -> Inventory:
        endpoints = []
        for i in range(count):
            port = free_port()
            props = {"state_dir": str(tmp_path), "stem": f"p{i}", "bind_address": "127.0.0.1", "port": port}
            props |= {"protocol": "http", "username": "user", "password": "Pass1234"}
            props["egress"] = {"allow": [{"cidr": "127.0.0.1/32", "ports": ports}]}
            created.append(provider.create(props))
            endpoints.append(endpoint(f"p{i}", port=port, username="user", password="Pass1234"))
        inventory = Inventory()
        inventory.replace_all(endpoints)
        for item in endpoints:
            inventory.set_health(item.key, Health(state=HealthState.healthy, egress_ip="127.0.0.1"))
        return inventory

    yield make
    for result in created:
        provider.delete(result.id, result.outs or {})


def penalised(api: Api, inventory: Inventory) -> list[str]:
    with api.client() as http:
        return [
            ep.key
            for ep in inventory.endpoints()
            if http.get(f"/v1/proxies/{ep.key}", headers=auth("crawler-a")).json()["penalties"]
        ]


def test_the_python_client_reports_a_refusal_and_a_site_down_as_neither_ban_nor_error(
    start_api: ApiFactory,
    forward_proxies: Callable[[int], Inventory],
    allowed: Site,
    refused: Site,
    down: int,
) -> None:
    inventory = forward_proxies(3)
    api = start_api(inventory=inventory, cooldown_seconds=0, error_quorum=1)
    outcomes: dict[str, Any] = {}
    with DiscoveryClient(api.url, TOKENS["crawler-a"][0]) as client:
        page = client.fetch(allowed.url("/ban403"), target=TARGET, wait=0)  # the site's 403: a ban
        for name, url in {
            "refused": refused.url("/ok"),
            "refused tunnel": f"https://127.0.0.1:{refused.base.rsplit(':', 1)[1]}/ok",
            "down": f"http://127.0.0.1:{down}/",
            "down tunnel": f"https://127.0.0.1:{down}/",
        }.items():
            with pytest.raises(ProxyAnswer) as raised:
                client.fetch(url, target=TARGET, wait=0)
            outcomes[name] = (type(raised.value).__name__, raised.value.status, raised.value.error)

    assert (page.status_code, dict(allowed.hits)) == (200, {"/ban403": 2})
    assert outcomes == {
        "refused": ("Refused", 403, "destination_ip_prohibited"),
        "refused tunnel": ("Refused", 403, None),
        "down": ("SiteDown", 502, "connection_refused"),
        "down tunnel": ("SiteDown", 502, None),
    }
    assert dict(refused.hits) == {}  # the proxy never reached it
    # Only the site's own 403 was a ban; the proxy's answers were neither bans nor errors, and not retried.
    assert metric(api, 'proxy_operator_reports_total{outcome="banned"}') == 1
    assert len(penalised(api, inventory)) == 1
    assert metric(api, 'proxy_operator_reports_total{outcome="error"}') == 0
    assert api.errors_reported == []
    assert metric(api, "proxy_operator_leased_proxies_total") == 2 + 4
    assert metric(api, "proxy_operator_lease_releases_total") == 2 + 4


def test_the_scrapy_middleware_does_not_ban_or_retry_a_refusal_and_leaves_a_site_down_to_scrapy(
    start_api: ApiFactory,
    forward_proxies: Callable[[int], Inventory],
    allowed: Site,
    refused: Site,
    down: int,
) -> None:
    inventory = forward_proxies(3)
    api = start_api(inventory=inventory, cooldown_seconds=0, lease_ttl_seconds=300, error_quorum=1)
    refused_port = refused.base.rsplit(":", 1)[1]
    urls = [
        allowed.url("/ban403"),
        refused.url("/ok"),
        f"https://127.0.0.1:{refused_port}/ok",
        f"http://127.0.0.1:{down}/",
        f"https://127.0.0.1:{down}/",
    ]
    result = crawl(api, urls, RETRY_TIMES=1, CONCURRENT_REQUESTS=1)

    pages = {page["url"]: page["status"] for page in result["pages"]}
    assert pages == {urls[0]: 200, urls[1]: 403, urls[3]: 502}  # the proxy's answers reach the spider
    assert sorted(f["url"] for f in result["failures"]) == sorted([urls[2], urls[4]])  # failed CONNECTs
    assert {f["error"] for f in result["failures"]} == {"TunnelError"}
    assert (dict(allowed.hits), dict(refused.hits)) == ({"/ban403": 2}, {})
    with api.client() as http:
        text = http.get("/metrics").text
    assert metric_in(text, 'proxy_operator_reports_total{outcome="banned"}') == 1
    assert len(penalised(api, inventory)) == 1
    assert metric_in(text, 'proxy_operator_reports_total{outcome="error"}') == 0
    assert api.errors_reported == []
    # The ban retried once through the middleware; each refusal leased once (not retried); each site down
    # twice (Scrapy's RetryMiddleware, RETRY_TIMES=1, through a fresh lease).
    assert metric_in(text, "proxy_operator_leased_proxies_total") == 2 + 1 + 1 + 2 + 2
    assert metric_in(text, "proxy_operator_lease_releases_total") == 8
