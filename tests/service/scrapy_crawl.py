"""Run a real Scrapy spider with the client package's add-on (proxy_operator_client.scrapy), in its own
process (one reactor per process): `python scrapy_crawl.py '<json>'` with {"api", "token", "urls",
"settings"}; prints one JSON line: pages, failures, the crawl's stats, and when it opened and stopped.

The spider fetches each URL once and records what reached its callbacks: pages (status, the proxy used,
the lease's key) and failures. A later middleware replaces `/detour` with a fresh request for `/ok` (as a
login or captcha middleware would: the first request is never downloaded) and `/rewrite` with the same
request for `/ok` (`request.replace`: sent again, with the proxy middleware's meta).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import scrapy
from scrapy import signals
from scrapy.crawler import Crawler, CrawlerProcess

TIMES: dict[str, float] = {}


class Detour:
    """A downloader middleware after the proxy middleware (620 > 610) that swaps requests for others."""

    def process_request(self, request: scrapy.Request) -> scrapy.Request | None:
        if request.url.endswith("/detour"):
            return scrapy.Request(request.url.replace("/detour", "/ok"), dont_filter=True)
        if request.url.endswith("/rewrite"):
            return request.replace(url=request.url.replace("/rewrite", "/ok"))
        return None


class Timing:
    """An extension: when the spider opened and when the engine stopped (monotonic seconds). It is built
    before the downloader, so its `engine_stopped` handler runs first: the time includes the spider's whole
    close (the add-on's own included) but not Scrapy's closing of idle connections after it."""

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Timing:
        timing = cls()
        crawler.signals.connect(timing.opened, signal=signals.spider_opened)
        crawler.signals.connect(timing.stopped, signal=signals.engine_stopped)
        return timing

    def opened(self) -> None:
        TIMES["opened"] = time.monotonic()

    def stopped(self) -> None:
        TIMES["stopped"] = time.monotonic()


class SiteSpider(scrapy.Spider):
    name = "site"

    def __init__(self, urls: list[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.urls = urls
        self.pages: list[dict[str, Any]] = []
        self.failures: list[dict[str, Any]] = []

    async def start(self) -> Any:
        for url in self.urls:
            yield scrapy.Request(url, callback=self.page, errback=self.failed, dont_filter=True)

    def parse(self, response: scrapy.http.Response, **kwargs: Any) -> None:
        self.page(response)

    def page(self, response: scrapy.http.Response) -> None:
        meta = response.meta
        lease = meta.get("proxy_operator_lease") or {}
        self.pages.append(
            {
                "url": response.url,
                "status": response.status,
                "proxy": meta.get("proxy"),
                "key": lease.get("key"),
            }
        )

    def failed(self, failure: Any) -> None:
        self.failures.append({"url": failure.request.url, "error": type(failure.value).__name__})


def main(config: dict[str, Any]) -> None:
    settings = {
        "PROXY_OPERATOR_URL": config["api"],
        "PROXY_OPERATOR_TOKEN": config["token"],
        "ADDONS": {"proxy_operator_client.scrapy.ProxyOperatorAddon": 500},
        "DOWNLOADER_MIDDLEWARES": {Detour: 620},
        "EXTENSIONS": {Timing: 0},
        "ROBOTSTXT_OBEY": False,
        "TELNETCONSOLE_ENABLED": False,
        "HTTPERROR_ALLOW_ALL": True,  # the callback sees a final 403/429 too
        "LOG_LEVEL": "INFO",
        **config.get("settings", {}),
    }
    process = CrawlerProcess(settings)
    crawler = process.create_crawler(SiteSpider)
    process.crawl(crawler, urls=config["urls"])
    process.start()
    spider = crawler.spider
    stats = crawler.stats.get_stats() if crawler.stats else {}
    print(
        json.dumps(
            {
                "pages": spider.pages,
                "failures": spider.failures,
                "stats": {k: v for k, v in stats.items() if isinstance(v, int | float | str)},
                "times": TIMES,
            },
            default=str,
        )
    )


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
