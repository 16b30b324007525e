"""The asyncio client: `AsyncDiscoveryClient`, the same behaviour as sync.DiscoveryClient with `await`
(its docstring tells the loop). The Scrapy integration takes its leases through this client's calls."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from proxy_operator_client.backoff import Backoff
from proxy_operator_client.errors import ApiUnavailable, NoGoodAnswer, NoProxyAvailable, ProxyOperatorError
from proxy_operator_client.fetching import (
    Answer,
    BanCheck,
    Judge,
    fetch_ttl,
    pause,
    settle,
    waits_for_own_release,
)
from proxy_operator_client.judge import BAN_CODES, Verdict
from proxy_operator_client.wire import (
    API_PREFIX,
    Lease,
    checked,
    lease_body,
    leases_from,
    report_body,
    unavailable,
)

log = logging.getLogger(__name__)


class AsyncDiscoveryClient:
    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float | httpx.Timeout = 40.0,
        backoff: Backoff = Backoff(),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # The timeout must exceed the longest `wait` (30 s): the API holds waiting requests open.
        self._http = httpx.AsyncClient(
            base_url=base_url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout
        )
        self._backoff, self._clock = backoff, clock
        self._live: dict[str, Lease] = {}  # taken and not yet released
        self._released = asyncio.Event()  # set at each release (then a fresh one): past its share, waited on

    async def lease(
        self,
        *,
        target: str | None = None,
        count: int = 1,
        wait: float = 0,
        ttl: float | None = None,
        **filters: Any,
    ) -> list[Lease]:
        """Lease up to `count` proxies. Filters: pool, provider, labels, protocol, session, strict."""
        body = lease_body(target=target, count=count, wait=wait, ttl=ttl, filters=filters)
        leases = leases_from(checked(await self._call("POST", "/leases", json=body), leasing=True), ttl)
        self._live.update((lease.lease_id, lease) for lease in leases)
        return leases

    async def renew(self, lease: Lease, *, ttl: float | None = None) -> Lease:
        """Make the lease end `ttl` seconds from now (the server lowers it to its maximum)."""
        body = {"ttl": ttl} if ttl else None
        renewed = lease.renewed(
            checked(await self._call("POST", f"/leases/{lease.lease_id}/renew", json=body)), ttl
        )
        self._live[lease.lease_id] = renewed
        return renewed

    async def release(self, lease: Lease) -> None:
        """End the lease (already ended, 404: nothing to do)."""
        self._live.pop(lease.lease_id, None)
        response = await self._call("DELETE", f"/leases/{lease.lease_id}")
        self._released.set()
        self._released = asyncio.Event()
        if response.status_code != 404:
            checked(response)

    async def report(self, lease: Lease, outcome: str, *, status_code: int | None = None) -> dict[str, Any]:
        return checked(await self._call("POST", "/reports", json=report_body(lease, outcome, status_code)))

    async def fetch(
        self,
        url: str,
        *,
        target: str,
        attempts: int = 3,
        patience: float = 60,
        wait: float = 10,
        timeout: float = 30,  # noqa: ASYNC109 - the download's (httpx's), as in the sync client
        ttl: float | None = None,
        ban_codes: frozenset[int] = BAN_CODES,
        is_ban: BanCheck | None = None,
        **filters: Any,
    ) -> httpx.Response:
        """GET `url` through a leased proxy; on a ban or a failing proxy, report it and try another (see
        sync.DiscoveryClient.fetch: the same rules)."""
        judge, deadline = Judge(ban_codes, is_ban), self._clock() + patience
        last: Exception | None = None
        tried = waited = 0
        while tried < attempts:
            try:
                leases = await self.lease(target=target, wait=wait, ttl=fetch_ttl(ttl, timeout), **filters)
            except (NoProxyAvailable, ApiUnavailable) as exc:
                last = exc
                if not await self._pause(exc, tries=waited, left=deadline - self._clock()):
                    break
                waited += 1
                continue
            tried, waited, lease = tried + 1, 0, leases[0]
            answer = await self._get(url, lease, timeout)
            verdict = judge(answer)
            await self._finish(lease, verdict)
            result = settle(url, lease, answer, verdict)
            if isinstance(result, httpx.Response):
                return result
            last = result
        raise NoGoodAnswer(f"no good answer from {url} after {tried} proxies") from last

    async def aclose(self, *, release_held: bool = True) -> None:
        """Release the leases still held (unless told not to), then close the connection to the API."""
        try:
            for lease in list(self._live.values()) if release_held else []:
                await self._quietly(self.release, lease)
        finally:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncDiscoveryClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _pause(self, exc: NoProxyAvailable | ApiUnavailable, *, tries: int, left: float) -> bool:
        """Wait before leasing again; False when patience has run out."""
        if left <= 0:
            return False
        seconds = pause(exc, tries=tries, backoff=self._backoff, left=left)
        log.info("no lease (%s); trying again in %.2f s", exc, seconds)
        if waits_for_own_release(exc):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._released.wait(), seconds)
        else:
            await asyncio.sleep(seconds)
        return True

    async def _get(self, url: str, lease: Lease, timeout: float) -> Answer:  # noqa: ASYNC109
        try:
            async with httpx.AsyncClient(proxy=lease.url, timeout=timeout) as http:
                return await http.get(url)
        except httpx.TransportError as exc:  # connect errors, resets, timeouts, a failed CONNECT
            return exc

    async def _finish(self, lease: Lease, verdict: Verdict) -> None:
        """Report what the answer said about the proxy, then release: either may fail, the page stays."""
        if verdict.outcome.report is not None:
            await self._quietly(self.report, lease, verdict.outcome.report, status_code=verdict.status)
        await self._quietly(self.release, lease)

    async def _quietly(
        self, call: Callable[..., Awaitable[object]], lease: Lease, *args: Any, **kwargs: Any
    ) -> None:
        try:
            await call(lease, *args, **kwargs)
        except ProxyOperatorError as exc:
            log.warning("%s of lease on %s not taken: %s", call.__name__, lease.key, exc)

    async def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return await self._http.request(method, API_PREFIX + path, **kwargs)
        except httpx.TransportError as exc:
            raise unavailable(exc) from exc
