"""A real Kubernetes API server for the tests: etcd and kube-apiserver on loopback, stopped by pid.

`running_apiserver(workdir)` starts etcd, then kube-apiserver (from `make kube-tools`)
on free loopback ports with: serving certificates the apiserver makes itself (`--cert-dir`), a service-account
key pair, one static admin token (`--token-auth-file`, group system:masters), RBAC authorization and an audit
log of every request (metadata level). It yields a `KubeApi` with a kubeconfig file; on leaving, both
processes are stopped (SIGTERM, then SIGKILL) and etcd's data removed. A part missing or refusing to start
raises `ApiServerUnavailable` saying what to do.
"""

from __future__ import annotations

import ctypes
import dataclasses
import secrets
import shutil
import signal
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from kubernetes import config
from kubernetes.client import ApiClient

from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
TOOLS_BIN = ROOT / ".tools" / "bin"
KUBE_VERSION = "v1.37.2"  # tools/kube-apiserver/go.mod
START_TIMEOUT = 60.0
AUDIT_POLICY = {"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "rules": [{"level": "Metadata"}]}


class ApiServerUnavailable(RuntimeError):
    """etcd or kube-apiserver is missing or did not come up; the message says what to do."""


@dataclass(frozen=True)
class KubeApi:
    """How to reach the running apiserver as its admin."""

    url: str
    token: str
    ca_file: Path
    kubeconfig: Path
    audit_log: Path
    etcd_url: str = ""  # etcd's client URL (a test may compact its history)

    def client(self) -> ApiClient:
        """A new `kubernetes` ApiClient from the kubeconfig (close it when done)."""
        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def service_account(self, folder: Path, namespace: str) -> dict[str, str]:
        """What a pod of `namespace` is given to reach this API server as its admin: `folder` filled as
        the kubelet's ServiceAccount mount (token, ca.crt, namespace), and the environment it sets (to
        add to a process's). The service reads it with `PROXY_OPERATOR_KUBE_SERVICE_ACCOUNT_DIR=folder`
        and no kubeconfig: the in-cluster configuration a replica in a pod has."""
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "token").write_text(self.token)
        (folder / "ca.crt").write_bytes(self.ca_file.read_bytes())
        (folder / "namespace").write_text(namespace)
        host, _, port = self.url.removeprefix("https://").rpartition(":")
        return {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port}


@dataclass
class Child:
    """A started server process and the file its output goes to."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)

    def failure(self, what: str) -> ApiServerUnavailable:
        tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-15:])
        return ApiServerUnavailable(f"{self.name} {what} (log {self.log}):\n{tail}")


def binaries() -> tuple[Path, Path]:
    """etcd and kube-apiserver, or ApiServerUnavailable naming what is missing."""
    etcd = shutil.which("etcd") or shutil.which("etcd", path=str(TOOLS_BIN))
    apiserver = TOOLS_BIN / "kube-apiserver"
    missing = [] if etcd else ["etcd (Debian package etcd-server)"]
    if not apiserver.exists():  # also a link into a build cache that is gone
        missing.append(f"kube-apiserver {KUBE_VERSION} ({apiserver})")
    if missing:
        raise ApiServerUnavailable(
            f"{' and '.join(missing)} missing: run `make kube-tools` (scripts/install-kube.sh)"
        )
    return Path(str(etcd)), apiserver


def start(stack: ExitStack, *, name: str, argv: list[str], workdir: Path) -> Child:
    log = workdir / f"{name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, preexec_fn=die_with_parent
        )
    child = Child(name=name, process=process, log=log)
    stack.callback(child.stop)
    return child


def die_with_parent() -> None:
    """In the child: SIGTERM when the test process dies, even by SIGKILL (Linux prctl PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


def wait_until(child: Child, ready: Callable[[], bool], *, timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if child.process.poll() is not None:
            raise child.failure(f"exited with code {child.process.returncode} while starting")
        if time.monotonic() > deadline:
            raise child.failure(f"was not ready after {timeout:.0f} s")
        time.sleep(0.1)


def answers(url: str, *, verify: ssl.SSLContext | bool = True, token: str | None = None) -> bool:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.get(url, verify=verify, headers=headers, timeout=2)
    except (httpx.HTTPError, ssl.SSLError, OSError):
        return False
    return response.status_code == 200


def start_etcd(stack: ExitStack, etcd: Path, workdir: Path) -> str:
    client, peer = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    data = workdir / "etcd-data"
    stack.callback(shutil.rmtree, data, True)
    argv = [str(etcd), "--name=test", f"--data-dir={data}", f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}", f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}", f"--initial-cluster=test={peer}",
            "--logger=zap", "--log-outputs=stderr"]  # fmt: skip
    child = start(stack, name="etcd", argv=argv, workdir=workdir)
    wait_until(child, lambda: answers(f"{client}/health"))
    return client


def write_credentials(workdir: Path) -> tuple[str, Path, Path]:
    """A random admin token in tokens.csv, and a service-account RSA key pair."""
    token = secrets.token_urlsafe(32)
    (workdir / "tokens.csv").write_text(f"{token},admin,admin-uid,system:masters\n")
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private, public = workdir / "sa.key", workdir / "sa.pub"
    pem, spki = serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    private.write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    public.write_bytes(key.public_key().public_bytes(pem, spki))
    private.chmod(0o600)
    return token, private, public


def start_apiserver(
    stack: ExitStack,
    apiserver: Path,
    *,
    workdir: Path,
    etcd_url: str,
    children: list[Child] | None = None,
    extra_args: tuple[str, ...] = (),
) -> KubeApi:
    token, sa_key, sa_pub = write_credentials(workdir)
    port, certs = free_port(), workdir / "certs"
    (workdir / "audit-policy.yaml").write_text(yaml.safe_dump(AUDIT_POLICY))
    argv = [str(apiserver), f"--etcd-servers={etcd_url}", f"--secure-port={port}", "--bind-address=127.0.0.1",
            f"--cert-dir={certs}", "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={sa_pub}", f"--service-account-signing-key-file={sa_key}",
            "--authorization-mode=RBAC", f"--token-auth-file={workdir / 'tokens.csv'}",
            "--service-cluster-ip-range=10.0.0.0/24", f"--audit-policy-file={workdir / 'audit-policy.yaml'}",
            f"--audit-log-path={workdir / 'audit.log'}", *extra_args]  # fmt: skip
    child = start(stack, name="kube-apiserver", argv=argv, workdir=workdir)
    if children is not None:
        children.append(child)
    url, ca_file = f"https://127.0.0.1:{port}", certs / "apiserver.crt"
    # The self-signed serving certificate is written before the port opens; the file also holds its CA.
    wait_until(child, lambda: _ready(url, ca_file, token))
    kubeconfig = write_kubeconfig(workdir, url=url, ca_file=ca_file, token=token)
    return KubeApi(
        url=url, token=token, ca_file=ca_file, kubeconfig=kubeconfig, audit_log=workdir / "audit.log"
    )


def _ready(url: str, ca_file: Path, token: str) -> bool:
    """The API server answers /readyz over TLS verified by its certificate file, once that file is whole (it
    exists a moment before its certificate is in it: loading it then raised `NO_CERTIFICATE_OR_CRL_FOUND`
    and failed every test of the session at its setup)."""
    if not ca_file.exists():
        return False
    try:
        context = tls(ca_file)
    except ssl.SSLError:
        return False
    return answers(f"{url}/readyz", verify=context, token=token)


def tls(ca_file: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca_file))


def write_kubeconfig(workdir: Path, *, url: str, ca_file: Path, token: str) -> Path:
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": url, "certificate-authority": str(ca_file)}}],
        "users": [{"name": "admin", "user": {"token": token}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "admin"}}],
        "current-context": "test",
    }
    path = workdir / "kubeconfig"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    path.chmod(0o600)
    return path


@contextmanager
def running_apiserver(workdir: Path, *, extra_args: tuple[str, ...] = ()) -> Iterator[KubeApi]:
    """etcd + kube-apiserver on loopback for the body of the `with`; both stopped on leaving it.
    `extra_args`: more kube-apiserver flags (e.g. `--watch-cache=false`)."""
    with restartable_apiserver(workdir, extra_args=extra_args) as (api, _):
        yield api


@contextmanager
def restartable_apiserver(
    workdir: Path, *, extra_args: tuple[str, ...] = ()
) -> Iterator[tuple[KubeApi, Callable[[], None]]]:
    """As `running_apiserver`, with a `restart()` that stops kube-apiserver (SIGTERM) and starts it again
    on the same port, certificates and etcd: what clients see when the control plane restarts."""
    etcd, apiserver = binaries()
    with ExitStack() as stack:
        etcd_url = start_etcd(stack, etcd, workdir)
        children: list[Child] = []
        api = start_apiserver(
            stack, apiserver, workdir=workdir, etcd_url=etcd_url, children=children, extra_args=extra_args
        )
        api = dataclasses.replace(api, etcd_url=etcd_url)

        def restart() -> None:
            old = children.pop()
            old.stop()
            argv = [str(arg) for arg in old.process.args]  # type: ignore[union-attr]
            child = start(stack, name="kube-apiserver", argv=argv, workdir=workdir)
            children.append(child)
            verify = tls(api.ca_file)
            wait_until(child, lambda: answers(f"{api.url}/readyz", verify=verify, token=api.token))

        yield api, restart
