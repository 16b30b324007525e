"""Loading the provider catalogue: YAML with a top-level `providers` list, or a ConfigMap holding it.

In a cluster the catalogue is the key `providers.yaml` of a ConfigMap; on a laptop it is a plain file. Both
shapes go through `catalogue_body`, so every reader accepts the same two forms.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from stacks.models import ProviderCatalogue

CONFIGMAP_KEY = "providers.yaml"


class CatalogueFormatError(ValueError):
    """The document is neither `{providers: [...]}` nor a ConfigMap with `providers.yaml`."""


def is_catalogue_document(document: Any) -> bool:
    """True for `{providers: [...]}` without a kind, and for a ConfigMap carrying `providers.yaml`."""
    if not isinstance(document, Mapping):
        return False
    if document.get("kind") == "ConfigMap":
        return CONFIGMAP_KEY in (document.get("data") or {})
    return "kind" not in document and "providers" in document


def catalogue_body(document: Mapping[str, Any]) -> Mapping[str, Any]:
    """The `{providers: [...]}` mapping, unwrapped from a ConfigMap when needed."""
    if document.get("kind") != "ConfigMap":
        return document
    name = (document.get("metadata") or {}).get("name", "?")
    text = (document.get("data") or {}).get(CONFIGMAP_KEY)
    if not isinstance(text, str):
        raise CatalogueFormatError(
            f"ConfigMap {name} has no data key {CONFIGMAP_KEY}: put the catalogue there"
        )
    try:
        body = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CatalogueFormatError(f"ConfigMap {name} key {CONFIGMAP_KEY} is not YAML: {exc}") from exc
    if not isinstance(body, Mapping):
        raise CatalogueFormatError(
            f"ConfigMap {name} key {CONFIGMAP_KEY} must hold a mapping with a `providers` list"
        )
    return body


def parse_catalogue(document: Mapping[str, Any]) -> ProviderCatalogue:
    """Validate either shape; raises CatalogueFormatError or pydantic.ValidationError."""
    return ProviderCatalogue.model_validate(catalogue_body(document))


def load_catalogue(path: Path) -> ProviderCatalogue:
    """Read a single-document catalogue file (plain or ConfigMap)."""
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not is_catalogue_document(document):
        raise CatalogueFormatError(
            f"{path} holds no catalogue: write a top-level `providers:` list, or a ConfigMap with the key "
            f"{CONFIGMAP_KEY}"
        )
    return parse_catalogue(document)


def catalogue_configmap(catalogue: ProviderCatalogue, *, name: str, namespace: str) -> dict[str, Any]:
    """The ConfigMap that carries `catalogue` into a cluster."""
    body = {"providers": [entry.model_dump(by_alias=True, mode="json") for entry in catalogue.providers]}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "data": {CONFIGMAP_KEY: yaml.safe_dump(body, sort_keys=False)},
    }
