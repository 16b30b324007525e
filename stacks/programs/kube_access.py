"""Before the kubernetes program declares a proxy: may its credentials manage the objects it declares?

The Kubernetes provider meets a missing RBAC permission only at the object it concerns, after the others of
the proxy were made (a Service created, its NetworkPolicy refused), and reports it as a failed create, which
no retry fixes. So the program first asks the cluster what its user may do in the entry's namespace (one
SelfSubjectRulesReview, which every authenticated user may make) and, when a verb the provider uses on a kind
the program manages is missing, stops before anything is declared with `AccessDeniedError`, naming the user
and every missing permission. Its message begins with "403 Forbidden", which the automation layer reads as
rejected credentials: a permanent error on the stack's Proxies, retried when the input changes or at resync.

When the cluster cannot answer or says its answer is incomplete (an authorizer other than RBAC), nothing is
decided here and the provider reports what it meets. Under Pulumi mocks no cluster is asked.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import yaml
from kubernetes import client as kube_client
from kubernetes import config as kube_config
from kubernetes.config.config_exception import ConfigException
from pulumi.runtime.mocks import MockMonitor
from pulumi.runtime.settings import get_monitor
from urllib3.exceptions import HTTPError

# (API group, resource) of every kind the program declares, and the verbs the provider uses on them:
# server-side apply is a patch that may create, refresh is a get, deletion a delete, await a list + watch.
MANAGED_KINDS = (
    ("", "secrets"),
    ("", "services"),
    ("apps", "deployments"),
    ("networking.k8s.io", "networkpolicies"),
)
VERBS = ("get", "list", "watch", "create", "patch", "delete")
# What the provider's await reads while a Deployment rolls out and a Service gets endpoints (its Deployment
# awaiter also watches the namespace's PersistentVolumeClaims): without one of these an `up` does not fail,
# it waits until the await's timeout with the pods long Ready, so the check names them too.
AWAITED_KINDS = (
    ("", "pods"),
    ("", "events"),
    ("", "endpoints"),
    ("", "persistentvolumeclaims"),
    ("apps", "replicasets"),
)
READ_VERBS = ("get", "list", "watch")
RBAC_HINT = "the Role proxy-operator-workloads in deploy/rbac.yaml"
TIMEOUT_SECONDS = 10


class AccessDeniedError(Exception):
    """The cluster would refuse (HTTP 403) verbs the provider needs on the program's objects."""


def missing_permissions(rules: Iterable[Mapping[str, Any]]) -> list[str]:
    """`resource.group (verb, ...)` for each managed kind lacking a verb under `rules` (RBAC resource rules
    of one namespace, as a SelfSubjectRulesReview returns them). Rules limited to resourceNames do not count:
    the Secrets' names are generated."""
    missing = []
    wanted = [(kind, VERBS) for kind in MANAGED_KINDS] + [(kind, READ_VERBS) for kind in AWAITED_KINDS]
    for (group, resource), verbs in wanted:
        granted = set()
        for rule in rules:
            if rule.get("resourceNames"):
                continue
            if _matches(rule.get("apiGroups"), group) and _matches(rule.get("resources"), resource):
                granted |= set(rule.get("verbs") or ())
        lacking = [verb for verb in verbs if verb not in granted and "*" not in granted]
        if lacking:
            missing.append(f"{resource}{'.' + group if group else ''} ({', '.join(lacking)})")
    return missing


def _matches(values: Iterable[str] | None, wanted: str) -> bool:
    return any(value in (wanted, "*") for value in values or ())


def check_access(*, kubeconfig: str | None, namespace: str, provider: str) -> None:
    """Raise AccessDeniedError when the user of `kubeconfig` (None: the ambient configuration, as the
    provider finds it) lacks a permission the program needs in `namespace`; else return."""
    if isinstance(get_monitor(), MockMonitor):
        return
    api = _api_client(kubeconfig)
    if api is None:
        return
    with api:
        try:
            rules = _resource_rules(api, namespace)
            if rules is None:
                return
            missing = missing_permissions(rules)
            if not missing:
                return
            user = _username(api)
        except (kube_client.ApiException, HTTPError, OSError):
            return  # the provider meets the cluster's own answer and reports it
    raise AccessDeniedError(
        f"403 Forbidden: {user} may not manage the proxies' objects of provider '{provider}' in namespace "
        f"'{namespace}': it lacks {'; '.join(missing)}. No Kubernetes object was created or changed. Grant "
        f"these verbs (see {RBAC_HINT}) or name another user's kubeconfig in kubeconfigSecret."
    )


def _api_client(kubeconfig: str | None) -> kube_client.ApiClient | None:
    """A client as the provider would connect: the given kubeconfig, else $KUBECONFIG or ~/.kube/config,
    else the in-cluster ServiceAccount; None when there is no usable configuration."""
    try:
        if kubeconfig is not None:
            document = yaml.safe_load(kubeconfig)
            if not isinstance(document, dict):
                return None
            return kube_config.new_client_from_config_dict(document)
        if os.environ.get("KUBECONFIG") or os.path.exists(os.path.expanduser("~/.kube/config")):
            return kube_config.new_client_from_config()
        configuration = kube_client.Configuration()
        kube_config.load_incluster_config(client_configuration=configuration)
        return kube_client.ApiClient(configuration)
    except (ConfigException, yaml.YAMLError, OSError, ValueError, TypeError):
        return None


def _resource_rules(api: kube_client.ApiClient, namespace: str) -> list[dict[str, Any]] | None:
    review = kube_client.AuthorizationV1Api(api).create_self_subject_rules_review(
        kube_client.V1SelfSubjectRulesReview(
            spec=kube_client.V1SelfSubjectRulesReviewSpec(namespace=namespace)
        ),
        _request_timeout=TIMEOUT_SECONDS,
    )
    status = review.status
    if status is None or status.incomplete:
        return None
    return [api.sanitize_for_serialization(rule) for rule in status.resource_rules or ()]


def _username(api: kube_client.ApiClient) -> str:
    try:
        review = kube_client.AuthenticationV1Api(api).create_self_subject_review(
            kube_client.V1SelfSubjectReview(), _request_timeout=TIMEOUT_SECONDS
        )
    except (kube_client.ApiException, HTTPError, OSError):
        return "the kubeconfig's user"
    user = review.status.user_info if review.status else None
    return f'User "{user.username}"' if user and user.username else "the kubeconfig's user"
