"""The client package's Scrapy add-on (proxy_operator_client.scrapy) under a real Scrapy spider, through
real proxies (pproxy, and our own forward proxy where lease users matter) leased from a live discovery API,
against a real site on loopback. The verdicts are read from the service (its metrics, penalties, health
reports and holds) and from the spider's pages, not from its logs.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from service.inventory import Health, HealthState, Inventory
from stacks.programs.local import LocalProxyProvider
from tests.ports import free_port
from tests.service.conftest import TOKENS, Api, ApiFactory, Pproxy, auth, endpoint
from tests.service.site import Site

CRAWL = Path(__file__).with_name("scrapy_crawl.py")
TARGET = "127.0.0.1"  # the site's host: the middleware leases for it
pytestmark = pytest.mark.parametrize("store_kind", ["memory"])  # the stores have their own suites


@pytest.fixture
def six_proxies(pproxies: Callable[..., Pproxy]) -> Inventory:
    """Enough for two bans and two requests in flight: the API's clock stands still here, so a penalty or
    a forgotten hold never ends by itself."""
    inventory = Inventory()
    inventory.replace_all(
        [endpoint(f"p{i}", port=pproxies().port, username="user", password="pass") for i in range(6)]
    )
    for i in range(6):
        inventory.set_health(f"default/p{i}", Health(state=HealthState.healthy, egress_ip="127.0.0.1"))
    return inventory


def healthy(endpoints: list[Any]) -> Inventory:
    inventory = Inventory()
    inventory.replace_all(endpoints)
    for item in endpoints:
        inventory.set_health(item.key, Health(state=HealthState.healthy, egress_ip="127.0.0.1"))
    return inventory


@pytest.fixture
def site() -> Iterator[Site]:
    with Site(slow_seconds=2) as running:
        yield running


@pytest.fixture
def forward_proxies(tmp_path: Path, site: Site) -> Iterator[Callable[[int], Inventory]]:
    """`make(n)`: n real `local` forward proxies (lease users of their own, ended by the proxy's clock at
    the lease's ttl) allowing the site, healthy in a new inventory."""
    provider, created = LocalProxyProvider(), []
    allowed = {"allow": [{"cidr": "127.0.0.1/32", "ports": [int(site.base.rsplit(":", 1)[1])]}]}

    def make(count: int) -> Inventory:
        endpoints = []
        for i in range(count):
            port = free_port()
            props = {"state_dir": str(tmp_path), "stem": f"p{i}", "bind_address": "127.0.0.1", "port": port}
            props |= {"protocol": "http", "username": "user", "password": "Pass1234", "egress": allowed}
            result = provider.create(props)
            created.append(result)
            endpoints.append(
                endpoint(
                    f"p{i}", port=port, username="user", password="Pass1234", control=result.outs["control"]
                )
            )
        return healthy(endpoints)

    yield make
    for result in created:
        provider.delete(result.id, result.outs or {})


class Crawl:
    """A spider running in its own process (scrapy_crawl.py); `result()` waits for it."""

    def __init__(self, api_url: str, urls: list[str], settings: dict[str, Any]) -> None:
        config = {"api": api_url, "token": TOKENS["crawler-a"][0], "urls": urls, "settings": settings}
        command = [sys.executable, str(CRAWL), json.dumps(config)]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def result(self, *, timeout: float = 90) -> dict[str, Any]:
        try:
            stdout, stderr = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            _, stderr = self.process.communicate()
            pytest.fail(f"the spider did not finish in {timeout:g} s:\n{stderr[-6000:]}")
        assert self.process.returncode == 0, stderr[-4000:]
        assert "ScrapyDeprecationWarning" not in stderr, stderr[-4000:]
        result: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
        result["log"] = stderr
        return result

    def kill(self) -> None:
        """End it if it still runs (a test that failed before waiting for it)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.communicate()


def crawl(api: Api, urls: list[str], *, timeout: float = 90, **settings: Any) -> dict[str, Any]:
    return Crawl(api.url, urls, settings).result(timeout=timeout)


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
    # 5 first tries + 4 retries + the two replacements: a lease is taken only when a request is sent, so
    # the detoured and the rewritten requests (replaced before they reached the downloader) took none.
    assert metric(text, "proxy_operator_leased_proxies_total") == 11
    assert metric(text, "proxy_operator_lease_releases_total") == 11
    stats = result["stats"]
    assert stats["proxy_operator/leases"] == stats["proxy_operator/releases"] == 11
    assert (stats["proxy_operator/reports/ok"], stats["proxy_operator/reports/banned"]) == (7, 2)
    assert stats["proxy_operator/reports/error"] == 2
    assert stats["proxy_operator/retry/count"] == 4
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


def test_a_per_site_concurrency_within_the_share_asks_no_lease_past_it(
    start_api: ApiFactory, six_proxies: Inventory
) -> None:
    """The same share (three of six proxies), PROXY_OPERATOR_CONCURRENCY_PER_SITE = 2: the requests past
    two wait outside the downloader for one of the site's leases to end, without asking the API, so the
    API never answers 429 `lease_share`."""
    api = start_api(
        inventory=six_proxies, cooldown_seconds=0, lease_ttl_seconds=300, lease_share=0.5, lease_rate=1000.0
    )
    with Site() as site:
        urls = [site.url(f"/ok?page={i}") for i in range(12)]
        settings = {"CONCURRENT_REQUESTS": 6, "CONCURRENT_REQUESTS_PER_DOMAIN": 6}
        result = crawl(api, urls, PROXY_OPERATOR_CONCURRENCY_PER_SITE=2, **settings)
    assert result["failures"] == []
    assert sorted(p["url"] for p in result["pages"]) == sorted(urls)
    assert result["stats"]["proxy_operator/parked/site_concurrency"] > 0
    with api.client() as http:
        text = http.get("/metrics").text
    assert metric(text, 'proxy_operator_lease_requests_total{outcome="lease_share"}') == 0
    assert metric(text, "proxy_operator_leased_proxies_total") == 12


def test_a_6_s_api_outage_loses_no_page(start_api: ApiFactory, six_proxies: Inventory, site: Site) -> None:
    """The API stops after a few pages and comes back 6 s later on the same port, with a fresh store (what a
    restart of a replica with the memory store is): lease calls that find no API park their requests with
    a backoff (none fails), and the reports and releases of the pages fetched just before are retried in
    the background (the pages went on at once). On the middleware before, 16 of 71 requests failed with
    httpx.ConnectError in process_request and 3 good pages were dropped when their report raised."""
    settings = {"cooldown_seconds": 0, "lease_ttl_seconds": 300}
    api = start_api(inventory=six_proxies, **settings)
    port = int(api.url.rsplit(":", 1)[1])
    urls = [site.url(f"/ok?page={i}") for i in range(24)]
    running = Crawl(api.url, urls, {"CONCURRENT_REQUESTS": 2, "DOWNLOAD_DELAY": 0.25})
    try:
        assert until(lambda: site.hits["/ok"] >= 4), "the crawl did not start"
        api.server.stop()
        during = site.hits["/ok"]
        time.sleep(6)
        back = start_api(inventory=six_proxies, port=port, **settings)
        result = running.result()
    finally:
        running.kill()

    assert result["failures"] == []
    assert sorted(page["url"] for page in result["pages"]) == sorted(urls)
    assert {page["status"] for page in result["pages"]} == {200}
    assert site.hits["/ok"] == len(urls)  # each page fetched once: none was dropped and fetched again
    assert during < len(urls)  # the crawl was still going when the API stopped
    stats = result["stats"]
    assert stats["proxy_operator/api_errors"] > 0
    assert stats["proxy_operator/parked/api_unavailable"] > 0
    with back.client() as http:
        text = http.get("/metrics").text
    assert metric(text, "proxy_operator_leased_proxies_total") > 0  # the rest were leased after the restart


def test_a_download_delay_longer_than_the_lease_ttl_loses_no_page_and_reports_no_ok_for_a_407(
    start_api: ApiFactory, forward_proxies: Callable[[int], Inventory], site: Site
) -> None:
    """Leases of 1 s, DOWNLOAD_DELAY 1.5 s, real `local` proxies that end a lease's user at its ttl: a lease
    is taken when Scrapy sends its request (after the delay), so none has expired by then, and a download
    longer than the ttl (/slow, 2 s) renews it. On the middleware before, the leases were taken before the
    delay: every request after the first got 407 from the proxy, reported as `ok`, and lost its page."""
    api = start_api(inventory=forward_proxies(3), cooldown_seconds=0, lease_ttl_seconds=1)
    urls = [site.url(f"/ok?page={i}") for i in range(3)] + [site.url("/slow")]
    settings = {
        "DOWNLOAD_DELAY": 1.5,
        "DOWNLOAD_DELAY_JITTER": 0,
        "PROXY_OPERATOR_TTL": 1,
        "DOWNLOAD_TIMEOUT": 10,
    }
    result = crawl(api, urls, **settings)

    assert result["failures"] == []
    assert sorted((page["url"], page["status"]) for page in result["pages"]) == sorted((u, 200) for u in urls)
    with api.client() as http:
        text = http.get("/metrics").text
    assert metric(text, 'proxy_operator_reports_total{outcome="ok"}') == len(urls)
    assert metric(text, 'proxy_operator_reports_total{outcome="error"}') == 0  # no 407 at all
    assert metric(text, "proxy_operator_lease_renewals_total") >= 1  # /slow outlived its first second


def test_a_407_from_the_proxy_is_an_error_and_the_request_is_retried_with_a_fresh_lease(
    start_api: ApiFactory, pproxies: Callable[..., Pproxy], site: Site
) -> None:
    """p0's credentials in the inventory are wrong, so it answers 407 to every request: that is the proxy
    failing (`error`, counted against its health), not a page, and the request goes through another proxy.
    On the middleware before, the 407 was reported `ok` and reached the spider as its page."""
    good = pproxies().port
    inventory = healthy(
        [endpoint("p0", port=pproxies().port, username="user", password="wrong")]
        + [endpoint(f"p{i}", port=good, username="user", password="pass") for i in (1, 2)]
    )
    api = start_api(inventory=inventory, cooldown_seconds=0, error_quorum=1)
    urls = [site.url(f"/ok?page={i}") for i in range(3)]
    result = crawl(api, urls, CONCURRENT_REQUESTS=1)

    assert result["failures"] == []
    assert {page["status"] for page in result["pages"]} == {200}
    assert "default/p0" not in {page["key"] for page in result["pages"]}
    assert api.errors_reported == ["default/p0"]  # counted towards its health (once per client and window)
    with api.client() as http:
        text = http.get("/metrics").text
    assert metric(text, 'proxy_operator_reports_total{outcome="ok"}') == len(urls)
    # Each time p0 came round again (least recently used), its 407 was an `error` and the request retried.
    errors = metric(text, 'proxy_operator_reports_total{outcome="error"}')
    assert errors >= 1
    assert result["stats"]["proxy_operator/retry/count"] == errors


def test_a_banned_site_waits_outside_the_downloader_and_the_spider_closes_within_a_second(
    start_api: ApiFactory, pproxies: Callable[..., Pproxy], site: Site
) -> None:
    """Every proxy is banned for `localhost` (another client's reports; the API's clock stands still, so
    the bans never end): its requests get 503 `all_cooling_down` and are parked outside the downloader, so
    the unrelated site (127.0.0.1, the same server) is crawled whole meanwhile, and when CLOSESPIDER_TIMEOUT
    closes the spider at 3 s it is gone within a second (the parked requests are dropped, not awaited). On
    the middleware before, the banned site's requests waited inside process_request holding Scrapy's
    concurrency, and the close waited for them: the spider did not end within 30 s."""
    port = pproxies().port
    inventory = healthy([endpoint(f"p{i}", port=port, username="user", password="pass") for i in range(4)])
    api = start_api(inventory=inventory, cooldown_seconds=0)
    with api.client() as http:
        leased = http.post("/v1/leases", json={"target": "localhost", "count": 4}, headers=auth("crawler-b"))
        for item in leased.json()["leases"]:
            report = {"lease": item["leaseId"], "outcome": "banned"}
            assert http.post("/v1/reports", json=report, headers=auth("crawler-b")).status_code == 200
    banned = [site.url(f"/ok?banned={i}").replace("127.0.0.1", "localhost") for i in range(12)]
    unrelated = [site.url(f"/ok?page={i}") for i in range(6)]
    urls = [url for pair in zip(banned[:6], unrelated, strict=True) for url in pair] + banned[6:]
    result = crawl(api, urls, timeout=30, CONCURRENT_REQUESTS=4, CLOSESPIDER_TIMEOUT=3)

    assert sorted(page["url"] for page in result["pages"]) == sorted(unrelated)
    assert result["failures"] == []  # dropped at close, not failed
    stats = result["stats"]
    assert stats["finish_reason"] == "closespider_timeout"
    assert stats["proxy_operator/parked_at_close"] == len(banned)
    assert stats["proxy_operator/lease_refused/all_cooling_down"] >= 1
    closing = result["times"]["stopped"] - result["times"]["opened"] - 3
    assert closing < 1.0, f"the close took {closing:.2f} s"


def until(condition: Callable[[], bool], *, within: float = 20.0) -> bool:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
