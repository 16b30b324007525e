"""The service's settings: one validated tree, every field documented with a safe default.

Environment variables: `PROXY_OPERATOR_<FIELD>` (and `PROXY_OPERATOR_DISCOVERY_*`, `PROXY_OPERATOR_HEALTH_*`
for the nested discovery and health settings). docs/operations.md describes each field.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from automation.backoff import BackoffPolicy
from automation.engine import EngineConfig
from automation.engine.config import find_pulumi
from service.settings import DiscoverySettings, HealthSettings
from service.ui.settings import UiSettings

log = logging.getLogger(__name__)


class FolderOverlap(ValueError):
    """The state folder lies inside the manifests folder: its files would be read as manifests, and
    emptying the manifests folder would delete the passphrase and the backend."""


def check_folders(settings: OperatorSettings, manifests: Path) -> None:
    """Refuse a `--state-dir` inside the `--manifests` folder (FolderOverlap, saying how to fix it)."""
    state, folder = settings.state_dir.resolve(), manifests.resolve()
    if state == folder or folder in state.parents:
        raise FolderOverlap(
            f"--state-dir {settings.state_dir} is inside --manifests {manifests}: its files would be read "
            "as manifests, and emptying that folder would delete the state (the passphrase, the backend); "
            "give a state folder outside it"
        )


class OperatorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PROXY_OPERATOR_", extra="forbid")

    state_dir: Path = Field(Path(".state"), description="Work directories, default backend, local proxies.")
    backend_url: str | None = Field(
        None,
        description="PULUMI_BACKEND_URL: file://, s3://bucket?endpoint=..., gs://. Default: a "
        "file:// folder under state_dir. Also read from PULUMI_BACKEND_URL.",
    )
    secrets_provider: str = Field("passphrase", description="`passphrase`, or a KMS URL (awskms://...).")
    passphrase_file: Path | None = Field(
        None,
        description="File holding the secrets passphrase (a mounted Secret); else "
        "PULUMI_CONFIG_PASSPHRASE; else one generated once into state_dir/passphrase.",
    )
    max_parallel: int = Field(4, ge=1, le=64, description="Stacks that run at the same time.")
    stall_after: int = Field(3, ge=1, le=100, description="Consecutive failures before a stack is Stalled.")
    backoff_base_seconds: float = Field(10.0, gt=0, description="First retry delay bound (full jitter).")
    backoff_cap_seconds: float = Field(600.0, gt=0, description="Longest retry delay.")
    resync_seconds: float = Field(
        600.0, ge=0, description="Drift check of every stack this often (per-provider driftPolicy); 0: off."
    )
    pulumi_path: Path | None = Field(
        None, description="The `pulumi` executable; else `pulumi` on PATH; else a checkout's .tools/bin."
    )
    poll_seconds: float = Field(1.0, gt=0, le=60, description="How often the manifests folder is checked.")
    installation: str | None = Field(
        None,
        pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
        description="This installation's name, recorded as the owner (stack tag) of every stack it creates; "
        "stacks owned by another installation are never touched. Default: generated once into "
        "state_dir/installation. Set it explicitly when state_dir does not persist (a pod).",
    )
    deletion_budget_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="A change that removes more than this share of the running proxies (and more than "
        "deletion_budget_count) stops until allowed by its id.",
    )
    deletion_budget_count: int = Field(
        5, ge=0, description="Removals up to this many proxies at once never need an allowance."
    )
    deletion_window_quiet_seconds: float = Field(
        2.0,
        ge=0,
        le=60,
        description="Declared deletions are judged by the deletion budget once none has arrived for this "
        "long, so a mass deletion arriving over many events is one change (docs/operations.md).",
    )
    deletion_window_longest_seconds: float = Field(
        30.0, ge=0, le=600, description="...or at the latest this long after the oldest waiting one."
    )
    deletion_window_horizon_seconds: float = Field(
        600.0,
        ge=0,
        le=86400,
        description="Removals count together toward the budget, against the fleet as it stood at the first, "
        "until none has been declared for this long.",
    )
    repair_interval_seconds: float = Field(
        60.0,
        ge=0,
        description="A proxy failing its probes has its stack refreshed at most this often per stack.",
    )
    engine_host_idle_seconds: float = Field(
        60.0,
        ge=0,
        description="In a cluster, a leader's Pulumi calls run in an engine host process that exits after "
        "this many idle seconds, so the service never loads the Pulumi SDK; 0: in the service's process "
        '(docs/decisions.md, "The engine host process"). Folder mode runs them in its own process.',
    )
    engine_host_nice: int = Field(
        10,
        ge=0,
        le=19,
        description="The engine host's nice value: its Pulumi calls, their plugins and the `local` proxies "
        "an `up` starts yield the cores to the service when both want them, so leases and probes do not "
        "wait behind an `up` (docs/decisions.md); 0: the service's priority.",
    )
    malloc_trim_seconds: float = Field(
        30.0,
        ge=0,
        description="Free C heap pages go back to the system this often (glibc's malloc_trim); 0: off.",
    )
    gc_settle_seconds: float = Field(
        300.0,
        ge=0,
        description="Every this often, one full garbage collection, then what survived is frozen out of "
        "later collections (service/gc_tuning.py); 0: CPython's collector as it comes.",
    )
    loop_stall_seconds: float = Field(
        0.5,
        ge=0,
        description="When the event loop runs this many seconds late, a warning says where its thread and "
        "the busy threads were (service/loop_stalls.py; at most one every 10 s); 0: off.",
    )
    access_log: Literal["all", "api", "off"] = Field(
        "api",
        description="Which requests get an access-log line: all; api (all but the probes' /v1/echo and "
        "successful /healthz, /readyz and /metrics); off.",
    )
    listen_host: str = Field("127.0.0.1", description="Address the API listens on.")
    listen_port: int = Field(
        8080, ge=0, le=65535, description="Port of the API; 0: any free port (probes use the bound one)."
    )
    discovery: DiscoverySettings = Field(default_factory=DiscoverySettings)
    health: HealthSettings = Field(default_factory=HealthSettings)
    ui: UiSettings = Field(default_factory=UiSettings)

    def backoff(self) -> BackoffPolicy:
        return BackoffPolicy(base=self.backoff_base_seconds, cap=self.backoff_cap_seconds)

    def resolved_backend_url(self) -> str:
        url = self.backend_url or os.environ.get("PULUMI_BACKEND_URL")
        if url:
            return url
        folder = (self.state_dir / "backend").resolve()
        folder.mkdir(parents=True, exist_ok=True)
        return folder.as_uri()

    def passphrase(self) -> str | None:
        if self.secrets_provider != "passphrase":
            return None
        if self.passphrase_file is not None:
            return self.passphrase_file.read_text().rstrip("\n")
        if "PULUMI_CONFIG_PASSPHRASE" in os.environ:
            return os.environ["PULUMI_CONFIG_PASSPHRASE"]
        return secret_file(self.state_dir / "passphrase")

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            backend_url=self.resolved_backend_url(),
            state_dir=self.state_dir.resolve(),
            secrets_provider=self.secrets_provider,
            passphrase=self.passphrase(),
            pulumi=find_pulumi(self.pulumi_path),
            installation=self.installation_name(),
            probe_url=self.health.probe_url,  # serve sets its default (the bound port) before building
        )

    def ui_session_key(self) -> bytes:
        """The key that signs page sessions: the file's (a Secret, the same on every replica), else one made
        once beside the state (valid on this replica only when the state folder is the pod's own)."""
        path = self.ui.session_key_file
        key = path.read_bytes().strip() if path is not None and path.is_file() else b""
        if key and len(key) < 32:
            raise ValueError(f"{path}: the page's session key must be at least 32 characters")
        if not key and path is not None:
            log.warning(
                "%s is missing or empty: page sessions are signed with a key of this replica only", path
            )
        return key or secret_file(self.state_dir / "ui-session-key").encode()

    def installation_name(self) -> str:
        if self.installation:
            return self.installation
        return secret_file(self.state_dir / "installation", make=lambda: f"install-{secrets.token_hex(4)}")


def secret_file(path: Path, *, make: Callable[[], str] = lambda: secrets.token_urlsafe(32)) -> str:
    """The embedded default's secrets and identity (passphrase, dev token, installation name): made once,
    mode 0600, beside the state."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(make())
    return path.read_text().strip()
