"""docs/clients/python_client.py against a live discovery API, real pproxy proxies and a real loopback site.
The verdicts are read from the service: penalties, health reports, metrics and holds."""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import httpx
import pytest

from service.inventory import Health, HealthState, Inventory
from tests.service.conftest import TOKENS, Api, ApiFactory, Pproxy, auth, endpoint
from tests.service.site import Site

DOCS = Path(__file__).resolve().parents[2] / "docs" / "clients"
TARGET = "127.0.0.1"
KEYS = [f"default/p{i}" for i in range(4)]
pytestmark = pytest.mark.parametrize("store_kind", ["memory"])  # the stores have their own suites


def load_client() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_clients_python_client", DOCS / "python_client.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


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
    start_api: ApiFactory, four_proxies: Inventory
) -> None:
    client_module = load_client()
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

    token = TOKENS["crawler-a"][0]
    with (
        Site(on_first_hit={"/ban403": use_every_other_proxy}) as site,
        client_module.DiscoveryClient(api.url, token) as client,
    ):
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
    start_api: ApiFactory, four_proxies: Inventory
) -> None:
    client_module = load_client()
    api = start_api(inventory=four_proxies, cooldown_seconds=0, error_quorum=1)  # one client here
    with (
        Site(slow_seconds=3) as site,
        client_module.DiscoveryClient(api.url, TOKENS["crawler-a"][0]) as client,
    ):
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


def test_close_releases_the_leases_still_held(start_api: ApiFactory, four_proxies: Inventory) -> None:
    client_module = load_client()
    api = start_api(inventory=four_proxies, cooldown_seconds=0, lease_ttl_seconds=300)
    with client_module.DiscoveryClient(api.url, TOKENS["crawler-a"][0]) as client:
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
    start_api: ApiFactory, four_proxies: Inventory
) -> None:
    """Past the report rate the API answers 429; the page was fetched all the same."""
    client_module = load_client()
    api = start_api(inventory=four_proxies, cooldown_seconds=0, report_rate_limit=1)
    with Site() as site, client_module.DiscoveryClient(api.url, TOKENS["crawler-a"][0]) as client:
        pages = [client.fetch(site.url("/ok"), target=TARGET, wait=0) for _ in range(2)]
    assert [page.status_code for page in pages] == [200, 200]
    assert metric(api, 'proxy_operator_reports_total{outcome="ok"}') == 1  # the second was refused


def test_past_its_share_a_lease_raises_no_proxy_available_with_the_reason(
    start_api: ApiFactory, four_proxies: Inventory
) -> None:
    """A 429 (the client's fair share) is a NoProxyAvailable with its Retry-After, as a 503 is, so `fetch`
    waits it out instead of failing (before: a RuntimeError from the 429)."""
    client_module = load_client()
    api = start_api(inventory=four_proxies, lease_share=0.5, lease_ttl_seconds=120)
    with client_module.DiscoveryClient(api.url, TOKENS["crawler-a"][0]) as client:
        assert len(client.lease(target=TARGET, count=4)) == 2
        with pytest.raises(client_module.NoProxyAvailable) as refused:
            client.lease(target=TARGET)
    assert refused.value.reason == "lease_share"
    assert refused.value.retry_after == 120
