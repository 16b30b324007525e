"""A Scrapy spider whose requests go through proxy-operator's proxies (docs/clients.md, "Scrapy").

    pip install './clients/python[scrapy]'
    PROXY_OPERATOR_URL=http://127.0.0.1:8080 PROXY_OPERATOR_TOKEN=$(cat .state/dev-token) \
        scrapy runspider docs/clients/scrapy_spider.py -a start=https://example.com/

In a project the same settings go into settings.py. Run by tests/service/test_client_examples.py.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import scrapy


class ExampleSpider(scrapy.Spider):
    name = "example"
    custom_settings: ClassVar[dict[str, Any]] = {
        # One line installs the add-on's middleware and its leasing download handler.
        "ADDONS": {"proxy_operator_client.scrapy.ProxyOperatorAddon": 500},
        "PROXY_OPERATOR_URL": os.environ.get("PROXY_OPERATOR_URL"),
        "PROXY_OPERATOR_TOKEN": os.environ.get("PROXY_OPERATOR_TOKEN"),  # scopes lease and report
        # "PROXY_OPERATOR_POOL": "main",            # and PROXY_OPERATOR_LABELS = {"zone": "eu"}
        # "PROXY_OPERATOR_CONCURRENCY_PER_SITE": 3,  # your share of the pool, to spare 429s
        "DOWNLOAD_DELAY": 1.0,  # per site, as usual: a lease is taken after it, when the request goes out
    }

    def __init__(self, start: str = "https://example.com/", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_url = start

    async def start(self) -> AsyncIterator[scrapy.Request]:
        yield scrapy.Request(self.start_url)

    def parse(self, response: scrapy.http.Response, **kwargs: Any) -> Any:
        lease = response.meta.get("proxy_operator_lease", {})
        yield {"url": response.url, "status": response.status, "proxy": lease.get("key")}
