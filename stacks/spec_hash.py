"""Spec hashes: what decides a proxy's resources, and a stack's, as SHA-256 over canonical JSON.

A stack runs `up` when its hash changes, so the hash holds exactly the inputs of the program: a proxy's
namespace, name and spec (defaults included, so writing a default out does not change it) and the catalogue
entry. Status, labels, the selection-only `pool` and annotations are left out.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from stacks.models import ProviderEntry, Proxy

# Annotations whose value changes what a program builds; none today. Listed ones join the hash.
RESOURCE_ANNOTATIONS: tuple[str, ...] = ()
# Spec fields that only select (discovery pools), never shape a resource.
SELECTION_ONLY_FIELDS = frozenset({"pool"})


# What json.dumps(ensure_ascii=False) writes as an escape in a string: the quote, the backslash, controls.
_ESCAPED = re.compile(r'["\\\x00-\x1f]')


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
    """The catalogue entry plus every proxy's hash keyed by `ns/name`, in key order: SHA-256 of the
    canonical JSON of `{"provider": entry, "proxies": [[key, hash], ...]}`."""
    fragments = (proxy_hash_fragment(key, proxy_hashes[key]) for key in sorted(proxy_hashes))
    return stack_spec_hash_joined(entry_hash_text(entry), ",".join(fragments).encode())


def entry_hash_text(entry: ProviderEntry) -> str:
    """The catalogue entry's part of a stack's hash document."""
    return canonical_json(entry.model_dump(by_alias=True, mode="json"))


def proxy_hash_fragment(key: str, proxy_hash: str) -> str:
    """One proxy's item of a stack's hash document, `["ns/name","<hash>"]`, as `canonical_json` gives it: put
    together directly when neither string has a character JSON escapes (a Kubernetes name and a hex hash
    never do; the planner makes one per proxy at each plan of its stack)."""
    if _ESCAPED.search(key) is None and _ESCAPED.search(proxy_hash) is None:
        return '["' + key + '","' + proxy_hash + '"]'
    return canonical_json([key, proxy_hash])


def stack_spec_hash_joined(entry_text: str, joined: bytes | bytearray) -> str:
    """The stack hash from its parts: the entry's text and the proxies' items in key order, joined by ","
    and encoded (UTF-8), fed as the same text `canonical_json` gives for the whole document ("provider"
    sorts before "proxies"; items joined by "," as its separators say). The planner keeps each stack's
    joined items and rewrites one proxy's in place (automation/stack_view.py)."""
    digest = hashlib.sha256(('{"provider":' + entry_text + ',"proxies":[').encode())
    digest.update(joined)
    digest.update(b"]}")
    return digest.hexdigest()
