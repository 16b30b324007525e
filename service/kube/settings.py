"""Settings of the in-cluster mode (`PROXY_OPERATOR_KUBE_<FIELD>`), every field with a safe default."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# Where the kubelet mounts a pod's ServiceAccount (token, ca.crt, namespace).
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class KubeSettings(BaseSettings):
    """What the Kubernetes source watches, and how replicas elect the one that reconciles."""

    model_config = SettingsConfigDict(env_prefix="PROXY_OPERATOR_KUBE_", extra="forbid")

    kubeconfig: Path | None = Field(
        None, description="A kubeconfig file; default: the pod's ServiceAccount (in-cluster configuration)."
    )
    service_account_dir: Path = Field(
        SERVICE_ACCOUNT_DIR,
        description="Without a kubeconfig: the folder holding the ServiceAccount's `token`, `ca.crt` and "
        "`namespace` (the kubelet's mount in a pod; the API server's address comes from "
        "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT).",
    )
    namespaces: list[str] = Field(
        default_factory=list, description="Namespaces whose Proxies are watched; empty: all namespaces."
    )
    namespace: str | None = Field(
        None,
        description="The service's own namespace (catalogue ConfigMap, Lease); default: the pod's namespace, "
        "else `proxy-operator`.",
    )
    catalogue_configmap: str = Field(
        "proxy-operator-providers", description="ConfigMap holding the provider catalogue."
    )
    catalogue_key: str = Field("providers.yaml", description="Key of that ConfigMap holding the catalogue.")
    identity: str = Field(
        default_factory=socket.gethostname,
        description="This replica's identity in the Lease (and in stack locks); default: the host name.",
    )
    lease_name: str = Field("proxy-operator", description="The Lease (coordination.k8s.io) to elect by.")
    pod_labels: dict[str, str] = Field(
        default_factory=lambda: {"app.kubernetes.io/name": "proxy-operator"},
        description="Labels that select this service's pods (deploy/deployment.yaml's): proxy pods' "
        "NetworkPolicies let the health probe reach these pods on the listen port.",
    )
    lease_duration_seconds: float = Field(
        15.0, gt=0, le=300, description="A leader that has not renewed for this long loses the Lease."
    )
    renew_deadline_seconds: float = Field(
        10.0, gt=0, le=300, description="A leader that cannot renew within this long stops its work."
    )
    retry_period_seconds: float = Field(2.0, gt=0, le=60, description="How often the Lease is tried.")
    loop_stall_seconds: float = Field(
        30.0,
        gt=0,
        le=600,
        description="A leader whose event loop has not run for this long stops renewing its Lease (renewals "
        "come from a thread of their own): a wedged process gives the lead up as a dead one would.",
    )

    @model_validator(mode="after")
    def _election_timing(self) -> KubeSettings:
        # A leader must stop its work before its Lease can expire for the others (client-go's rule), and
        # must get more than one try at renewing within its deadline.
        if not self.renew_deadline_seconds < self.lease_duration_seconds:
            raise ValueError("renew_deadline_seconds must be shorter than lease_duration_seconds")
        if not self.retry_period_seconds < self.renew_deadline_seconds:
            raise ValueError("retry_period_seconds must be shorter than renew_deadline_seconds")
        if self.loop_stall_seconds < self.renew_deadline_seconds:
            raise ValueError("loop_stall_seconds must be at least renew_deadline_seconds")
        return self

    def probe_pods(self, listen_port: int) -> str:
        """The engine's `probe_pods` (automation/engine/config.py): this service's pods, as JSON."""
        return json.dumps(
            {"namespace": self.own_namespace(), "labels": self.pod_labels, "port": listen_port},
            sort_keys=True,
        )

    def own_namespace(self) -> str:
        if self.namespace:
            return self.namespace
        try:
            return (self.service_account_dir / "namespace").read_text().strip() or "proxy-operator"
        except OSError:
            return "proxy-operator"
