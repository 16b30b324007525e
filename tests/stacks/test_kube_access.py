"""Which RBAC rules let the kubernetes program's provider manage its objects (the cluster side runs in
tests/kube/test_kubernetes_program_engine.py, against a real API server)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from stacks.programs.kube_access import VERBS, check_access, missing_permissions
from tests.conftest import ROOT

ALL = list(VERBS)


def rule(groups: list[str], resources: list[str], verbs: list[str], **extra: Any) -> dict[str, Any]:
    return {"apiGroups": groups, "resources": resources, "verbs": verbs, **extra}


READ = ["get", "list", "watch"]
AWAITED = [
    rule([""], ["pods", "events", "endpoints", "persistentvolumeclaims"], READ),
    rule(["apps"], ["replicasets"], READ),
]


def test_the_documented_role_is_enough() -> None:
    documents = yaml.safe_load_all((ROOT / "deploy" / "rbac.yaml").read_text())
    [role] = [
        d
        for d in documents
        if d and d["kind"] == "Role" and d["metadata"]["name"] == "proxy-operator-workloads"
    ]
    assert missing_permissions(role["rules"]) == []


def test_what_the_await_reads_is_named_when_missing() -> None:
    """Seen on the test node: without `persistentvolumeclaims` the provider's Deployment await waited for
    its timeout with the pod Ready. The check names it before anything is created."""
    rules = [
        rule([""], ["secrets", "services"], ALL),
        rule(["apps"], ["deployments"], ALL),
        rule(["networking.k8s.io"], ["networkpolicies"], ALL),
        rule([""], ["pods", "events", "endpoints"], READ),
        rule(["apps"], ["replicasets"], ["get"]),
    ]
    assert missing_permissions(rules) == [
        "persistentvolumeclaims (get, list, watch)",
        "replicasets.apps (list, watch)",
    ]


def test_wildcards_grant_everything() -> None:
    assert missing_permissions([rule(["*"], ["*"], ["*"])]) == []


def test_each_missing_kind_and_verb_is_named() -> None:
    rules = [
        rule([""], ["secrets", "services"], ALL),
        rule(["apps"], ["deployments"], ["get", "list", "watch"]),
        *AWAITED,
    ]

    assert missing_permissions(rules) == [
        "deployments.apps (create, patch, delete)",
        "networkpolicies.networking.k8s.io (get, list, watch, create, patch, delete)",
    ]


def test_rules_limited_to_names_and_other_groups_do_not_count() -> None:
    rules = [
        rule([""], ["secrets"], ALL, resourceNames=["px-crawl-a"]),  # the Secrets' names are generated
        rule(["extensions"], ["services", "deployments", "networkpolicies"], ALL),
        *AWAITED,
    ]
    assert len(missing_permissions(rules)) == 4


def test_no_cluster_is_asked_without_a_usable_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/nonexistent")
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)

    check_access(kubeconfig=None, namespace="proxies", provider="in-cluster")  # nothing to ask: no error
    check_access(kubeconfig="not: [a kubeconfig", namespace="proxies", provider="in-cluster")
