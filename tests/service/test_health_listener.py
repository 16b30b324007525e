"""The probe gate of `local` proxies: a listener that is not the process its stack recorded is never sent a
byte (so never the credentials), and the proxy is out of discovery at once. A real listener on loopback
stands for another local user who took the port; the process checks read the real /proc."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from service.health import listener
from service.health.engine import HealthEngine, HealthTransition
from service.health.metrics import HealthMetrics
from service.health.probe import ProxyProber
from service.health.thresholds import Thresholds
from service.inventory import Health, HealthState, Inventory
from service.reporter import endpoint_of
from stacks.forward_proxy.identity import ProcessRef, start_time
from stacks.models import Proxy
from tests.ports import free_port
from tests.service.conftest import endpoint
from tests.service.impostor import Impostor

KEY = "default/a"


@pytest.fixture
def impostor() -> Iterator[Impostor]:
    with Impostor(free_port()) as listening:
        yield listening


def _gone() -> str:
    """The instance id of a process that ran and is gone (a proxy killed, or from before a reboot)."""
    me = ProcessRef(pid=os.getpid(), start_time=start_time(os.getpid()) or 0)
    return ProcessRef(pid=me.pid, start_time=me.start_time + 1).instance_id


def _engine(
    inventory: Inventory, transitions: list[HealthTransition]
) -> tuple[HealthEngine, CollectorRegistry]:
    registry = CollectorRegistry()
    engine = HealthEngine(
        inventory=inventory,
        prober=ProxyProber(probe_url="http://127.0.0.1:9/v1/echo", connect_timeout=1, timeout=2),
        metrics=HealthMetrics(registry, health=inventory.health_snapshot),
        thresholds=Thresholds(unhealthy=3, healthy=2),
        on_transition=transitions.append,
    )
    return engine, registry


def test_a_local_proxy_whose_process_is_gone_is_not_probed_and_leaves_discovery_at_once(
    impostor: Impostor,
) -> None:
    inventory = Inventory()
    inventory.replace_all([endpoint("a", port=impostor.port, local=True, instance_id=_gone())])
    inventory.set_health(KEY, Health(state=HealthState.healthy, egress_ip="127.0.0.1"))  # served until now
    transitions: list[HealthTransition] = []
    engine, registry = _engine(inventory, transitions)

    health = asyncio.run(engine.probe_once(KEY))

    assert (impostor.connections, impostor.received) == (0, b"")
    assert health is not None
    assert health.state is HealthState.unhealthy  # at once, not after `unhealthy` failed probes
    assert inventory.healthy_keys() == frozenset()
    assert health.last_error is not None
    assert f"127.0.0.1:{impostor.port} is not held by the proxy its stack started" in health.last_error
    assert "is gone" in health.last_error
    assert [t.reason for t in transitions] == [health.last_error]  # the Healthy condition's message
    labels = {"provider": "local", "outcome": "unverified"}
    assert registry.get_sample_value("proxy_operator_probe_results_total", labels) == 1
    assert (
        registry.get_sample_value("proxy_operator_probe_duration_seconds_count", {"provider": "local"})
        is None
    )


def test_a_local_endpoint_without_a_recorded_process_is_not_probed(impostor: Impostor) -> None:
    for instance_id in (None, "pod-abc", "12"):
        refused = listener.refusal(endpoint("a", port=impostor.port, local=True, instance_id=instance_id))
        assert (
            refused
            == f"not probed: the stack recorded no process for the local proxy at 127.0.0.1:{impostor.port}"
        )


def test_a_live_pid_of_another_program_is_refused(impostor: Impostor) -> None:
    me = ProcessRef(pid=os.getpid(), start_time=start_time(os.getpid()) or 0)
    refused = listener.refusal(endpoint("a", port=impostor.port, local=True, instance_id=me.instance_id))
    assert refused is not None
    assert f"pid {me.pid} now runs another program" in refused


def test_endpoints_of_other_providers_are_probed_as_before(impostor: Impostor) -> None:
    inventory = Inventory()
    inventory.replace_all([endpoint("a", port=impostor.port, provider="in-cluster", instance_id="proxy-a")])
    engine, _ = _engine(inventory, [])
    asyncio.run(engine.probe_once(KEY))
    assert impostor.saw(b"Proxy-Authorization")  # not a local process: nothing to check here


def test_the_reporter_marks_local_endpoints_by_their_output() -> None:
    proxy = Proxy.model_validate(
        {
            "apiVersion": "crawl.example.com/v1alpha1",
            "kind": "Proxy",
            "metadata": {"name": "a", "namespace": "crawl"},
            "spec": {"provider": "local", "port": 3128},
        }
    )
    out = {"host": "127.0.0.1", "port": 3128, "protocol": "http", "instanceId": "4242-99", "control": None}
    local = endpoint_of(proxy, stack="local", out=out, creds={})
    assert (local.local, local.instance_id) == (True, "4242-99")
    pod = {key: value for key, value in out.items() if key != "control"} | {"instanceId": "uid-1"}
    other = endpoint_of(proxy, stack="in-cluster", out=pod, creds={})
    assert (other.local, other.instance_id) == (False, "uid-1")
