"""Is the replica that holds a stack lock gone? The evidence the engine needs before `pulumi cancel`.

A stack lock records the host of the process that took it; in a cluster that is the pod's name, which is
also its identity in the Lease. The lock of a replica that crashed or was replaced stays behind and blocks
every later operation on its stack. It is cancelled only on evidence that its owner cannot be running
Pulumi any more, never on a timer:

- the owner's operations heartbeat (`service.kube.heartbeat`) has expired: it has not renewed for longer
  than any child of its may run (the watchdog interrupts a child whose term is not renewed, and a term is
  never renewed past what the heartbeat covers); or
- the heartbeat was released: the owner ended its term with no child left; or
- the owner's pod does not exist (404 in our namespace): a kubelet removes a pod only once its processes are
  dead.

The current leader's locks are never stale (it is the one writer). Anything uncertain answers None: the
lock stays a transient error, tried again, and the stack's status says whose lock it waits for.
"""

from __future__ import annotations

import logging

from kubernetes.client import ApiClient

from service.kube.client import ApiException, request_json
from service.kube.heartbeat import heartbeat_name
from service.kube.lease import API_ERRORS, read_lease, utcnow
from service.kube.settings import KubeSettings

__all__ = ["lease_holder_gone", "why_holder_gone"]

log = logging.getLogger(__name__)
TIMEOUT = 10.0


def lease_holder_gone(api: ApiClient, settings: KubeSettings, identity: str) -> bool:
    """True when the replica `identity` is gone for good (see the module's docstring). Blocking."""
    why = why_holder_gone(api, settings, identity)
    if why:
        log.info("replica %s is gone: %s", identity, why)
    else:
        log.info("replica %s may still run operations: its stack locks stay", identity)
    return why is not None


def why_holder_gone(api: ApiClient, settings: KubeSettings, identity: str) -> str | None:
    """Why `identity` cannot be running Pulumi any more, or None when it may be (or nobody can tell)."""
    namespace = settings.own_namespace()
    try:
        leader = read_lease(api, namespace=namespace, name=settings.lease_name, timeout=TIMEOUT)
        if leader is not None and leader.record.holder == identity and not leader.record.free(utcnow()):
            return None
        name = heartbeat_name(settings, identity)
        heartbeat = read_lease(api, namespace=namespace, name=name, timeout=TIMEOUT)
    except API_ERRORS as exc:
        log.warning("cannot read the Leases of %s: %s", identity, exc)
        return None
    if heartbeat is not None:
        record = heartbeat.record
        if record.holder is None:
            return (
                f"its operations heartbeat {name} was released at {record.renewed}: no operation of it runs"
            )
        expires = record.expires()
        if expires is not None and expires < utcnow():
            return f"its operations heartbeat {name} expired at {expires.isoformat()}"
    if _pod_missing(api, namespace, identity):
        return f"pod {namespace}/{identity} does not exist"
    return None


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
