"""What the add-on's middleware and download handler share, one per crawler: the settings, the API client,
the gates, the parking and the leases; and the spider's close, which leaves nothing waiting."""

from __future__ import annotations

import logging
import random
import time
import weakref

import httpx
from scrapy import signals
from scrapy.crawler import Crawler
from scrapy.exceptions import NotConfigured

from proxy_operator_client.aio import AsyncDiscoveryClient
from proxy_operator_client.errors import ProxyOperatorError
from proxy_operator_client.scrapy.gates import Gates
from proxy_operator_client.scrapy.leases import Leases
from proxy_operator_client.scrapy.parking import Parking
from proxy_operator_client.scrapy.settings import Settings
from proxy_operator_client.scrapy.stats import Stats

log = logging.getLogger(__name__)
_shared: weakref.WeakKeyDictionary[Crawler, ProxyOperator] = weakref.WeakKeyDictionary()


class ProxyOperator:
    def __init__(self, crawler: Crawler, settings: Settings) -> None:
        self.settings = settings
        self.stats = Stats(crawler.stats)
        rng = random.Random()
        self.gates = Gates(time.monotonic)
        self.parking = Parking(crawler, stats=self.stats, rng=rng)
        timeout = httpx.Timeout(settings.api_timeout + settings.wait, connect=settings.api_timeout)
        client = AsyncDiscoveryClient(settings.url, settings.token, timeout=timeout, backoff=settings.backoff)
        self.leases = Leases(
            client=client,
            settings=settings,
            gates=self.gates,
            parking=self.parking,
            stats=self.stats,
            rng=rng,
        )
        crawler.signals.connect(self._closed, signal=signals.spider_closed)

    @classmethod
    def of(cls, crawler: Crawler) -> ProxyOperator:
        """The crawler's; NotConfigured when PROXY_OPERATOR_ENABLED is false. Missing settings or a reactor
        that is not asyncio's fail the crawl: crawling on without proxies would show the crawler's own IP."""
        if not crawler.settings.getbool("PROXY_OPERATOR_ENABLED", True):
            raise NotConfigured("PROXY_OPERATOR_ENABLED is false")
        if crawler not in _shared:
            if "asyncio" not in str(crawler.settings.get("TWISTED_REACTOR") or ""):
                raise ProxyOperatorError(
                    "proxy_operator_client.scrapy needs TWISTED_REACTOR = "
                    '"twisted.internet.asyncioreactor.AsyncioSelectorReactor" (Scrapy\'s default since 2.13)'
                )
            _shared[crawler] = cls(crawler, Settings.from_scrapy(crawler.settings))
        return _shared[crawler]

    async def _closed(self) -> None:
        """Drop the parked requests, give what is left to send a bounded time: nothing outlives the close."""
        self.parking.close()
        await self.leases.close()
