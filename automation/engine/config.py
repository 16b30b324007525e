"""What the engine needs to know: backend, secrets, where the program and the CLI live."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from automation.errors import PermanentError
from stacks.models.no_auth import NO_AUTH_MAX_PREFIX_ENV, no_auth_min_prefix

# The folder that holds our packages: the checkout, or site-packages when the distribution is installed.
ROOT = Path(__file__).resolve().parents[2]
# The program (`stacks/__main__.py`) ships inside the package; the checkout's `make tools` puts the CLI here.
PROGRAM_DIR = ROOT / "stacks"
CHECKOUT_PULUMI = ROOT / ".tools" / "bin" / "pulumi"

# The program's stack config namespace, and the outputs it echoes back for the reconciler
# (see stacks/__main__.py).
CONFIG_NAMESPACE = "proxy-operator"
HASH_OUTPUT = "specHash"
APPLIED_PROXIES_OUTPUT = "appliedProxies"
CREDENTIALS_OUTPUT = "credentials"
# The stack tag naming the installation that owns a stack: only the owner ever runs `up`, `destroy` or a
# state edit on it (two installations sharing a backend never touch each other's stacks).
OWNER_TAG = "proxy-operator:installation"


@dataclass(frozen=True)
class EngineConfig:
    """Settings of one engine. Build it from the service settings; tests build it directly."""

    backend_url: str
    state_dir: Path
    program_dir: Path = PROGRAM_DIR
    pulumi: Path = field(default_factory=lambda: find_pulumi(None))  # the CLI; see find_pulumi
    project_name: str = "proxy-operator"
    # "passphrase" (the passphrase below) or a KMS URL such as awskms://..., gcpkms://...
    secrets_provider: str = "passphrase"
    passphrase: str | None = field(default=None, repr=False)
    pulumi_home: Path | None = None
    parallel: int = 16
    hostname: str = field(default_factory=socket.gethostname)
    installation: str | None = None  # tagged as the owner of every stack this engine creates
    extra_env: Mapping[str, str] = field(default_factory=dict)
    # The health probe's URL: every stack's config `proxy-operator:probeUrl`, so the programs allow its echo
    # endpoint in each proxy's egress policy (stacks/programs/probe_allow.py); None: the environment's.
    probe_url: str | None = None
    # The service's own pods when it runs in a cluster, as JSON {"namespace", "labels", "port"}: every stack's
    # config `proxy-operator:probePods`, so a proxy pod's NetworkPolicy lets the probe reach them (the pod
    # address after the Service's DNAT, not the ClusterIP). None: not in a cluster.
    probe_pods: str | None = None
    # Given the host of a stack lock that is not `hostname`: is that holder gone for good, so its lock may be
    # cancelled? None: other hosts' locks are never recovered. In a cluster the service passes a check of the
    # Lease and the pods (service.kube.holder); it may block (operations run in threads).
    foreign_lock_gone: Callable[[str], bool] | None = field(default=None, compare=False)
    # Operations only inside a term (Engine.in_term): the in-cluster engine, where only a leader acts.
    fenced: bool = False
    # > 0: a term's calls run in an engine host process (automation/engine/hosted.py), closed after this many
    # idle seconds, so the service never loads the Pulumi SDK; 0: in this process.
    host_idle_seconds: float = 0.0
    # How long a host's own term end waits for its CLI calls after SIGINT before killing them: below the
    # service's term grace, so the host is gone before the service would kill it.
    host_grace: float = 6.0
    # The engine host's nice value, so its CLI calls and their plugins (and whatever they start) yield the
    # cores to the service when both want them: an intake's or a resync's `up`s took the service's event
    # loop's CPU and held every lease behind them (docs/decisions.md, "The engine host yields the CPU").
    host_nice: int = 0

    def environment(self) -> dict[str, str]:
        """Environment of every CLI call: the CLI's folder (a bundle's plugins), then our interpreter's (the
        language host and dynamic-provider plugins this package installs) first on PATH, our Python for
        programs."""
        python_bin = str(Path(sys.executable).parent)
        env = {
            "PATH": os.pathsep.join([str(self.pulumi.parent), python_bin, os.environ.get("PATH", "")]),
            # The language host and the dynamic-provider launcher run this interpreter (our venv).
            "PULUMI_PYTHON_CMD": sys.executable,
            "PULUMI_SKIP_UPDATE_CHECK": "true",
            "PULUMI_BACKEND_URL": self.backend_url,
            # gRPC's fork handlers restart its threads in a forked child: a program's dynamic provider
            # that forks and execs (libvirt's ssh transport, the kvm program) saw that child die before its
            # exec ("epoll_wait error: Bad file descriptor"). grpc/grpc#13873: off for fork-then-exec.
            "GRPC_ENABLE_FORK_SUPPORT": "false",
        }
        if self.passphrase is not None:
            env["PULUMI_CONFIG_PASSPHRASE"] = self.passphrase
        # The program validates Proxies with the model too: the same open-proxy limit as this process's.
        env[NO_AUTH_MAX_PREFIX_ENV] = "{},{}".format(*no_auth_min_prefix())
        env.update(self.extra_env)
        return env


@dataclass(frozen=True)
class StackInput:
    """Everything one `up` or `preview` of a stack needs, already serialised for stack config."""

    name: str
    provider_json: str
    proxies_json: str
    credentials_json: str = field(default="{}", repr=False)
    spec_hash: str = ""
    provider_credentials: str | None = field(default=None, repr=False)  # GCP key JSON or a kubeconfig
    # The state saved once when the `up` ends, not after each step (the entry's `checkpoints: end`)
    skip_checkpoints: bool = False


class PulumiNotFoundError(PermanentError):
    """No usable Pulumi CLI: a set-up problem, reported before any operation runs."""


def find_pulumi(configured: Path | None) -> Path:
    """The Pulumi CLI: the setting (`PROXY_OPERATOR_PULUMI_PATH`), else `pulumi` on PATH, else the checkout's
    `.tools/bin/pulumi` (what `make tools` installs)."""
    if configured is not None:
        if not (configured.is_file() and os.access(configured, os.X_OK)):
            raise PulumiNotFoundError(f"PROXY_OPERATOR_PULUMI_PATH: {configured} is not an executable file")
        return configured.absolute()
    on_path = shutil.which("pulumi")
    if on_path:
        return Path(on_path).absolute()
    if CHECKOUT_PULUMI.exists():
        return CHECKOUT_PULUMI
    raise PulumiNotFoundError(
        "no Pulumi CLI: set PROXY_OPERATOR_PULUMI_PATH to the `pulumi` executable, put `pulumi` on PATH, "
        "or run `make tools` in a checkout"
    )


def cli_version(cli: Path) -> str:
    """What `pulumi version` prints (`v3.260.0`): one CLI call, without the SDK."""
    env = {**os.environ, "PULUMI_SKIP_UPDATE_CHECK": "true"}
    return subprocess.check_output([str(cli), "version"], env=env, text=True).strip()


def read_passphrase(*, path: Path | None, env_var: str = "PULUMI_CONFIG_PASSPHRASE") -> str | None:
    """The secrets passphrase from a file (a mounted Secret) or the environment; the file wins."""
    if path is not None:
        return path.read_text().rstrip("\n")
    return os.environ.get(env_var)
