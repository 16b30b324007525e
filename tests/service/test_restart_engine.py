"""What is declared runs: after the machine restarts (the local proxy processes are gone) and the service
starts again, the proxies are back and healthy well before the resync interval, and no log line claims a
dead proxy serves. Credentials go only to the process the stack started: a listener that took a dead proxy's
port (another local user) is never probed nor handed out, after a restart or while the service runs. Real
engine, real forward-proxy processes, the real service on loopback.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import httpx
import pytest

from service.config import OperatorSettings
from service.serve import Service, build_service, dev_token, serve
from service.settings import DiscoverySettings, HealthSettings
from tests.automation.fleet import Fleet, accepts
from tests.conftest import PulumiEnv
from tests.ports import free_port
from tests.service.impostor import Impostor

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


# --- a listener that is not ours ---------------------------------------------------------------------------

T = TypeVar("T")
Credentials = dict[str, tuple[str, str]]
PROTOCOLS = {"crawl/web": "http", "crawl/sock": "socks5"}


def _impostor_fleet(pulumi_env: PulumiEnv, tmp_path: Path) -> tuple[Fleet, dict[str, int], OperatorSettings]:
    fleet = Fleet(root=tmp_path, backend_url=pulumi_env.backend_url)
    fleet.write_catalogue(["local"], driftPolicy="correct")
    ports = {key: free_port() for key in PROTOCOLS}
    for key, port in ports.items():
        fleet.write_proxy(key.split("/")[1], port=port, pool="main", protocol=PROTOCOLS[key])
    settings = OperatorSettings(
        state_dir=tmp_path / "state",
        backend_url=pulumi_env.backend_url,
        listen_port=0,
        resync_seconds=3600,
        backoff_base_seconds=0.2,
        backoff_cap_seconds=1.0,
        health=HealthSettings(interval_seconds=0.5, healthy_threshold=1),
        discovery=DiscoverySettings(lease_share=1.0),  # one lease call takes both proxies
    )
    return fleet, ports, settings


async def _with_service(
    settings: OperatorSettings, fleet: Fleet, scenario: Callable[[Service, httpx.AsyncClient], Awaitable[T]]
) -> T:
    """Start `serve`, run `scenario` against its API, stop it (the proxies stay, as after a Ctrl-C)."""
    service = build_service(settings, fleet.manifests)
    running = asyncio.create_task(serve(service))
    headers = {"Authorization": f"Bearer {dev_token(settings.state_dir)}"}
    try:
        base = f"http://127.0.0.1:{service.port}"
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=10) as client:
            return await scenario(service, client)
    finally:
        service.server.should_exit = True
        await running


def _provision(settings: OperatorSettings, fleet: Fleet, ports: dict[str, int]) -> Credentials:
    """A first life of the service: the proxies run and are healthy; returns their static credentials."""

    async def scenario(service: Service, _client: httpx.AsyncClient) -> Credentials:
        await _all_healthy(str(_client.base_url), settings, set(ports))
        await asyncio.wait_for(service.controller.queue.drain(), 120)
        endpoints = {key: service.controller.inventory.get(key) for key in ports}
        return {key: (ep.username or "", ep.password or "") for key, ep in endpoints.items() if ep}

    credentials = asyncio.run(_with_service(settings, fleet, scenario))
    assert sorted(credentials) == sorted(ports)
    assert all(all(pair) for pair in credentials.values()), "generated credentials"
    return credentials


def _kill_and_wait(fleet: Fleet, ports: dict[str, int]) -> None:
    fleet.kill_proxies()
    for _ in range(100):  # SIGKILL is delivered asynchronously; the listening sockets close with them
        if not any(accepts(port) for port in ports.values()):
            return
        time.sleep(0.05)
    raise AssertionError("the killed proxies still accept connections")


def _assert_got_nothing(impostors: dict[str, Impostor], credentials: Credentials) -> None:
    for key, impostor in impostors.items():
        user, password = credentials[key]
        received = impostor.received
        basic = base64.b64encode(f"{user}:{password}".encode())
        assert b"Proxy-Authorization" not in received, f"{key}: the listener got a Proxy-Authorization header"
        assert password.encode() not in received, f"{key}: the listener got its password"
        assert basic not in received, f"{key}: the listener got its credentials"
        assert received == b"", f"{key}: the listener that took its port was sent {received[:200]!r}"


async def _lease(client: httpx.AsyncClient, *, target: str = "example.com") -> httpx.Response:
    """Both proxies if both are eligible (a new target for each call: no use cooldown refuses it)."""
    return await client.post("/v1/leases", json={"target": target, "pool": "main", "count": 2})


def _unverified_probes(metrics: str) -> float:
    pattern = re.compile(
        r'^proxy_operator_probe_results_total\{[^}]*outcome="unverified"[^}]*\} (\S+)$', re.M
    )
    return sum(float(value) for value in pattern.findall(metrics))


def _healthy_condition(service: Service, key: str) -> tuple[str, str]:
    """The proxy's Healthy condition as (status, message); ("", "") before there is one."""
    conditions = service.controller.status.get(key).conditions
    return next(((c.status, c.message) for c in conditions if c.type == "Healthy"), ("", ""))


def test_a_listener_on_a_dead_proxys_port_gets_nothing_after_a_restart(
    pulumi_env: PulumiEnv, tmp_path: Path
) -> None:
    """After a reboot another local user binds the proxies' ports before the service starts again: it must
    not receive their credentials (HTTP Proxy-Authorization, SOCKS5 user/password), nor be handed out; the
    service says why, and once the port is free the stack's `up` starts the proxies again."""
    fleet, ports, settings = _impostor_fleet(pulumi_env, tmp_path)
    try:
        credentials = _provision(settings, fleet, ports)
        _kill_and_wait(fleet, ports)
        impostors = {key: Impostor(port, protocol=PROTOCOLS[key]) for key, port in ports.items()}

        async def scenario(service: Service, client: httpx.AsyncClient) -> None:
            status = service.controller.status
            for _ in range(240):  # the restart's first run (up --refresh) tried to start them again
                operations = [status.get(key).last_operation for key in ports]
                if all(op is not None and op.result == "failed" for op in operations):
                    break
                await asyncio.sleep(0.25)
            else:
                raise AssertionError(f"no failed up for the proxies whose ports are taken: {operations}")
            await asyncio.sleep(4 * settings.health.interval_seconds)  # several probe rounds
            _assert_got_nothing(impostors, credentials)
            refused = await _lease(client)
            assert refused.status_code == 503, f"handed out while another listener holds it: {refused.text}"
            for key in ports:
                healthy, why = _healthy_condition(service, key)
                assert healthy == "False", f"{key}: Healthy={healthy!r} ({why})"
                assert "not held by the proxy its stack started" in why, why
            assert _unverified_probes((await client.get("/metrics")).text) > 0
            for impostor in impostors.values():
                impostor.close()  # the port is free again: the next retry of the up starts the proxy
            await _all_healthy(str(client.base_url), settings, set(ports))
            leased = await _lease(client)
            assert leased.status_code == 200, leased.text
            assert all(accepts(port) for port in ports.values())

        try:
            asyncio.run(_with_service(settings, fleet, scenario))
        finally:
            for impostor in impostors.values():
                impostor.close()
    finally:
        fleet.kill_proxies()


def test_a_restart_serves_running_proxies_and_a_crash_leaves_nothing_to_the_next_listener(
    pulumi_env: PulumiEnv, tmp_path: Path
) -> None:
    """With the proxies still running, a restarted service verifies them, probes them and hands them out
    within the first probe interval or so. When they die while served and another listener takes their
    ports, that listener is not probed, and the proxies are not handed out from the next probe on."""
    fleet, ports, settings = _impostor_fleet(pulumi_env, tmp_path)
    try:
        credentials = _provision(settings, fleet, ports)
        impostors: dict[str, Impostor] = {}

        async def scenario(service: Service, client: httpx.AsyncClient) -> None:
            started = asyncio.get_running_loop().time()
            await _all_healthy(str(client.base_url), settings, set(ports))
            took = asyncio.get_running_loop().time() - started
            assert took < 20, f"the running proxies served only after {took:.1f} s"
            leased = await _lease(client)
            assert leased.status_code == 200, leased.text
            assert sorted(lease["key"] for lease in leased.json()["leases"]) == sorted(ports)

            _kill_and_wait(fleet, ports)  # a crash (or a kill) while served
            impostors.update({key: Impostor(port, protocol=PROTOCOLS[key]) for key, port in ports.items()})
            await asyncio.sleep(6 * settings.health.interval_seconds)
            _assert_got_nothing(impostors, credentials)
            refused = await _lease(client, target="example.org")
            assert refused.status_code == 503, f"handed out while another listener holds it: {refused.text}"
            for key in ports:
                healthy, why = _healthy_condition(service, key)
                assert healthy == "False", f"{key}: Healthy={healthy!r} ({why})"

        try:
            asyncio.run(_with_service(settings, fleet, scenario))
        finally:
            for impostor in impostors.values():
                impostor.close()
    finally:
        fleet.kill_proxies()
