"""Replicas of `proxy-operator serve --kubeconfig` as separate OS processes, each with a Pod object.

Every replica runs with `FAULTS_REPLICA=<identity>` in its environment; its descendants (the wrapper, the
real CLI, the language host, the dynamic providers) inherit it, while the local proxies start with a minimal
environment of their own (stacks/programs/local_process.py), so "the replica and all its descendants" is
every process carrying that marker, even after a SIGKILL re-parented them to init. The Pod (in the service
namespace, named as the identity) is what `service.kube.holder` reads to tell a replica is gone: it is
deleted only once no process of the replica is left, as a kubelet would.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes.client import ApiClient

from service.kube.client import ApiException, request_json
from tests.faults.record import pid_alive
from tests.ports import free_port

MARKER = "FAULTS_REPLICA"
LEASE_SECONDS, RENEW_SECONDS, RETRY_SECONDS = 6.0, 4.0, 1.0


def marked_pids(identity: str) -> list[int]:
    """Live processes whose environment carries `FAULTS_REPLICA=identity`."""
    wanted = f"{MARKER}={identity}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if wanted in environ.split(b"\0") and pid_alive(int(entry)):
            found.append(int(entry))
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@dataclass
class Replica:
    identity: str
    process: subprocess.Popen[bytes]
    port: int
    state_dir: Path
    log: Path
    expected_exit: bool = False

    def alive(self) -> bool:
        return self.process.poll() is None

    def processes(self) -> list[int]:
        return marked_pids(self.identity)

    def dev_token(self) -> str:
        return (self.state_dir / "dev-token").read_text().strip()

    def tail(self, lines: int = 20) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class ReplicaSet:
    """Starts, signals and replaces replicas; creates and deletes their Pods."""

    api: ApiClient
    root: Path
    kubeconfig: Path
    namespace: str  # the service's: Lease, catalogue, Pods
    watched: str  # the Proxies'
    env: dict[str, str]  # backend, passphrase, PULUMI_HOME, the wrapper...
    replicas: list[Replica] = field(default_factory=list)
    counter: int = 0

    def __post_init__(self) -> None:
        sa = {"metadata": {"name": "default"}}
        with contextlib.suppress(ApiException):
            request_json(self.api, "POST", f"/api/v1/namespaces/{self.namespace}/serviceaccounts", body=sa)

    def live(self) -> list[Replica]:
        return [r for r in self.replicas if r.alive()]

    def start(self) -> Replica:
        self.counter += 1
        identity = f"replica-{self.counter}"
        self.create_pod(identity)
        state_dir, port = self.root / "replicas" / identity, free_port()
        state_dir.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            **self.env,
            MARKER: identity,
            "PROXY_OPERATOR_KUBE_IDENTITY": identity,
            "PROXY_OPERATOR_KUBE_NAMESPACES": json.dumps([self.watched]),
            "PROXY_OPERATOR_KUBE_NAMESPACE": self.namespace,
            "PROXY_OPERATOR_KUBE_LEASE_DURATION_SECONDS": str(LEASE_SECONDS),
            "PROXY_OPERATOR_KUBE_RENEW_DEADLINE_SECONDS": str(RENEW_SECONDS),
            "PROXY_OPERATOR_KUBE_RETRY_PERIOD_SECONDS": str(RETRY_SECONDS),
            # one cgroup for every replica and the rest of the suite, not a pod each: see cluster_fleet.py
            "PROXY_OPERATOR_ENGINE_HOST_NICE": "0",
        }
        command = [str(Path(sys.executable).parent / "proxy-operator"), "serve", "--port", str(port),
                   "--kubeconfig", str(self.kubeconfig), "--state-dir", str(state_dir)]  # fmt: skip
        log = self.root / "replicas" / f"{identity}.log"
        with log.open("ab") as out:
            process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                       stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        replica = Replica(identity=identity, process=process, port=port, state_dir=state_dir, log=log)
        self.replicas.append(replica)
        return replica

    # --- Pods ---------------------------------------------------------------------------------------------

    def create_pod(self, identity: str) -> None:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": identity, "labels": {"app": "proxy-operator"}},
            "spec": {
                "automountServiceAccountToken": False,
                "containers": [{"name": "operator", "image": "proxy-operator:faults"}],
            },
        }
        request_json(self.api, "POST", f"/api/v1/namespaces/{self.namespace}/pods", body=pod)

    def delete_pod(self, identity: str) -> None:
        path = f"/api/v1/namespaces/{self.namespace}/pods/{identity}"
        with contextlib.suppress(ApiException):  # no kubelet: the grace period 0 removes it at once
            request_json(self.api, "DELETE", path, body={"gracePeriodSeconds": 0})

    # --- the Lease ----------------------------------------------------------------------------------------

    def holder(self) -> str | None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/proxy-operator"
        try:
            lease: dict[str, Any] = request_json(self.api, "GET", path, timeout=5)
        except Exception:
            return None
        return (lease.get("spec") or {}).get("holderIdentity") or None

    def leader(self) -> Replica | None:
        holder = self.holder()
        return next((r for r in self.replicas if r.identity == holder and r.alive()), None)

    def wait_leader(self, within: float = 60.0) -> Replica | None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            leader = self.leader()
            if leader is not None:
                return leader
            time.sleep(0.2)
        return None

    # --- ends -----------------------------------------------------------------------------------------------

    def kill(self, replica: Replica, *, within: float = 30.0) -> bool:
        """SIGKILL the replica and every process of it, wait until none is left, then delete its Pod."""
        replica.expected_exit = True
        deadline = time.monotonic() + within
        while True:
            with contextlib.suppress(ProcessLookupError):
                os.kill(replica.process.pid, signal.SIGKILL)
            for pid in replica.processes():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                replica.process.wait(timeout=0.2)
            if not replica.alive() and not replica.processes():
                break
            if time.monotonic() > deadline:
                return False
        self.delete_pod(replica.identity)
        return True

    def terminate(
        self, replica: Replica, *, within: float = 60.0, check: list[int] | None = None
    ) -> int | None:
        """SIGTERM (a pod deletion): wait for the clean exit; its exit code (None: killed after `within`).
        `check` receives the `pulumi` processes of the replica still running 1 s after its exit."""
        replica.expected_exit = True
        replica.process.send_signal(signal.SIGTERM)
        try:
            code: int | None = replica.process.wait(timeout=within)
        except subprocess.TimeoutExpired:
            code = None
        if check is not None and code is not None:
            time.sleep(1.0)
            check.extend(pid for pid in replica.processes() if "pulumi" in cmdline(pid))
        self.kill(replica)  # what is left of it (nothing, on a clean exit), then the Pod
        return code

    def stop_all(self) -> None:
        for replica in self.replicas:
            if replica.alive() or replica.processes():
                self.kill(replica)
