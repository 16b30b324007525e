"""`validate` knows ProxyPools: the example is clean; placements and templates are checked like Proxies."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from service.validate import validate_manifests

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pools"


def test_example_pool_is_valid() -> None:
    report = validate_manifests(EXAMPLE)
    assert report.problems == []
    assert report.pools == 1
    assert "1 ProxyPool" in report.summary()


def _broken(tmp_path: Path, edit: dict[str, object]) -> list[str]:
    shutil.copytree(EXAMPLE, tmp_path / "m")
    path = tmp_path / "m" / "pool.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["spec"].update(edit)
    path.write_text(yaml.safe_dump(doc))
    return [f"{p.path}: {p.message}" for p in validate_manifests(tmp_path / "m").problems]


def test_unknown_placement_provider(tmp_path: Path) -> None:
    found = _broken(tmp_path, {"placement": [{"provider": "local-c", "portBase": 18101}]})
    assert found == [
        "spec.placement.0.provider: no provider named 'local-c' in the catalogue (known: local-a, local-b)"
    ]


def test_local_placement_without_port_base(tmp_path: Path) -> None:
    found = _broken(tmp_path, {"placement": [{"provider": "local-a"}]})
    assert found == [
        "spec.placement.0.portBase: local children share one host: "
        "set portBase so each child gets its own port"
    ]


def test_template_block_of_another_type(tmp_path: Path) -> None:
    template = {"spec": {"allowedSourceRanges": ["127.0.0.0/8"], "gcp": {"machineType": "e2-micro"}}}
    found = _broken(tmp_path, {"template": template})
    assert found
    assert all(line.startswith("spec.template.spec.") for line in found)


def test_template_naming_a_provider_is_refused(tmp_path: Path) -> None:
    found = _broken(tmp_path, {"template": {"spec": {"provider": "local-a"}}})
    assert any("names no provider" in line for line in found)
