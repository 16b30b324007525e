"""Editing an exported deployment: forget proxy components and everything parented under them."""

from __future__ import annotations

import copy
from typing import Any

from automation.engine.events import COMPONENT_TYPE, urn_name, urn_type


def remove_components(deployment: dict[str, Any], names: list[str]) -> tuple[dict[str, Any], list[str]]:
    """Return (edited copy, forgotten URNs). A component named `ns/name` goes with all its descendants."""
    resources = deployment.get("resources") or []
    wanted = set(names)
    doomed = {
        r["urn"] for r in resources if urn_type(r["urn"]) == COMPONENT_TYPE and urn_name(r["urn"]) in wanted
    }
    grew = True
    while grew:  # parents come before children in a deployment, but don't rely on it
        before = len(doomed)
        doomed |= {r["urn"] for r in resources if r.get("parent") in doomed}
        grew = len(doomed) != before
    if not doomed:
        return deployment, []
    edited = copy.deepcopy(deployment)
    edited["resources"] = [r for r in resources if r["urn"] not in doomed]
    for resource in edited["resources"]:
        # Nothing that stays may point at what went: drop dangling dependencies.
        for key in ("dependencies",):
            if resource.get(key):
                resource[key] = [urn for urn in resource[key] if urn not in doomed]
        for prop, deps in list((resource.get("propertyDependencies") or {}).items()):
            resource["propertyDependencies"][prop] = [urn for urn in deps if urn not in doomed]
    edited.pop("pending_operations", None)
    return edited, sorted(doomed)
