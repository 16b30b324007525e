"""The service's probe URL reaches the programs, so a proxy allows the probe without the Proxy saying so.

The real engine runs `up` of a `local` proxy whose egress policy is the default (loopback refused, nothing
allowed); the health probe then fetches the service's echo endpoint through it. With the probe URL in the
engine's configuration (`EngineConfig.probe_url`, from `OperatorSettings.health.probe_url`, which `serve`
fills with its default) the probe passes; without it the same proxy refuses it: the allow is the program's.
`serve` itself is checked to hand its default probe URL (the port actually bound) to the engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.api import create_app
from service.auth import TokenAuthenticator
from service.config import OperatorSettings
from service.controller import Controller
from service.discovery.memory import MemoryStore
from service.discovery.service import DiscoveryService
from service.health.probe import ProxyProber
from service.inventory import Inventory
from service.serve import build_service
from service.settings import DiscoverySettings, HealthSettings
from service.sources.directory import DirectorySource
from tests.automation.fleet import CountingEngine, Fleet
from tests.conftest import PulumiEnv
from tests.ports import free_port
from tests.service.conftest import UvicornThread


@pytest.fixture
def echo_url() -> Iterator[str]:
    """The service's own echo route on a live uvicorn (loopback, a port the kernel picks)."""
    inventory = Inventory()
    discovery = DiscoveryService(inventory=inventory, store=MemoryStore(), settings=DiscoverySettings())
    server = UvicornThread(
        create_app(inventory=inventory, discovery=discovery, authenticator=TokenAuthenticator([]))
    ).start()
    yield f"{server.url}/v1/echo"
    server.stop()


@pytest.fixture
def fleet(pulumi_env: PulumiEnv, tmp_path: Path) -> Iterator[Fleet]:
    fleet = Fleet(root=tmp_path, backend_url=pulumi_env.backend_url)
    yield fleet
    fleet.kill_proxies()


async def _probe_after_up(fleet: Fleet, settings: OperatorSettings, echo_url: str) -> tuple[str, str]:
    controller = Controller(
        settings=settings,
        engine=CountingEngine(settings.engine_config()),
        source=DirectorySource(fleet.manifests),
        inventory=Inventory(),
    )
    result: tuple[str, str] = ("", "")

    async def scenario() -> None:
        nonlocal result
        await fleet.apply(controller)
        [endpoint] = controller.inventory.endpoints()
        probed = await ProxyProber(probe_url=echo_url, connect_timeout=5, timeout=10).probe(endpoint)
        result = (probed.outcome, probed.error or "")

    fleet._controllers.append(controller)
    await fleet.run(scenario)
    return result


@pytest.mark.parametrize("given", [True, False], ids=["probe-url-given", "no-probe-url"])
def test_a_default_policy_proxy_serves_the_probe_only_when_the_program_knows_its_url(
    fleet: Fleet, echo_url: str, given: bool
) -> None:
    fleet.write_proxy("p1", port=free_port(), egress={})  # the default policy: loopback refused
    health = HealthSettings(probe_url=echo_url if given else None)
    settings = fleet.settings().model_copy(update={"health": health})
    assert settings.engine_config().probe_url == (echo_url if given else None)
    outcome, message = asyncio.run(_probe_after_up(fleet, settings, echo_url))
    if given:
        assert outcome == "ok", message
    else:
        assert (outcome, "403" in message) == ("bad_status", True), message


def test_serve_hands_its_default_probe_url_to_the_engine(tmp_path: Path, fleet: Fleet) -> None:
    service = build_service(fleet.settings(), fleet.manifests, port=0)
    try:
        assert isinstance(service.controller, Controller)
        expected = f"http://127.0.0.1:{service.port}/v1/echo"
        assert service.controller.engine.config.probe_url == expected
    finally:
        service.listener.close()
