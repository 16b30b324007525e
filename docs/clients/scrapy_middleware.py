"""A Scrapy downloader middleware that takes its proxies from proxy-operator (docs/api.md).

For each request it leases a proxy for the request's host (the target), sends the request through it,
reports the answer (`banned` on 403/429 or your codes, `ok` otherwise, `error` on a download error,
a timeout included), releases the lease, and on a ban or an error retries the request through another
proxy. A lease whose request never came back (another middleware replaced or dropped it) is released when
the request is sent again, or at the latest when the spider closes. Sticky sessions: set
`request.meta["proxy_session"] = "cart-42"` and every request of that session uses one proxy (a session
belongs to the token's client name, whatever the site: see docs/api.md).

The proxy's own answers are not the site's (docs/security.md, "The proxies"): an answer whose
`Proxy-Status` header (RFC 9209) names an error, or a CONNECT tunnel that failed. A refusal by the proxy's
egress policy (`destination_ip_prohibited`, a CONNECT answered 403) is neither reported nor retried (the
request gets `dont_retry`: every proxy would refuse it). A site the proxy could not reach
(`connection_refused`, `dns_error`, ..., a CONNECT answered 502/504) is not reported either and is left
to Scrapy's RetryMiddleware, which leases afresh. Other errors the proxy names are reported as `error`.
A 503 (nothing eligible) and a 429 past the token's lease rate are waited out for their Retry-After; a 429
past the token's share of the pool (`lease_share`) waits for the next of the spider's own releases.

settings.py:

    TWISTED_REACTOR = "twisted.internet.asyncioreactor.AsyncioSelectorReactor"  # the middleware is asyncio
    DOWNLOADER_MIDDLEWARES = {"myproject.scrapy_middleware.ProxyOperatorMiddleware": 610}  # before 750,
                                          # Scrapy's HttpProxyMiddleware, which reads meta["proxy"]
    PROXY_OPERATOR_URL = "http://proxy-operator.crawl.svc:8080"
    PROXY_OPERATOR_TOKEN = "..."          # a token with scopes lease and report
    PROXY_OPERATOR_POOL = "main"          # optional; PROXY_OPERATOR_LABELS = {"zone": "eu"} too
    PROXY_OPERATOR_BAN_CODES = [403, 429]
    PROXY_OPERATOR_MAX_RETRIES = 3
    PROXY_OPERATOR_WAIT = 10              # seconds the API may hold a lease request when all cool down

Scrapy speaks HTTP(S) proxies only (credentials from the URL become Proxy-Authorization), so the middleware
leases `protocol: http` proxies. Scrapy is imported only inside the methods that need it, so this file
imports without Scrapy installed. tests/service/test_scrapy_middleware.py runs it under a real spider.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from typing import Any
from urllib.parse import urlsplit

import httpx

log = logging.getLogger(__name__)
LEASE_META = "proxy_operator_lease"
RETRIES_META = "proxy_operator_retries"
# RFC 9209 error types: what a refusal by the proxy's policy and a site it could not reach are called.
REFUSALS = frozenset({"destination_ip_prohibited", "http_request_denied"})
SITE_DOWN = ("dns_", "destination_", "connection_", "tls_", "http_response_")  # prefixes of the types
CONNECT_REFUSED, CONNECT_SITE_DOWN = frozenset({403}), frozenset({502, 504})


class ProxyOperatorMiddleware:
    def __init__(
        self,
        *,
        url: str,
        token: str,
        pool: str | None = None,
        labels: dict[str, str] | None = None,
        ban_codes: frozenset[int] = frozenset({403, 429}),
        max_retries: int = 3,
        wait: float = 10,
    ) -> None:
        self._http = httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=45)
        self._filters: dict[str, Any] = {"pool": pool, "labels": labels or None, "protocol": "http"}
        self._ban_codes = ban_codes
        self._max_retries = max_retries
        self._wait = wait
        self._live: dict[str, dict[str, Any]] = {}  # lease id -> lease, until reported or released
        self._released = asyncio.Event()  # set at each release: a request past our share waits for it

    @classmethod
    def from_crawler(cls, crawler: Any) -> ProxyOperatorMiddleware:
        from scrapy import signals
        from scrapy.exceptions import NotConfigured

        settings = crawler.settings
        if not settings.get("PROXY_OPERATOR_URL") or not settings.get("PROXY_OPERATOR_TOKEN"):
            raise NotConfigured("set PROXY_OPERATOR_URL and PROXY_OPERATOR_TOKEN")
        middleware = cls(
            url=settings.get("PROXY_OPERATOR_URL"),
            token=settings.get("PROXY_OPERATOR_TOKEN"),
            pool=settings.get("PROXY_OPERATOR_POOL"),
            labels=settings.getdict("PROXY_OPERATOR_LABELS") or None,
            ban_codes=frozenset(int(c) for c in settings.getlist("PROXY_OPERATOR_BAN_CODES", [403, 429])),
            max_retries=settings.getint("PROXY_OPERATOR_MAX_RETRIES", 3),
            wait=settings.getfloat("PROXY_OPERATOR_WAIT", 10),
        )
        crawler.signals.connect(middleware.spider_closed, signal=signals.spider_closed)
        return middleware

    # `spider` is optional: Scrapy 2.13+ no longer passes it, older versions do.
    async def process_request(self, request: Any, spider: Any = None) -> None:
        if "proxy" in request.meta and LEASE_META not in request.meta:
            return None  # the spider chose its own proxy
        unfinished = request.meta.get(LEASE_META)
        if unfinished is not None and unfinished["leaseId"] in self._live:
            await self._release(unfinished)  # sent again before its answer reached us: free that proxy
        lease = await self._lease(request)
        self._live[lease["leaseId"]] = lease
        request.meta[LEASE_META] = lease
        request.meta["proxy"] = lease["url"]
        return None

    async def process_response(self, request: Any, response: Any, spider: Any = None) -> Any:
        lease = request.meta.get(LEASE_META)
        if lease is None or lease["leaseId"] not in self._live:
            return response
        error = proxy_error(response.status, response.headers.get("Proxy-Status"))
        if error is not None:
            return await self._proxy_answered(request, response, lease, error=error)
        banned = response.status in self._ban_codes
        await self._finish(lease, outcome="banned" if banned else "ok", status_code=response.status)
        if banned:
            return self._retry(request, reason=f"{response.status} through {lease['key']}") or response
        return response

    async def process_exception(self, request: Any, exception: Exception, spider: Any = None) -> Any:
        from scrapy.exceptions import IgnoreRequest

        lease = request.meta.get(LEASE_META)
        if lease is None or lease["leaseId"] not in self._live:
            return None
        if isinstance(exception, IgnoreRequest):  # dropped by a later middleware: not the proxy's fault
            await self._release(lease)
            return None
        kind = answer_kind(connect=connect_status(exception))
        if kind is not None:  # a tunnel the proxy would not or could not open: no report
            await self._release(lease)
            log.warning("%s: CONNECT through %s: %s (%s)", request.url, lease["key"], kind, exception)
            request.meta["dont_retry"] = request.meta.get("dont_retry") or kind == "refused"
            return None
        await self._finish(lease, outcome="error", status_code=None)
        return self._retry(request, reason=f"{type(exception).__name__} through {lease['key']}")

    async def spider_closed(self, spider: Any = None) -> None:
        """Release the leases whose requests never came back, then close the API client."""
        if self._live:
            log.info("releasing %d unfinished lease(s) at close", len(self._live))
        for lease in list(self._live.values()):
            await self._release(lease)
        await self._http.aclose()

    async def _proxy_answered(self, request: Any, response: Any, lease: dict[str, Any], *, error: str) -> Any:
        """The proxy answered with RFC 9209 type `error`: a refusal or a site down passes the answer on,
        unreported (a refusal also unretried); any other error of the proxy's is its failure."""
        kind = answer_kind(error=error)
        if kind is None:
            await self._finish(lease, outcome="error", status_code=response.status)
            return self._retry(request, reason=f"{response.status} {error} from {lease['key']}") or response
        await self._release(lease)
        log.warning(
            "%s: proxy %s answered %s %s (%s)", request.url, lease["key"], response.status, error, kind
        )
        if kind == "refused":
            request.meta["dont_retry"] = True  # Scrapy's RetryMiddleware reads the response's request
        return response

    async def _lease(self, request: Any) -> dict[str, Any]:
        body = {
            **{k: v for k, v in self._filters.items() if v is not None},
            "target": urlsplit(request.url).hostname,
            "session": request.meta.get("proxy_session"),
            "wait": self._wait,
        }
        while True:
            response = await self._http.post(
                "/v1/leases", json={k: v for k, v in body.items() if v is not None}
            )
            if response.status_code not in (429, 503):  # 429: past this client's share or lease rate
                response.raise_for_status()
                return dict(response.json()["leases"][0])
            retry_after = float(response.headers.get("Retry-After", "1"))
            reason = response.json()["error"]
            log.info("no proxy for %s (%s); retrying in %g s", body["target"], reason, retry_after)
            if reason == "lease_share":  # our own leases hold our share: the first we release frees it
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._released.wait(), retry_after)
            else:
                await asyncio.sleep(retry_after)

    async def _finish(self, lease: dict[str, Any], *, outcome: str, status_code: int | None) -> None:
        report = {"lease": lease["leaseId"], "outcome": outcome}
        if status_code is not None:
            report["statusCode"] = status_code
        await self._http.post("/v1/reports", json=report)
        await self._release(lease)

    async def _release(self, lease: dict[str, Any]) -> None:
        self._live.pop(lease["leaseId"], None)
        await self._http.delete(f"/v1/leases/{lease['leaseId']}")  # 404: it had expired already
        self._released.set()  # wakes every request waiting for our share, then a fresh event for the next
        self._released = asyncio.Event()

    def _retry(self, request: Any, *, reason: str) -> Any:
        retries = request.meta.get(RETRIES_META, 0) + 1
        if retries > self._max_retries:
            log.warning("giving up on %s after %d proxies: %s", request.url, retries - 1, reason)
            return None
        log.info("retrying %s through another proxy: %s", request.url, reason)
        meta = {k: v for k, v in request.meta.items() if k not in (LEASE_META, "proxy")}
        meta[RETRIES_META] = retries
        return request.replace(meta=meta, dont_filter=True)


def proxy_error(status: int, proxy_status: bytes | str | None) -> str | None:
    """The error type of the proxy's own answer: the `error` parameter of the last `Proxy-Status` member
    (the intermediary nearest to us, RFC 9209 section 2) of an error response; None for the site's answers."""
    if status < 400 or not proxy_status:
        return None
    value = proxy_status.decode("latin-1") if isinstance(proxy_status, bytes) else proxy_status
    for param in _split(_split(value, ",")[-1], ";")[1:]:
        name, _, token = param.partition("=")
        if name.strip() == "error":
            return token.strip()
    return None


def connect_status(exception: Exception) -> int | None:
    """The status of a failed CONNECT: Scrapy's TunnelError names it as "{'status': 403, ...}"."""
    if type(exception).__name__ != "TunnelError":
        return None
    found = re.search(r"'status': (\d{3})", str(exception))
    return int(found.group(1)) if found else None


def answer_kind(*, error: str | None = None, connect: int | None = None) -> str | None:
    """ "refused" or "site_down" for the proxy's own answer, told by its RFC 9209 error type or, for a
    tunnel, by the failed CONNECT's status; None when it is neither (a proxy failure, or the site's)."""
    if error is not None:
        if error in REFUSALS:
            return "refused"
        return "site_down" if error.startswith(SITE_DOWN) else None
    if connect in CONNECT_REFUSED:
        return "refused"
    return "site_down" if connect in CONNECT_SITE_DOWN else None


def _split(text: str, separator: str) -> list[str]:
    """Split a structured-field list on `separator` outside quoted strings."""
    parts, current, quoted, escaped = [], "", False, False
    for char in text:
        if char == separator and not quoted:
            parts.append(current)
            current = ""
            continue
        current += char
        quoted = quoted != (char == '"' and not escaped)
        escaped = char == "\\" and not escaped
    return [*parts, current]
