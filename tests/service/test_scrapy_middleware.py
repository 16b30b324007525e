"""docs/clients/scrapy_middleware.py under a real Scrapy spider, through real pproxy proxies leased from a
live discovery API, against a real site on loopback. The verdicts are read from the service (its metrics,
penalties, health reports and holds), not from the spider's logs.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from service.inventory import Health, HealthState, Inventory
from tests.service.conftest import TOKENS, Api, ApiFactory, Pproxy, auth, endpoint
from tests.service.site import Site

CRAWL = Path(__file__).with_name("scrapy_crawl.py")
TARGET = "127.0.0.1"  # the site's host: the middleware leases for it
pytestmark = pytest.mark.parametrize("store_kind", ["memory"])  # the stores have their own suites


@pytest.fixture
def six_proxies(pproxies: Callable[..., Pproxy]) -> Inventory:
    """Enough for two bans, one lease left unfinished until close, and two requests in flight: the API's
    clock stands still here, so a penalty or a forgotten hold never ends by itself."""
    inventory = Inventory()
    inventory.replace_all(
        [endpoint(f"p{i}", port=pproxies().port, username="user", password="pass") for i in range(6)]
    )
    for i in range(6):
        inventory.set_health(f"default/p{i}", Health(state=HealthState.healthy, egress_ip="127.0.0.1"))
    return inventory


def crawl(api: Api, urls: list[str], **settings: Any) -> dict[str, Any]:
    config = {"api": api.url, "token": TOKENS["crawler-a"][0], "urls": urls, "settings": settings}
    try:
        done = subprocess.run(
            [sys.executable, str(CRAWL), json.dumps(config)], capture_output=True, text=True, timeout=90
        )
    except subprocess.TimeoutExpired as exc:  # run() killed it
        stderr = exc.stderr.decode() if isinstance(exc.stderr, bytes) else str(exc.stderr)
        pytest.fail(f"the spider did not finish in 90 s:\n{stderr[-6000:]}")
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["log"] = done.stderr
    return result


def metric(text: str, name: str) -> float:
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def test_a_real_spider_leases_reports_rotates_and_releases(
    start_api: ApiFactory, six_proxies: Inventory
) -> None:
    api = start_api(inventory=six_proxies, cooldown_seconds=0, lease_ttl_seconds=300, error_quorum=1)
    ports = {ep.port: ep.key for ep in six_proxies.endpoints()}
    paths = ["/ok", "/ban403", "/ban429", "/drop", "/slow", "/detour", "/rewrite"]
    with Site(slow_seconds=4) as site:
        result = crawl(api, [site.url(p) for p in paths], DOWNLOAD_TIMEOUT=1.5, CONCURRENT_REQUESTS=2)
        hits = dict(site.hits)

    # Every URL ended in a page, through one of our proxies (/detour and /rewrite as /ok).
    assert result["failures"] == []
    assert sorted(p["url"].removeprefix(site.base) for p in result["pages"]) == sorted(
        ["/ok", "/ban403", "/ban429", "/drop", "/slow", "/ok", "/ok"]
    )
    assert {p["status"] for p in result["pages"]} == {200}
    # Each page came through the proxy its lease named (Scrapy moved the credentials into a header).
    for page in result["pages"]:
        assert ports[int(page["proxy"].removeprefix("http://127.0.0.1:"))] == page["key"], page
    through = {p["url"].removeprefix(site.base): p["key"] for p in result["pages"]}
    assert hits == {"/ok": 3, "/ban403": 2, "/ban429": 2, "/drop": 2, "/slow": 2}

    with api.client() as http:
        text = http.get("/metrics").text
        penalised = {
            key: http.get(f"/v1/proxies/{key}", headers=auth("crawler-a")).json()["penalties"]
            for key in sorted(ports.values())
        }
        # Nothing is still held for this client and site: every lease was released (the cooldown is 0).
        after = http.post("/v1/leases", json={"target": TARGET, "count": 6}, headers=auth("crawler-a"))

    banned = sorted(key for key, penalties in penalised.items() if penalties)
    # 403 and 429 were reported as bans, for the site only, each on the proxy that met it.
    assert metric(text, 'proxy_operator_reports_total{outcome="banned"}') == 2
    assert len(banned) == 2
    assert all(p == [{**p[0], "target": TARGET, "strikes": 1}] for p in penalised.values() if p)
    # The retried pages came through proxies not banned for the site.
    assert through["/ban403"] not in banned
    assert through["/ban429"] not in banned
    # The dropped connection and the site timeout were reported as `error` (health), not as bans.
    assert metric(text, 'proxy_operator_reports_total{outcome="error"}') == 2
    assert len(api.errors_reported) == 2
    assert metric(text, 'proxy_operator_reports_total{outcome="ok"}') == 7
    # 7 first tries + 4 retries + 2 replacements. The rewritten request's first lease was released when it
    # was sent again; the detour's, whose request never came back, when the spider closed.
    assert metric(text, "proxy_operator_leased_proxies_total") == 13
    assert metric(text, "proxy_operator_lease_releases_total") == 13
    assert "releasing 1 unfinished lease(s) at close" in result["log"]
    assert after.status_code == 200, after.text
    assert sorted(item["key"] for item in after.json()["leases"]) == sorted(set(ports.values()) - set(banned))


def test_past_its_share_the_spider_waits_for_its_own_release_and_loses_no_page(
    start_api: ApiFactory, six_proxies: Inventory
) -> None:
    """Fair shares on (half of six proxies), six requests in flight: the API answers 429 `lease_share` to
    the requests past three; each waits for one of the spider's own releases, not for Retry-After (the
    API's clock stands still here, so Retry-After never comes: a middleware that slept it or failed on the
    429 would lose those pages or hit the 90 s limit)."""
    api = start_api(
        inventory=six_proxies, cooldown_seconds=0, lease_ttl_seconds=300, lease_share=0.5, lease_rate=1000.0
    )
    with Site() as site:
        urls = [site.url(f"/ok?page={i}") for i in range(12)]
        result = crawl(api, urls, CONCURRENT_REQUESTS=6, CONCURRENT_REQUESTS_PER_DOMAIN=6)
    assert result["failures"] == []
    assert sorted(p["url"] for p in result["pages"]) == sorted(urls)
    with api.client() as http:
        text = http.get("/metrics").text
    assert metric(text, 'proxy_operator_lease_requests_total{outcome="lease_share"}') > 0
    assert metric(text, "proxy_operator_leased_proxies_total") == 12
