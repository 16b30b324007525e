"""The catalogue loads from a plain file or a ConfigMap, and manifests keep their file, document and line."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from stacks.catalogue import (
    CatalogueFormatError,
    catalogue_configmap,
    is_catalogue_document,
    load_catalogue,
    parse_catalogue,
)
from stacks.manifests import load_manifests
from stacks.models import KvmProvider, ProviderCatalogue

ROOT = Path(__file__).resolve().parents[2]
PLAIN = {"providers": [{"name": "local", "type": "local"}]}


def test_plain_file(tmp_path: Path) -> None:
    path = tmp_path / "providers.yaml"
    path.write_text(yaml.safe_dump(PLAIN))
    assert load_catalogue(path).names() == ["local"]


def test_configmap_round_trip(tmp_path: Path) -> None:
    catalogue = load_catalogue(ROOT / "examples" / "kvm-home" / "catalogue.yaml")
    configmap = catalogue_configmap(catalogue, name="providers", namespace="proxy-operator")
    assert is_catalogue_document(configmap)
    assert parse_catalogue(configmap) == catalogue
    path = tmp_path / "cm.yaml"
    path.write_text(yaml.safe_dump(configmap))
    assert load_catalogue(path) == catalogue


def test_in_cluster_example_is_a_configmap() -> None:
    catalogue = load_catalogue(ROOT / "examples" / "in-cluster" / "providers-configmap.yaml")
    assert [entry.type for entry in catalogue.providers] == ["kubernetes"]


def test_configmap_without_the_key_is_not_a_catalogue(tmp_path: Path) -> None:
    document = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"other": "1"}}
    assert not is_catalogue_document(document)
    path = tmp_path / "cm.yaml"
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(CatalogueFormatError, match="top-level `providers:` list"):
        load_catalogue(path)


def test_configmap_key_must_hold_a_mapping() -> None:
    document = {"kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"providers.yaml": "- a\n- b\n"}}
    with pytest.raises(CatalogueFormatError, match="must hold a mapping"):
        parse_catalogue(document)


def test_duplicate_names_are_refused_naming_both_positions() -> None:
    body = {"providers": [*PLAIN["providers"], {"name": "local", "type": "local"}]}
    with pytest.raises(ValidationError, match=r"providers\[0\] and providers\[1\] are both named 'local'"):
        parse_catalogue(body)


def test_kvm_example_fills_host_defaults() -> None:
    entry = load_catalogue(ROOT / "examples" / "kvm-home" / "catalogue.yaml").get("kvm-home")
    assert isinstance(entry, KvmProvider)
    assert [(h.name, h.pool, h.network) for h in entry.hosts] == [
        ("kvm1", "default", "default"),
        ("kvm2", "fast-ssd", "default"),
    ]


def test_manifests_keep_file_document_and_line(tmp_path: Path) -> None:
    (tmp_path / "a-catalogue.yaml").write_text(yaml.safe_dump(PLAIN))
    proxy = "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {name: p%d}\n"
    proxy += "spec: {provider: local, allowedSourceRanges: [127.0.0.0/8]}\n"
    secret = "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\n"
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.yml").write_text(f"{proxy % 1}---\n{secret}---\n{proxy % 2}")
    found = load_manifests(tmp_path)
    assert found.catalogue == ProviderCatalogue.model_validate(PLAIN)
    assert [(p.obj.key, p.source.document, p.source.line) for p in found.proxies] == [
        ("default/p1", 0, 1),
        ("default/p2", 2, 10),
    ]
    assert found.proxies[1].source.line_of(("spec", "provider")) == 13
    assert found.proxies[1].source.file.endswith("sub/b.yml")
    assert [s.document for s in found.ignored] == [1]
    assert found.problems == []


def test_broken_yaml_is_a_problem_not_an_exception(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("kind: Proxy\nspec: [unclosed\n")
    found = load_manifests(tmp_path)
    assert len(found.problems) == 1
    assert "not valid YAML" in found.problems[0].message


def test_get_finds_every_entry_by_name_and_follows_a_replaced_list() -> None:
    """`get` answers from an index built at first use; a catalogue given a new list answers from that."""
    catalogue = ProviderCatalogue.model_validate(
        {"providers": [{"name": f"site-{i}", "type": "local"} for i in range(50)]}
    )
    assert [catalogue.get(f"site-{i}").name for i in range(50)] == [f"site-{i}" for i in range(50)]
    assert catalogue.get("site-50") is None
    catalogue.providers = catalogue.providers[:10]
    assert catalogue.get("site-20") is None
    assert catalogue.get("site-9") is not None
    renamed = [entry.model_copy(update={"name": f"other-{i}"}) for i, entry in enumerate(catalogue.providers)]
    catalogue.providers = renamed  # as many entries as before: only the list's identity tells
    assert catalogue.get("site-9") is None
    assert catalogue.get("other-9") is not None
