"""The marks our resources carry: the programs set them, `orphans` looks for them.

Kubernetes objects: `app.kubernetes.io/managed-by=proxy-operator` and `crawl.example.com/installation=<id>`
(on the objects' metadata only: never on a pod template or selector, so adding it rolls no pod). GCP
instances, addresses and secrets: the labels `managed-by=proxy-operator` and `installation=<id>`; firewall
rules take no labels, so their description carries the same words. libvirt domains: the description
`managed-by=proxy-operator ... installation=<id>`. An installation id is squeezed into each kind's label
value the same way on both sides (`kubernetes_value`, `gcp_value`).
"""

from __future__ import annotations

import hashlib
import re

MANAGED_BY = "proxy-operator"
LABEL_PREFIX = "crawl.example.com"
K8S_MANAGED_BY = "app.kubernetes.io/managed-by"
K8S_INSTALLATION = f"{LABEL_PREFIX}/installation"
GCP_MANAGED_BY = "managed-by"
GCP_INSTALLATION = "installation"
WORD_MANAGED_BY = "managed-by"  # in a description: `key=value` words separated by spaces
WORD_INSTALLATION = "installation"


def short_hash(text: str, length: int = 8) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def label_value(text: str, *, allowed: str = r"[^A-Za-z0-9_.-]", max_length: int = 63) -> str:
    """Squeeze `text` into a label value; an over-long value keeps a hash so two proxies never collide."""
    value = re.sub(allowed, "_", text)
    if len(value) > max_length:
        suffix = short_hash(text)
        value = f"{value[: max_length - len(suffix) - 1]}-{suffix}"
    return value.strip("_.-") or "x"


def gcp_value(text: str) -> str:
    """GCP label values: lowercase letters, digits, `-` and `_`, at most 63 characters."""
    return label_value(text.lower(), allowed=r"[^a-z0-9_-]")


def kubernetes_installation_labels(installation: str | None) -> dict[str, str]:
    return {K8S_INSTALLATION: label_value(installation)} if installation else {}


def gcp_installation_labels(installation: str | None) -> dict[str, str]:
    return {GCP_INSTALLATION: gcp_value(installation)} if installation else {}


def description_words(**words: str | None) -> str:
    """`managed-by=proxy-operator key=value ...` (values without spaces; None left out)."""
    pairs = {WORD_MANAGED_BY: MANAGED_BY, **{k.replace("_", "-"): v for k, v in words.items() if v}}
    return " ".join(f"{key}={word_value(value)}" for key, value in pairs.items())


def word_value(text: str) -> str:
    return re.sub(r"\s+", "_", text)


def read_words(description: str) -> dict[str, str]:
    """The `key=value` words of a description (anything else in it is ignored)."""
    return dict(word.split("=", 1) for word in description.split() if "=" in word)


def carries_installation(description: str, installation: str) -> bool:
    """A description marked as ours and as this installation's (`description_words`)."""
    words = read_words(description)
    ours = words.get(WORD_MANAGED_BY) == MANAGED_BY
    return ours and words.get(WORD_INSTALLATION) == word_value(installation)
