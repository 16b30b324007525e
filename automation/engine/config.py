"""What the engine needs to know: backend, secrets, where the program and the CLI live."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The program's stack config namespace, and the outputs it echoes back for the reconciler
# (see stacks/__main__.py).
CONFIG_NAMESPACE = "proxy-operator"
HASH_OUTPUT = "specHash"
APPLIED_PROXIES_OUTPUT = "appliedProxies"


@dataclass(frozen=True)
class EngineConfig:
    """Settings of one engine. Build it from the service settings; tests build it directly."""

    backend_url: str
    state_dir: Path
    program_dir: Path = ROOT / "stacks"
    tools_dir: Path = ROOT / ".tools"
    project_name: str = "proxy-operator"
    # "passphrase" (the passphrase below) or a KMS URL such as awskms://..., gcpkms://...
    secrets_provider: str = "passphrase"
    passphrase: str | None = field(default=None, repr=False)
    pulumi_home: Path | None = None
    parallel: int = 16
    hostname: str = field(default_factory=socket.gethostname)
    extra_env: Mapping[str, str] = field(default_factory=dict)

    def environment(self) -> dict[str, str]:
        """Environment of every CLI call: our CLI and plugins first on PATH, our Python for programs."""
        python_bin = str(Path(sys.executable).parent)
        env = {
            "PATH": os.pathsep.join([str(self.tools_dir / "bin"), python_bin, os.environ.get("PATH", "")]),
            # The language host and the dynamic-provider launcher run this interpreter (our venv).
            "PULUMI_PYTHON_CMD": sys.executable,
            "PULUMI_SKIP_UPDATE_CHECK": "true",
            "PULUMI_BACKEND_URL": self.backend_url,
        }
        if self.passphrase is not None:
            env["PULUMI_CONFIG_PASSPHRASE"] = self.passphrase
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


def read_passphrase(*, path: Path | None, env_var: str = "PULUMI_CONFIG_PASSPHRASE") -> str | None:
    """The secrets passphrase from a file (a mounted Secret) or the environment; the file wins."""
    if path is not None:
        return path.read_text().rstrip("\n")
    return os.environ.get(env_var)
