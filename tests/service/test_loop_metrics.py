"""The lease path's plain-number metrics expose exactly what prometheus_client's Counter and Histogram do
after the same counting: names, help, types, labels, buckets, values and `_created` samples."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from service.api.loop_metrics import LoopCounter, LoopHistogram

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1, 5, 30)
CREATED = re.compile(rb"^(\S+_created(?:\{[^}]*\})?) \S+$", re.MULTILINE)
OUTCOMES = ("ok", "rebound", "no_proxy_available", "lease_share")


def _pair() -> tuple[CollectorRegistry, list[object], CollectorRegistry, list[object]]:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    their_metrics: list[object] = [
        Counter("t_requests_total", "Requests by outcome.", ["outcome"], registry=theirs),
        Counter("t_leased_total", "Proxies handed out.", registry=theirs),
        Histogram("t_seconds", "Time to answer.", buckets=BUCKETS, registry=theirs),
    ]
    our_metrics: list[object] = [
        LoopCounter("t_requests_total", "Requests by outcome.", ["outcome"], registry=ours),
        LoopCounter("t_leased_total", "Proxies handed out.", registry=ours),
        LoopHistogram("t_seconds", "Time to answer.", buckets=BUCKETS, registry=ours),
    ]
    return theirs, their_metrics, ours, our_metrics


def _exposed(registry: CollectorRegistry) -> bytes:
    """The text format with each `_created` sample's time left out (each side takes its own)."""
    return CREATED.sub(rb"\1 T", generate_latest(registry))


@given(
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("outcome"), st.sampled_from(OUTCOMES), st.integers(0, 5)),
            st.tuples(st.just("leased"), st.just(""), st.integers(0, 5)),
            st.tuples(
                st.just("seconds"),
                st.just(""),
                st.one_of(st.sampled_from(BUCKETS), st.floats(0, 100, allow_nan=False)),
            ),
        ),
        max_size=40,
    )
)
def test_the_exposition_is_prometheus_client_s(steps: list[tuple[str, str, float]]) -> None:
    theirs, their_metrics, ours, our_metrics = _pair()
    for metrics in (their_metrics, our_metrics):
        requests, leased, seconds = metrics
        for kind, label, value in steps:
            if kind == "outcome":
                requests.labels(label).inc(value)  # type: ignore[attr-defined]
            elif kind == "leased":
                leased.inc(value)  # type: ignore[attr-defined]
            else:
                seconds.observe(value)  # type: ignore[attr-defined]
    assert _exposed(ours) == _exposed(theirs)
    assert ours.get_sample_value("t_leased_total") == theirs.get_sample_value("t_leased_total")


def test_labels_by_name_and_the_refusals_match_too() -> None:
    theirs, their_metrics, ours, our_metrics = _pair()
    for registry, (requests, leased, _) in ((theirs, their_metrics), (ours, our_metrics)):
        requests.labels(outcome="ok").inc(2)  # type: ignore[attr-defined]
        assert registry.get_sample_value("t_requests_total", {"outcome": "ok"}) == 2
        with pytest.raises(ValueError, match="only be incremented by non-negative amounts"):
            leased.inc(-1)  # type: ignore[attr-defined]
        with pytest.raises(ValueError, match="counter metric is missing label values"):
            requests.inc()  # type: ignore[attr-defined]
        with pytest.raises(ValueError, match="Incorrect label count"):
            requests.labels("ok", "extra")  # type: ignore[attr-defined]
        with pytest.raises(ValueError, match="Incorrect label names"):
            requests.labels(other="ok")  # type: ignore[attr-defined]
        with pytest.raises(ValueError, match="Incorrect label names"):
            requests.labels(outcome="ok", other="ok")  # type: ignore[attr-defined]
        with pytest.raises(ValueError, match="both"):
            requests.labels("ok", outcome="ok")  # type: ignore[attr-defined]
    assert our_metrics[0].labels(outcome="ok") is our_metrics[0].labels("ok")  # type: ignore[attr-defined]
