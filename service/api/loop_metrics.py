"""A counter and a histogram for the lease path, counted as plain numbers by the event loop.

prometheus_client's `Counter.inc` checks the metric, then takes a lock around the addition (a
`threading.Lock` per value), and `Histogram.observe` does so twice; per lease that was four locked additions
and about 3 us of its CPU in process, 5 % of a lease (issue 20). These count with plain additions and turn
into the same families when scraped (`collect`), so /metrics, the fleet page and
`registry.get_sample_value` read them as before: the same names, help, labels, buckets and `_created`
samples (tests/service/test_loop_metrics.py holds the exposition to prometheus_client's, byte for byte).

Only the event loop's thread may count on them (every lease is served there); a scrape reads whole numbers,
so it never sees a torn value, at worst one a lease older.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterable, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

try:  # prometheus_client's switch (PROMETHEUS_DISABLE_CREATED_SERIES), read the same way
    from prometheus_client.metrics import _get_use_created as _use_created
except ImportError:  # pragma: no cover - an older or newer prometheus_client: the series as it exports them

    def _use_created() -> bool:
        return True


class Count:
    """One counter's value: `inc` as prometheus_client's (never down)."""

    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self.value += amount


class LoopCounter:
    """A Prometheus counter, with or without labels (then `labels(...)` gives each child, as
    prometheus_client's does)."""

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str] = (), *, registry: CollectorRegistry
    ) -> None:
        self.name = name.removesuffix("_total")
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], Count] = {}
        self._own = None if self.labelnames else Count()
        registry.register(self)

    def labels(self, *values: str, **named: str) -> Count:
        if values and named:
            raise ValueError("Can't pass both *args and **kwargs")  # prometheus_client's words, as below
        if named:
            if sorted(named) != sorted(self.labelnames):
                raise ValueError("Incorrect label names")
            values = tuple(named[name] for name in self.labelnames)
        if len(values) != len(self.labelnames):
            raise ValueError("Incorrect label count")  # prometheus_client's words
        key = tuple(str(v) for v in values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = Count()
        return child

    def inc(self, amount: float = 1) -> None:
        if self._own is None:
            raise ValueError("counter metric is missing label values")
        self._own.inc(amount)

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        created = _use_created()
        counts = [((), self._own)] if self._own is not None else list(self._children.items())
        for values, count in counts:
            family.add_metric(list(values), count.value, created=count.created if created else None)
        yield family


class LoopHistogram:
    """A Prometheus histogram without labels: `observe` counts a value in the first bucket that holds it."""

    def __init__(
        self, name: str, documentation: str, *, buckets: Sequence[float], registry: CollectorRegistry
    ) -> None:
        self.name = name
        self.documentation = documentation
        self._upper = sorted(float(b) for b in buckets)
        self._counts = [0] * (len(self._upper) + 1)  # the last: above every bound (+Inf)
        self._sum = 0.0
        self._created = time.time()
        registry.register(self)

    def observe(self, value: float) -> None:
        self._counts[bisect_left(self._upper, value)] += 1
        self._sum += value

    def collect(self) -> Iterable[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation)
        running, buckets = 0, []
        for upper, count in zip([*self._upper, float("inf")], self._counts, strict=True):
            running += count
            buckets.append((floatToGoString(upper), float(running)))
        family.add_metric([], buckets, self._sum)
        if _use_created():
            family.add_sample(f"{self.name}_created", {}, self._created)
        yield family
