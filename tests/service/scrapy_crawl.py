"""Run a real Scrapy spider with docs/clients/scrapy_middleware.py, in its own process (one reactor per
process): `python scrapy_crawl.py '<json>'` with {"api", "token", "urls", "settings"}; prints one JSON line.

The spider fetches each URL once and records what reached its callbacks: pages (status, the proxy used)
and failures. A later middleware replaces `/detour` with a fresh request for `/ok` (as a login or captcha
middleware would: the first lease never sees an answer, nor is its request sent again) and `/rewrite` with
the same request for `/ok` (`request.replace`: sent again, with the proxy middleware's meta).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import scrapy
from scrapy.crawler import CrawlerProcess

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "docs" / "clients"))


class Detour:
    """A downloader middleware after the proxy middleware (620 > 610) that swaps requests for others."""

    def process_request(self, request: scrapy.Request) -> scrapy.Request | None:
        if request.url.endswith("/detour"):
            return scrapy.Request(request.url.replace("/detour", "/ok"), dont_filter=True)
        if request.url.endswith("/rewrite"):
            return request.replace(url=request.url.replace("/rewrite", "/ok"))
        return None


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
        "DOWNLOADER_MIDDLEWARES": {"scrapy_middleware.ProxyOperatorMiddleware": 610, Detour: 620},
        "TWISTED_REACTOR": "twisted.internet.asyncioreactor.AsyncioSelectorReactor",
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
            },
            default=str,
        )
    )


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
