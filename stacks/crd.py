"""The Proxy CRD, generated from the pydantic models.

`python -m stacks.crd > crds/crawl.example.com_proxies.yaml` writes it; a test checks the committed file.
pydantic writes JSON Schema (draft 2020-12, `$ref`s, `anyOf` with null); Kubernetes wants a structural
OpenAPI v3 schema. `structural` rewrites one into the other: refs inlined, optional-null unions collapsed,
titles and `additionalProperties: false` dropped (the API server prunes unknown fields instead, and refuses
them under `fieldValidation=Strict`, kubectl's default), and an object's default completed with its fields'
defaults (the API server checks CEL rules against a default as written: `auth: {}` failed `self.mode`).
`FIELD_RULES` adds CEL for the models' Python validators that a schema cannot hold, and the metadata name is
restricted as `ObjectMeta` restricts it, so the API server refuses what `proxy-operator validate` refuses.
"""

from __future__ import annotations

import sys
from typing import Any

import yaml

from stacks.models import (
    API_GROUP,
    KIND,
    POOL_KIND,
    ObjectMeta,
    ProxyPoolSpec,
    ProxyPoolStatus,
    ProxySpec,
    ProxyStatus,
)

PLURAL = "proxies"
VERSION = "v1alpha1"
CRD_FILE = f"crds/{API_GROUP}_{PLURAL}.yaml"
POOL_PLURAL = "proxypools"
POOL_CRD_FILE = f"crds/{API_GROUP}_{POOL_PLURAL}.yaml"
POOL_PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Desired", "type": "integer", "jsonPath": ".status.desired"},
    {"name": "Ready", "type": "integer", "jsonPath": ".status.ready"},
    {"name": "Degraded", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Degraded")].status'},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]
_DROPPED = {"title", "$defs"}
PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Provider", "type": "string", "jsonPath": ".spec.provider"},
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Address", "type": "string", "jsonPath": ".status.address.host"},
    {"name": "Port", "type": "integer", "jsonPath": ".status.address.port", "priority": 1},
    {"name": "Healthy", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Healthy")].status'},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

# CEL for the Python validators of the models that a JSON schema cannot express, on the spec field each checks
# (a path of property names, `items` for an array's items). A path that no longer exists is an error.
FIELD_RULES: dict[tuple[str, ...], list[dict[str, str]]] = {
    ("allowedSourceRanges", "items"): [  # stacks.models.wire.normalise_cidr
        {
            "rule": "isIP(self) || isCIDR(self)",
            "message": "not a CIDR: write it like 203.0.113.0/24 or 2001:db8::/32",
        }
    ],
    ("egress", "allow", "items", "cidr"): [  # EgressRule._cidr
        {
            "rule": "isIP(self) || isCIDR(self)",
            "message": "egress.allow[].cidr must be an address or a range such as 203.0.113.0/24",
        }
    ],
    ("local", "bindAddress"): [  # LocalProxySpec._ip_address
        {"rule": "isIP(self)", "message": "not an IP address: use one such as 127.0.0.1"}
    ],
    ("kubernetes", "resources"): [  # KubernetesProxySpec._known_resource_keys
        {
            "rule": "self.all(k, k == 'requests' || k == 'limits')",
            "message": "unknown keys: use only `requests` and `limits`",
        }
    ],
}


def structural(schema: dict[str, Any], defs: dict[str, Any] | None = None) -> dict[str, Any]:
    """A pydantic JSON schema node as a Kubernetes structural schema node."""
    defs = schema.get("$defs", {}) if defs is None else defs
    if "$ref" in schema:
        target = defs[schema["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
        return structural(merged, defs)
    if "anyOf" in schema:
        return structural(_without_null(schema), defs)
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _DROPPED or (key == "default" and value is None):
            continue
        if key == "additionalProperties" and value is False:
            continue
        out[key] = _convert(key, value, defs)
    if isinstance(out.get("default"), dict) and "properties" in out:
        out["default"] = with_field_defaults(out["default"], out["properties"])
    return out


def with_field_defaults(value: dict[str, Any], properties: dict[str, Any]) -> dict[str, Any]:
    """`value` with every absent field's default filled in, nested, as the API server defaults an object."""
    filled = dict(value)
    for name, node in properties.items():
        if name not in filled and "default" in node:
            filled[name] = node["default"]
        if isinstance(filled.get(name), dict) and "properties" in node:
            filled[name] = with_field_defaults(filled[name], node["properties"])
    return filled


def with_field_rules(
    spec: dict[str, Any], field_rules: dict[tuple[str, ...], list[dict[str, str]]] = FIELD_RULES
) -> dict[str, Any]:
    """`spec` with the CEL rules of `field_rules` added to the fields they check."""
    for path, rules in field_rules.items():
        node: Any = spec
        for step in path:
            node = node.get(step) if step == "items" else node.get("properties", {}).get(step)
            if not isinstance(node, dict):
                raise ValueError(f"FIELD_RULES names spec.{'.'.join(path)}, which the schema does not have")
        node["x-kubernetes-validations"] = [*node.get("x-kubernetes-validations", []), *rules]
    return spec


def _convert(key: str, value: Any, defs: dict[str, Any]) -> Any:
    if key == "properties":
        return {name: structural(sub, defs) for name, sub in value.items()}
    if key in ("items", "additionalProperties") and isinstance(value, dict):
        return structural(value, defs)
    if key == "const":
        raise ValueError("`const` has no place in a CRD schema: use a one-value Literal with a default")
    return value


def _without_null(schema: dict[str, Any]) -> dict[str, Any]:
    options = [option for option in schema["anyOf"] if option.get("type") != "null"]
    if len(options) != 1:
        raise ValueError(f"cannot express anyOf {schema['anyOf']} structurally: give the field one type")
    rest = {k: v for k, v in schema.items() if k != "anyOf"}
    return {**options[0], **rest}


def _template_rules() -> dict[tuple[str, ...], list[dict[str, str]]]:
    """The Proxy spec's field rules, under the pool's template."""
    return {("template", "spec", *path): rules for path, rules in FIELD_RULES.items()}


def pool_schema() -> dict[str, Any]:
    return _object_schema(
        spec=with_field_rules(
            structural(ProxyPoolSpec.model_json_schema(by_alias=True, mode="validation")), _template_rules()
        ),
        status=structural(ProxyPoolStatus.model_json_schema(by_alias=True, mode="validation")),
        spec_description="A template, a placement over providers and a count of child Proxies.",
        description="A pool of Proxies that proxy-operator expands, spreads, rotates and scales.",
    )


def open_api_schema() -> dict[str, Any]:
    return _object_schema(
        spec=with_field_rules(structural(ProxySpec.model_json_schema(by_alias=True, mode="validation"))),
        status=structural(ProxyStatus.model_json_schema(by_alias=True, mode="validation")),
        spec_description="What to run: the provider instance, port, protocol, auth and source ranges.",
        description="A forward proxy for crawlers, provisioned by proxy-operator through Pulumi.",
    )


def _object_schema(
    *, spec: dict[str, Any], status: dict[str, Any], spec_description: str, description: str
) -> dict[str, Any]:
    """A kind's schema: its spec and status, and a name that is a DNS label (ObjectMeta)."""
    name = structural(ObjectMeta.model_json_schema(by_alias=True, mode="validation")["properties"]["name"])
    spec["description"] = spec_description
    status["description"] = "What the service observed; written by proxy-operator only."
    return {
        "type": "object",
        "description": description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            # Only name (and generateName) may be restricted here.
            "metadata": {"type": "object", "properties": {"name": name}},
            "spec": spec,
            "status": status,
        },
    }


def proxy_crd() -> dict[str, Any]:
    return _crd(
        kind=KIND,
        plural=PLURAL,
        short="px",
        columns=PRINTER_COLUMNS,
        schema=open_api_schema(),
    )


def pool_crd() -> dict[str, Any]:
    return _crd(
        kind=POOL_KIND,
        plural=POOL_PLURAL,
        short="pxp",
        columns=POOL_PRINTER_COLUMNS,
        schema=pool_schema(),
    )


def _crd(
    *, kind: str, plural: str, short: str, columns: list[dict[str, Any]], schema: dict[str, Any]
) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{API_GROUP}"},
        "spec": {
            "group": API_GROUP,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": [short],
                "categories": ["crawl"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


def render() -> str:
    header = "# GENERATED by `python -m stacks.crd` from stacks/models.py: do not edit by hand.\n"
    return header + yaml.safe_dump(proxy_crd(), sort_keys=False, width=110)


def render_pool() -> str:
    header = "# GENERATED by `python -m stacks.crd pool` from stacks/models/pool.py: do not edit by hand.\n"
    return header + yaml.safe_dump(pool_crd(), sort_keys=False, width=110)


if __name__ == "__main__":
    sys.stdout.write(render_pool() if sys.argv[1:] == ["pool"] else render())
