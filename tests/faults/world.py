"""What the campaign knows of the cluster it disturbs: the Proxies it created and deleted, their processes,
the catalogue, and the violations found so far."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client import ApiClient

from service.kube.client import ApiException, request_json
from tests.kube.cluster_fleet import proxy_doc
from tests.ports import free_port

BASE = "/apis/crawl.example.com/v1alpha1"
SKIP_CLEANUP = "crawl.example.com/skip-cleanup"
PROVIDERS = ("local-a", "local-b")
_SS_PID = re.compile(r"pid=(\d+)")


def listeners() -> dict[int, int]:
    """Listening TCP port -> pid of its process (`ss -ltnpH`: our own processes, all we need)."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=False).stdout
    found: dict[int, int] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        port = parts[3].rsplit(":", 1)[-1]
        pid = _SS_PID.search(line)
        if port.isdigit() and pid:
            found[int(port)] = int(pid.group(1))
    return found


@dataclass
class Tracked:
    """A Proxy the campaign created: its port, the process seen serving it, and what was done to it."""

    name: str
    provider: str
    port: int | None
    created: float = field(default_factory=time.time)
    pid: int | None = None  # the process first seen serving the port once the Proxy was Ready
    deleted: float | None = None  # the harness declared its deletion at this time
    skip_cleanup: bool = False  # annotated before or during its deletion
    alive_when_annotated: bool = False
    gone: float | None = None  # the object was first seen gone
    mass: int | None = None  # the mass deletion it belonged to
    flagged: set[str] = field(default_factory=set)  # kinds already reported for it


@dataclass
class MassDeletion:
    number: int
    names: list[str]
    started: float
    fleet: int = 0  # proxies whose removal counts (running, not skip-cleanup) when it started
    allowed: float | None = None
    removed_unallowed: set[str] = field(default_factory=set)

    def free(self, *, count: int, share: float) -> int:
        """How many of its removals the budget lets go without an allowance: up to `count`, or up to
        `share` of the fleet, whichever is more (service/deletions.py judges them over one window)."""
        return max(count, int(share * self.fleet))


@dataclass
class Violation:
    kind: str
    sequence: int
    message: str
    time: float = field(default_factory=time.time)


class World:
    def __init__(self, api: ApiClient, *, namespace: str, service_namespace: str, state: Path,
                 backend_dir: Path) -> None:  # fmt: skip
        self.api, self.namespace, self.service_namespace = api, namespace, service_namespace
        self.local_state, self.backend_dir = state, backend_dir
        self.proxies: dict[str, Tracked] = {}
        self.masses: list[MassDeletion] = []
        self.violations: list[Violation] = []
        self.faults: Counter[str] = Counter()
        self.sequence = 0
        self.last_fault = time.time()
        self.lock = threading.RLock()
        self.names = 0
        self.catalogue_names = list(PROVIDERS)

    # --- reporting --------------------------------------------------------------------------------------

    def violate(self, kind: str, message: str, proxy: Tracked | None = None) -> None:
        with self.lock:
            if proxy is not None:
                if kind in proxy.flagged:
                    return
                proxy.flagged.add(kind)
            self.violations.append(Violation(kind, self.sequence, message))
        print(f"VIOLATION [{kind}] seq {self.sequence}: {message}", flush=True)

    def note(self, message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] seq {self.sequence}: {message}", flush=True)

    # --- the catalogue ------------------------------------------------------------------------------------

    def set_catalogue(self, names: list[str]) -> None:
        self.catalogue_names = names
        entries = [{"name": n, "type": "local", "stateDir": str(self.local_state / n)} for n in names]
        body = {"metadata": {"name": "proxy-operator-providers"},
                "data": {"providers.yaml": yaml.safe_dump({"providers": entries})}}  # fmt: skip
        path = f"/api/v1/namespaces/{self.service_namespace}/configmaps"
        try:
            request_json(self.api, "POST", path, body=body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            request_json(self.api, "PATCH", f"{path}/proxy-operator-providers", body=body,
                         content_type="application/merge-patch+json")  # fmt: skip

    # --- Proxies --------------------------------------------------------------------------------------------

    def path(self, name: str) -> str:
        return f"{BASE}/namespaces/{self.namespace}/proxies/{name}"

    def create(self, provider: str, *, skip_cleanup: bool = False) -> Tracked:
        self.names += 1
        name, port = f"p{self.names:03d}", free_port()
        annotations = {SKIP_CLEANUP: "true"} if skip_cleanup else {}
        body = proxy_doc(self.namespace, name, port=port, provider=provider, annotations=annotations)
        tracked = Tracked(
            name=name,
            provider=provider,
            port=port,
            skip_cleanup=skip_cleanup,
            alive_when_annotated=skip_cleanup,
        )
        with self.lock:
            self.proxies[name] = tracked
        self.call("POST", f"{BASE}/namespaces/{self.namespace}/proxies", body)
        return tracked

    def delete(self, tracked: Tracked) -> None:
        with self.lock:
            tracked.deleted = time.time()
        self.call("DELETE", self.path(tracked.name))

    def annotate_skip(self, tracked: Tracked) -> None:
        tracked.skip_cleanup = True
        patch = {"metadata": {"annotations": {SKIP_CLEANUP: "true"}}}
        self.call("PATCH", self.path(tracked.name), patch, merge=True)
        tracked.alive_when_annotated = (
            tracked.pid is not None and listeners().get(tracked.port or 0) == tracked.pid
        )

    def call(self, method: str, path: str, body: Any = None, *, merge: bool = False) -> dict[str, Any] | None:
        """One API call, tried again while the apiserver restarts; None for a 404."""
        kind = "application/merge-patch+json" if merge else "application/json"
        for attempt in range(30):
            try:
                return request_json(self.api, method, path, body=body, content_type=kind, timeout=10)
            except ApiException as exc:
                if exc.status == 404:
                    return None
                if exc.status < 500 and exc.status != 429:
                    raise
            except Exception:
                pass
            time.sleep(min(0.2 * (attempt + 1), 2))
        raise RuntimeError(f"{method} {path}: the apiserver did not answer")

    def objects(self) -> dict[str, dict[str, Any]] | None:
        """Every Proxy in the namespace by name; None when the apiserver does not answer."""
        try:
            items = request_json(self.api, "GET", f"{BASE}/namespaces/{self.namespace}/proxies", timeout=5)
        except Exception:
            return None
        return {o["metadata"]["name"]: o for o in items["items"]}

    def live(self) -> list[Tracked]:
        with self.lock:
            return [t for t in self.proxies.values() if t.deleted is None and t.port is not None]

    def ready(self, obj: dict[str, Any] | None) -> bool:
        return bool(obj) and ((obj or {}).get("status") or {}).get("phase") == "Ready"

    # --- the backend ----------------------------------------------------------------------------------------

    def state_urns(self, stack: str) -> list[str] | None:
        """The URNs in a stack's latest checkpoint (the file backend's own file); None when unreadable."""
        for path in self.backend_dir.glob(f".pulumi/stacks/**/{stack}.json*"):
            if path.name.endswith((".bak", ".attrs")):
                continue
            try:
                raw = path.read_bytes()
                data = json.loads(gzip.decompress(raw) if path.name.endswith(".gz") else raw)
            except (OSError, ValueError):
                continue
            resources = ((data.get("checkpoint") or {}).get("latest") or {}).get("resources") or []
            return [str(r.get("urn")) for r in resources]
        return None
