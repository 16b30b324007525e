"""Documents that look like ours but are not exactly ours: a misspelt kind, an unknown version, a near group.

A folder of manifests mixes our objects with others (ConfigMaps, Secrets, a Kustomization), and a document
that is not ours is set aside. A document *meant* as a Proxy must not be set aside: `kind: proxy` would read
as "no Proxy here", and a clean read declares that Proxy deleted. So a document counts as meant for us when
its group is ours (any version), its group is within two edits of ours, or its kind is within two edits of
`Proxy` or `ProxyPool` (any apiVersion, none included); such a document that is not exactly one of our kinds
with our apiVersion is refused with a "did you mean". The same goes for a near miss of the catalogue
ConfigMap's kind. requirements.lock has no edit-distance library, so `distance` is the textbook
Damerau-Levenshtein below (difflib has no distance; it only suggests a kind when none is within two edits).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from stacks.catalogue import CONFIGMAP_KEY
from stacks.models import API_GROUP, API_VERSION, KIND, POOL_KIND

OUR_KINDS = (KIND, POOL_KIND)
CATALOGUE_KIND = "ConfigMap"
NEAR = 2  # edits (insert, delete, substitute, swap two neighbours), compared case-insensitively
UNTIL_FIXED = "nothing is deleted until this is fixed"


def distance(a: str, b: str) -> int:
    """Damerau-Levenshtein distance: inserts, deletes, substitutions and swaps of two neighbours, where
    an edit may touch what another made (Lowrance-Wagner)."""
    far = len(a) + len(b)
    rows = [[far] * (len(b) + 2), [far, *range(len(b) + 1)]]
    rows += [[far, i, *[0] * len(b)] for i in range(1, len(a) + 1)]
    last_row: dict[str, int] = {}
    for i in range(1, len(a) + 1):
        last_col = 0
        for j in range(1, len(b) + 1):
            k, cost = last_row.get(b[j - 1], 0), int(a[i - 1] != b[j - 1])
            rows[i + 1][j + 1] = min(
                rows[i][j] + cost,  # substitute (or keep)
                rows[i + 1][j] + 1,  # insert
                rows[i][j + 1] + 1,  # delete
                rows[k][last_col] + (i - k - 1) + 1 + (j - last_col - 1),  # swap, edits between
            )
            if not cost:
                last_col = j
        last_row[a[i - 1]] = i
    return rows[len(a) + 1][len(b) + 1]


def is_near(word: str, target: str) -> bool:
    return distance(word.lower(), target.lower()) <= NEAR


def closest_kind(kind: str) -> str | None:
    """Our kind within two edits of `kind` (the nearer one; Proxy on a tie), else None."""
    near = [(distance(kind.lower(), ours.lower()), ours) for ours in OUR_KINDS if is_near(kind, ours)]
    return min(near)[1] if near else None


def not_ours_message(document: Mapping[str, Any]) -> str | None:
    """Why a document that looks meant for us is not one of our objects, with the fix; None for one of ours
    exactly, and for a document of another group with an unrelated kind."""
    kind, api = _text(document.get("kind")), _text(document.get("apiVersion"))
    if kind in OUR_KINDS and api == API_VERSION:
        return None
    group, _, version = (api or "").rpartition("/")
    in_group = group == API_GROUP
    near_group = bool(group) and not in_group and is_near(group, API_GROUP)
    guess = closest_kind(kind) if kind is not None else None
    if not (in_group or near_group or guess is not None):
        return None
    found = f'kind "{kind}" with apiVersion {api}' if api is not None else f'kind "{kind}" without apiVersion'
    if kind is None:
        wrong = f"the document with apiVersion {api} has no kind"
    elif near_group:
        wrong = f"{found} is not in the group {API_GROUP}"
    elif kind in OUR_KINDS and in_group:
        wrong = f"{found} is not a version of {API_GROUP} this operator reads ({version} is not served)"
    elif kind in OUR_KINDS:
        wrong = f"{found} is not the {kind} of {API_GROUP}"
    else:
        wrong = f"{found} is not a kind of {API_GROUP}"
    return f"{wrong} ({_did_you_mean(kind, api, guess)}); {UNTIL_FIXED}"


def catalogue_near_miss(document: Mapping[str, Any]) -> str | None:
    """A ConfigMap carrying the catalogue whose kind is misspelt (`Configmap`): the hint, else None."""
    kind, data = _text(document.get("kind")), document.get("data")
    if kind is None or kind == CATALOGUE_KIND or not is_near(kind, CATALOGUE_KIND):
        return None
    if not isinstance(data, Mapping) or CONFIGMAP_KEY not in data:
        return None
    return (
        f'kind "{kind}" with the data key {CONFIGMAP_KEY} is not a {CATALOGUE_KIND}, so the provider '
        f'catalogue in it is not read (did you mean "{CATALOGUE_KIND}"?); {UNTIL_FIXED}'
    )


def _did_you_mean(kind: str | None, api: str | None, guess: str | None) -> str:
    if kind in OUR_KINDS:
        return (
            f"did you mean {API_VERSION}?" if api is not None else f"did you mean apiVersion {API_VERSION}?"
        )
    if guess is None and kind is not None:
        lowered = {ours.lower(): ours for ours in OUR_KINDS}
        loose = difflib.get_close_matches(kind.lower(), list(lowered), n=1)
        guess = lowered[loose[0]] if loose else None
    api_fix = "" if api == API_VERSION else f" with apiVersion {API_VERSION}"
    if guess is None:
        return f'its kinds are "{KIND}" and "{POOL_KIND}"' + (f"; use{api_fix}" if api_fix else "")
    return f'did you mean "{guess}"{api_fix}?'


def _text(value: Any) -> str | None:
    return None if value is None else str(value)
