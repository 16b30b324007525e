"""The examples in docs/clients run as their docstrings say, against a live API, real pproxy proxies and a
loopback site: the Python client's script (sync and async) and the Scrapy spider with the add-on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from service.inventory import Inventory
from tests.service.conftest import TOKENS, ApiFactory, Pproxy, healthy_inventory
from tests.service.site import Site

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "clients"
pytestmark = pytest.mark.parametrize("store_kind", ["memory"])  # the stores have their own suites


@pytest.fixture
def two_proxies(pproxies: Callable[..., Pproxy]) -> Inventory:
    return healthy_inventory(["a", "b"], port=pproxies().port, username="user", password="pass")


def run(command: list[str], api_url: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PROXY_OPERATOR_URL": api_url, "PROXY_OPERATOR_TOKEN": TOKENS["crawler-a"][0]}
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done


def test_the_python_example_fetches_each_page_sync_and_async(
    start_api: ApiFactory, two_proxies: Inventory, tmp_path: Path
) -> None:
    api = start_api(inventory=two_proxies, cooldown_seconds=0)
    with Site() as site:
        urls = [site.url("/ok"), site.url("/ban403")]
        done = run([sys.executable, str(EXAMPLES / "python_client.py"), *urls], api.url, tmp_path)
    assert done.stdout.splitlines() == [
        f"{urls[0]}: 200, 15 bytes",
        f"{urls[1]}: 200, 15 bytes",  # banned once, then through the other proxy
        f"{urls[0]}: 200 (async)",
        f"{urls[1]}: 200 (async)",
    ]


def test_the_scrapy_example_crawls_through_a_leased_proxy(
    start_api: ApiFactory, two_proxies: Inventory, tmp_path: Path
) -> None:
    api = start_api(inventory=two_proxies, cooldown_seconds=0)
    items = tmp_path / "items.json"
    with Site() as site:
        spider = [sys.executable, "-m", "scrapy", "runspider", str(EXAMPLES / "scrapy_spider.py")]
        run([*spider, "-a", f"start={site.url('/ban429')}", "-o", str(items)], api.url, tmp_path)
    [item] = json.loads(items.read_text())
    assert item["status"] == 200  # the 429 was a ban: retried through the other proxy
    assert item["proxy"] in {"default/a", "default/b"}
