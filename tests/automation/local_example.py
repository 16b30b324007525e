"""`examples/local` copied into a test folder: one file per Proxy, free loopback ports, a private state dir.

The catalogue entry gets a `stateDir` inside the test folder, so every pproxy process these proxies start
carries that path on its command line: `kill_processes` finds exactly ours, by pid.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.ports import free_port

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "local"


@dataclass
class LocalExample:
    root: Path
    ports: dict[str, int] = field(default_factory=dict)  # proxy name -> port

    def __post_init__(self) -> None:
        self.manifests = self.root / "manifests"
        self.proxy_state = self.root / "proxy-state"  # no "__": pproxy splits its URI there
        self.manifests.mkdir(parents=True)
        catalogue = yaml.safe_load((EXAMPLE / "catalogue.yaml").read_text())
        for entry in catalogue["providers"]:
            entry["stateDir"] = str(self.proxy_state)
        (self.manifests / "catalogue.yaml").write_text(yaml.safe_dump(catalogue))
        for document in yaml.safe_load_all((EXAMPLE / "proxies.yaml").read_text()):
            self.write(document, port=free_port())

    @property
    def keys(self) -> list[str]:
        return sorted(f"default/{name}" for name in self.ports)

    def write(self, document: dict[str, Any], *, port: int) -> None:
        name = document["metadata"]["name"]
        document["spec"]["port"] = port
        # The service's echo (the health probe) listens on a port the kernel picks: allow loopback explicitly.
        document["spec"]["egress"] = {"allow": [{"cidr": "127.0.0.1/32"}]}
        self.ports[name] = port
        (self.manifests / f"{name}.yaml").write_text(yaml.safe_dump(document))

    def set_port(self, name: str, port: int) -> None:
        path = self.manifests / f"{name}.yaml"
        self.write(yaml.safe_load(path.read_text()), port=port)

    def remove(self, name: str) -> None:
        (self.manifests / f"{name}.yaml").unlink()
        del self.ports[name]

    def kill_processes(self) -> list[int]:
        """Fallback cleanup: SIGKILL every pproxy started under our state dir; returns their pids."""
        found = subprocess.run(["pgrep", "-f", str(self.proxy_state)], capture_output=True, text=True)
        pids = [int(pid) for pid in found.stdout.split()]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids
