"""The crawler's leases: one taken as each request is sent, renewed while its download lasts, reported and
released in the background once its answer is in.

`download` wraps the real download handler's call. Before it, the request's gate (gates.py) is checked and
a lease is asked for: one API call at most, and anything but a lease raises NoLeaseYet (park the request:
the middleware does) or ApiError (the API refuses for good: the request fails). After it, the answer is
judged (judge.py) and the verdict left in the request's meta for the middleware; the report and the
release run as a task of their own, retried with backoff while the API cannot be reached, so the page goes
on at once and a report that fails never loses it. The close gives those tasks `close_timeout` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from scrapy import Request
from scrapy.http import Response
from scrapy.utils.httpobj import urlparse_cached
from w3lib.http import basic_auth_header

from proxy_operator_client.aio import AsyncDiscoveryClient
from proxy_operator_client.errors import ApiError, ApiUnavailable, NoProxyAvailable
from proxy_operator_client.judge import Outcome, Verdict, judge_answer, judge_failure
from proxy_operator_client.scrapy.gates import API_BACK, OWN_RELEASE, Gates, NoLeaseYet
from proxy_operator_client.scrapy.meta import LEASE_META, SESSION_META, VERDICT_META
from proxy_operator_client.scrapy.parking import Parking
from proxy_operator_client.scrapy.settings import Settings
from proxy_operator_client.scrapy.stats import Stats
from proxy_operator_client.wire import Lease

log = logging.getLogger(__name__)
SEND_TRIES = 10  # a report or a release is given up after this many tries without an API (~1 minute)

Send = Callable[[Request], Awaitable[Response]]


class Leases:
    def __init__(
        self,
        *,
        client: AsyncDiscoveryClient,
        settings: Settings,
        gates: Gates,
        parking: Parking,
        stats: Stats,
        rng: random.Random,
    ) -> None:
        self._client, self._settings, self._gates = client, settings, gates
        self._parking, self._stats, self._rng = parking, stats, rng
        self._unreachable = 0  # lease calls in a row that found no API
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = asyncio.Event()

    async def download(self, request: Request, send: Send) -> Response:
        site = (urlparse_cached(request).hostname or "*").rstrip(".")
        lease = await self._take(request, site)
        _apply(request, lease)
        verdict: Verdict | None = None
        try:
            async with self._renewing(lease):
                response = await send(request)
            verdict = self._judge(response)
            return response
        except Exception as exc:
            verdict = judge_failure(tunnel_status(exc))
            raise
        finally:
            request.meta[VERDICT_META] = verdict.outcome.value if verdict else None
            self._finish(site, lease, verdict)

    async def close(self) -> None:
        """Give the reports and releases still to send `close_timeout` seconds, then let them go."""
        self._closing.set()
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=self._settings.close_timeout)
            for task in pending:
                task.cancel()
            if pending:
                self._stats.inc("unsent_at_close", len(pending))
                log.warning(
                    "%d lease(s) not reported or released at close: they end by their ttl", len(pending)
                )
        await self._client.aclose(release_held=False)

    async def _take(self, request: Request, site: str) -> Lease:
        self._gates.check(site, concurrency=self._settings.concurrency_per_site)
        self._gates.enter(site)  # counted from the ask: requests sent together must not all pass the check
        try:
            lease = await self._ask(request, site)
        except BaseException as exc:
            self._gates.leave(site)
            if not isinstance(exc, NoLeaseYet):  # its place is free, the site's gate still open
                self._parking.wake(site)
            raise
        self._stats.inc("leases")
        if self._unreachable:
            self._unreachable = 0
            self._gates.reached()
            self._parking.wake(API_BACK, every=True)
        self._parking.wake(site)  # this site has proxies again: one more of its parked requests may try
        return lease

    async def _ask(self, request: Request, site: str) -> Lease:
        """One lease call; anything but a lease raises NoLeaseYet (with its gate closed) or ApiError."""
        session = request.meta.get(SESSION_META)
        try:
            [lease] = await self._client.lease(
                target=site,
                ttl=self._settings.ttl,
                wait=self._settings.wait,
                session=session,
                **self._settings.filters,
            )
        except NoProxyAvailable as exc:
            self._stats.inc(f"lease_refused/{exc.reason}")
            raise self._gates.refused(site, exc) from exc
        except ApiUnavailable as exc:
            self._stats.inc("api_errors")
            self._unreachable += 1
            log.log(
                logging.WARNING if self._unreachable == 1 else logging.DEBUG, "no API (%s): leases wait", exc
            )
            raise self._gates.unreachable(
                self._settings.backoff.delay(self._unreachable - 1, self._rng)
            ) from exc
        except ApiError:
            self._stats.inc("api_refusals")
            raise
        return lease

    def _judge(self, response: Response) -> Verdict:
        return judge_answer(
            response.status,
            response.headers.get(b"Proxy-Status"),
            ban_codes=self._settings.ban_codes,
            looks_banned=self._looks_banned(response),
        )

    def _looks_banned(self, response: Response) -> bool:
        check = self._settings.ban_check
        if check is None or response.status >= 400:
            return False
        try:
            return bool(check(response))
        except Exception:  # the project's check failed: not the proxy's fault, and no reason to lose the page
            log.exception("PROXY_OPERATOR_BAN_CHECK failed on %s", response)
            return False

    @contextlib.asynccontextmanager
    async def _renewing(self, lease: Lease) -> AsyncIterator[None]:
        """Renew the lease every third of its ttl while the download lasts."""
        if not self._settings.renew or not lease.ttl:
            yield
            return
        renewer = asyncio.create_task(self._renew_every(lease, lease.ttl / 3), name="proxy-operator-renewer")
        try:
            yield
        finally:
            renewer.cancel()

    async def _renew_every(self, lease: Lease, period: float) -> None:
        while True:
            await asyncio.sleep(period)
            try:
                lease = await self._client.renew(lease, ttl=self._settings.ttl)
            except ApiUnavailable:
                self._stats.inc("api_errors")
                continue
            except ApiError as exc:  # it ended (404): nothing left to renew
                log.warning("renewal of the lease on %s refused: %s", lease.key, exc)
                return
            self._stats.inc("renewals")

    def _finish(self, site: str, lease: Lease, verdict: Verdict | None) -> None:
        task = asyncio.create_task(
            self._report_and_release(site, lease, verdict), name="proxy-operator-finish"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _report_and_release(self, site: str, lease: Lease, verdict: Verdict | None) -> None:
        """The report first: a ban must count before the release lets the proxy be handed out again."""
        outcome = verdict.outcome.report if verdict else None
        if outcome is not None and verdict is not None:
            status = verdict.status
            if await self._send("report", lambda: self._client.report(lease, outcome, status_code=status)):
                self._stats.inc(f"reports/{outcome}")
        if await self._send("release", lambda: self._client.release(lease)):
            self._stats.inc("releases")
        self._gates.leave(site)  # the lease is held (and counts in our share) until its release lands
        self._gates.released(site)
        self._parking.wake(site)
        self._parking.wake(OWN_RELEASE)

    async def _send(self, what: str, call: Callable[[], Awaitable[Any]]) -> bool:
        for tries in range(SEND_TRIES):
            try:
                await call()
                return True
            except ApiError as exc:  # refused for good (the lease is gone, a report rate): nothing to retry
                log.info("%s not taken: %s", what, exc)
                self._stats.inc(f"{what}_refused")
                return False
            except ApiUnavailable as exc:
                self._stats.inc("api_errors")
                if self._closing.is_set():
                    break
                log.info("%s failed (%s); trying again", what, exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self._closing.wait(), self._settings.backoff.delay(tries, self._rng)
                    )
        self._stats.inc(f"{what}_failures")
        return False


def _apply(request: Request, lease: Lease) -> None:
    """Send the request through the lease's proxy, with its credentials (what HttpProxyMiddleware would do
    with a `meta["proxy"]` URL, done here because the lease is taken after that middleware ran)."""
    request.meta["proxy"] = lease.address
    request.meta.pop("_auth_proxy", None)
    request.meta[LEASE_META] = {
        "leaseId": lease.lease_id,
        "key": lease.key,
        "target": lease.target,
        "proxy": lease.address,
    }
    if lease.username is not None:
        request.headers[b"Proxy-Authorization"] = basic_auth_header(lease.username, lease.password or "")
    else:
        request.headers.pop(b"Proxy-Authorization", None)


def tunnel_status(exc: Exception) -> int | None:
    """The status of a failed CONNECT: Scrapy's TunnelError names it as "{'status': 403, ...}"."""
    if type(exc).__name__ != "TunnelError":
        return None
    found = re.search(r"'status': (\d{3})", str(exc))
    return int(found.group(1)) if found else None


def outcome_of(request: Request) -> Outcome | None:
    value = request.meta.get(VERDICT_META)
    return Outcome(value) if value else None
