"""A pool on two `local` providers, run by the real engine with real proxy processes and real probes.

Time for the pools and discovery is a FakeClock (epoch seconds), moved by the test; Pulumi and the proxy
processes run in real time. `step()` is one turn of the service: poll (the pools decide), run the stacks
until the queue is drained, probe every proxy once through it to a local site.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import yaml
from prometheus_client import CollectorRegistry

from automation.clock import FakeClock
from service.controller import Controller
from service.discovery.memory import MemoryStore
from service.discovery.service import DiscoveryService
from service.health.engine import HealthEngine
from service.health.metrics import HealthMetrics
from service.health.probe import ProxyProber
from service.health.thresholds import Thresholds
from service.inventory import Inventory
from service.pools.naming import Member
from service.pools.source import PoolSource
from service.pools.wiring import attach_discovery, pooled_directory
from service.runner import _settle
from service.settings import DiscoverySettings
from service.sources.directory import DirectorySource
from tests.automation.fleet import CountingEngine, Fleet
from tests.ports import free_range
from tests.service.site import Site

START = 1_700_000_000.0
POOL_KEY = "crawl/eu"


def pool_document(*, replicas: int, **spec: Any) -> dict[str, Any]:
    placement = spec.pop("placement", None) or [
        {"provider": "a", "portBase": spec.pop("port_a")},
        {"provider": "b", "portBase": spec.pop("port_b")},
    ]
    return {
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "ProxyPool",
        "metadata": {"name": "eu", "namespace": "crawl"},
        "spec": {
            "replicas": replicas,
            "placement": placement,
            "template": {
                "spec": {
                    "allowedSourceRanges": ["127.0.0.0/8"],
                    "egress": {"allow": [{"cidr": "127.0.0.1/32"}]},
                }
            },
            **spec,
        },
    }


@dataclass
class PoolRig:
    fleet: Fleet
    site: Site
    clock: FakeClock = field(default_factory=lambda: FakeClock(start=START))
    controllers: list[Controller] = field(default_factory=list)

    def write_pool(self, **kwargs: Any) -> None:
        path = self.fleet.manifests / "pool.yaml"
        path.write_text(yaml.safe_dump(pool_document(**kwargs)))
        os.utime(path, ns=(time.time_ns(), time.time_ns()))

    def start(self) -> None:
        settings = self.fleet.settings()
        self.inventory = Inventory()
        self.source: PoolSource = pooled_directory(
            DirectorySource(self.fleet.manifests), inventory=self.inventory, clock=self.clock.now
        )
        self.engine = CountingEngine(settings.engine_config())
        self.controller = Controller(
            settings=settings, engine=self.engine, source=self.source, inventory=self.inventory
        )
        self.source.ready = lambda: self.controller.started
        self.controllers.append(self.controller)
        self.health = HealthEngine(
            inventory=self.inventory,
            prober=ProxyProber(probe_url=self.site.url("/ok"), connect_timeout=2, timeout=5),
            metrics=HealthMetrics(CollectorRegistry(), health=self.inventory.health_snapshot),
            thresholds=Thresholds(unhealthy=1, healthy=1),
            clock=self.clock.now,
        )
        self.discovery = DiscoveryService(
            inventory=self.inventory, store=MemoryStore(), settings=DiscoverySettings(), clock=self.clock.now
        )
        attach_discovery(self.source, self.discovery)

    async def step(self) -> None:
        if not self.controller.started:
            await self.controller.start()
        self.controller.sync()
        await _settle(self.controller)
        await self.health.probe_all()

    async def close(self) -> None:
        for controller in self.controllers:
            await controller.close(grace=5)

    def children(self) -> list[Member]:
        return self.source.children(POOL_KEY)

    def placements(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for endpoint in self.inventory.endpoints():
            if endpoint.pool == "eu" and endpoint.has_address:
                counts[str(endpoint.stack)] = counts.get(str(endpoint.stack), 0) + 1
        return counts


def free_base(width: int = 20) -> int:
    """A base port below the ephemeral range (where the engine's own servers bind at random) with `width`
    free ports above it, reserved (tests/ports.py): children on a shared host take ports upwards from it."""
    return free_range(width)


def accepts(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.3)
        return sock.connect_ex(("127.0.0.1", port)) == 0


class Sampler:
    """A thread counting, every few milliseconds, the pool's children that discovery may hand out (not
    drained) and whose port accepts a connection; keeps the lowest count seen."""

    def __init__(self, inventory: Inventory) -> None:
        self.inventory = inventory
        self.lowest: int | None = None
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler")

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            serving = [
                e
                for e in self.inventory.endpoints()
                if e.pool == "eu" and e.port is not None and not self.inventory.is_draining(e.key)
            ]
            count = sum(1 for e in serving if accepts(e.port or 0))
            self.lowest = count if self.lowest is None else min(self.lowest, count)
            self.samples += 1

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
