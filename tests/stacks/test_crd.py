"""The committed CRD is the generated one, is structural, and agrees with the models (offline)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import yaml
from pydantic import ValidationError

from stacks.crd import CRD_FILE, proxy_crd, render, structural, with_field_rules
from stacks.models import Address, Condition, Proxy

ROOT = Path(__file__).resolve().parents[2]
CRD = yaml.safe_load((ROOT / CRD_FILE).read_text())
VERSION = CRD["spec"]["versions"][0]
SCHEMA = VERSION["schema"]["openAPIV3Schema"]
# Fields a JSONSchemaProps of apiextensions.k8s.io/v1 may carry that our generator could produce; `$ref`,
# `definitions`, `const`, `anyOf`/`oneOf`/`allOf` and `uniqueItems` are deliberately absent.
ALLOWED_KEYS = {
    "type", "format", "description", "default", "maximum", "minimum", "maxLength", "minLength", "pattern",
    "maxItems", "minItems", "multipleOf", "enum", "maxProperties", "minProperties", "required", "items",
    "properties", "additionalProperties", "nullable", "example", "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-int-or-string", "x-kubernetes-embedded-resource", "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys", "x-kubernetes-map-type", "x-kubernetes-validations",
}  # fmt: skip
TYPES: dict[str, type | tuple[type, ...]] = {
    "object": dict,
    "array": list,
    "string": str,
    "integer": int,
    "boolean": bool,
    "number": (int, float),
}


def structural_violations(node: dict[str, Any], path: str = "") -> list[str]:
    """What Kubernetes' structural-schema rules refuse in `node`, as far as they can be checked offline."""
    found = [f"{path}: key {key} is not allowed" for key in node if key not in ALLOWED_KEYS]
    opaque = node.get("x-kubernetes-preserve-unknown-fields") or node.get("x-kubernetes-int-or-string")
    kind = node.get("type")
    if kind is None and not opaque:
        found.append(f"{path}: no type")
    if "properties" in node and "additionalProperties" in node:
        found.append(f"{path}: properties and additionalProperties together")
    if "additionalProperties" in node and not isinstance(node["additionalProperties"], dict):
        found.append(f"{path}: additionalProperties must be a schema")
    if kind == "array" and not isinstance(node.get("items"), dict):
        found.append(f"{path}: an array needs one items schema")
    found += [f"{path}: enum value {v!r} is not {kind}" for v in node.get("enum", []) if not _is(v, kind)]
    found += _default_violations(node, path) + _list_map_violations(node, path)
    for name, child in node.get("properties", {}).items():
        found += structural_violations(child, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            found += structural_violations(node[key], f"{path}[{key}]")
    return found


def _is(value: Any, kind: str | None) -> bool:
    return kind is None or (isinstance(value, TYPES[kind]) and not (kind == "integer" and value is True))


def _default_violations(node: dict[str, Any], path: str) -> list[str]:
    if "default" not in node:
        return []
    errors = jsonschema.Draft7Validator(node).iter_errors(node["default"])
    return [f"{path}: default {node['default']!r} is invalid: {e.message}" for e in errors]


def _list_map_violations(node: dict[str, Any], path: str) -> list[str]:
    if node.get("x-kubernetes-list-type") != "map":
        return []
    required = set(node.get("items", {}).get("required", []))
    return [
        f"{path}: map key {k} must be required"
        for k in node["x-kubernetes-list-map-keys"]
        if k not in required
    ]


def crd_errors(document: dict[str, Any]) -> list[str]:
    return [error.message for error in jsonschema.Draft7Validator(SCHEMA).iter_errors(document)]


def example_proxies() -> list[dict[str, Any]]:
    documents = []
    for path in sorted((ROOT / "examples").rglob("*.yaml")):
        documents += [
            doc for doc in yaml.safe_load_all(path.read_text()) if doc and doc.get("kind") == "Proxy"
        ]
    return documents


def test_committed_crd_is_the_generated_one() -> None:
    assert (ROOT / CRD_FILE).read_text() == render(), "run: python -m stacks.crd > " + CRD_FILE


def test_crd_identity_scope_and_columns() -> None:
    assert CRD["apiVersion"] == "apiextensions.k8s.io/v1"
    assert CRD["metadata"]["name"] == "proxies.crawl.example.com"
    assert (CRD["spec"]["group"], CRD["spec"]["scope"]) == ("crawl.example.com", "Namespaced")
    assert (CRD["spec"]["names"]["kind"], CRD["spec"]["names"]["plural"]) == ("Proxy", "proxies")
    assert (VERSION["name"], VERSION["served"], VERSION["storage"]) == ("v1alpha1", True, True)
    assert VERSION["subresources"] == {"status": {}}
    columns = [c["name"] for c in VERSION["additionalPrinterColumns"] if c.get("priority", 0) == 0]
    assert columns == ["Provider", "Phase", "Address", "Healthy", "Age"]


def test_schema_is_structural() -> None:
    assert structural_violations(SCHEMA) == []
    # Kubernetes allows restricting only metadata.name and metadata.generateName.
    assert SCHEMA["properties"]["metadata"]["type"] == "object"
    assert set(SCHEMA["properties"]["metadata"]["properties"]) <= {"name", "generateName"}
    assert SCHEMA["required"] == ["spec"]


def test_structural_check_catches_what_kubernetes_refuses() -> None:
    bad = {"type": "object", "properties": {"a": {"$ref": "#/x"}, "b": {"type": "array"},
                                            "c": {"type": "integer", "default": "x"}}}  # fmt: skip
    assert len(structural_violations(bad)) == 4  # a: $ref + no type; b: no items; c: bad default


def test_generator_refuses_unions_it_cannot_express() -> None:
    with pytest.raises(ValueError, match="one type"):
        structural({"anyOf": [{"type": "string"}, {"type": "integer"}]})


@pytest.mark.parametrize("document", example_proxies(), ids=lambda d: d["metadata"]["name"])
def test_examples_pass_the_crd_and_the_models(document: dict[str, Any]) -> None:
    assert crd_errors(document) == []
    Proxy.model_validate(document)


def test_a_model_dump_with_status_passes_the_crd() -> None:
    proxy = Proxy.model_validate(example_proxies()[0])
    proxy.status.phase = "Ready"
    proxy.status.address = Address(host="127.0.0.1", port=18081)
    proxy.status.conditions = [Condition(type="Healthy", status="True", reason="ProbeOK")]
    proxy.status.observed_spec_hash = "0" * 64
    assert crd_errors(proxy.model_dump(by_alias=True, mode="json", exclude_none=True)) == []


def base() -> dict[str, Any]:
    return {"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy", "metadata": {"name": "p"},
            "spec": {"provider": "local", "allowedSourceRanges": ["10.0.0.0/8"]}}  # fmt: skip


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("port", 70000),
        ("port", 0),
        ("provider", "Local_1"),
        ("protocol", "ftp"),
        ("auth", {"mode": "open"}),
        ("allowedSourceRanges", ["not-a-cidr"]),
        ("kvm", {"vcpus": 0}),
        ("kubernetes", {"serviceType": "ExternalName"}),
    ],
)
def test_crd_and_models_both_reject(field: str, value: Any) -> None:
    document = base()
    document["spec"][field] = value
    assert crd_errors(document) != []
    with pytest.raises(ValidationError):
        Proxy.model_validate(document)


def test_missing_provider_is_rejected_by_both() -> None:
    document = base()
    del document["spec"]["provider"]
    assert any("'provider' is a required property" in e for e in crd_errors(document))
    with pytest.raises(ValidationError):
        Proxy.model_validate(document)


def test_rules_the_schema_cannot_hold_are_cel_on_the_crd() -> None:
    """CEL cannot run offline; check the rules are there, next to the model validators they mirror."""
    spec = SCHEMA["properties"]["spec"]
    rules = " ".join(r["rule"] for r in spec["x-kubernetes-validations"])
    assert "self.auth.mode != 'none'" in rules
    assert "endsWith('/0')" in rules
    assert "has(self.kubernetes), has(self.gcp), has(self.kvm), has(self.local)" in rules
    auth_rules = " ".join(r["rule"] for r in spec["properties"]["auth"]["x-kubernetes-validations"])
    assert "has(self.secretRef)" in auth_rules
    assert proxy_crd() == yaml.safe_load(render())


def test_object_defaults_carry_their_fields_defaults() -> None:
    """The API server checks CEL rules against a default as written: `auth: {}` failed on `self.mode`."""
    spec = SCHEMA["properties"]["spec"]
    assert spec["properties"]["auth"]["default"] == {"mode": "generated"}
    properties = {"a": {"type": "object", "default": {}}, "b": {"type": "string", "default": "x"}}
    node = {"type": "object", "default": {"a": {}}, "properties": properties}
    assert structural(node)["default"] == {"a": {}, "b": "x"}


def test_python_validators_have_cel_mirrors() -> None:
    spec = SCHEMA["properties"]["spec"]["properties"]
    assert "isCIDR(self)" in spec["allowedSourceRanges"]["items"]["x-kubernetes-validations"][0]["rule"]
    assert spec["local"]["properties"]["bindAddress"]["x-kubernetes-validations"][0]["rule"] == "isIP(self)"
    assert "'limits'" in spec["kubernetes"]["properties"]["resources"]["x-kubernetes-validations"][0]["rule"]


def test_a_field_rule_on_a_missing_field_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"spec\.nope\.x"):
        with_field_rules({"type": "object", "properties": {}}, {("nope", "x"): [{"rule": "true"}]})


def test_a_proxy_name_longer_than_a_dns_label_is_rejected_by_both() -> None:
    document = base()
    document["metadata"]["name"] = "a" * 64
    assert crd_errors(document) != []
    with pytest.raises(ValidationError):
        Proxy.model_validate(document)
