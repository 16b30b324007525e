"""`serve` end to end: real engine, real pproxy processes, the health engine, and the API on uvicorn.

This is what `make run` does; README's two `curl` commands are the same requests.
"""

from __future__ import annotations

import asyncio
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


def test_serve_provisions_probes_and_leases(pulumi_env: PulumiEnv, tmp_path: Path) -> None:
    fleet = Fleet(root=tmp_path, backend_url=pulumi_env.backend_url)
    ports = [free_port(), free_port()]
    for i, port in enumerate(ports):
        fleet.write_proxy(f"p{i}", port=port, pool="main")
    api_port = free_port()
    settings = OperatorSettings(
        state_dir=tmp_path / "state",
        backend_url=pulumi_env.backend_url,
        listen_port=api_port,
        resync_seconds=0,
        health=HealthSettings(interval_seconds=0.5, healthy_threshold=1),
    )
    service = build_service(settings, fleet.manifests)
    headers = {"Authorization": f"Bearer {dev_token(settings.state_dir)}"}
    base = f"http://127.0.0.1:{api_port}"

    async def scenario() -> None:
        running = asyncio.create_task(serve(service))
        try:
            async with httpx.AsyncClient(base_url=base, timeout=10) as client:
                lease = await _lease_when_healthy(client, headers)
                proxy_url = lease["leases"][0]["url"]
                assert lease["leases"][0]["egressIp"] == "127.0.0.1"
                # The leased proxy works with its credentials, and refuses without them.
                async with httpx.AsyncClient(proxy=proxy_url, timeout=10) as through:
                    echo = (await through.get(f"{base}/v1/echo")).json()
                assert echo["ip"] == "127.0.0.1"
                bare = f"http://127.0.0.1:{lease['leases'][0]['port']}"
                async with httpx.AsyncClient(proxy=bare, timeout=10) as anonymous:
                    assert (await anonymous.get(f"{base}/v1/echo")).status_code == 407
                # Its own user, pushed to the socket the stack's outputs name; refused after the release.
                assert lease["leases"][0]["credentialsScope"] == "lease"
                released = await client.delete(f"/v1/leases/{lease['leases'][0]['leaseId']}", headers=headers)
                assert released.status_code in (200, 204)
                async with httpx.AsyncClient(proxy=proxy_url, timeout=10) as after:
                    assert (await after.get(f"{base}/v1/echo")).status_code == 407
                proxies = (await client.get("/v1/proxies", headers=headers)).json()
                assert sorted(p["key"] for p in proxies["items"]) == ["crawl/p0", "crawl/p1"]
                leased = lease["leases"][
                    0
                ]  # healthy by now: it was leased (its neighbour may not be probed yet)
                status = (await client.get(f"/v1/status/{leased['key']}", headers=headers)).json()
                assert status["status"]["phase"] == "Ready"
                assert status["status"]["address"]["port"] == leased["port"]
                reasons = [e["reason"] for e in status["events"]]
                assert "Provisioned" in reasons
                assert "ProbeSucceeded" in reasons
                missing = await client.get("/v1/status/crawl/nope", headers=headers)
                assert missing.status_code == 404
        finally:
            service.server.should_exit = True
            await running

    try:
        asyncio.run(scenario())
        assert all(accepts(port) for port in ports), "stopping the service must not stop the proxies"
    finally:
        fleet.kill_proxies()


async def _lease_when_healthy(client: httpx.AsyncClient, headers: dict[str, str]) -> dict:
    last = "the API never answered"
    for _ in range(240):
        await asyncio.sleep(0.25)
        try:
            response = await client.post(
                "/v1/leases", json={"target": "example.com", "pool": "main"}, headers=headers
            )
        except httpx.ConnectError:
            continue  # uvicorn is still starting
        if response.status_code == 200:
            return response.json()
        assert response.status_code == 503, response.text
        last = response.text
    raise AssertionError(f"no proxy became leasable: {last}")
