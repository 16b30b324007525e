"""The health engine against real pproxy processes: thresholds, egress IPs, shared egress, transitions."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry

from service.health.engine import HealthEngine, HealthTransition
from service.health.metrics import HealthMetrics
from service.health.probe import ProbeResult, ProxyProber
from service.health.thresholds import Thresholds
from service.inventory import HealthState, Inventory, ProxyEndpoint
from tests.service.conftest import Pproxy, endpoint


def _engine(
    inventory: Inventory, *, prober: object, transitions: list[HealthTransition], **kwargs: object
) -> tuple[HealthEngine, CollectorRegistry]:
    registry = CollectorRegistry()
    engine = HealthEngine(
        inventory=inventory,
        prober=prober,  # type: ignore[arg-type]
        metrics=HealthMetrics(
            registry, health=lambda: {e.key: inventory.health(e.key) for e in inventory.endpoints()}
        ),
        thresholds=Thresholds(unhealthy=3, healthy=2),
        **{"on_transition": transitions.append, **kwargs},  # type: ignore[arg-type]
    )
    return engine, registry


def _proxy_endpoint(name: str, proxy: Pproxy) -> ProxyEndpoint:
    return endpoint(name, port=proxy.port, protocol=proxy.protocol, username="user", password="pass")


def test_a_stopped_proxy_turns_unhealthy_after_n_failures_and_back_after_m(
    echo_url: str, pproxies: Callable[..., Pproxy]
) -> None:
    proxy = pproxies()
    inventory = Inventory()
    inventory.replace_all([_proxy_endpoint("a", proxy)])
    transitions: list[HealthTransition] = []
    engine, registry = _engine(
        inventory, prober=ProxyProber(probe_url=echo_url, timeout=2), transitions=transitions
    )

    def round_() -> HealthState:
        asyncio.run(engine.probe_all())
        return inventory.health("default/a").state

    assert round_() is HealthState.healthy  # a new proxy is decided by its first probe
    assert inventory.health("default/a").egress_ip == "127.0.0.1"
    assert inventory.healthy_keys() == {"default/a"}
    proxy.stop()
    assert [round_(), round_()] == [HealthState.healthy, HealthState.healthy]  # N-1 failures: still healthy
    assert round_() is HealthState.unhealthy
    assert inventory.healthy_keys() == frozenset()
    pproxies(port=proxy.port)  # the same address comes back
    assert round_() is HealthState.unhealthy  # M-1 successes: not yet
    assert round_() is HealthState.healthy
    assert [(t.previous, t.current) for t in transitions] == [
        (HealthState.unknown, HealthState.healthy),
        (HealthState.healthy, HealthState.unhealthy),
        (HealthState.unhealthy, HealthState.healthy),
    ]
    assert "connect" in transitions[1].reason
    assert (
        registry.get_sample_value(
            "proxy_operator_probe_results_total", {"provider": "local", "outcome": "connect_error"}
        )
        == 3
    )
    assert (
        registry.get_sample_value("proxy_operator_probe_duration_seconds_count", {"provider": "local"}) == 6
    )


def test_proxies_sharing_an_egress_ip_are_reported(echo_url: str, pproxies: Callable[..., Pproxy]) -> None:
    inventory = Inventory()
    inventory.replace_all(
        [
            _proxy_endpoint("a", pproxies()),
            _proxy_endpoint("b", pproxies(protocol="socks5")),
            endpoint("unaddressed", host=None, port=None),
        ]
    )
    engine, registry = _engine(inventory, prober=ProxyProber(probe_url=echo_url), transitions=[])
    asyncio.run(engine.probe_all())
    assert engine.shared_egress() == {"127.0.0.1": ["default/a", "default/b"]}
    assert registry.get_sample_value("proxy_operator_shared_egress_proxies") == 2
    assert registry.get_sample_value("proxy_operator_proxies", {"state": "healthy"}) == 2
    assert registry.get_sample_value("proxy_operator_proxies", {"state": "unknown"}) == 1  # never probed


class CountingProber:
    """Answers ok after a short sleep and records how many probes were in flight at once."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.most = 0
        self.calls = 0
        self.keys: list[str] = []  # each probe's proxy, in order

    async def probe(self, endpoint: ProxyEndpoint) -> ProbeResult:
        self.in_flight += 1
        self.calls += 1
        self.keys.append(endpoint.key)
        self.most = max(self.most, self.in_flight)
        await asyncio.sleep(0.01)
        self.in_flight -= 1
        return ProbeResult(True, "ok", 0.01, egress_ip=f"10.0.0.{self.calls % 250}")

    async def until(self, calls: int) -> None:
        """Until `calls` probes were made, 2 s at most (the test's assertions then say what is missing)."""
        for _ in range(200):
            if self.calls >= calls:
                return
            await asyncio.sleep(0.01)


def test_probes_in_flight_are_bounded() -> None:
    inventory = Inventory()
    inventory.replace_all([endpoint(f"p{i}") for i in range(20)])
    prober = CountingProber()
    engine, _ = _engine(inventory, prober=prober, transitions=[], concurrency=3)
    asyncio.run(engine.probe_all())
    assert prober.calls == 20
    assert prober.most == 3


def test_the_prober_task_probes_every_interval_and_stops_cleanly() -> None:
    inventory = Inventory()
    inventory.replace_all([endpoint(f"p{i}") for i in range(5)])
    prober = CountingProber()
    engine, _ = _engine(inventory, prober=prober, transitions=[], interval=0.05, concurrency=2)

    async def scenario() -> None:
        task = asyncio.create_task(engine.run(), name="prober")
        await prober.until(15)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert prober.most <= 2
        assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []

    asyncio.run(scenario())
    assert prober.calls >= 15  # every proxy probed about three times
    assert all(inventory.health(f"default/p{i}").healthy for i in range(5))


def test_a_proxy_that_left_the_inventory_is_reported_gone_once_and_no_longer_probed() -> None:
    """The fleet page's probe history forgets what the engine reports gone (service/serve.py wires
    `on_gone` to `ProbeHistory.forget`); a proxy that only lost its address is not gone."""
    inventory = Inventory()
    inventory.replace_all([endpoint("a"), endpoint("b"), endpoint("c")])
    prober, gone = CountingProber(), list[str]()
    engine, _ = _engine(inventory, prober=prober, transitions=[], interval=0.05, on_gone=gone.append)

    async def scenario() -> None:
        task = asyncio.create_task(engine.run(), name="prober")
        await prober.until(6)
        inventory.remove("default/a")
        inventory.upsert(endpoint("b", host=None))  # no address: unscheduled, still in the inventory
        await asyncio.sleep(0.06)  # past one interval: a probe of either in flight has ended
        since = len(prober.keys)
        await prober.until(since + 6)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert set(prober.keys[since:]) == {"default/c"}, "only the proxy with an address is probed"

    asyncio.run(scenario())
    assert gone == ["default/a"]


def test_client_error_reports_count_like_failed_probes() -> None:
    inventory = Inventory()
    inventory.replace_all([endpoint("a")])
    transitions: list[HealthTransition] = []
    engine, _ = _engine(inventory, prober=CountingProber(), transitions=transitions)

    async def scenario() -> None:
        await engine.probe_all()
        for _ in range(3):
            await engine.record_failure("default/a")

    asyncio.run(scenario())
    assert inventory.health("default/a").state is HealthState.unhealthy
    assert transitions[-1].reason == "client reported an error"


def test_thresholds_decide_unknown_by_the_first_result() -> None:
    from service.inventory import Health

    t = Thresholds(unhealthy=2, healthy=3)
    assert t.apply(Health(), ok=False, at=1).state is HealthState.unhealthy
    h = t.apply(Health(), ok=True, at=1, egress_ip="1.2.3.4")
    assert (h.state, h.egress_ip) == (HealthState.healthy, "1.2.3.4")
    h = t.apply(h, ok=False, at=2, error="x")
    assert (h.state, h.egress_ip, h.last_error) == (HealthState.healthy, "1.2.3.4", "x")  # the ip is kept
    h = t.apply(h, ok=False, at=3)
    assert h.state is HealthState.unhealthy
    for _ in range(2):
        h = t.apply(h, ok=True, at=4)
    assert h.state is HealthState.unhealthy
    assert t.apply(h, ok=True, at=5).state is HealthState.healthy


def test_a_failing_transition_sink_does_not_stop_probing(caplog: pytest.LogCaptureFixture) -> None:
    inventory = Inventory()
    inventory.replace_all([endpoint("a")])

    def broken_sink(transition: HealthTransition) -> None:
        raise RuntimeError("status writer down")

    engine, _ = _engine(inventory, prober=CountingProber(), transitions=[], on_transition=broken_sink)
    asyncio.run(engine.probe_all())
    assert inventory.health("default/a").healthy
    assert "health transition sink failed for default/a" in caplog.text
