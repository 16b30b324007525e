"""The fleet page in a real headless Chromium, against a real `serve --manifests` with real `local` proxies.

Log in; the fleet lists the proxies; a lease taken through the API and a ban report show; a stopped proxy
process shows Degraded with the probe's reason; a manifest that stops parsing shows its proxy Held with the
reason; a mass deletion shows held with its id and the command that allows it; each view passes axe-core
with no serious finding and is photographed wide and narrow (the folder is printed); log out.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.wait import WebDriverWait

from service.config import OperatorSettings
from service.serve import Service, build_service, dev_token, serve
from service.settings import DiscoverySettings, HealthSettings
from service.ui.session import COOKIE
from tests.automation.fleet import Fleet
from tests.conftest import PulumiEnv
from tests.ports import free_port
from tests.service.ui.browser import chromium, require_browser, screenshots, serious_violations, wait_for

pytestmark = pytest.mark.engine
VIEWS = {"fleet": "/", "pools": "/pools", "stacks": "/stacks", "deletions": "/deletions", "leases": "/leases"}


class Serving:
    """`serve` on its own event loop in a thread, stopped the way a signal stops it."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.thread = threading.Thread(target=lambda: asyncio.run(serve(service)), name="serve", daemon=True)

    def __enter__(self) -> Serving:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.service.server.should_exit = True
        self.thread.join(timeout=60)
        assert not self.thread.is_alive(), "serve did not stop"


PORTS: dict[str, int] = {}


@pytest.fixture
def fleet(pulumi_env: PulumiEnv, tmp_path: Path) -> Iterator[Fleet]:
    require_browser()
    fleet = Fleet(root=tmp_path, backend_url=pulumi_env.backend_url)
    for name in ("p0", "p1", "p2"):
        PORTS[name] = free_port()
        fleet.write_proxy(name, port=PORTS[name], pool="main")
    try:
        yield fleet
    finally:
        fleet.kill_proxies()


def _lease(base: str, headers: dict[str, str]) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        answer = httpx.post(
            f"{base}/v1/leases", json={"target": "shop.example", "pool": "main"}, headers=headers
        )
        if answer.status_code == 200:
            lease: dict[str, Any] = answer.json()["leases"][0]
            return lease
        time.sleep(0.5)
    raise AssertionError(f"no proxy became leasable: {answer.text}")


def settings_discovery() -> DiscoverySettings:
    return DiscoverySettings(penalty_base_seconds=1e6, penalty_cap_seconds=1e6)


def _stop_process(fleet: Fleet, name: str) -> None:
    """Kill the proxy process that runs on this proxy's own config file (its stack still says it runs)."""
    [config] = [p for p in fleet.local_state.rglob("*.json") if p.stem.endswith(name)]
    found = subprocess.run(["pgrep", "-f", str(config)], capture_output=True, text=True).stdout.split()
    assert found, f"no process runs {config}"
    for pid in found:
        os.kill(int(pid), signal.SIGKILL)


def test_the_fleet_page_in_a_browser(
    fleet: Fleet, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    settings = fleet.settings().model_copy(
        update={
            "listen_port": port,
            "health": HealthSettings(interval_seconds=0.5, healthy_threshold=1),
            "deletion_budget_count": 0,
            # a ban lasts uniform(0, min(cap, base)): long enough that it cannot end while the test reads it
            "discovery": settings_discovery(),  # two of three at once is over budget (share 0.5)
            "repair_interval_seconds": 600,  # the stopped process stays stopped while the page is read
        }
    )
    assert isinstance(settings, OperatorSettings)
    token = dev_token(settings.state_dir)
    headers = {"Authorization": f"Bearer {token}"}
    base = f"http://127.0.0.1:{port}"
    shots = tmp_path / "screenshots"
    shots.mkdir()
    with Serving(build_service(settings, fleet.manifests)), chromium() as driver:
        lease = _lease(base, headers)  # the proxies are up and probed
        driver.get(base + "/")
        assert "/login" in driver.current_url, "the page asks for a log in first"
        screenshots(driver, shots, "login")
        assert serious_violations(driver) == []
        driver.find_element("id", "token").send_keys(token)
        driver.find_element("css selector", "form button[type=submit]").click()
        main = lambda: driver.find_element("tag name", "main").text  # noqa: E731
        wait_for(
            lambda: all(f"crawl/{p}" in main() for p in ("p0", "p1", "p2")),
            what="three proxies",
            driver=driver,
        )
        assert "local-dev" in driver.find_element("tag name", "header").text  # who is signed in
        # The page's own style and script run under its Content-Security-Policy; the refresh pauses.
        assert driver.find_element("tag name", "header").value_of_css_property("display") == "flex"
        driver.find_element("id", "pause").click()
        WebDriverWait(driver, 5).until(lambda d: d.find_element("id", "countdown").text == "paused")
        driver.find_element("id", "pause").click()
        WebDriverWait(driver, 5).until(lambda d: d.find_element("id", "countdown").text != "paused")

        # The lease taken through the API shows on its proxy's row, with its client.
        row = lambda key: driver.find_element("xpath", f"//tr[td/a[text()='{key}']]").text  # noqa: E731
        wait_for(lambda: "local-dev" in row(lease["key"]), what="the lease", driver=driver)
        ban = httpx.post(
            f"{base}/v1/reports", json={"lease": lease["leaseId"], "outcome": "banned"}, headers=headers
        )
        assert ban.status_code == 200, ban.text
        wait_for(lambda: "shop.example" in row(lease["key"]), what="the ban's target", driver=driver)
        driver.get(f"{base}/proxy/{lease['key']}")
        assert "shop.example" in main()  # and on its own page
        reports = driver.find_element("xpath", "//table[caption[starts-with(., 'reports of')]]").text
        assert "shop.example local-dev banned 1" in reports  # who said what, from the discovery store
        driver.get(base + "/stacks")  # the stack's last update, as the control loop ran it
        assert "up succeeded" in driver.find_element("xpath", "//tr[td/a[text()='local']]").text
        driver.get(base + "/")

        # A manifest that stops parsing: its proxy keeps running its last version, Held, and says why.
        (fleet.manifests / "proxy-p2.yaml").write_text("apiVersion: [unclosed\n")
        wait_for(lambda: "Held" in row("crawl/p2"), what="p2 held", driver=driver)
        for words in ("ManifestUnreadable", "not valid YAML", "its last applied version stays"):
            assert words in row("crawl/p2")
        # A mass deletion (two of three): held, with its id and the one command that lets it through.
        fleet.write_proxy("p2", port=PORTS["p2"], pool="main")
        wait_for(lambda: "Held" not in row("crawl/p2"), what="p2 no longer held", driver=driver)
        fleet.remove_proxy("p1")
        fleet.remove_proxy("p2")
        driver.get(base + "/deletions")
        wait_for(lambda: "Held deletion" in main(), what="the held deletion", driver=driver)
        change = httpx.get(f"{base}/v1/deletions", headers=headers).json()["held"]["changeId"]
        assert f"/v1/deletions/{change}/allow" in main()
        assert f"proxy-operator up --allow-deletions {change}" in main()
        # A stopped process: its probes fail, the row says so in the probe's words.
        driver.get(base + "/")
        _stop_process(fleet, "p0")
        wait_for(lambda: "ProbeFailed" in row("crawl/p0"), what="p0's failed probe", driver=driver)
        assert "its process (pid" in row("crawl/p0")  # not probed: the listener check found it gone
        driver.get(base + "/proxy/crawl/p0")  # its probe chart has the failures
        label = driver.find_element("css selector", "svg.chart").get_attribute("aria-label") or ""
        assert re.search(r": [1-9][0-9]* failed", label), label

        for name, path in VIEWS.items():
            driver.get(base + path)
            screenshots(driver, shots, name)
            assert serious_violations(driver) == [], name
        driver.get(f"{base}/proxy/{lease['key']}")
        screenshots(driver, shots, "proxy")
        assert serious_violations(driver) == []
        for secret in (lease["password"], token):
            assert secret not in driver.page_source

        driver.find_element("css selector", "header form button").click()
        WebDriverWait(driver, 10).until(expected_conditions.url_contains("/login"))
        assert COOKIE not in {c["name"] for c in driver.get_cookies()}, "log out clears the cookie"
        driver.get(base + "/")
        assert "/login" in driver.current_url, "after log out the page asks again"
    with capsys.disabled():
        print(f"\nfleet page screenshots: {shots}")
