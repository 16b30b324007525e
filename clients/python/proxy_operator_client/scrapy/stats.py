"""The integration's counters in Scrapy's stats collector, all under `proxy_operator/`."""

from __future__ import annotations

from scrapy.statscollectors import StatsCollector

PREFIX = "proxy_operator/"


class Stats:
    def __init__(self, collector: StatsCollector | None) -> None:
        self._collector = collector

    def inc(self, key: str, count: int = 1) -> None:
        if self._collector is not None:
            self._collector.inc_value(PREFIX + key, count)
