"""The blocking client: `DiscoveryClient` (the same behaviour as aio.AsyncDiscoveryClient).

`fetch` runs the loop every crawler runs: lease, fetch through the proxy, report, release; a ban or a
failing proxy is reported and the request tried through another proxy (up to `attempts` proxies); no
lease for now (503, 429) or no API (unreachable, 5xx) is waited out, for at most `patience` seconds in
all: Retry-After, one of this client's own releases past its share (429 `lease_share`), or a backoff.
A report or a release that fails is logged and never fails a page that came.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
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


class DiscoveryClient:
    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 40.0,
        backoff: Backoff = Backoff(),
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        # The timeout must exceed the longest `wait` (30 s): the API holds waiting requests open.
        self._http = httpx.Client(
            base_url=base_url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout
        )
        self._backoff, self._clock, self._sleep = backoff, clock, sleep
        self._live: dict[str, Lease] = {}  # taken and not yet released
        self._released = threading.Condition()  # notified at each release: a client past its share waits

    def lease(
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
        leases = leases_from(checked(self._call("POST", "/leases", json=body), leasing=True), ttl)
        self._live.update((lease.lease_id, lease) for lease in leases)
        return leases

    def renew(self, lease: Lease, *, ttl: float | None = None) -> Lease:
        """Make the lease end `ttl` seconds from now (the server lowers it to its maximum)."""
        answer = checked(
            self._call("POST", f"/leases/{lease.lease_id}/renew", json={"ttl": ttl} if ttl else None)
        )
        renewed = lease.renewed(answer, ttl)
        self._live[lease.lease_id] = renewed
        return renewed

    def release(self, lease: Lease) -> None:
        """End the lease (already ended, 404: nothing to do)."""
        self._live.pop(lease.lease_id, None)
        response = self._call("DELETE", f"/leases/{lease.lease_id}")
        with self._released:
            self._released.notify_all()
        if response.status_code != 404:
            checked(response)

    def report(self, lease: Lease, outcome: str, *, status_code: int | None = None) -> dict[str, Any]:
        return checked(self._call("POST", "/reports", json=report_body(lease, outcome, status_code)))

    def fetch(
        self,
        url: str,
        *,
        target: str,
        attempts: int = 3,
        patience: float = 60,
        wait: float = 10,
        timeout: float = 30,
        ttl: float | None = None,
        ban_codes: frozenset[int] = BAN_CODES,
        is_ban: BanCheck | None = None,
        **filters: Any,
    ) -> httpx.Response:
        """GET `url` through a leased proxy; on a ban or a failing proxy, report it and try another.

        A site that does not answer within `timeout` is reported as `error`, like a proxy that fails:
        from here the two cannot be told apart (docs/api.md, "What to report"). The proxy's own refusal
        raises `Refused`, a site it could not reach `SiteDown`: neither is reported nor retried.
        """
        judge, deadline = Judge(ban_codes, is_ban), self._clock() + patience
        last: Exception | None = None
        tried = waited = 0
        while tried < attempts:
            try:
                lease = self.lease(target=target, wait=wait, ttl=fetch_ttl(ttl, timeout), **filters)[0]
            except (NoProxyAvailable, ApiUnavailable) as exc:
                last = exc
                if not self._pause(exc, tries=waited, left=deadline - self._clock()):
                    break
                waited += 1
                continue
            tried, waited = tried + 1, 0
            answer = self._get(url, lease, timeout)
            verdict = judge(answer)
            self._finish(lease, verdict)
            result = settle(url, lease, answer, verdict)
            if isinstance(result, httpx.Response):
                return result
            last = result
        raise NoGoodAnswer(f"no good answer from {url} after {tried} proxies") from last

    def close(self) -> None:
        """Release the leases still held, then close the connection to the API."""
        try:
            for lease in list(self._live.values()):
                self._quietly(self.release, lease)
        finally:
            self._http.close()

    def __enter__(self) -> DiscoveryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _pause(self, exc: NoProxyAvailable | ApiUnavailable, *, tries: int, left: float) -> bool:
        """Wait before leasing again; False when patience has run out."""
        if left <= 0:
            return False
        seconds = pause(exc, tries=tries, backoff=self._backoff, left=left)
        log.info("no lease (%s); trying again in %.2f s", exc, seconds)
        if waits_for_own_release(exc):
            with self._released:
                self._released.wait(seconds)
        else:
            self._sleep(seconds)
        return True

    def _get(self, url: str, lease: Lease, timeout: float) -> Answer:
        try:
            return httpx.get(url, proxy=lease.url, timeout=timeout)
        except httpx.TransportError as exc:  # connect errors, resets, timeouts, a failed CONNECT
            return exc

    def _finish(self, lease: Lease, verdict: Verdict) -> None:
        """Report what the answer said about the proxy, then release: either may fail, the page stays."""
        if verdict.outcome.report is not None:
            self._quietly(self.report, lease, verdict.outcome.report, status_code=verdict.status)
        self._quietly(self.release, lease)

    def _quietly(self, call: Callable[..., object], lease: Lease, *args: Any, **kwargs: Any) -> None:
        try:
            call(lease, *args, **kwargs)
        except ProxyOperatorError as exc:
            log.warning("%s of lease on %s not taken: %s", call.__name__, lease.key, exc)

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, API_PREFIX + path, **kwargs)
        except httpx.TransportError as exc:
            raise unavailable(exc) from exc
