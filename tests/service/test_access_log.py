"""The access log of `serve`: the probes' requests leave no line by default (at 10,000 proxies the echo
route alone is 1,000 requests a second), the API's requests do; `all` and `off` as they say."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import httpx
import pytest

from service.config import OperatorSettings
from service.serve import build_service, dev_token, serve
from tests.conftest import PulumiEnv
from tests.ports import free_port

pytestmark = pytest.mark.engine


def _paths_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return sorted(
        str(record.args[2])
        for record in caplog.records
        if record.name == "uvicorn.access" and isinstance(record.args, tuple)
    )


@pytest.mark.parametrize(
    ("mode", "logged"),
    [
        ("api", ["/v1/nope", "/v1/proxies"]),
        ("all", ["/healthz", "/metrics", "/v1/echo", "/v1/nope", "/v1/proxies"]),
        ("off", []),
    ],
)
def test_the_access_log_leaves_the_probes_out(
    pulumi_env: PulumiEnv, tmp_path: Path, caplog: pytest.LogCaptureFixture, mode: str, logged: list[str]
) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    port = free_port()
    settings = OperatorSettings(
        state_dir=tmp_path / "state",
        backend_url=pulumi_env.backend_url,
        listen_port=port,
        resync_seconds=0,
        access_log=mode,  # type: ignore[arg-type]  # the Literal's values, parametrized
    )
    service = build_service(settings, manifests)
    headers = {"Authorization": f"Bearer {dev_token(settings.state_dir)}"}

    async def scenario() -> None:
        running = asyncio.create_task(serve(service))
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
                for _ in range(50):  # up yet?
                    try:
                        await client.get("/healthz")
                        break
                    except httpx.TransportError:
                        await asyncio.sleep(0.1)
                caplog.clear()
                for path in ("/v1/echo", "/healthz", "/metrics", "/v1/proxies", "/v1/nope"):
                    response = await client.get(path, headers=headers)
                    assert response.status_code in (200, 404), (path, response.status_code)
        finally:
            service.server.should_exit = True
            await running

    with caplog.at_level(logging.INFO, logger="uvicorn.access"):
        asyncio.run(scenario())
    assert _paths_logged(caplog) == logged


def test_a_failing_health_check_is_logged() -> None:
    """A health route that answers 400 or more keeps its line: that one says something."""
    from service.logging_setup import QuietProbes

    def line(path: str, status: int) -> logging.LogRecord:
        args = ("127.0.0.1:5000", "GET", path, "1.1", status)
        return logging.LogRecord("uvicorn.access", logging.INFO, "", 0, '%s - "%s %s HTTP/%s" %d', args, None)

    quiet = QuietProbes()
    assert not quiet.filter(line("/readyz", 200))
    assert quiet.filter(line("/readyz", 503))
    assert not quiet.filter(line("/v1/echo?x=1", 502))
    assert quiet.filter(line("/v1/leases", 201))
