"""`proxy-operator orphans`: resources carrying our marks and this installation's id that no stack's state
holds; `--delete` removes them after a confirmation (`--yes` for scripts). The judging is
`automation/orphans/` (one module per provider type); this module reaches each entry's provider (the
Kubernetes client with the entry's kubeconfigSecret or the ambient configuration, the Compute API, the KVM
hosts over SSH), lists what it finds, and deletes."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from automation.engine import Engine
from automation.engine.errors import STACK_NOT_FOUND
from automation.errors import InvalidInputError
from automation.orphans import (
    Orphan,
    forward_proxy_processes,
    known_instance_ids,
    local_orphans,
    state_ids,
    stop_local,
)
from automation.orphans.gcp import ComputeApi, HttpCompute, delete_gcp, gcp_orphans
from automation.orphans.kubernetes import (
    KubeObject,
    KubeObjects,
    collection_path,
    delete_kubernetes,
    kubernetes_orphans,
    list_labelled,
    object_path,
)
from automation.orphans.kvm import KvmHosts, delete_kvm, kvm_orphans
from automation.stack_input import provider_credentials
from service.cli_settings import command_settings, setup_errors
from service.config import OperatorSettings
from service.kube.client import ApiException, api_client, request_json
from service.sources.directory import DirectorySource
from stacks.kvm_ssh import mounted_ssh_dir
from stacks.models import GcpProvider, KubernetesProvider, KvmProvider, LocalProvider, ProviderEntry


@dataclass
class ApiObjects:
    """`KubeObjects` over the service's Kubernetes client (raw JSON, names only)."""

    api: Any

    def list(self, *, kind: str, namespace: str, selector: str) -> list[KubeObject]:
        query = [("labelSelector", selector)]
        body = request_json(self.api, "GET", collection_path(kind, namespace), query=query)
        return [KubeObject(kind, namespace, item["metadata"]["name"]) for item in body.get("items") or ()]

    def delete(self, obj: KubeObject) -> bool:
        try:
            request_json(self.api, "DELETE", object_path(obj), body={"propagationPolicy": "Background"})
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True


def kube_cluster(kubeconfig: str | None) -> KubeObjects:
    """The entry's kubeconfig (from its kubeconfigSecret), else $KUBECONFIG or ~/.kube/config, else the
    pod's ServiceAccount: the configuration the kubernetes program's provider would use."""
    if kubeconfig is None:
        return ApiObjects(api_client(_ambient_kubeconfig()))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kubeconfig"
        path.write_text(kubeconfig)
        path.chmod(0o600)
        return ApiObjects(api_client(path))  # the client reads the file now


def _ambient_kubeconfig() -> Path | None:
    named = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
    home = Path("~/.kube/config").expanduser()
    return Path(named) if named else home if home.exists() else None


@dataclass
class Reach:
    """How each provider type is reached (the tests put fakes here)."""

    kube: Callable[[str | None], KubeObjects] = kube_cluster
    compute: Callable[[GcpProvider], ComputeApi] = lambda _entry: HttpCompute()
    kvm: Callable[[KvmProvider], KvmHosts] = lambda entry: KvmHosts(entry, mounted_ssh_dir())


def _stored(engine: Engine, name: str) -> dict[str, Any]:
    """A listed stack's state; empty when the stack went meanwhile (a service removed it after its last
    Proxy left): a stack that is gone holds nothing."""
    try:
        return engine.export_stored(name)
    except InvalidInputError as exc:
        if exc.reason == STACK_NOT_FOUND:
            return {}
        raise


@dataclass
class OrphanFinder:
    settings: OperatorSettings
    manifests: Path
    reach: Reach = field(default_factory=Reach)
    _source: DirectorySource | None = None
    _clients: dict[str, Any] = field(default_factory=dict)

    def find(self) -> list[Orphan]:
        """Every entry of the catalogue, against every stack's state (local: the `proxies` outputs)."""
        entries = self._catalogue()
        engine = Engine(self.settings.engine_config())
        names = engine.list_stack_names()
        found = self._local(engine, names, [e for e in entries if isinstance(e, LocalProvider)])
        remote = [e for e in entries if not isinstance(e, LocalProvider)]
        if remote:
            known = state_ids(_stored(engine, name) for name in names)
            for entry in remote:
                found += self._remote(entry, known)
        return found

    def delete(self, orphans: list[Orphan]) -> list[Orphan]:
        entries = {entry.name: entry for entry in self._catalogue()}
        return [orphan for orphan in orphans if self._delete(entries[orphan.provider], orphan)]

    def _catalogue(self) -> list[ProviderEntry]:
        if self._source is None:
            self._source = DirectorySource(self.manifests)
            self._source.poll()
        if self._source.catalogue is None:
            raise ValueError(f"{self.manifests}: no provider catalogue: orphans are judged by its entries")
        return list(self._source.catalogue.providers)

    def _local(self, engine: Engine, names: list[str], entries: list[LocalProvider]) -> list[Orphan]:
        if not entries:
            return []
        state_dirs = {entry.name: local_state_dir(entry, self.settings) for entry in entries}
        known = known_instance_ids(engine.plain_outputs(name) for name in names)
        return local_orphans(forward_proxy_processes(), state_dirs=state_dirs, known=known)

    def _remote(self, entry: ProviderEntry, known: set[tuple[str, str]]) -> list[Orphan]:
        installation = self.settings.installation_name()
        client = self._client(entry)
        if isinstance(entry, KubernetesProvider):
            objects = list_labelled(client, namespace=entry.namespace, installation=installation)
            return kubernetes_orphans(objects, provider=entry.name, known=known)
        if isinstance(entry, GcpProvider):
            return gcp_orphans(
                client, provider=entry.name, project=entry.project, installation=installation, known=known
            )
        assert isinstance(entry, KvmProvider)
        return kvm_orphans(client.domains(), provider=entry.name, installation=installation, known=known)

    def _delete(self, entry: ProviderEntry, orphan: Orphan) -> bool:
        if isinstance(entry, LocalProvider):
            return stop_local(orphan)
        if isinstance(entry, KubernetesProvider):
            return delete_kubernetes(self._client(entry), orphan)
        if isinstance(entry, GcpProvider):
            return delete_gcp(self._client(entry), orphan)
        return delete_kvm(self._client(entry), orphan)

    def _client(self, entry: ProviderEntry) -> Any:
        if entry.name not in self._clients:
            if isinstance(entry, KubernetesProvider):
                assert self._source is not None
                self._clients[entry.name] = self.reach.kube(provider_credentials(entry, self._source))
            elif isinstance(entry, GcpProvider):
                self._clients[entry.name] = self.reach.compute(entry)
            else:
                assert isinstance(entry, KvmProvider)
                self._clients[entry.name] = self.reach.kvm(entry)
        return self._clients[entry.name]


def find_orphans(settings: OperatorSettings, manifests: Path) -> list[Orphan]:
    return OrphanFinder(settings, manifests).find()


def local_state_dir(entry: LocalProvider, settings: OperatorSettings) -> Path:
    """Where the local program keeps an entry's processes (stacks/programs/local.py `state_dir`): its
    stateDir, else `.state/local-proxies` under the stack's work directory (the program's root)."""
    if entry.state_dir:
        return Path(entry.state_dir).resolve()
    return (settings.state_dir / "work" / entry.name / ".state" / "local-proxies").resolve()


def orphans(
    manifests: Annotated[Path, typer.Option("--manifests", help="Folder with the provider catalogue.")],
    delete: Annotated[bool, typer.Option("--delete", help="Remove them, after a confirmation.")] = False,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask (scripts).")] = False,
    state_dir: Annotated[Path | None, typer.Option("--state-dir")] = None,
) -> None:
    """List resources that carry our marks and this installation's id but are in no stack's state."""
    settings = command_settings(state_dir=state_dir)
    finder = OrphanFinder(settings, manifests)
    with setup_errors():
        found = finder.find()
    for orphan in found:
        typer.echo(f"{orphan.provider}\t{orphan.kind}\t{orphan.id}\t{orphan.detail}")
    typer.echo(f"{len(found)} orphan(s)")
    if not delete or not found:
        return
    if not yes and not typer.confirm(f"delete {len(found)} orphan(s)?"):
        raise typer.Exit(1)
    removed = finder.delete(found)
    typer.echo(f"deleted {len(removed)} orphan(s)")
