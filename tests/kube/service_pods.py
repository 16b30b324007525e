"""The service itself in pods on the test node: deploy/ applied as it is, the image from `make image`.

`deployed_service` applies crds/, then deploy/namespace.yaml, serviceaccount.yaml, rbac.yaml, deployment.yaml
and service.yaml unchanged; of deploy/config-samples/ only the values a user must edit change: the state
backend (an `s3://` bucket on a moto server the test starts on the host's veth address, which pods reach),
a passphrase and a discovery token of the test's own. The provider catalogue is the sample's. The Proxies'
namespace `crawl` is made first (rbac.yaml has a Role there). It waits for both replicas to be Ready.

`ServiceInNode` reads what a test needs: the Service's ClusterIP (the host routes the Service range to the
node), the Lease's holder, the replicas' pods, the stack history in the bucket, and the service processes'
memory (`/proc` of the host sees the node's processes; the kubelet's summary API gives each pod's working
set).
"""

from __future__ import annotations

import hashlib
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import httpx
import yaml
from kubernetes.client import ApiClient, AppsV1Api, CoordinationV1Api, CoreV1Api
from kubernetes.dynamic import DynamicClient

from service.kube.client import request_json
from tests.kube.apiserver import ROOT
from tests.kube.manifests import apply, dynamic_client, install_crds, kube_documents
from tests.kube.node import KubeNode
from tests.ports import free_port

NAMESPACE = "proxy-operator"
PROXY_NAMESPACE = "crawl"
BUCKET = "proxy-operator-state"
DEPLOY = ROOT / "deploy"
APPLIED = ["namespace.yaml", "serviceaccount.yaml", "rbac.yaml", "deployment.yaml", "service.yaml"]
READY_TIMEOUT = 240.0  # two replicas: image already imported, Python imports under two cores' contention


class ServiceUnavailable(RuntimeError):
    """The service's pods did not come up; the message carries their state and logs."""


@contextmanager
def moto_s3(host: str) -> Iterator[str]:
    """moto's S3 server on `host` (the host's veth address: pods reach it, nothing outside does)."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", host, "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://{host}:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(endpoint, timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise ServiceUnavailable("the moto S3 server did not start") from None
                time.sleep(0.2)
        s3 = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="t",
            aws_secret_access_key="t",
        )
        s3.create_bucket(Bucket=BUCKET)
        yield endpoint
    finally:
        process.terminate()
        process.wait(timeout=10)


@dataclass
class ServiceInNode:
    node: KubeNode
    api: ApiClient
    dynamic: DynamicClient
    s3_endpoint: str
    token: str  # a discovery token with every scope

    @property
    def core(self) -> CoreV1Api:
        return CoreV1Api(self.api)

    def url(self) -> str:
        service = self.core.read_namespaced_service(NAMESPACE, NAMESPACE)
        return f"http://{service.spec.cluster_ip}"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url(), headers=self.headers(), timeout=15, trust_env=False)

    def pods(self) -> list[Any]:
        found = self.core.list_namespaced_pod(
            NAMESPACE, label_selector="app.kubernetes.io/name=proxy-operator"
        )
        return [p for p in found.items if p.metadata.deletion_timestamp is None]

    def ready_pods(self) -> list[Any]:
        return [p for p in self.pods() if _ready(p)]

    def leader(self) -> str | None:
        lease = CoordinationV1Api(self.api).read_namespaced_lease(NAMESPACE, NAMESPACE)
        return lease.spec.holder_identity

    def history(self) -> list[str]:
        """Every update the backend recorded (one history file per `up`, `destroy`, `refresh`)."""
        s3 = boto3.client(
            "s3",
            endpoint_url=self.s3_endpoint,
            region_name="us-east-1",
            aws_access_key_id="t",
            aws_secret_access_key="t",
        )
        listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=".pulumi/history/")
        return sorted(o["Key"] for o in listed.get("Contents", []) if o["Key"].endswith(".history.json"))

    def logs(self) -> str:
        parts = []
        for pod in self.pods():
            try:
                log = self.core.read_namespaced_pod_log(
                    pod.metadata.name, NAMESPACE, container="proxy-operator"
                )
            except Exception as exc:
                log = f"(no log: {exc})"
            lines = [line for line in log.splitlines() if '"uvicorn.access"' not in line]  # probes' noise
            parts.append(f"--- {pod.metadata.name}\n" + "\n".join(lines[-60:]))
        return "\n".join(parts)

    def wait_ready(self, replicas: int = 2, *, timeout: float = READY_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while len(self.ready_pods()) < replicas:
            if time.monotonic() > deadline:
                states = [(p.metadata.name, p.status.phase, _reasons(p)) for p in self.pods()]
                raise ServiceUnavailable(f"{replicas} service replicas not Ready: {states}\n{self.logs()}")
            time.sleep(1)
        deployment = AppsV1Api(self.api).read_namespaced_deployment(NAMESPACE, NAMESPACE)
        while (deployment.status.updated_replicas or 0) < replicas or (
            deployment.status.replicas or 0
        ) > replicas:
            if time.monotonic() > deadline:
                raise ServiceUnavailable(f"the rollout did not finish: {deployment.status}")
            time.sleep(1)
            deployment = AppsV1Api(self.api).read_namespaced_deployment(NAMESPACE, NAMESPACE)

    def memory(self, pod: Any) -> dict[str, int]:
        """The service container's memory as the host's /proc and cgroup v1 see it (bytes): the service
        process's RSS and its peak RSS (`hwm`), and the container's usage now, its working set (usage less
        inactive file pages, as the kubelet counts it), its peak and its limit (page cache included; the
        peak covers every Pulumi child the container ran)."""
        uid = pod.metadata.uid
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cgroup = (entry / "cgroup").read_text()
                command = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if (
                uid not in cgroup
                or b"serve" not in command
                or not any(b"proxy-operator" in c for c in command)
            ):
                continue
            memory = next(line.split(":", 2)[2] for line in cgroup.splitlines() if ":memory:" in line)
            status = _fields((entry / "status").read_text(), separator=":")
            rss, hwm = (int(status[k].split()[0]) * 1024 for k in ("VmRSS", "VmHWM"))
            return {"rss": rss, "hwm": hwm} | _cgroup_memory(
                Path("/sys/fs/cgroup/memory") / memory.lstrip("/")
            )
        raise ServiceUnavailable(f"no service process of pod {pod.metadata.name} on this host")

    def summary(self) -> dict[str, Any]:
        """The kubelet's stats summary (pods' working sets), through the API server's node proxy."""
        [node] = self.core.list_node().items
        return request_json(self.api, "GET", f"/api/v1/nodes/{node.metadata.name}/proxy/stats/summary")


def _fields(text: str, *, separator: str | None = None) -> dict[str, str]:
    pairs = (line.split(separator, 1) for line in text.splitlines())
    return {k.strip(): v.strip() for k, v in pairs}


def _cgroup_memory(folder: Path) -> dict[str, int]:
    """A cgroup v1 memory controller's usage, working set (usage less inactive file pages, as the kubelet
    counts it), peak (max_usage_in_bytes) and limit, in bytes."""
    files = {"usage": "usage_in_bytes", "peak": "max_usage_in_bytes", "limit": "limit_in_bytes"}
    found = {k: int((folder / f"memory.{v}").read_text()) for k, v in files.items()}
    inactive = int(_fields((folder / "memory.stat").read_text())["total_inactive_file"])
    return {"working_set": max(0, found["usage"] - inactive)} | found


def _ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


def _reasons(pod: Any) -> list[str]:
    reasons = []
    for status in pod.status.container_statuses or []:
        state = status.state
        if state.waiting:
            reasons.append(f"{status.name}: waiting {state.waiting.reason} {state.waiting.message or ''}")
        if state.terminated:
            reasons.append(
                f"{status.name}: terminated {state.terminated.reason} ({state.terminated.exit_code})"
            )
    return reasons


def samples(*, backend_url: str, passphrase: str, token: str) -> list[dict[str, Any]]:
    """deploy/config-samples/ with the values a user must edit replaced."""
    documents = [d for _, d in kube_documents(sorted((DEPLOY / "config-samples").glob("*.yaml")))]
    for document in documents:
        name = document["metadata"]["name"]
        if name == "proxy-operator-state":
            document["stringData"] = {
                "backend-url": backend_url,
                "passphrase": passphrase,
                "AWS_ACCESS_KEY_ID": "t",
                "AWS_SECRET_ACCESS_KEY": "t",
                "AWS_REGION": "us-east-1",
            }
        elif name == "proxy-operator-tokens":
            digest = hashlib.sha256(token.encode()).hexdigest()
            tokens = [{"name": "test", "scopes": ["lease", "report", "admin", "view"], "sha256": digest}]
            document["stringData"] = {"tokens.yaml": yaml.safe_dump(tokens)}
    return documents


@contextmanager
def deployed_service(node: KubeNode, image: str, *, cache_dir: Path) -> Iterator[ServiceInNode]:
    """The service from deploy/ on the node, two replicas Ready; its namespaces deleted afterwards."""
    del image  # imported into the node under the name deploy/deployment.yaml runs (operator_image)
    token = secrets.token_urlsafe(24)
    with moto_s3(node.host_ip) as endpoint, node.client() as api:
        host = endpoint.removeprefix("http://")
        backend = f"s3://{BUCKET}?endpoint={host}&disableSSL=true&s3ForcePathStyle=true&region=us-east-1"
        install_crds(api, ROOT / "crds", cache_dir=cache_dir)
        dynamic = dynamic_client(api, cache_dir)
        core = CoreV1Api(api)
        core.create_namespace({"metadata": {"name": PROXY_NAMESPACE}})
        documents = [d for name in APPLIED for _, d in kube_documents([DEPLOY / name])]
        config = samples(backend_url=backend, passphrase=secrets.token_urlsafe(32), token=token)
        try:
            for document in documents[:3] + config + documents[3:]:  # namespaces, SA, RBAC, config, workload
                apply(dynamic, document)
            service = ServiceInNode(node=node, api=api, dynamic=dynamic, s3_endpoint=endpoint, token=token)
            service.wait_ready()
            yield service
        finally:
            for namespace in (PROXY_NAMESPACE, NAMESPACE, "proxies"):
                with suppress(Exception):  # cleanup: already gone is fine
                    core.delete_namespace(namespace, grace_period_seconds=0)
