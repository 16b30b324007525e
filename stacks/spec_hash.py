"""Spec hashes: what decides a proxy's resources, and a stack's, as SHA-256 over canonical JSON.

A stack runs `up` when its hash changes, so the hash holds exactly the inputs of the program: a proxy's
namespace, name and spec (defaults included, so writing a default out does not change it) and the catalogue
entry. Status, labels, the selection-only `pool` and annotations are left out.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from stacks.models import ProviderEntry, Proxy

# Annotations whose value changes what a program builds; none today. Listed ones join the hash.
RESOURCE_ANNOTATIONS: tuple[str, ...] = ()
# Spec fields that only select (discovery pools), never shape a resource.
SELECTION_ONLY_FIELDS = frozenset({"pool"})


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, UTF-8 kept: equal data gives equal text whatever the key order."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_hex(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def proxy_hash_input(proxy: Proxy) -> dict[str, Any]:
    """The document the proxy hash is taken over (exposed so a test or a log can show it)."""
    annotations = proxy.metadata.annotations
    return {
        "namespace": proxy.metadata.namespace,
        "name": proxy.metadata.name,
        "spec": proxy.spec.model_dump(by_alias=True, mode="json", exclude=set(SELECTION_ONLY_FIELDS)),
        "annotations": {key: annotations[key] for key in RESOURCE_ANNOTATIONS if key in annotations},
    }


def proxy_spec_hash(proxy: Proxy) -> str:
    return sha256_hex(proxy_hash_input(proxy))


def stack_spec_hash(entry: ProviderEntry, proxy_hashes: Mapping[str, str]) -> str:
    """The catalogue entry plus every proxy's hash keyed by `ns/name`, in key order."""
    document = {
        "provider": entry.model_dump(by_alias=True, mode="json"),
        "proxies": [[key, proxy_hashes[key]] for key in sorted(proxy_hashes)],
    }
    return sha256_hex(document)
