"""The `s3://` state backend against a real S3 API: moto in server mode on loopback.

moto stands in for AWS S3 (no cloud is reachable here); it speaks the S3 HTTP API that Pulumi's backend
uses, so the engine, the lock files and the checkpoints all go over the wire for real.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from tests.automation.fleet import Fleet, accepts
from tests.conftest import PulumiEnv
from tests.ports import free_port

pytestmark = pytest.mark.engine

BUCKET = "proxy-operator-state"


@pytest.fixture
def moto_endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not accepts(port):
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("moto server did not start")
            time.sleep(0.1)
        for key, value in {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",
        }.items():
            monkeypatch.setenv(key, value)
        endpoint = f"http://127.0.0.1:{port}"
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
        yield endpoint
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_reconcile_with_an_s3_backend(pulumi_env: PulumiEnv, tmp_path: Path, moto_endpoint: str) -> None:
    host = moto_endpoint.removeprefix("http://")
    url = f"s3://{BUCKET}?endpoint={host}&disableSSL=true&s3ForcePathStyle=true&region=us-east-1"
    fleet = Fleet(root=tmp_path, backend_url=url)
    port = free_port()
    fleet.write_proxy("remote-state", port=port)

    async def scenario() -> None:
        controller = await fleet.apply()
        assert accepts(port)
        assert controller.engine.list_stack_names() == ["local"]
        fleet.remove_proxy("remote-state")
        await fleet.apply(controller)
        assert not accepts(port)
        assert controller.engine.list_stack_names() == []

    try:
        asyncio.run(fleet.run(scenario))
    finally:
        fleet.kill_proxies()
    objects = boto3.client("s3", endpoint_url=moto_endpoint).list_objects_v2(Bucket=BUCKET)
    keys = [o["Key"] for o in objects.get("Contents", [])]
    # The checkpoints went to the bucket; the stack is gone; no lock was left behind.
    assert any(k.startswith(".pulumi/backups/proxy-operator/local/") for k in keys), keys
    assert ".pulumi/stacks/proxy-operator/local.json" not in keys
    assert not [k for k in keys if k.startswith(".pulumi/locks/") and k.endswith(".json")], keys
