"""What is declared runs: after the machine restarts (the local proxy processes are gone) and the service
starts again, the proxies are back and healthy well before the resync interval, and no log line claims a
dead proxy serves. Real engine, real pproxy processes, the real service on loopback.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from pathlib import Path

import httpx
import pytest

from service.config import OperatorSettings
from service.serve import build_service, dev_token, serve
from service.settings import HealthSettings
from tests.automation.fleet import Fleet, accepts
from tests.conftest import PulumiEnv
from tests.ports import free_port

pytestmark = pytest.mark.engine

CLAIM = re.compile(r"^(?P<key>\S+) serves at \S+://[^:]+:(?P<port>\d+)$")


class ClaimChecker(logging.Handler):
    """At the moment a "serves at" line is logged, the proxy it names must accept connections."""

    def __init__(self) -> None:
        super().__init__()
        self.claims: list[str] = []
        self.false_claims: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        match = CLAIM.match(record.getMessage())
        if match is None:
            return
        self.claims.append(match["key"])
        if not accepts(int(match["port"])):
            self.false_claims.append(record.getMessage())


def test_a_restart_after_the_proxies_died_brings_them_back(
    pulumi_env: PulumiEnv, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fleet = Fleet(root=tmp_path, backend_url=pulumi_env.backend_url)
    fleet.write_catalogue(["local"], driftPolicy="correct")
    ports = {"crawl/p0": free_port(), "crawl/p1": free_port()}
    for key, port in ports.items():
        fleet.write_proxy(key.split("/")[1], port=port, pool="main")
    settings = OperatorSettings(
        state_dir=tmp_path / "state",
        backend_url=pulumi_env.backend_url,
        listen_port=0,
        resync_seconds=3600,  # the periodic drift check is far away: only the restart path may repair
        health=HealthSettings(interval_seconds=0.5, healthy_threshold=1),
    )
    caplog.set_level(logging.INFO, logger="service.reporter")  # "<key> serves at ..." lines
    checker = ClaimChecker()
    logging.getLogger().addHandler(checker)

    async def run_until_healthy() -> float:
        service = build_service(settings, fleet.manifests)
        running = asyncio.create_task(serve(service))
        started = asyncio.get_running_loop().time()
        try:
            await _all_healthy(f"http://127.0.0.1:{service.port}", settings, set(ports))
            took = asyncio.get_running_loop().time() - started
            await asyncio.wait_for(service.controller.queue.drain(), 120)  # let the run that repaired end
            return took
        finally:
            service.server.should_exit = True
            await running

    try:
        asyncio.run(run_until_healthy())
        assert all(accepts(port) for port in ports.values())
        fleet.kill_proxies()  # the machine restarted: the processes are gone, the state says they run
        for _ in range(100):  # SIGKILL is delivered asynchronously; the listening sockets close with them
            if not any(accepts(port) for port in ports.values()):
                break
            time.sleep(0.05)
        assert not any(accepts(port) for port in ports.values())
        checker.claims.clear()

        took = asyncio.run(run_until_healthy())
        assert all(accepts(port) for port in ports.values()), "the proxies are back"
        assert took < settings.resync_seconds / 10, f"back after {took:.0f} s"
        assert checker.false_claims == [], "a log line claimed a dead proxy serves"
        assert sorted(set(checker.claims)) == sorted(ports), "the recreated proxies are announced"
    finally:
        logging.getLogger().removeHandler(checker)
        fleet.kill_proxies()


async def _all_healthy(base: str, settings: OperatorSettings, keys: set[str]) -> None:
    headers = {"Authorization": f"Bearer {dev_token(settings.state_dir)}"}
    last = "the API never answered"
    async with httpx.AsyncClient(base_url=base, timeout=10) as client:
        for _ in range(480):
            await asyncio.sleep(0.25)
            try:
                response = await client.get("/v1/proxies", headers=headers)
            except httpx.TransportError:
                continue
            if response.status_code != 200:
                last = response.text
                continue
            items = response.json()["items"]
            healthy = {item["key"] for item in items if item["health"]["state"] == "healthy"}
            if healthy >= keys:
                return
            last = str(items)
    raise AssertionError(f"the proxies never all became healthy: {last}")
