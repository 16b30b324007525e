"""The API's server as `proxy-operator serve` runs it: uvicorn on uvloop's loop, HTTP parsed by httptools.

The process is the installed console script with an empty manifests folder (it serves, reconciling
nothing); the line it logs names the running loop's class and the protocol class uvicorn builds each
connection with, as the process sees them (service/api_server.py `describe`).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import uvicorn

from service import api_server
from tests.conftest import PulumiEnv

pytestmark = pytest.mark.engine  # `serve` finds the Pulumi CLI before it serves

SERVING = re.compile(r"serving on http://127\.0\.0\.1:(\d+) ")
SERVED_BY = "API served by uvicorn on "


def test_serve_runs_on_uvloop_with_httptools(pulumi_env: PulumiEnv, tmp_path: Path) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    command = [str(Path(sys.executable).parent / "proxy-operator"), "serve", "--manifests", str(manifests)]
    stderr = tmp_path / "stderr"
    with (
        stderr.open("w") as errors,
        subprocess.Popen(
            [*command, "--port", "0", "--state-dir", str(tmp_path / "state")],
            cwd=tmp_path,
            env={**os.environ, "PROXY_OPERATOR_RESYNC_SECONDS": "0"},
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
        ) as process,
    ):
        try:
            assert process.stdout is not None
            found = SERVING.match(process.stdout.readline())
            assert found, stderr.read_text()
            with httpx.Client(base_url=f"http://127.0.0.1:{found.group(1)}", timeout=10) as client:
                assert _answers(client, "/healthz") == 200
            served_by = _line(stderr, SERVED_BY)
        finally:
            process.send_signal(signal.SIGINT)
            code = process.wait(timeout=60)
    assert "uvloop.Loop, " in served_by, served_by
    assert served_by.endswith("HTTP by uvicorn.protocols.http.httptools_impl.HttpToolsProtocol"), served_by
    assert code == 0, stderr.read_text()


def test_the_config_names_both_rather_than_auto() -> None:
    """uvicorn's "auto" would fall back to asyncio and h11 without a word if either went missing."""
    config = api_server.server_config(object(), host="127.0.0.1", port=0)
    assert (config.loop, config.http) == ("uvloop", "httptools")
    assert config.ws == "none", "no route is a WebSocket: nothing to import an implementation for"
    assert isinstance(config, uvicorn.Config)


def _answers(client: httpx.Client, path: str) -> int:
    deadline = time.monotonic() + 30
    while True:
        try:
            return client.get(path).status_code
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _line(log: Path, prefix: str) -> str:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            if prefix in line:
                return line.split(prefix, 1)[1]
        time.sleep(0.05)
    raise AssertionError(f"no {prefix!r} line in the log:\n{log.read_text()}")
