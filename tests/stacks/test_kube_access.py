"""Which RBAC rules let the kubernetes program's provider manage its objects (the cluster side runs in
tests/kube/test_kubernetes_program_engine.py, against a real API server)."""

from __future__ import annotations

from typing import Any

import pytest

from stacks.programs.kube_access import VERBS, check_access, missing_permissions

ALL = list(VERBS)


def rule(groups: list[str], resources: list[str], verbs: list[str], **extra: Any) -> dict[str, Any]:
    return {"apiGroups": groups, "resources": resources, "verbs": verbs, **extra}


def test_the_documented_role_is_enough() -> None:
    rules = [
        rule([""], ["secrets", "services"], [*ALL, "update"]),
        rule(["apps"], ["deployments"], ALL),
        rule(["networking.k8s.io"], ["networkpolicies"], ALL),
    ]
    assert missing_permissions(rules) == []


def test_wildcards_grant_everything() -> None:
    assert missing_permissions([rule(["*"], ["*"], ["*"])]) == []


def test_each_missing_kind_and_verb_is_named() -> None:
    rules = [
        rule([""], ["secrets", "services"], ALL),
        rule(["apps"], ["deployments"], ["get", "list", "watch"]),
    ]

    assert missing_permissions(rules) == [
        "deployments.apps (create, patch, delete)",
        "networkpolicies.networking.k8s.io (get, list, watch, create, patch, delete)",
    ]


def test_rules_limited_to_names_and_other_groups_do_not_count() -> None:
    rules = [
        rule([""], ["secrets"], ALL, resourceNames=["px-crawl-a"]),  # the Secrets' names are generated
        rule(["extensions"], ["services", "deployments", "networkpolicies"], ALL),
    ]
    assert len(missing_permissions(rules)) == 4


def test_no_cluster_is_asked_without_a_usable_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/nonexistent")
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)

    check_access(kubeconfig=None, namespace="proxies", provider="in-cluster")  # nothing to ask: no error
    check_access(kubeconfig="not: [a kubeconfig", namespace="proxies", provider="in-cluster")
