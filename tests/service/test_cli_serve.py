"""`proxy-operator serve --port 0`: any free port, and the health probes reach the service on the port bound.

The process is the installed console script, as a person runs it; its proxies become leasable only once a
probe fetched `/v1/echo` through them from this service, so a probe URL naming port 0 (or any port but the
bound one) never lets a lease through. It also tunes the garbage collector as served (service/gc_tuning.py):
a settle at start, on /metrics.
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

from tests.automation.local_example import LocalExample
from tests.conftest import PulumiEnv

pytestmark = pytest.mark.engine

SERVING = re.compile(r"serving on http://127\.0\.0\.1:(\d+) ")


def test_serve_on_port_zero_probes_and_leases_on_the_bound_port(
    pulumi_env: PulumiEnv, tmp_path: Path
) -> None:
    example = LocalExample(tmp_path / "example")
    state = tmp_path / "state"
    env = {
        **os.environ,
        "PROXY_OPERATOR_HEALTH_INTERVAL_SECONDS": "0.5",
        "PROXY_OPERATOR_HEALTH_HEALTHY_THRESHOLD": "1",
        "PROXY_OPERATOR_RESYNC_SECONDS": "0",
        "PROXY_OPERATOR_GC_SETTLE_SECONDS": "300",  # as served (tests/conftest.py turns it off for pytest)
    }
    command = [
        str(Path(sys.executable).parent / "proxy-operator"),
        "serve",
        "--manifests",
        str(example.manifests),
    ]
    with subprocess.Popen(
        [*command, "--port", "0", "--state-dir", str(state)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as process:
        try:
            assert process.stdout is not None
            first = process.stdout.readline()
            found = SERVING.match(first)
            assert found, f"no 'serving on' line with the bound port: {first!r}"
            port = int(found.group(1))
            assert port != 0
            token = (state / "dev-token").read_text().strip()
            lease = _lease_when_healthy(f"http://127.0.0.1:{port}", token)
            assert lease["leases"][0]["key"] in example.keys
            metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
            settles = re.search(r"^proxy_operator_gc_settle_seconds_count (\S+)$", metrics, re.M)
            frozen = re.search(r"^proxy_operator_gc_frozen_objects (\S+)$", metrics, re.M)
            assert settles, "no proxy_operator_gc_settle_seconds on /metrics"
            assert float(settles.group(1)) >= 1, "serve did not settle the collector at start"
            assert frozen, "no proxy_operator_gc_frozen_objects on /metrics"
            assert float(frozen.group(1)) > 10_000, "serve froze nothing out of the collector"
        finally:
            _stop(process)
            example.kill_processes()


def _stop(process: subprocess.Popen[str]) -> None:
    """Ctrl-C, as a person stops it; a kill if it does not stop in time."""
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _lease_when_healthy(base: str, token: str) -> dict:
    headers = {"Authorization": f"Bearer {token}"}
    last = "the API never answered"
    deadline = time.monotonic() + 120
    with httpx.Client(base_url=base, timeout=10) as client:
        while time.monotonic() < deadline:
            try:
                response = client.post("/v1/leases", json={"target": "example.com"}, headers=headers)
            except httpx.TransportError as exc:
                last = repr(exc)
            else:
                if response.status_code == 200:
                    return dict(response.json())
                assert response.status_code == 503, response.text
                last = response.text
            time.sleep(0.25)
    raise AssertionError(f"no proxy became leasable (probes never reached the bound port?): {last}")
