"""Requests that cannot have a proxy yet wait here, outside Scrapy's downloader and scheduler.

A request waiting inside the downloader holds one of Scrapy's global concurrency places (CONCURRENT_REQUESTS)
for as long as it waits: a banned site would stall every other. So the middleware hands such a request back
to the engine with a parking ticket in its meta (`park`); the engine schedules it again, and this module's
`request_scheduled` handler takes it instead of the scheduler (raising IgnoreRequest there is Scrapy's way
to keep a request out of the scheduler, silently) and holds it until its time, or until the event it waits
for (`wake`: one of our releases on its site, the API coming back), then gives it to the engine again. While
requests are parked the spider is kept open (`spider_idle` raises DontCloseSpider); `close` drops them at
once, so a spider closes without waiting for them.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass, field
from itertools import count

from scrapy import Request, signals
from scrapy.crawler import Crawler
from scrapy.exceptions import DontCloseSpider, IgnoreRequest

from proxy_operator_client.scrapy.gates import NoLeaseYet
from proxy_operator_client.scrapy.meta import PARK_META
from proxy_operator_client.scrapy.stats import Stats

log = logging.getLogger(__name__)
JITTER = 0.1  # a parked request comes back up to this share of its wait later (at most a second)


@dataclass(frozen=True)
class Ticket:
    seconds: float
    wake: str | None
    reason: str


@dataclass(eq=False)
class _Parked:
    request: Request
    wake: str | None
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)


class Parking:
    def __init__(self, crawler: Crawler, *, stats: Stats, rng: random.Random) -> None:
        self._crawler, self._stats, self._rng = crawler, stats, rng
        self._parked: dict[str | None, dict[int, _Parked]] = {}  # by what wakes them, oldest first
        self._ids = count()
        self._closed = False
        crawler.signals.connect(self._scheduled, signal=signals.request_scheduled)
        crawler.signals.connect(self._idle, signal=signals.spider_idle)

    def __len__(self) -> int:
        return sum(len(group) for group in self._parked.values())

    def park(self, request: Request, why: NoLeaseYet) -> Request:
        """The request to hand back to the engine: a copy carrying its ticket (see the module)."""
        ticket = Ticket(why.seconds, why.wake, why.reason)
        self._stats.inc(f"parked/{why.reason}")
        log.debug("parking %s for %.2f s (%s)", request, why.seconds, why.reason)
        return request.replace(meta={**request.meta, PARK_META: ticket}, dont_filter=True)

    def wake(self, key: str, *, every: bool = False) -> None:
        """Give back the oldest request (or all, `every`) waiting for `key` now."""
        group = self._parked.get(key, {})
        for ident in list(group)[: None if every else 1]:
            self._unpark(key, ident)

    def close(self) -> int:
        """Drop what is parked (the spider is closing); how many were."""
        self._closed = True
        dropped = len(self)
        for group in self._parked.values():
            for parked in group.values():
                if parked.timer is not None:
                    parked.timer.cancel()
        self._parked.clear()
        if dropped:
            self._stats.inc("parked_at_close", dropped)
            log.info("dropped %d request(s) still waiting for a proxy at close", dropped)
        return dropped

    def _scheduled(self, request: Request) -> None:
        ticket = request.meta.pop(PARK_META, None)
        if not isinstance(ticket, Ticket):
            return
        if self._closed:
            self._stats.inc("parked_at_close")
            raise IgnoreRequest("the spider is closing")
        ident = next(self._ids)
        parked = _Parked(request, ticket.wake)
        self._parked.setdefault(ticket.wake, {})[ident] = parked
        delay = ticket.seconds + self._rng.uniform(0, min(1.0, JITTER * ticket.seconds))
        parked.timer = asyncio.get_running_loop().call_later(delay, self._unpark, ticket.wake, ident)
        raise IgnoreRequest("parked until a proxy can be leased")  # held here, not by the scheduler

    def _unpark(self, key: str | None, ident: int) -> None:
        group = self._parked.get(key, {})
        parked = group.pop(ident, None)
        if not group:
            self._parked.pop(key, None)
        if parked is None:
            return
        if parked.timer is not None:
            parked.timer.cancel()
        try:
            assert self._crawler.engine is not None  # parked while the crawl runs
            self._crawler.engine.crawl(parked.request)
        except Exception:  # the engine is closing between its close and ours: the request goes with it
            self._stats.inc("parked_at_close")
            log.debug("could not give %s back to a closing engine", parked.request, exc_info=True)

    def _idle(self) -> None:
        if len(self):
            raise DontCloseSpider("requests wait for a proxy")
