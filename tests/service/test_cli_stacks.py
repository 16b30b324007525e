"""`proxy-operator preview` and `proxy-operator stacks ...` via CliRunner, with the real engine."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from click.testing import Result
from typer.testing import CliRunner

from automation.engine import Engine
from service.cli import app
from service.config import OperatorSettings
from service.runner import apply_once
from tests.automation.local_example import LocalExample
from tests.conftest import PulumiEnv


@pytest.fixture
def example(tmp_path: Path) -> Iterator[LocalExample]:
    example = LocalExample(tmp_path / "example")
    yield example
    example.kill_processes()


def invoke(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def test_invalid_manifest_exits_1_naming_the_problem(example: LocalExample, tmp_path: Path) -> None:
    path = example.manifests / "local-2.yaml"
    document = yaml.safe_load(path.read_text())
    document["spec"]["port"] = 70000
    path.write_text(yaml.safe_dump(document))

    result = invoke("preview", "--manifests", str(example.manifests), "--state-dir", str(tmp_path / "state"))
    assert result.exit_code == 1
    assert "local-2.yaml" in result.stderr
    assert "spec.port" in result.stderr
    # The preview still shows what the problem holds back: local-2 was never applied, so it is refused.
    assert "refused: default/local-2" in result.stdout or "problem: default/local-2" in result.stdout
    both = invoke("preview", "--manifests", str(example.manifests), "--json", "--markdown")
    assert both.exit_code == 2
    assert "--json" in both.stderr


@pytest.mark.engine
def test_a_misspelt_kind_fails_the_preview_instead_of_deleting(
    pulumi_env: PulumiEnv, example: LocalExample, tmp_path: Path
) -> None:
    """`kind: proxy` on an applied Proxy used to preview as its deletion, exit 0."""
    settings = OperatorSettings(state_dir=tmp_path / "state")
    state = ["--state-dir", str(settings.state_dir)]
    try:
        assert asyncio.run(apply_once(settings, example.manifests)).ok
        path = example.manifests / "local-2.yaml"
        path.write_text(path.read_text().replace("kind: Proxy", "kind: proxy"))
        result = invoke("preview", "--manifests", str(example.manifests), *state, "--json")
        assert result.exit_code == 1, result.output
        assert "local-2.yaml:" in result.stderr
        assert 'kind "proxy" with apiVersion crawl.example.com/v1alpha1' in result.stderr
        assert 'did you mean "Proxy"?' in result.stderr
        report = json.loads(result.stdout)
        assert report["decisions"]["deleted"] == []
        assert "default/local-2" in report["decisions"]["held"]
        [stack] = report["stacks"]
        assert stack["proxies"]["delete"] == []
    finally:
        Engine(settings.engine_config()).destroy("local")
    assert example.kill_processes() == []


@pytest.mark.engine
def test_preview_then_stacks_commands(pulumi_env: PulumiEnv, example: LocalExample, tmp_path: Path) -> None:
    """The backend and passphrase come from PULUMI_BACKEND_URL / PULUMI_CONFIG_PASSPHRASE (pulumi_env)."""
    settings = OperatorSettings(state_dir=tmp_path / "state")
    state = ["--state-dir", str(settings.state_dir)]
    try:
        previewed = invoke("preview", "--manifests", str(example.manifests), *state, "--json")
        assert previewed.exit_code == 0, previewed.output
        report = json.loads(previewed.stdout)
        assert (report["schemaVersion"], report["ok"], report["totals"]["create"]) == (1, True, 3)
        [stack] = report["stacks"]
        assert stack["name"] == "local"
        assert stack["proxies"] == {"create": example.keys, "update": [], "replace": [], "delete": []}

        markdown = invoke("preview", "--manifests", str(example.manifests), *state, "--markdown")
        assert markdown.exit_code == 0, markdown.output
        assert "| `local` | up | 3 | 0 | 0 | 0 | changes |" in markdown.stdout
        assert "<summary><code>local</code>: up: 3 to create</summary>" in markdown.stdout

        assert asyncio.run(apply_once(settings, example.manifests)).ok
        check_inspection(example, state=state, applied_hash=stack["desiredHash"])

        # A preview that fails (here: the state cannot be decrypted) is reported and exits 1.
        args = ["preview", "--manifests", str(example.manifests), *state]
        failed = CliRunner().invoke(app, args, env={"PULUMI_CONFIG_PASSPHRASE": "wrong"})
        assert failed.exit_code == 1
        assert "stack local: up: preview FAILED" in failed.stdout
        assert "incorrect passphrase" in failed.stdout
    finally:
        Engine(settings.engine_config()).destroy("local")
    assert example.kill_processes() == []


def check_inspection(example: LocalExample, *, state: list[str], applied_hash: str) -> None:
    listing = invoke("stacks", "list", *state)
    assert listing.exit_code == 0, listing.output
    [row] = [line.split() for line in listing.stdout.splitlines() if line.startswith("local ")]
    # name, type, proxies, resources (3 components, 3 credentials, 3 processes), last operation, hash
    assert row == ["local", "local", "3", "9", "update", "succeeded", applied_hash[:12]]

    shown = invoke("stacks", "show", "local", *state)
    assert shown.exit_code == 0, shown.output
    assert "provider:       local (type local)" in shown.stdout
    assert f"proxies:        3: {', '.join(example.keys)}" in shown.stdout
    assert f"applied hash:   {applied_hash}" in shown.stdout
    assert "  credentials: [secret]" in shown.stdout

    masked = json.loads(invoke("stacks", "outputs", "local", *state).stdout)
    assert masked["credentials"] == "[secret]"
    assert {key: out["port"] for key, out in masked["proxies"].items()} == {
        f"default/{name}": port for name, port in example.ports.items()
    }
    clear = json.loads(invoke("stacks", "outputs", "local", "--show-secrets", *state).stdout)
    passwords = [clear["credentials"][key]["password"] for key in example.keys]
    assert all(len(password) >= 16 for password in passwords)

    exported = invoke("stacks", "export", "local", *state)
    assert exported.exit_code == 0, exported.output
    resources = json.loads(exported.stdout)["deployment"]["resources"]
    components = sorted(
        r["urn"].rsplit("::", 1)[-1] for r in resources if r["type"] == "proxy-operator:index:Proxy"
    )
    assert components == example.keys
    assert "ciphertext" in exported.stdout
    for text in (shown.stdout, json.dumps(masked), exported.stdout):
        assert not any(password in text for password in passwords)

    missing = invoke("stacks", "show", "nope", *state)
    assert missing.exit_code == 1
    assert "no stack 'nope'" in missing.stderr
