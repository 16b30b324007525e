"""A small fleet of `local` proxies in a temporary manifests folder, reconciled by the real engine."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from automation.engine import Engine, StackInput
from service.config import OperatorSettings
from service.controller import Controller
from service.inventory import Inventory
from service.runner import _settle
from service.sources.directory import DirectorySource


def accepts(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def proxy_doc(name: str, *, provider: str = "local", port: int, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": name, "namespace": "crawl", "annotations": spec.pop("annotations", {})},
        "spec": {
            "provider": provider,
            "port": port,
            "allowedSourceRanges": ["127.0.0.0/8"],
            # Test sites and the service's echo listen on loopback ports the kernel picks: allowed explicitly.
            "egress": {"allow": [{"cidr": "127.0.0.1/32"}]},
            **spec,
        },
    }


class CountingEngine(Engine):
    """The real engine, counting its `up` runs and recording when each ran (instrumentation, no mock)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ups: list[tuple[str, float, float]] = []

    def up(self, spec: StackInput, *, refresh: bool = False) -> Any:
        started = time.monotonic()
        try:
            return super().up(spec, refresh=refresh)
        finally:
            self.ups.append((spec.name, started, time.monotonic()))

    def up_count(self, name: str) -> int:
        return sum(1 for stack, _, _ in self.ups if stack == name)


@dataclass
class Fleet:
    root: Path
    backend_url: str
    providers: list[str] = field(default_factory=lambda: ["local"])
    max_parallel: int = 4
    _controllers: list[Controller] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.manifests = self.root / "manifests"
        self.manifests.mkdir(parents=True, exist_ok=True)
        self.local_state = self.root / "local-proxies"
        self.write_catalogue(self.providers)

    # --- manifests ----------------------------------------------------------------------------------

    def write_catalogue(self, names: list[str], **extra: Any) -> None:
        entries = [
            {"name": n, "type": "local", "stateDir": str(self.local_state / n), **extra} for n in names
        ]
        (self.manifests / "catalogue.yaml").write_text(yaml.safe_dump({"providers": entries}))

    def write_proxy(self, name: str, **spec: Any) -> None:
        self._write(name, proxy_doc(name, **spec))

    def remove_proxy(self, name: str) -> None:
        (self.manifests / f"proxy-{name}.yaml").unlink()
        _touch_dir(self.manifests)

    def _write(self, name: str, document: dict[str, Any]) -> None:
        path = self.manifests / f"proxy-{name}.yaml"
        path.write_text(yaml.safe_dump(document))
        # mtime resolution: make sure a rewrite within the same tick is still seen as a change
        os.utime(path, ns=(time.time_ns(), time.time_ns()))

    # --- running ------------------------------------------------------------------------------------

    def settings(self) -> OperatorSettings:
        return OperatorSettings(
            state_dir=self.root / "state",
            backend_url=self.backend_url,
            max_parallel=self.max_parallel,
            backoff_base_seconds=0.2,
            backoff_cap_seconds=1.0,
            resync_seconds=0,
        )

    def controller(self) -> Controller:
        settings = self.settings()
        return Controller(
            settings=settings,
            engine=CountingEngine(settings.engine_config()),
            source=DirectorySource(self.manifests),
            inventory=Inventory(),
        )

    async def run(self, scenario: Callable[[], Awaitable[None]]) -> None:
        """Run a test scenario on one event loop; close every controller it made, leaving no task."""
        try:
            await scenario()
        finally:
            for controller in self._controllers:
                await controller.close(grace=5)
            self._controllers.clear()

    async def apply(self, controller: Controller | None = None) -> Controller:
        if controller is None:
            controller = self.controller()
            self._controllers.append(controller)
        if not controller.started:
            await controller.start()
        else:
            controller.sync()
        await _settle(controller)
        return controller

    # --- cleanup ------------------------------------------------------------------------------------

    def kill_proxies(self) -> None:
        """Stop every pproxy this fleet started (they carry our state folder in their command line)."""
        out = subprocess.run(["pgrep", "-f", str(self.local_state)], capture_output=True, text=True)
        for pid in (int(p) for p in out.stdout.split()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _touch_dir(path: Path) -> None:
    os.utime(path, ns=(time.time_ns(), time.time_ns()))


def kill_up_holding_lock(engine: Engine, stack: str) -> tuple[Path, int]:
    """Start `pulumi up` on the stack's work dir and SIGKILL it as soon as its lock file exists."""
    work = engine.config.state_dir / "work" / stack
    env = {**os.environ, **engine.config.environment()}
    locks = Path(engine.config.backend_url.removeprefix("file://")) / ".pulumi" / "locks"
    command = [
        str(engine.config.pulumi),
        "up",
        "--yes",
        "--stack",
        stack,
        "--non-interactive",
        "--skip-preview",
    ]
    victim = subprocess.Popen(
        command, cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 60
    while not list(locks.rglob("*.json")) and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    if not list(locks.rglob("*.json")):
        raise AssertionError("the killed up left no lock: the scenario did not happen")
    return locks, victim.pid
