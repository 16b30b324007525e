"""Editing an exported deployment: forget proxy components and everything parented under them."""

from __future__ import annotations

import copy
from typing import Any

from automation.engine.events import COMPONENT_TYPE, urn_name, urn_type


def remove_components(
    deployment: dict[str, Any], names: list[str]
) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """Return (edited copy, {name: forgotten URNs}). A component `ns/name` goes with all its descendants."""
    resources = deployment.get("resources") or []
    wanted = set(names)
    owner = {
        r["urn"]: urn_name(r["urn"])
        for r in resources
        if urn_type(r["urn"]) == COMPONENT_TYPE and urn_name(r["urn"]) in wanted
    }
    grew = True
    while grew:  # parents come before children in a deployment, but don't rely on it
        before = len(owner)
        owner |= {r["urn"]: owner[r["parent"]] for r in resources if r.get("parent") in owner}
        grew = len(owner) != before
    doomed = set(owner)
    forgotten: dict[str, list[str]] = {
        name: sorted(u for u, n in owner.items() if n == name) for name in names
    }
    if not doomed:
        return deployment, forgotten
    edited = copy.deepcopy(deployment)
    edited["resources"] = [r for r in resources if r["urn"] not in doomed]
    for resource in edited["resources"]:
        # Nothing that stays may point at what went: drop dangling dependencies.
        for key in ("dependencies",):
            if resource.get(key):
                resource[key] = [urn for urn in resource[key] if urn not in doomed]
        for prop, deps in list((resource.get("propertyDependencies") or {}).items()):
            resource["propertyDependencies"][prop] = [urn for urn in deps if urn not in doomed]
    return edited, forgotten
