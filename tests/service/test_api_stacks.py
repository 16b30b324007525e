"""`/v1/stacks` served by the real inspector (automation/inspect.py) over a real stack of `local` proxies
that the real Pulumi engine made; destroyed at the end."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from automation.engine import Engine
from automation.inspect import StackInspector
from service.config import OperatorSettings
from service.inventory import Inventory
from service.runner import apply_once
from tests.automation.local_example import LocalExample
from tests.conftest import PulumiEnv
from tests.service.conftest import ApiFactory, auth

pytestmark = [pytest.mark.engine, pytest.mark.parametrize("store_kind", ["memory"])]


@pytest.fixture
def example(tmp_path: Path) -> Iterator[LocalExample]:
    example = LocalExample(tmp_path / "example")
    yield example
    example.kill_processes()


def test_stacks_routes_show_a_real_stack_as_the_cli_does(
    pulumi_env: PulumiEnv, example: LocalExample, start_api: ApiFactory, tmp_path: Path
) -> None:
    settings = OperatorSettings(state_dir=tmp_path / "state")
    engine = Engine(settings.engine_config())
    try:
        assert asyncio.run(apply_once(settings, example.manifests)).ok
        inspector = StackInspector(engine)
        api = start_api(inventory=Inventory(), stacks=inspector)
        with api.client() as client:
            listed = client.get("/v1/stacks", headers=auth("admin"))
            one = client.get("/v1/stacks/local", headers=auth("admin"))
            missing = client.get("/v1/stacks/nope", headers=auth("admin"))
            not_admin = client.get("/v1/stacks", headers=auth("crawler-a"))
        cli_view = [summary.model_dump(mode="json", by_alias=True) for summary in inspector.list_stacks()]
    finally:
        engine.destroy("local")
    assert example.kill_processes() == []  # destroy stopped every proxy process

    assert listed.status_code == 200, listed.text
    [stack] = listed.json()["items"]
    assert listed.json()["items"] == cli_view  # what `proxy-operator stacks list` reads
    assert (stack["name"], stack["provider"], stack["providerType"]) == ("local", "local", "local")
    assert stack["proxies"] == example.keys
    assert stack["resourceCount"] == 9  # per proxy: its component, its credentials, its process
    assert (stack["lastOperation"], stack["lastResult"]) == ("update", "succeeded")
    assert stack["lastChanges"] == {"create": 10}  # the 9 resources and the stack itself
    assert len(stack["appliedHash"]) == 64
    assert "outputs" not in stack

    assert one.status_code == 200, one.text
    detail = one.json()
    assert {k: v for k, v in detail.items() if k != "outputs"} == stack
    assert detail["outputs"]["credentials"] == "[secret]"
    assert {key: out["port"] for key, out in detail["outputs"]["proxies"].items()} == {
        f"default/{name}": port for name, port in example.ports.items()
    }
    assert "password" not in json.dumps(detail["outputs"]["proxies"])

    assert (missing.status_code, missing.json()["error"]) == (404, "stack_not_found")
    assert (not_admin.status_code, not_admin.json()["error"]) == (403, "forbidden")
