"""Is the replica that holds a stack lock gone? The evidence the engine needs before `pulumi cancel`.

A stack lock records the host of the process that took it; in a cluster that is the pod's name, which is
also its identity in the Lease. The lock of a replica that crashed or was replaced stays behind and blocks
every later operation on its stack. It is safe to cancel once that replica cannot be running Pulumi any
more: it no longer holds the Lease and either its pod is gone (404 in our namespace) or the Lease left it
more than `lock_grace_seconds` ago (a leader stops its work before its Lease expires, so a live replica
that lost the Lease has stopped its children long before the grace ends). Anything uncertain answers
False: the lock stays a transient error and is tried again.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from kubernetes.client import ApiClient

from service.kube.client import ApiException, request_json
from service.kube.lease import API_ERRORS, LeaseRecord, read_lease, utcnow
from service.kube.settings import KubeSettings

__all__ = ["lease_holder_gone", "why_holder_gone"]

log = logging.getLogger(__name__)
TIMEOUT = 10.0


def lease_holder_gone(api: ApiClient, settings: KubeSettings, identity: str) -> bool:
    """True when the replica `identity` is gone for good (see the module's docstring). Blocking."""
    why = why_holder_gone(api, settings, identity)
    if why:
        log.info("replica %s is gone: %s", identity, why)
    return why is not None


def why_holder_gone(api: ApiClient, settings: KubeSettings, identity: str) -> str | None:
    """Why `identity` is gone, or None when it may still be running (or the answer is unknown)."""
    namespace = settings.own_namespace()
    try:
        lease = read_lease(api, namespace=namespace, name=settings.lease_name, timeout=TIMEOUT)
    except API_ERRORS as exc:
        log.warning("cannot read Lease %s/%s: %s", namespace, settings.lease_name, exc)
        return None
    record = lease.record if lease is not None else LeaseRecord()
    if record.holder == identity:
        return None
    left = _left_at_least(record, settings.lock_grace_seconds)
    if left:
        return left
    if _pod_missing(api, namespace, identity):
        return f"it does not hold Lease {settings.lease_name} and pod {namespace}/{identity} does not exist"
    return None


def _left_at_least(record: LeaseRecord, grace: float) -> str | None:
    """The Lease changed hands more than `grace` seconds ago: the new holder's acquireTime (or a release's
    renewTime) is the latest moment the old holder can have held it."""
    since = record.acquired if record.holder else record.renewed
    if since is None:
        return None
    age = utcnow() - since
    if age <= timedelta(seconds=grace):
        return None
    holder = f"is held by {record.holder}" if record.holder else "was released"
    return f"the Lease {holder} since {age.total_seconds():.0f} s (grace {grace:g} s)"


def _pod_missing(api: ApiClient, namespace: str, name: str) -> bool:
    try:
        request_json(api, "GET", f"/api/v1/namespaces/{namespace}/pods/{name}", timeout=TIMEOUT)
    except ApiException as exc:
        if exc.status == 404:
            return True
        log.warning("cannot read pod %s/%s: %s %s", namespace, name, exc.status, exc.reason)
    except API_ERRORS as exc:
        log.warning("cannot read pod %s/%s: %s", namespace, name, exc)
    return False
