"""The downloader middleware: which requests are leased, what their answers lead to.

Before the download it marks a request as ours (unless the spider chose a proxy or opted out with
`meta["proxy_operator"] = False`), drops what a previous try left (its lease, proxy and credentials), and
parks it at once when its site's gate is closed. After the download it reads the handler's verdict:

- `ok`: the response goes on;
- `banned`, `error` (a 407 included): retried through a fresh lease with Scrapy's `get_retry_request`
  (RETRY_TIMES, or PROXY_OPERATOR_MAX_RETRIES); once the retries are spent, the answer or error goes on;
- `refused`: goes on with `dont_retry` (every proxy would refuse it);
- `site_down`: goes on to Scrapy's RetryMiddleware, which retries it (through a fresh lease);
- no lease yet: parked outside the downloader (parking.py), sent again later;
- the API refused the lease for good (ApiError): the request fails with it (its errback).
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

from scrapy import Request
from scrapy.crawler import Crawler
from scrapy.downloadermiddlewares.retry import get_retry_request
from scrapy.http import Response

from proxy_operator_client.errors import ApiError
from proxy_operator_client.judge import Outcome
from proxy_operator_client.scrapy.core import ProxyOperator
from proxy_operator_client.scrapy.gates import NoLeaseYet
from proxy_operator_client.scrapy.leases import outcome_of
from proxy_operator_client.scrapy.meta import LEASE_META, USE_META, forget_lease, wants_lease

log = logging.getLogger(__name__)
RETRY_STATS = "proxy_operator/retry"


class ProxyOperatorMiddleware:
    def __init__(self, crawler: Crawler, operator: ProxyOperator) -> None:
        self._crawler, self._operator = crawler, operator

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> ProxyOperatorMiddleware:
        return cls(crawler, ProxyOperator.of(crawler))

    def process_request(self, request: Request) -> Request | None:
        if not wants_lease(request):
            return None
        forget_lease(request)
        request.meta[USE_META] = True
        site = (urlsplit(request.url).hostname or "*").rstrip(".")
        try:
            self._operator.gates.check(site)
        except NoLeaseYet as closed:  # no call to make yet: straight to the parking, not into a slot
            return self._operator.parking.park(request, closed)
        return None

    def process_response(self, request: Request, response: Response) -> Request | Response:
        outcome = outcome_of(request)
        if outcome is Outcome.REFUSED:
            self._refused(request, f"{response.status} {response.headers.get(b'Proxy-Status')!r}")
        self._count(outcome)
        if outcome is not None and outcome.try_another_proxy:
            return self._retry(request, outcome) or response
        return response

    def process_exception(self, request: Request, exception: Exception) -> Request | None:
        if isinstance(exception, NoLeaseYet):
            return self._operator.parking.park(request, exception)
        if isinstance(exception, ApiError):
            log.error("%s: the API refused its lease: %s", request, exception)
            return None
        outcome = outcome_of(request)
        self._count(outcome)
        if outcome is Outcome.REFUSED:
            self._refused(request, str(exception))
        if outcome is Outcome.ERROR:
            return self._retry(request, outcome)
        return None  # a site down: Scrapy's RetryMiddleware decides (TunnelError is one of its exceptions)

    def _retry(self, request: Request, outcome: Outcome) -> Request | None:
        spider = self._crawler.spider
        assert spider is not None  # a download runs inside a spider
        lease = request.meta.get(LEASE_META) or {}
        return get_retry_request(
            request,
            spider=spider,
            reason=f"{outcome.value} through {lease.get('key')}",
            max_retry_times=self._operator.settings.max_retries,
            stats_base_key=RETRY_STATS,
        )

    def _refused(self, request: Request, what: str) -> None:
        lease = request.meta.get(LEASE_META) or {}
        log.warning(
            "%s: proxy %s refused the destination (%s): not retried", request.url, lease.get("key"), what
        )
        request.meta["dont_retry"] = True  # Scrapy's RetryMiddleware reads the response's request

    def _count(self, outcome: Outcome | None) -> None:
        if outcome is not None:
            self._operator.stats.inc(f"outcomes/{outcome.value}")
