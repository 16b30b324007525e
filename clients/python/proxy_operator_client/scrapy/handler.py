"""The download handler that leases: it wraps the handler Scrapy would use for http and https (the default
HTTP11DownloadHandler, or whatever DOWNLOAD_HANDLERS named before the add-on) and takes each request's lease
right before handing it the request, which is when Scrapy sends it: after the site's DOWNLOAD_DELAY and
its slot's concurrency, so a lease never waits in Scrapy's queues and cannot expire before it is used."""

from __future__ import annotations

from typing import Any

from scrapy import Request
from scrapy.crawler import Crawler
from scrapy.exceptions import NotConfigured, NotSupported
from scrapy.http import Response
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.misc import build_from_crawler, load_object

from proxy_operator_client.scrapy.core import ProxyOperator
from proxy_operator_client.scrapy.meta import USE_META
from proxy_operator_client.scrapy.settings import DEFAULT_HANDLER, HANDLERS


class ProxyOperatorDownloadHandler:
    lazy = False

    def __init__(self, crawler: Crawler) -> None:
        self._crawler = crawler
        self._paths: dict[str, Any] = {
            "http": DEFAULT_HANDLER,
            "https": DEFAULT_HANDLER,
            **crawler.settings.getdict(HANDLERS),
        }
        self._inner: dict[str, Any] = {}
        try:
            self._operator: ProxyOperator | None = ProxyOperator.of(crawler)
        except NotConfigured:
            self._operator = None  # switched off: a plain handler

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> ProxyOperatorDownloadHandler:
        return cls(crawler)

    async def download_request(self, request: Request) -> Response:
        inner = self._inner_for(urlparse_cached(request).scheme)
        if self._operator is None or request.meta.get(USE_META) is not True:
            return await inner.download_request(request)
        return await self._operator.leases.download(request, inner.download_request)

    async def close(self) -> None:
        for inner in self._inner.values():
            await inner.close()

    def _inner_for(self, scheme: str) -> Any:
        """The wrapped handler of `scheme`, built at its first request (one per scheme, as Scrapy does)."""
        if scheme not in self._inner:
            path = self._paths.get(scheme)
            if path is None:
                raise NotSupported(f"no download handler for {scheme!r} behind {type(self).__name__}")
            cls = load_object(path)
            if cls is type(self):  # named twice: wrap Scrapy's own
                cls = load_object(DEFAULT_HANDLER)
            self._inner[scheme] = build_from_crawler(cls, self._crawler)
        return self._inner[scheme]
