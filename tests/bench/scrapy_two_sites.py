"""The spider of bench_scrapy.py, in its own process (one reactor per process):
`scrapy_two_sites.py CONFIG.json` with {"api", "token", "sites": [base URL, ...], "seconds"} and optionally
"share_gate_per_site" (see gate_share_per_site).

One real Scrapy spider with the proxy-operator add-on (the asyncio reactor, Scrapy's default concurrency)
crawls `/page/0`, `/page/1`, ... of each site in turn (an endless supply, taken lazily by Scrapy) until
CLOSESPIDER_TIMEOUT = `seconds`. Prints one JSON line: for each site the times (seconds after the spider
opened) of the answers that reached the callback, by status; failures (errbacks) by site and error; the
crawl's `proxy_operator/` stats, `finish_reason` and when it opened and stopped.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import scrapy
from scrapy.crawler import CrawlerProcess

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.service.scrapy_crawl import TIMES, Timing

OUTSTANDING = 16  # per site: Scrapy's CONCURRENT_REQUESTS
KEPT_STATS = ("proxy_operator/", "finish_reason", "downloader/request_count", "scheduler/enqueued")


class TwoSites(scrapy.Spider):
    name = "two-sites"

    def __init__(self, sites: list[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sites = sites
        self.answers: dict[str, dict[int, list[float]]] = {urlsplit(s).netloc: {} for s in sites}
        self.failures: Counter[str] = Counter()
        self.outstanding: Counter[str] = Counter()

    async def start(self) -> AsyncIterator[scrapy.Request]:
        """Each site's next page whenever fewer than OUTSTANDING of its pages are on their way: an endless
        supply, but bounded (a parked request leaves Scrapy's downloader, so an unbounded start would be
        drained as fast as the engine can park its requests); a site at its bound never holds the other."""
        pages = dict.fromkeys(self.sites, 0)
        while True:
            ready = [s for s in self.sites if self.outstanding[urlsplit(s).netloc] < OUTSTANDING]
            for site in ready:
                self.outstanding[urlsplit(site).netloc] += 1
                url, pages[site] = f"{site}/page/{pages[site]}", pages[site] + 1
                yield scrapy.Request(url, callback=self.page, errback=self.failed, dont_filter=True)
            if not ready:
                await asyncio.sleep(0.02)

    def page(self, response: scrapy.http.Response) -> None:
        at, site = time.monotonic() - TIMES["opened"], urlsplit(response.url).netloc
        self.outstanding[site] -= 1
        self.answers[site].setdefault(response.status, []).append(round(at, 3))

    def failed(self, failure: Any) -> None:
        self.outstanding[urlsplit(failure.request.url).netloc] -= 1
        self.failures[f"{urlsplit(failure.request.url).netloc} {type(failure.value).__name__}"] += 1


def gate_share_per_site() -> None:
    """The diagnosis of bench_scrapy.py, in this process only: the add-on's gate for a 429 `lease_share`
    closes the refused site's gate (as for a 503 `all_cooling_down`) instead of every site's."""
    from proxy_operator_client.scrapy import gates

    gates.PER_SITE = gates.PER_SITE | {"lease_share"}


def main(config: dict[str, Any]) -> None:
    if config.get("share_gate_per_site"):
        gate_share_per_site()
    settings = {
        "PROXY_OPERATOR_URL": config["api"],
        "PROXY_OPERATOR_TOKEN": config["token"],
        "ADDONS": {"proxy_operator_client.scrapy.ProxyOperatorAddon": 500},
        "EXTENSIONS": {Timing: 0},
        "CLOSESPIDER_TIMEOUT": config["seconds"],
        "ROBOTSTXT_OBEY": False,
        "TELNETCONSOLE_ENABLED": False,
        "HTTPERROR_ALLOW_ALL": True,  # the callback sees B's final 403 (retries spent) too
        "LOG_LEVEL": "WARNING",
    }
    process = CrawlerProcess(settings)
    crawler = process.create_crawler(TwoSites)
    process.crawl(crawler, sites=config["sites"])
    process.start()
    spider = crawler.spider
    assert isinstance(spider, TwoSites)
    stats = crawler.stats.get_stats() if crawler.stats else {}
    kept = {k: v for k, v in stats.items() if k.startswith(KEPT_STATS) and isinstance(v, int | float | str)}
    print(json.dumps({"answers": spider.answers, "failures": spider.failures, "stats": kept, "times": TIMES}))


if __name__ == "__main__":
    main(json.loads(Path(sys.argv[1]).read_text()))
